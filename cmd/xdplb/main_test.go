package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/urfave/cli/v2"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/xdplb/xdplb/control/agent"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// testIface is the interface the agent tests name in --iface: one end of a
// veth pair in a test network namespace, so no flag fails for lack of an
// interface and nothing can touch the machine's own interfaces.
const testIface = "xlb0"

// cleanEnv unsets every variable the CLI reads, for the test.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "XDPLB_") && name != "XDPLB_CI" || name == "NODE_NAME" ||
			strings.HasPrefix(name, "KUBERNETES_SERVICE_") {
			val := os.Getenv(name)
			os.Unsetenv(name)
			t.Cleanup(func() { os.Setenv(name, val) })
		}
	}
}

// setEnv sets variables for the test (t.Setenv restores them).
func setEnv(t *testing.T, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}

type result struct {
	code           int
	stdout, stderr string
}

// runIn runs the command line in-process with the real agent, whose
// context is already cancelled: an agent that got past validation returns
// right after it started. With ns set, it runs on a thread inside that
// namespace.
func runIn(t *testing.T, ns *testenv.Netns, args ...string) result {
	t.Helper()
	return runWith(t, ns, runAgent, args...)
}

// runWith is runIn with the agent's run replaced by runner.
func runWith(t *testing.T, ns *testenv.Netns, runner agentRunner, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	var r result
	do := func() error {
		r.code = run(ctx, append([]string{"xdplb"}, args...), &out, &errb, runner)
		return nil
	}
	if ns != nil {
		if err := ns.Do(do); err != nil {
			t.Fatal(err)
		}
	} else {
		do()
	}
	r.stdout, r.stderr = out.String(), errb.String()
	return r
}

// An agentRecorder stands in for the agent's run and records the
// configurations it was given.
type agentRecorder struct {
	started []agent.Config
	run     agentRunner
}

// runIn is the package's runIn with the recorder as the agent's run.
func (a *agentRecorder) runIn(t *testing.T, ns *testenv.Netns, args ...string) result {
	t.Helper()
	return runWith(t, ns, a.run, args...)
}

// startOnly loads and attaches the datapath on the calling thread (inside
// the test namespace) and returns, so a test sees whatever an agent that
// passed validation would attach, and no goroutine of the agent runs
// outside the namespace.
func startOnly() *agentRecorder {
	a := &agentRecorder{}
	a.run = func(ctx context.Context, cfg agent.Config, log *slog.Logger) error {
		a.started = append(a.started, cfg)
		started, err := agent.Start(ctx, cfg, log)
		if err == nil {
			started.Close() // as an agent does when it stops
		}
		return err
	}
	return a
}

// captureConfig only records the validated configuration.
func captureConfig() *agentRecorder {
	a := &agentRecorder{}
	a.run = func(ctx context.Context, cfg agent.Config, log *slog.Logger) error {
		a.started = append(a.started, cfg)
		return nil
	}
	return a
}

// testNetns is a namespace with a veth pair (testIface and its peer) and
// an address on testIface.
func testNetns(t *testing.T, names ...string) *testenv.Netns {
	t.Helper()
	testenv.RequireCommand(t, "ip")
	ns := testenv.NewNetns(t, "cli")
	if len(names) == 0 {
		names = []string{testIface, "xlb1"}
	}
	ns.IP("link", "add", names[0], "type", "veth", "peer", "name", names[1])
	ns.IP("link", "set", names[0], "up")
	ns.IP("link", "set", names[1], "up")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", names[0])
	return ns
}

// state is what an agent leaves behind: a bpffs mount with pins under the
// root, programs on the interface, SNAT ports reserved.
type state struct {
	bpffs         bool
	entries       []string
	xdpProg       uint32
	tcxProgs      int
	reservedPorts string
}

func observe(t *testing.T, ns *testenv.Netns, root, iface string) state {
	t.Helper()
	var s state
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err == nil {
		s.bpffs = st.Type == unix.BPF_FS_MAGIC
	}
	des, _ := os.ReadDir(root)
	for _, de := range des {
		// A fresh bpffs may show the kernel's preloaded iterators.
		if de.Name() != "maps.debug" && de.Name() != "progs.debug" {
			s.entries = append(s.entries, de.Name())
		}
	}
	err := ns.Do(func() error {
		l, err := netlink.LinkByName(iface)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			s.xdpProg = x.ProgId
		}
		for _, attach := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: attach})
			if err != nil {
				return fmt.Errorf("query tcx programs: %w", err)
			}
			s.tcxProgs += len(q.Programs)
		}
		raw, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_reserved_ports")
		s.reservedPorts = strings.TrimSpace(string(raw))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cleanupRoot detaches and unmounts whatever an agent left under root.
func cleanupRoot(t *testing.T, ns *testenv.Netns, root string) {
	t.Cleanup(func() {
		var st unix.Statfs_t
		if unix.Statfs(root, &st) != nil || st.Type != unix.BPF_FS_MAGIC {
			return
		}
		if err := ns.Do(func() error { return loader.Detach(root) }); err != nil {
			t.Errorf("detach %s: %v", root, err)
		}
		if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
}

// flagCase is one invalid command line of `xdplb agent`.
type flagCase struct {
	name  string
	set   map[string]string // flags replacing the valid base ones
	unset []string          // base flags left out
	extra []string          // raw arguments appended
	env   map[string]string
	flag  string // the flag the message must name
	// allowedOf is the flag whose allowed values the message must quote
	// (default: flag; "-" for none).
	allowedOf string
	want      string // further text the message must contain
}

// agentCases lists bad values of every agent flag, and bad environment
// variables. TestEveryAgentFlagHasInvalidCases keeps it complete.
func agentCases(dir string) []flagCase {
	file := filepath.Join(dir, "plain-file")
	badKubeconfig := filepath.Join(dir, "bad-kubeconfig")
	return []flagCase{
		{name: "iface missing", unset: []string{"iface"}, flag: "iface", want: "--iface is required"},
		{name: "iface unknown", set: map[string]string{"iface": "nope0"}, flag: "iface", want: "no such network interface"},
		{name: "iface one of two unknown", set: map[string]string{"iface": testIface + ",nope1"}, flag: "iface", want: `"nope1": no such network interface`},
		{name: "iface bad name", set: map[string]string{"iface": "a/b"}, flag: "iface", want: "not a valid interface name"},
		{name: "iface too long", set: map[string]string{"iface": "averyverylongname"}, flag: "iface", want: "not a valid interface name"},
		{name: "iface without value", unset: []string{"iface"}, extra: []string{"--iface"}, flag: "iface", want: "needs a value"},
		{name: "xdp-mode unknown", set: map[string]string{"xdp-mode": "turbo"}, flag: "xdp-mode", want: "unknown mode"},
		{name: "xdp-mode empty", set: map[string]string{"xdp-mode": ""}, flag: "xdp-mode"},
		{name: "services-file is a directory", set: map[string]string{"services-file": dir}, flag: "services-file", want: "is a directory"},
		{name: "services-file in missing directory", set: map[string]string{"services-file": "/nonexistent-xdplb/services.yaml"},
			flag: "services-file", want: "does not exist"},
		{name: "services-file and kubeconfig", set: map[string]string{"kubeconfig": file}, flag: "services-file", want: "choose one source"},
		{name: "no source outside a pod", unset: []string{"services-file"}, flag: "services-file", allowedOf: "-", want: "no source of Services"},
		{name: "kubeconfig missing", unset: []string{"services-file"}, set: map[string]string{"kubeconfig": "/nonexistent-xdplb/kubeconfig"},
			flag: "kubeconfig", want: "no such file"},
		{name: "kubeconfig is a directory", unset: []string{"services-file"}, set: map[string]string{"kubeconfig": dir}, flag: "kubeconfig", want: "is a directory"},
		{name: "kubeconfig not a kubeconfig", unset: []string{"services-file"}, set: map[string]string{"kubeconfig": badKubeconfig},
			flag: "kubeconfig", want: "not a usable kubeconfig"},
		{name: "node-name invalid", set: map[string]string{"node-name": "Edge_1"}, flag: "node-name"},
		{name: "maglev-table-size not prime", set: map[string]string{"maglev-table-size": "1000"}, flag: "maglev-table-size", want: "not a supported table size"},
		{name: "maglev-table-size too small", set: map[string]string{"maglev-table-size": "7"}, flag: "maglev-table-size"},
		{name: "maglev-table-size zero", set: map[string]string{"maglev-table-size": "0"}, flag: "maglev-table-size"},
		{name: "maglev-table-size unsupported prime", set: map[string]string{"maglev-table-size": "262139"}, flag: "maglev-table-size"},
		{name: "maglev-table-size wraps to 251", set: map[string]string{"maglev-table-size": "4294967547"}, flag: "maglev-table-size"},
		{name: "maglev-table-size not a number", set: map[string]string{"maglev-table-size": "big"}, flag: "maglev-table-size", want: "not a whole number"},
		{name: "maglev-hash-seed not a number", set: map[string]string{"maglev-hash-seed": "x"}, flag: "maglev-hash-seed", want: "not a whole number"},
		{name: "maglev-hash-seed negative", set: map[string]string{"maglev-hash-seed": "-1"}, flag: "maglev-hash-seed"},
		{name: "maglev-hash-seed too large", set: map[string]string{"maglev-hash-seed": "18446744073709551616"}, flag: "maglev-hash-seed", want: "out of range"},
		{name: "conntrack-max too small", set: map[string]string{"conntrack-max": "1023"}, flag: "conntrack-max", want: "out of range"},
		{name: "conntrack-max zero", set: map[string]string{"conntrack-max": "0"}, flag: "conntrack-max"},
		{name: "conntrack-max too large", set: map[string]string{"conntrack-max": "134217729"}, flag: "conntrack-max"},
		{name: "conntrack-max negative", set: map[string]string{"conntrack-max": "-5"}, flag: "conntrack-max", want: "not a whole number"},
		{name: "nat-max too small", set: map[string]string{"nat-max": "1023"}, flag: "nat-max"},
		{name: "nat-max below conntrack-max", set: map[string]string{"nat-max": "2048"}, flag: "nat-max", want: "below --conntrack-max 524288"},
		{name: "services-max too small", set: map[string]string{"services-max": "1"}, flag: "services-max"},
		{name: "services-max too large", set: map[string]string{"services-max": "4194305"}, flag: "services-max"},
		{name: "backends-max too small", set: map[string]string{"backends-max": "1"}, flag: "backends-max"},
		{name: "backends-max too large", set: map[string]string{"backends-max": "16777217"}, flag: "backends-max"},
		{name: "frontends-max zero", set: map[string]string{"frontends-max": "0"}, flag: "frontends-max"},
		{name: "frontends-max too large", set: map[string]string{"frontends-max": "16777217"}, flag: "frontends-max"},
		{name: "memory-limit not a quantity", set: map[string]string{"memory-limit": "lots"}, flag: "memory-limit", want: "not a quantity of bytes"},
		{name: "memory-limit too small", set: map[string]string{"memory-limit": "100Mi"}, flag: "memory-limit", want: "below 256 MiB"},
		{name: "memory-limit too large", set: map[string]string{"memory-limit": "9Ei"}, flag: "memory-limit", want: "out of range"},
		{name: "conntrack-max beyond a fractional memory limit", set: map[string]string{"memory-limit": "0.5Gi", "conntrack-max": "4194304"},
			flag: "conntrack-max", want: "the 320 MiB that --memory-limit 512 MiB leaves"},
		{name: "conntrack-max beyond the memory limit", set: map[string]string{"memory-limit": "1Gi", "conntrack-max": "4194304"},
			flag: "conntrack-max", want: "--memory-limit 1.0 GiB leaves beside the agent's 192 MiB"},
		{name: "tcp-established-timeout without unit", set: map[string]string{"tcp-established-timeout": "5"}, flag: "tcp-established-timeout", want: "not a duration"},
		{name: "tcp-established-timeout zero", set: map[string]string{"tcp-established-timeout": "0s"}, flag: "tcp-established-timeout", want: "out of range"},
		{name: "tcp-established-timeout negative", set: map[string]string{"tcp-established-timeout": "-1s"}, flag: "tcp-established-timeout"},
		{name: "tcp-established-timeout too long", set: map[string]string{"tcp-established-timeout": "169h"}, flag: "tcp-established-timeout"},
		{name: "tcp-transient-timeout too short", set: map[string]string{"tcp-transient-timeout": "500ms"}, flag: "tcp-transient-timeout"},
		{name: "udp-timeout not a duration", set: map[string]string{"udp-timeout": "forever"}, flag: "udp-timeout"},
		{name: "udp-timeout too long", set: map[string]string{"udp-timeout": "200h"}, flag: "udp-timeout"},
		{name: "icmp-rate too high", set: map[string]string{"icmp-rate": "1000000001"}, flag: "icmp-rate", want: "out of range"},
		{name: "icmp-rate not a number", set: map[string]string{"icmp-rate": "fast"}, flag: "icmp-rate"},
		{name: "syn-cookies unknown mode", set: map[string]string{"syn-cookies": "sometimes"}, flag: "syn-cookies", want: "not a mode"},
		{name: "syn-flood-threshold zero", set: map[string]string{"syn-flood-threshold": "0"}, flag: "syn-flood-threshold", want: "out of range"},
		{name: "syn-flood-threshold not a number", set: map[string]string{"syn-flood-threshold": "many"}, flag: "syn-flood-threshold"},
		{name: "snat-port-range not a range", set: map[string]string{"snat-port-range": "40000"}, flag: "snat-port-range", want: "not LOW-HIGH"},
		{name: "snat-port-range not numbers", set: map[string]string{"snat-port-range": "a-b"}, flag: "snat-port-range"},
		{name: "snat-port-range privileged", set: map[string]string{"snat-port-range": "1000-3000"}, flag: "snat-port-range", want: "privileged"},
		{name: "snat-port-range too small", set: map[string]string{"snat-port-range": "40000-40100"}, flag: "snat-port-range", want: "at least 1024"},
		{name: "snat-port-range reversed", set: map[string]string{"snat-port-range": "60000-50000"}, flag: "snat-port-range", want: "is empty"},
		{name: "snat-port-range three ranges", set: map[string]string{"snat-port-range": "2000-3000,4000-5000,6000-7000"}, flag: "snat-port-range", want: "at most 2"},
		{name: "snat-port-range out of order", set: map[string]string{"snat-port-range": "50000-60000,2000-3000"}, flag: "snat-port-range", want: "give the lower range first"},
		{name: "snat-port-range second range privileged", set: map[string]string{"snat-port-range": "0-100,2000-3000"}, flag: "snat-port-range"},
		{name: "snat-port-range two ranges too small", set: map[string]string{"snat-port-range": "2000-2400,3000-3400"}, flag: "snat-port-range", want: "802 ports, at least 1024"},
		{name: "snat-port-range beyond 65535", set: map[string]string{"snat-port-range": "60000-70000"}, flag: "snat-port-range"},
		// The test namespace's ip_local_port_range is the kernel's 32768 60999.
		{name: "snat-port-range takes the host's ephemeral ports", set: map[string]string{"snat-port-range": "32768-60999"},
			flag: "snat-port-range", want: "would leave the host 0 of its ephemeral ports"},
		{name: "snat-port-range overlaps nodeport-range", set: map[string]string{"snat-port-range": "30000-40000"}, flag: "snat-port-range", want: "overlaps --nodeport-range"},
		{name: "snat-extra-addresses not an address", set: map[string]string{"snat-extra-addresses": "10.0.0.0/24"}, flag: "snat-extra-addresses", want: "not an IPv4 address"},
		{name: "snat-extra-addresses IPv6", set: map[string]string{"snat-extra-addresses": "fd00::1"}, flag: "snat-extra-addresses", want: "not an IPv4 address"},
		{name: "snat-extra-addresses loopback", set: map[string]string{"snat-extra-addresses": "127.0.0.2"}, flag: "snat-extra-addresses", want: "not a unicast address"},
		{name: "snat-extra-addresses too many", set: map[string]string{"snat-extra-addresses": "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5,10.0.0.6,10.0.0.7,10.0.0.8,10.0.0.9"},
			flag: "snat-extra-addresses", want: "9 addresses, at most 8"},
		{name: "nodeport-range not a range", set: map[string]string{"nodeport-range": "30000"}, flag: "nodeport-range"},
		{name: "nodeport-range zero", set: map[string]string{"nodeport-range": "0-100"}, flag: "nodeport-range"},
		{name: "nodeport-range overlaps a set snat-port-range", set: map[string]string{"nodeport-range": "50000-50100", "snat-port-range": "45000-55000"},
			flag: "snat-port-range", want: "45000-55000 overlaps --nodeport-range 50000-50100"},
		{name: "nodeport-addresses not a CIDR", set: map[string]string{"nodeport-addresses": "10.0.0.1"}, flag: "nodeport-addresses", want: "not an IPv4 CIDR"},
		{name: "nodeport-addresses IPv6", set: map[string]string{"nodeport-addresses": "fd00::/64"}, flag: "nodeport-addresses"},
		{name: "nodeport-addresses primary and CIDR", set: map[string]string{"nodeport-addresses": "primary,10.0.0.0/8"}, flag: "nodeport-addresses", want: `"primary" cannot be combined`},
		{name: "bpffs-root relative", set: map[string]string{"bpffs-root": "relative/pins"}, flag: "bpffs-root", want: "not an absolute path"},
		{name: "bpffs-root empty", set: map[string]string{"bpffs-root": ""}, flag: "bpffs-root"},
		{name: "bpffs-root is a file", set: map[string]string{"bpffs-root": file}, flag: "bpffs-root", want: "not a directory"},
		{name: "host-proc-sys relative", set: map[string]string{"host-proc-sys": "proc/sys"}, flag: "host-proc-sys", want: "not an absolute path"},
		{name: "host-proc-sys not a proc sys", set: map[string]string{"host-proc-sys": dir}, flag: "host-proc-sys", want: "not a /proc/sys"},
		{name: "metrics-bind-address not host:port", set: map[string]string{"metrics-bind-address": "metrics"}, flag: "metrics-bind-address"},
		{name: "metrics-bind-address bad port", set: map[string]string{"metrics-bind-address": "127.0.0.1:99999"}, flag: "metrics-bind-address"},
		{name: "metrics-bind-address host name", set: map[string]string{"metrics-bind-address": "metrics.example:80"}, flag: "metrics-bind-address"},
		{name: "metrics-bind-address same as healthz", set: map[string]string{"metrics-bind-address": "127.0.0.1:9999", "healthz-bind-address": "127.0.0.1:9999"},
			flag: "metrics-bind-address", want: "takes the same port as --healthz-bind-address"},
		{name: "metrics-bind-address on healthz's port of all addresses", set: map[string]string{"metrics-bind-address": ":10256"},
			flag: "metrics-bind-address", want: "takes the same port as --healthz-bind-address 0.0.0.0:10256"},
		{name: "metrics-bind-address localhost on healthz's loopback port", set: map[string]string{"metrics-bind-address": "localhost:10256", "healthz-bind-address": "127.0.0.1:10256"},
			flag: "metrics-bind-address", want: "takes the same port as --healthz-bind-address 127.0.0.1:10256"},
		{name: "metrics-bind-address IPv6 wildcard on healthz's port", set: map[string]string{"metrics-bind-address": "[::]:10256"},
			flag: "metrics-bind-address", want: "takes the same port as --healthz-bind-address"},
		{name: "metrics-bind-address same port with a leading zero", set: map[string]string{"metrics-bind-address": "127.0.0.1:09999", "healthz-bind-address": "127.0.0.1:9999"},
			flag: "metrics-bind-address", want: "takes the same port as --healthz-bind-address"},
		{name: "healthz-bind-address without port", set: map[string]string{"healthz-bind-address": "0.0.0.0"}, flag: "healthz-bind-address"},
		{name: "healthz-bind-address named port", set: map[string]string{"healthz-bind-address": ":healthz"}, flag: "healthz-bind-address"},
		{name: "service-proxy-name not a label value", set: map[string]string{"service-proxy-name": "my proxy!"}, flag: "service-proxy-name"},
		{name: "service-proxy-name too long", set: map[string]string{"service-proxy-name": strings.Repeat("x", 64)}, flag: "service-proxy-name"},
		{name: "pod-interfaces bad pattern", set: map[string]string{"pod-interfaces": "veth*,lxc["}, flag: "pod-interfaces", want: "not a valid pattern"},
		{name: "cgroup-root relative", set: map[string]string{"cgroup-root": "sys/fs/cgroup"}, flag: "cgroup-root", want: "not an absolute path"},
		{name: "cgroup-root missing", set: map[string]string{"cgroup-root": "/nonexistent-xdplb/cgroup"}, flag: "cgroup-root", want: "no such directory"},
		{name: "cgroup-root not cgroup2", set: map[string]string{"cgroup-root": dir}, flag: "cgroup-root", want: "not a cgroup v2 directory"},
		// A file of the hierarchy (cgroup.procs) when the node has one.
		{name: "cgroup-root a file of cgroup2", set: map[string]string{"cgroup-root": cgroupFile()}, flag: "cgroup-root", want: "not a directory"},
		{name: "min-sync-period too long", set: map[string]string{"min-sync-period": "2m"}, flag: "min-sync-period"},
		{name: "min-sync-period negative", set: map[string]string{"min-sync-period": "-1s"}, flag: "min-sync-period"},
		{name: "min-sync-period above half the health timeout", set: map[string]string{"min-sync-period": "31s"}, flag: "min-sync-period", want: "out of range"},
		{name: "min-sync-period above sync-period", set: map[string]string{"min-sync-period": "20s", "sync-period": "10s"},
			flag: "min-sync-period", want: "above --sync-period 10s"},
		{name: "sync-period too short", set: map[string]string{"sync-period": "500ms"}, flag: "sync-period"},
		{name: "sync-period too long", set: map[string]string{"sync-period": "25h"}, flag: "sync-period"},
		{name: "log-level unknown", set: map[string]string{"log-level": "loud"}, flag: "log-level"},
		{name: "log-level upper case", set: map[string]string{"log-level": "INFO"}, flag: "log-level"},
		{name: "log-format unknown", set: map[string]string{"log-format": "xml"}, flag: "log-format"},
		{name: "unknown flag", extra: []string{"--frontend-max", "5"}, flag: "frontend-max", allowedOf: "-", want: "unknown flag"},
		{name: "positional argument", extra: []string{testIface}, flag: "-", allowedOf: "-", want: `unexpected argument "xlb0"`},

		// Environment variables: the same checks, and the message names
		// the flag and the variable.
		{name: "env maglev table size 7", env: map[string]string{"XDPLB_MAGLEV_TABLE_SIZE": "7"}, flag: "maglev-table-size", want: "--maglev-table-size 7:"},
		{name: "env maglev table size not a number", env: map[string]string{"XDPLB_MAGLEV_TABLE_SIZE": "x"}, flag: "maglev-table-size", want: "$XDPLB_MAGLEV_TABLE_SIZE"},
		{name: "env xdp mode", env: map[string]string{"XDPLB_XDP_MODE": "turbo"}, flag: "xdp-mode"},
		{name: "env iface", unset: []string{"iface"}, env: map[string]string{"XDPLB_IFACE": "nope0"}, flag: "iface", want: "no such network interface"},
		{name: "env conntrack max", env: map[string]string{"XDPLB_CONNTRACK_MAX": "10"}, flag: "conntrack-max"},
		{name: "env udp timeout", env: map[string]string{"XDPLB_UDP_TIMEOUT": "forever"}, flag: "udp-timeout", want: "$XDPLB_UDP_TIMEOUT"},
		{name: "env node name", env: map[string]string{"NODE_NAME": "Edge_1"}, flag: "node-name"},
		{name: "env snat port range", env: map[string]string{"XDPLB_SNAT_PORT_RANGE": "1-2"}, flag: "snat-port-range"},
	}
}

// cgroupFile is a regular file in the node's cgroup v2 hierarchy; without
// one, a path that is not absolute (which fails all the same).
func cgroupFile() string {
	if root := loader.FindCgroup2Root(); root != "" {
		return filepath.Join(root, "cgroup.procs")
	}
	return "no-cgroup2/cgroup.procs"
}

// baseArgs are valid agent flags; cases replace or drop some.
func baseArgs(root, servicesFile string) map[string]string {
	return map[string]string{
		"iface":         testIface,
		"services-file": servicesFile,
		"bpffs-root":    root,
		// Not needed for validation, but an agent that wrongly got past
		// it must not watch the test machine's interfaces.
		"pod-interfaces": "",
	}
}

func (c flagCase) args(root, servicesFile string) []string {
	flags := baseArgs(root, servicesFile)
	for _, k := range c.unset {
		delete(flags, k)
	}
	for k, v := range c.set {
		flags[k] = v
	}
	args := []string{"agent"}
	for _, k := range slices.Sorted(maps.Keys(flags)) {
		args = append(args, "--"+k, flags[k])
	}
	return append(args, c.extra...)
}

// checkUsageError asserts exit code 2 and a one-line message that names
// the flag and its allowed values.
func checkUsageError(t *testing.T, r result, flag, allowedOf, want string) {
	t.Helper()
	if r.code != exitUsage {
		// Not fatal: the caller goes on to check what was attached.
		t.Errorf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, exitUsage, r.stdout, r.stderr)
		return
	}
	msg := strings.TrimSuffix(r.stderr, "\n")
	if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "xdplb: ") || strings.HasPrefix(msg, "xdplb: xdplb:") {
		t.Errorf("want one line starting with \"xdplb: \" once, got:\n%s", r.stderr)
	}
	if flag != "-" && !strings.Contains(msg, "--"+flag) {
		t.Errorf("message does not name --%s: %s", flag, msg)
	}
	if allowedOf == "" {
		allowedOf = flag
	}
	if allowedOf != "-" {
		a := allowed[allowedOf]
		if a == "" || !strings.Contains(msg, "allowed values: "+a) {
			t.Errorf("message does not give the allowed values of --%s (%q): %s", allowedOf, a, msg)
		}
	}
	if want != "" && !strings.Contains(msg, want) {
		t.Errorf("message does not say %q: %s", want, msg)
	}
	if r.stdout != "" {
		t.Errorf("unexpected output on stdout: %q", r.stdout)
	}
}

// TestAgentFlagValidation runs `xdplb agent` with every invalid value in
// a network namespace whose interface the flags name: each exits 2 with a
// message naming the flag and its allowed values, before anything is
// mounted, pinned, attached or reserved.
func TestAgentFlagValidation(t *testing.T) {
	ns := testNetns(t)
	agents := startOnly()
	dir := t.TempDir()
	servicesFile := filepath.Join(dir, "services.yaml")
	if err := os.WriteFile(filepath.Join(dir, "plain-file"), []byte("not a directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad-kubeconfig"), []byte("this: is: not: a kubeconfig\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range agentCases(dir) {
		t.Run(c.name, func(t *testing.T) {
			cleanEnv(t)
			setEnv(t, c.env)
			root := t.TempDir()
			cleanupRoot(t, ns, root)
			before := observe(t, ns, root, testIface)
			r := agents.runIn(t, ns, c.args(root, servicesFile)...)
			checkUsageError(t, r, c.flag, c.allowedOf, c.want)
			after := observe(t, ns, root, testIface)
			if after.bpffs || len(after.entries) > 0 {
				t.Errorf("--bpffs-root %s after a failed validation: bpffs mounted %v, entries %v", root, after.bpffs, after.entries)
			}
			if after.xdpProg != 0 || after.tcxProgs != 0 {
				t.Errorf("%s gained programs: XDP id %d, %d tcx programs", testIface, after.xdpProg, after.tcxProgs)
			}
			if after.reservedPorts != before.reservedPorts {
				t.Errorf("ip_local_reserved_ports changed from %q to %q", before.reservedPorts, after.reservedPorts)
			}
		})
	}
}

// TestValidFlagsAttach is the control for TestAgentFlagValidation: the
// same base flags pass validation, and then the checks there see the
// datapath mounted, pinned and attached; `xdplb detach` removes it all.
func TestValidFlagsAttach(t *testing.T) {
	ns := testNetns(t)
	agents := startOnly()
	cleanEnv(t)
	dir := t.TempDir()
	root := t.TempDir()
	cleanupRoot(t, ns, root)
	r := agents.runIn(t, ns, flagCase{set: map[string]string{"cgroup-root": "off"}}.args(root, filepath.Join(dir, "services.yaml"))...)
	if r.code != exitOK || len(agents.started) != 1 {
		t.Fatalf("exit code %d (agent started %d times)\nstderr: %s", r.code, len(agents.started), r.stderr)
	}
	s := observe(t, ns, root, testIface)
	if !s.bpffs || !slices.Contains(s.entries, "xdplb") {
		t.Errorf("after a valid start: bpffs mounted %v, entries %v", s.bpffs, s.entries)
	}
	if s.xdpProg == 0 || s.tcxProgs != 2 {
		t.Errorf("after a valid start: XDP program id %d, %d tcx programs; want XDP and TC ingress and egress", s.xdpProg, s.tcxProgs)
	}
	if !strings.Contains(s.reservedPorts, "40000-60999") {
		t.Errorf("SNAT ports not reserved: ip_local_reserved_ports %q", s.reservedPorts)
	}

	r = runIn(t, ns, "detach", "--bpffs-root", root)
	if r.code != exitOK {
		t.Fatalf("detach: exit code %d\n%s", r.code, r.stderr)
	}
	want := fmt.Sprintf("detached tc-egress from %s\ndetached tc-ingress from %s\ndetached xdp from %s\n"+
		"released ports 40000-60999 from net.ipv4.ip_local_reserved_ports\npins removed from %s\n",
		testIface, testIface, testIface, loader.Dir(root))
	if r.stdout != want {
		t.Errorf("detach said\n%s\nwant\n%s", r.stdout, want)
	}
	s = observe(t, ns, root, testIface)
	if s.xdpProg != 0 || s.tcxProgs != 0 {
		t.Errorf("after detach: XDP program id %d, %d tcx programs", s.xdpProg, s.tcxProgs)
	}
	if len(s.entries) != 0 {
		t.Errorf("after detach: %s still holds %v", root, s.entries)
	}
	if s.reservedPorts != "" {
		t.Errorf("after detach: ip_local_reserved_ports %q, want the agent's range released", s.reservedPorts)
	}
	r = runIn(t, ns, "status", "--bpffs-root", root)
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "xdplb: no xdplb datapath pinned under "+root) ||
		strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("status after detach: exit %d, %q; want 1 and one line saying nothing is pinned", r.code, r.stderr)
	}
}

// A VLAN interface's name has a dot (eth0.100): --iface takes it, the
// agent attaches to it, status lists it and detach removes it by that
// name.
func TestDottedIfaceAttaches(t *testing.T) {
	const vlan = "xlb0.5"
	ns := testNetns(t, vlan, "xlb1")
	agents := startOnly()
	cleanEnv(t)
	root := t.TempDir()
	cleanupRoot(t, ns, root)
	r := agents.runIn(t, ns, flagCase{set: map[string]string{"iface": vlan, "cgroup-root": "off"}}.args(root,
		filepath.Join(t.TempDir(), "services.yaml"))...)
	if r.code != exitOK || len(agents.started) != 1 {
		t.Fatalf("exit code %d (agent started %d times)\nstderr: %s", r.code, len(agents.started), r.stderr)
	}
	if s := observe(t, ns, root, vlan); s.xdpProg == 0 || s.tcxProgs != 2 {
		t.Errorf("on %s: XDP program id %d, %d tcx programs; want XDP and TC ingress and egress", vlan, s.xdpProg, s.tcxProgs)
	}
	r = runIn(t, ns, "status", "--bpffs-root", root)
	if r.code != exitOK || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(vlan)+`\s+xdp\s`).MatchString(r.stdout) {
		t.Errorf("status: exit %d, want the XDP attachment of %s listed\nstdout: %s\nstderr: %s", r.code, vlan, r.stdout, r.stderr)
	}
	r = runIn(t, ns, "detach", "--bpffs-root", root)
	if want := fmt.Sprintf("detached tc-egress from %s\ndetached tc-ingress from %s\ndetached xdp from %s\n", vlan, vlan, vlan); r.code != exitOK || !strings.HasPrefix(r.stdout, want) {
		t.Errorf("detach: exit %d, said\n%s\nwant it to start with\n%s\nstderr: %s", r.code, r.stdout, want, r.stderr)
	}
	if s := observe(t, ns, root, vlan); s.xdpProg != 0 || s.tcxProgs != 0 {
		t.Errorf("after detach: XDP program id %d, %d tcx programs", s.xdpProg, s.tcxProgs)
	}
}

// TestEveryAgentFlagHasInvalidCases keeps the table above complete, and
// checks that every flag has its environment variable and documented
// allowed values.
func TestEveryAgentFlagHasInvalidCases(t *testing.T) {
	covered := map[string]bool{}
	for _, c := range agentCases(t.TempDir()) {
		covered[c.flag] = true
	}
	for _, f := range agentFlags() {
		name := f.Names()[0]
		if !covered[name] {
			t.Errorf("--%s: no invalid value in agentCases", name)
		}
		doc := f.(cli.DocGenerationFlag)
		if !slices.Contains(doc.GetEnvVars(), env(name)[0]) {
			t.Errorf("--%s: environment variable %s missing (has %v)", name, env(name)[0], doc.GetEnvVars())
		}
		if allowed[name] == "" {
			t.Errorf("--%s: allowed values not documented", name)
		}
	}
}

// TestDefaultsValidate checks the configuration the defaults give, that
// the environment sets flags (the command line winning), and that the
// ConfigMap in deploy/ passes validation.
func TestDefaultsValidate(t *testing.T) {
	ns := testNetns(t, "eth0", "xlb1")
	agents := captureConfig()
	dir := t.TempDir()
	servicesFile := filepath.Join(dir, "services.yaml")

	t.Run("defaults", func(t *testing.T) {
		cleanEnv(t)
		agents.started = nil
		r := agents.runIn(t, ns, "agent", "--iface", "eth0", "--services-file", servicesFile)
		if r.code != exitOK || len(agents.started) != 1 {
			t.Fatalf("exit code %d, %d configs\n%s", r.code, len(agents.started), r.stderr)
		}
		cfg := agents.started[0]
		d := loader.DefaultOptions()
		d.AffinityMax = d.ConntrackMax / 8
		d.SourceRangesMax = d.ServicesMax
		if cfg.Datapath != d {
			t.Errorf("datapath options\n%+v\nwant the loader's defaults\n%+v", cfg.Datapath, d)
		}
		if cfg.MaglevTableSize != 16381 || cfg.MaglevSeed != uint64(d.HashSeed) || cfg.XDPMode != loader.XDPBestEffort ||
			cfg.NodePortMin != 30000 || cfg.NodePortMax != 32767 || cfg.NodeName != "" ||
			cfg.HealthzAddress != "0.0.0.0:10256" || cfg.MetricsAddress != "127.0.0.1:10249" ||
			cfg.MinSyncPeriod != 10*time.Millisecond || cfg.SyncPeriod != time.Minute ||
			!slices.Equal(cfg.Interfaces, []string{"eth0"}) || cfg.ServicesFile != servicesFile {
			t.Errorf("config from defaults: %+v", cfg)
		}
	})

	// The default SNAT ports leave out a NodePort range of another place;
	// set, two ranges are taken as given.
	for _, c := range []struct {
		name string
		args []string
		want xdp.SNATPorts
	}{
		{"SNAT ports beside the NodePort range", []string{"--nodeport-range", "20000-22767"},
			xdp.SNATPorts{{Min: 1024, Max: 19999}, {Min: 40000, Max: 65535}}},
		{"SNAT ports beside a NodePort range among them", []string{"--nodeport-range", "50000-50100"},
			xdp.SNATPorts{{Min: 1024, Max: 29999}, {Min: 50101, Max: 65535}}},
		{"two SNAT ranges", []string{"--snat-port-range", "2000-2999, 61000-62000"},
			xdp.SNATPorts{{Min: 2000, Max: 2999}, {Min: 61000, Max: 62000}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cleanEnv(t)
			agents.started = nil
			r := agents.runIn(t, ns, append([]string{"agent", "--iface", "eth0", "--services-file", servicesFile}, c.args...)...)
			if r.code != exitOK || len(agents.started) != 1 {
				t.Fatalf("exit code %d\n%s", r.code, r.stderr)
			}
			if got := agents.started[0].Datapath.SNATPorts; got != c.want {
				t.Errorf("SNAT ports %s, want %s", got, c.want)
			}
		})
	}

	t.Run("environment", func(t *testing.T) {
		cleanEnv(t)
		setEnv(t, map[string]string{
			"XDPLB_IFACE": "eth0, xlb1", "XDPLB_SERVICES_FILE": servicesFile, "XDPLB_CONNTRACK_MAX": "2048",
			"XDPLB_MAGLEV_TABLE_SIZE": "251", "NODE_NAME": "edge-1", "XDPLB_UDP_TIMEOUT": "30s",
			"XDPLB_NODEPORT_ADDRESSES": "192.0.2.0/24", "XDPLB_XDP_MODE": "generic", "XDPLB_ICMP_RATE": "0",
			"XDPLB_SYN_COOKIES": "always", "XDPLB_SYN_FLOOD_THRESHOLD": "50",
		})
		agents.started = nil
		r := agents.runIn(t, ns, "agent", "--maglev-table-size", "509")
		if r.code != exitOK || len(agents.started) != 1 {
			t.Fatalf("exit code %d\n%s", r.code, r.stderr)
		}
		cfg := agents.started[0]
		if !slices.Equal(cfg.Interfaces, []string{"eth0", "xlb1"}) || cfg.ServicesFile != servicesFile ||
			cfg.Datapath.ConntrackMax != 2048 || cfg.Datapath.NATMax != 2048 || cfg.NodeName != "edge-1" ||
			cfg.Datapath.UDPTimeout != 30*time.Second || cfg.XDPMode != loader.XDPGeneric || cfg.Datapath.ICMPRate != 0 ||
			len(cfg.NodePortAddresses) != 1 || cfg.NodePortAddresses[0].String() != "192.0.2.0/24" ||
			cfg.Datapath.SYNCookies != loader.SYNCookiesAlways || cfg.Datapath.SYNFloodThreshold != 50 {
			t.Errorf("config from the environment: %+v", cfg)
		}
		if cfg.MaglevTableSize != 509 {
			t.Errorf("--maglev-table-size 509 on the command line gave %d; it must win over the environment", cfg.MaglevTableSize)
		}
	})

	t.Run("deploy ConfigMap", func(t *testing.T) {
		cleanEnv(t)
		raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "configmap.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var cm struct {
			Data map[string]string `json:"data"`
		}
		if err := yaml.Unmarshal(raw, &cm); err != nil {
			t.Fatal(err)
		}
		if len(cm.Data) == 0 {
			t.Fatal("deploy/configmap.yaml has no data")
		}
		setEnv(t, cm.Data)
		// The DaemonSet's pod has a node name and the in-cluster
		// configuration; here the services file stands in for the latter.
		t.Setenv("NODE_NAME", "edge-1")
		// The pod's /host/proc/sys is the DaemonSet's mount of the
		// node's /proc/sys/net (tests/manifests checks the two agree).
		if cm.Data["XDPLB_HOST_PROC_SYS"] != "/host/proc/sys" {
			t.Errorf("XDPLB_HOST_PROC_SYS = %q, want /host/proc/sys", cm.Data["XDPLB_HOST_PROC_SYS"])
		}
		t.Setenv("XDPLB_HOST_PROC_SYS", "/proc/sys")
		agents.started = nil
		r := agents.runIn(t, ns, "agent", "--services-file", servicesFile)
		if r.code != exitOK || len(agents.started) != 1 {
			t.Fatalf("deploy/configmap.yaml does not validate: exit code %d\n%s", r.code, r.stderr)
		}
	})
}

// TestCommandUsageErrors covers the introspection commands' flags and
// arguments, unknown commands and flags: exit 2 before any pin is opened
// (an empty directory as --bpffs-root would make them exit 1 otherwise).
func TestCommandUsageErrors(t *testing.T) {
	cleanEnv(t)
	root := t.TempDir()
	cases := []struct {
		name      string
		args      []string
		flag      string
		allowedOf string
		want      string
	}{
		{"status output", []string{"status", "-o", "yaml"}, "output", "", `--output "yaml": unknown format`},
		{"status long output flag", []string{"status", "--output", "wide"}, "output", "", ""},
		{"status argument", []string{"status", "eth0"}, "-", "-", `status: unexpected argument "eth0"`},
		{"status unknown flag", []string{"status", "--verbose"}, "verbose", "-", "unknown flag --verbose (see xdplb status --help)"},
		{"status relative bpffs-root", []string{"status", "--bpffs-root", "pins"}, "bpffs-root", "", "not an absolute path"},
		{"services output", []string{"services", "-o", "xml"}, "output", "", ""},
		{"services argument", []string{"services", "default/web"}, "-", "-", "unexpected argument"},
		{"conntrack client not an address", []string{"conntrack", "--client", "300.1.1.1"}, "client", "", "not an IPv4 address"},
		{"conntrack client IPv6", []string{"conntrack", "--client", "fd00::1"}, "client", "", ""},
		{"conntrack backend", []string{"conntrack", "--backend", "pod-1"}, "backend", "", ""},
		{"conntrack backend with port", []string{"conntrack", "--backend", "10.0.0.1:80"}, "backend", "", ""},
		{"conntrack proto", []string{"conntrack", "--proto", "icmp"}, "proto", "", "unknown protocol"},
		{"conntrack output", []string{"conntrack", "-o", "csv"}, "output", "", ""},
		{"conntrack argument", []string{"conntrack", "default/web"}, "-", "-", "unexpected argument"},
		{"lookup without src", []string{"lookup", "--dst", "203.0.113.10:80"}, "src", "", "--src is required"},
		{"lookup without dst", []string{"lookup", "--src", "198.51.100.10:40000"}, "dst", "", "--dst is required"},
		{"lookup src without port", []string{"lookup", "--src", "198.51.100.10", "--dst", "203.0.113.10:80"}, "src", "", "not an IPv4 address and port"},
		{"lookup src IPv6", []string{"lookup", "--src", "[fd00::1]:80", "--dst", "203.0.113.10:80"}, "src", "", ""},
		{"lookup dst not an address", []string{"lookup", "--src", "198.51.100.10:40000", "--dst", "shop:80"}, "dst", "", ""},
		{"lookup dst port out of range", []string{"lookup", "--src", "198.51.100.10:40000", "--dst", "203.0.113.10:70000"}, "dst", "", ""},
		{"lookup proto", []string{"lookup", "--proto", "sctp", "--src", "198.51.100.10:40000", "--dst", "203.0.113.10:80"}, "proto", "", "unknown protocol"},
		{"lookup output", []string{"lookup", "-o", "yaml", "--src", "198.51.100.10:40000", "--dst", "203.0.113.10:80"}, "output", "", ""},
		{"maglev without service", []string{"maglev"}, "-", "-", "maglev: missing SERVICE argument"},
		{"maglev flags after service", []string{"maglev", "default/web", "-o", "json"}, "-", "-", "flags go before it: xdplb maglev -o json default/web"},
		{"maglev output", []string{"maglev", "-o", "html", "default/web"}, "output", "", ""},
		{"detach argument", []string{"detach", "eth0"}, "-", "-", "unexpected argument"},
		{"detach relative bpffs-root", []string{"detach", "--bpffs-root", "."}, "bpffs-root", "", ""},
		{"detach empty bpffs-root", []string{"detach", "--bpffs-root", ""}, "bpffs-root", "", ""},
		{"version output", []string{"version", "-o", "yaml"}, "output", "", ""},
		{"unknown command", []string{"stats"}, "-", "-", `unknown command "stats"; commands: agent, detach, status`},
		{"unknown global flag", []string{"--verbose", "status"}, "verbose", "-", "unknown flag --verbose (see xdplb --help)"},
		{"detach host-proc-sys", []string{"detach", "--host-proc-sys", root}, "host-proc-sys", "", "not a /proc/sys"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := c.args
			if slices.Contains([]string{"status", "services", "conntrack", "lookup", "maglev", "detach"}, args[0]) &&
				!slices.Contains(args, "--bpffs-root") {
				args = append([]string{args[0], "--bpffs-root", root}, args[1:]...)
			}
			r := runIn(t, nil, args...)
			checkUsageError(t, r, c.flag, c.allowedOf, c.want)
			if des, _ := os.ReadDir(root); len(des) != 0 {
				t.Errorf("%s gained %d entries", root, len(des))
			}
		})
	}

	t.Run("no command", func(t *testing.T) {
		r := runIn(t, nil)
		if r.code != exitUsage || !strings.Contains(r.stdout, "COMMANDS:") {
			t.Errorf("xdplb without a command: exit %d, want 2 and the help\n%s", r.code, r.stdout)
		}
	})
	t.Run("nothing pinned", func(t *testing.T) {
		for _, cmd := range [][]string{{"status"}, {"services"}, {"conntrack"}, {"maglev", "default/web"},
			{"lookup", "--src", "198.51.100.10:40000", "--dst", "203.0.113.10:80"}} {
			r := runIn(t, nil, append([]string{cmd[0], "--bpffs-root", root}, cmd[1:]...)...)
			want := "xdplb: no xdplb datapath pinned under " + root + " (is the agent running with this --bpffs-root?)\n"
			if r.code != exitFailure || r.stderr != want {
				t.Errorf("%v with nothing pinned: exit %d, %q; want 1 and %q", cmd, r.code, r.stderr, want)
			}
		}
	})
}

func TestVersion(t *testing.T) {
	r := runIn(t, nil, "version")
	if r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"xdplb ", "go:       " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		"schema:   " + loader.SchemaVersion, "xdplb_nic (XDP, ", "xdplb_nic_ingress (SchedCLS, ", "xdplb_pod (SchedCLS, ", "xdplb_connect4 ("} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("version output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = runIn(t, nil, "version", "-o", "json")
	var v VersionInfo
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || r.code != exitOK {
		t.Fatalf("version -o json: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	if v.Go != runtime.Version() || v.Schema != loader.SchemaVersion || len(v.Programs) < 7 {
		t.Errorf("version -o json: %+v", v)
	}
	for _, p := range v.Programs {
		if len(p.Digest) != 16 || p.Instructions == 0 {
			t.Errorf("program %+v: want a 16-digit digest and its instruction count", p)
		}
	}
}

// TestFlagTable renders docs/running.md's table of agent flags from the flag
// definitions and compares it with testdata/agent-flags.md (-update
// rewrites it), so the documentation cannot drift from the code.
func TestFlagTable(t *testing.T) {
	var buf bytes.Buffer
	if err := writeFlagTable(&buf, agentFlags()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "agent-flags.md")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/xdplb -run TestFlagTable -update)", err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Errorf("%s is out of date: run go test ./cmd/xdplb -run TestFlagTable -update\ngot:\n%s", path, buf.String())
	}
	// docs/running.md shows the same table.
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "running.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, buf.Bytes()) {
		t.Errorf("docs/running.md's flag table differs from %s: copy it over", path)
	}
}
