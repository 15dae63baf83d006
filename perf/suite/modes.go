package suite

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/apiserver/k8sbin"
	"github.com/xdplb/xdplb/tests/child"
	"github.com/xdplb/xdplb/xdp"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// A mode is one datapath under test. Only one mode handles traffic at a
// time: stop removes everything start set up, and the suite checks the
// node is clean before the next mode starts.
type mode interface {
	name() string
	// unavailable says why the mode cannot run here ("" when it can).
	unavailable(ctx context.Context, e *env) string
	// detail describes the set-up, for the report.
	detail() string
	// start brings the datapath up with the Services of set and waits
	// until it forwards.
	start(ctx context.Context, e *env, set ServiceSet) error
	stop(ctx context.Context, e *env) error
	// prepare is called before each scenario (the baseline picks its
	// egress port here).
	prepare(ctx context.Context, e *env, sc scenario) error
	// reset forgets every flow, between repetitions.
	reset(ctx context.Context, e *env) error
	// observe reads the mode's own counters; nil when it has none.
	observe(ctx context.Context, e *env) (*observation, error)
	// alive reports a datapath process that exited.
	alive() error
	// probeTargets are the targets to check it forwards to after start.
	probeTargets() []targetKind
	// replyTuples returns the reply 5-tuples (as the backends send them)
	// of the tracked flows towards the remote targets.
	replyTuples(ctx context.Context, e *env, limit int) ([]traffic.Tuple, error)
}

// observation is a snapshot of a datapath's counters.
type observation struct {
	counters  map[string]uint64 // xdplb: every counter
	ctEntries int
	ctMax     int
	natEnts   int
	natMax    int
	kernel    *summary.Conntrack
}

// ---- baseline ------------------------------------------------------------

// baselineMode is xdp_fwd on the edge node's NICs: MAC rewrite and
// redirect through a devmap, nothing else. The machine's limit.
type baselineMode struct {
	objs  baseline.XDPObjects
	links []link.Link
}

func (m *baselineMode) name() string { return summary.ModeBaseline }

func (m *baselineMode) unavailable(context.Context, *env) string { return "" }

func (m *baselineMode) detail() string {
	return "xdp_fwd (xdp/baseline/xdp.c): rewrite MACs, XDP_REDIRECT through a devmap; no parsing, no state"
}

func (m *baselineMode) start(ctx context.Context, e *env, _ ServiceSet) error {
	if err := baseline.LoadXDPObjects(&m.objs, nil); err != nil {
		return fmt.Errorf("load forwarding baseline: %w", err)
	}
	t := e.topo
	// Devmap entries name devices of the namespace the update is made in.
	err := t.Edge.Do(func() error {
		for _, idx := range []int{t.Eth0, t.Eth1, t.VethPod} {
			if err := m.objs.FwdPorts.Put(uint32(idx), uint32(idx)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		m.objs.Close()
		return fmt.Errorf("fill forwarding devmap: %w", err)
	}
	if err := m.route(t.Eth1, t.Eth0, t.GenMAC, t.Eth0MAC); err != nil {
		m.objs.Close()
		return err
	}
	if err := m.route(t.Eth0, t.Eth1, t.Node2MAC, t.Eth1MAC); err != nil {
		m.objs.Close()
		return err
	}
	for _, dev := range []string{"eth0", "eth1"} {
		l, err := traffic.AttachXDP(t.Edge, dev, m.objs.XdpFwd)
		if err != nil {
			m.stop(ctx, e)
			return err
		}
		m.links = append(m.links, l)
	}
	return nil
}

func (m *baselineMode) route(in, out int, dmac, smac []byte) error {
	p := baseline.XDPFwdPort{Ifindex: uint32(out)}
	copy(p.Dmac[:], dmac)
	copy(p.Smac[:], smac)
	if err := m.objs.FwdRoutes.Put(uint32(in), p); err != nil {
		return fmt.Errorf("forwarding route: %w", err)
	}
	return nil
}

func (m *baselineMode) prepare(_ context.Context, e *env, sc scenario) error {
	t := e.topo
	if sc.target == targetLocal {
		return m.route(t.Eth0, t.VethPod, t.PodMAC, t.VethPodMAC)
	}
	return m.route(t.Eth0, t.Eth1, t.Node2MAC, t.Eth1MAC)
}

func (m *baselineMode) stop(context.Context, *env) error {
	var errs []error
	for _, l := range m.links {
		errs = append(errs, l.Close())
	}
	m.links = nil
	errs = append(errs, m.objs.Close())
	return errors.Join(errs...)
}

func (m *baselineMode) reset(context.Context, *env) error { return nil }

func (m *baselineMode) alive() error { return nil }

// probeTargets: the baseline forwards to the remote side until a scenario
// says otherwise.
func (m *baselineMode) probeTargets() []targetKind { return []targetKind{targetRemote} }

func (m *baselineMode) observe(context.Context, *env) (*observation, error) { return nil, nil }

// replyTuples: the baseline keeps no state; replies are the forward
// tuples turned around, coming from a remote backend.
func (m *baselineMode) replyTuples(_ context.Context, e *env, limit int) ([]traffic.Tuple, error) {
	spec := establishedSpec(e, scenario{target: targetRemote, flows: uint32(limit)}, ServiceSet{Count: 1, Targets: 1, Backends: 1})
	out := make([]traffic.Tuple, 0, limit)
	for i := 0; i < limit; i++ {
		f := spec.Tuple(uint64(i))
		out = append(out, traffic.Tuple{Src: RemoteBackend0, Dst: f.Src, SrcPort: uint16(backendPort), DstPort: f.SrcPort})
	}
	return out, nil
}

// ---- xdplb ---------------------------------------------------------------

// xdplbMode runs the xdplb agent on the edge node's NICs, reading the
// Services from a file.
type xdplbMode struct {
	xdpOff bool // XDP off: the TC program does everything
	// synCookies is the agent's --syn-cookies: off for the new-flow
	// scenarios, auto (the default) for the flood.
	synCookies string
	set        ServiceSet // what it was started with
	args       []string
	proc       *child.Process
	maps       *loader.Maps
	names      []string
	undo       func() error // detaches the XDP_PASS programs (XDP off)
}

const (
	// The kernel's conntrack holds at most this many entries here; xdplb
	// gets the same room so "nearly full" means the same for both.
	conntrackMax = 262144
	// The agent's default SNAT ports (54,512 per backend and node
	// address: see docs/snat.md), named so the report says which.
	snatPortRange = "1024-29999,40000-65535"
)

func (m *xdplbMode) name() string {
	if m.xdpOff {
		return summary.ModeXDPLBTC
	}
	return summary.ModeXDPLB
}

func (m *xdplbMode) unavailable(_ context.Context, e *env) string {
	if e.xdplb == "" {
		return "no xdplb binary"
	}
	return ""
}

func (m *xdplbMode) detail() string {
	return "xdplb agent " + strings.Join(m.args, " ")
}

func (m *xdplbMode) start(ctx context.Context, e *env, set ServiceSet) error {
	file := filepath.Join(e.dir, fmt.Sprintf("services-%d.yaml", set.Count))
	if _, err := os.Stat(file); err != nil {
		t0 := time.Now()
		if err := set.WriteServicesFile(file); err != nil {
			return err
		}
		e.log.Info("wrote services file", "services", set.Count+2, "took", time.Since(t0).Round(time.Millisecond))
	}
	xdpMode := string(loader.XDPNative)
	if m.xdpOff {
		xdpMode = string(loader.XDPOff)
		undo, err := e.topo.PassXDP()
		if err != nil {
			return err
		}
		m.undo = undo
	}
	servicesMax := 65536
	for servicesMax < 2*(set.Count+2) {
		servicesMax *= 2
	}
	m.args = []string{
		"--iface", "eth0,eth1", "--node-name", edgeNode, "--xdp-mode", xdpMode,
		"--conntrack-max", strconv.Itoa(conntrackMax), "--nat-max", strconv.Itoa(conntrackMax),
		"--snat-port-range", snatPortRange,
		// The new-flow scenarios measure admitting new flows: every frame
		// a SYN nobody completes, which SYN cookies (on by default once a
		// service port leaves 1000 handshakes incomplete within a second)
		// would answer instead. The flood scenario runs the default.
		"--syn-cookies", m.cookies(),
		"--services-max", strconv.Itoa(servicesMax), "--frontends-max", strconv.Itoa(max(262144, 4*(set.Count+2))),
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
	}
	full := append([]string{"agent", "--bpffs-root", e.topo.BPFFS, "--services-file", file}, m.args...)
	m.set = set
	t0 := time.Now()
	p, err := e.startInNamespace(e.topo.Edge, filepath.Join(e.dir, fmt.Sprintf("%s-%s.log", m.name(), m.cookies())), e.xdplb, full...)
	if err != nil {
		return err
	}
	m.proc = p
	if err := m.waitHealthy(ctx, e, 2*time.Minute+time.Duration(set.Count)*5*time.Millisecond); err != nil {
		return err
	}
	e.log.Info("xdplb agent ready", "mode", m.name(), "services", set.Count+2, "took", time.Since(t0).Round(time.Millisecond))
	if m.maps, err = loader.OpenPinned(e.topo.BPFFS); err != nil {
		return fmt.Errorf("open xdplb's pinned maps: %w", err)
	}
	if m.names, err = xdp.StatNames(); err != nil {
		return err
	}
	return nil
}

func (m *xdplbMode) waitHealthy(ctx context.Context, e *env, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	last := "no answer yet"
	for time.Now().Before(deadline) {
		if m.proc.Exited() {
			return fmt.Errorf("xdplb agent exited: %v\n%s", m.proc.Err(), m.proc.LogTail(30))
		}
		code, body, err := e.httpGet(ctx, "http://127.0.0.1:10256/healthz")
		switch {
		case err != nil:
			last = err.Error()
		case code == http.StatusOK:
			return nil
		default:
			last = fmt.Sprintf("HTTP %d: %s", code, strings.TrimSpace(body))
		}
		e.log.Debug("xdplb agent not healthy yet", "last", last)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("xdplb agent not healthy after %s (%s):\n%s", timeout, last, m.proc.LogTail(30))
}

func (m *xdplbMode) stop(ctx context.Context, e *env) error {
	m.synCookies = "" // the next start is a new-flow one unless prepare says
	var errs []error
	if m.maps != nil {
		errs = append(errs, m.maps.Close())
		m.maps = nil
	}
	if m.proc != nil {
		if err := m.proc.Stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
		m.proc = nil
	}
	if out, err := e.topo.Edge.Exec(e.xdplb, "detach", "--bpffs-root", e.topo.BPFFS); err != nil {
		errs = append(errs, fmt.Errorf("xdplb detach: %w: %s", err, out))
	}
	if m.undo != nil {
		errs = append(errs, m.undo())
		m.undo = nil
	}
	return errors.Join(errs...)
}

func (m *xdplbMode) cookies() string {
	if m.synCookies == "" {
		return "off"
	}
	return m.synCookies
}

// prepare restarts the agent when the scenario wants SYN cookies set
// otherwise than it runs with.
func (m *xdplbMode) prepare(ctx context.Context, e *env, sc scenario) error {
	want := "off"
	if sc.traffic == trafficFlood {
		want = "auto"
	}
	if want == m.cookies() {
		return nil
	}
	if err := m.stop(ctx, e); err != nil {
		return fmt.Errorf("restart with --syn-cookies %s: %w", want, err)
	}
	m.synCookies = want
	if err := m.start(ctx, e, m.set); err != nil {
		return fmt.Errorf("restart with --syn-cookies %s: %w", want, err)
	}
	return waitForwarding(ctx, e, m.set, m.probeTargets(), 2*time.Minute, m.alive)
}

func (m *xdplbMode) alive() error { return checkRunning(m.proc) }

func (m *xdplbMode) probeTargets() []targetKind { return allTargets }

// reset empties the flow maps through the pins (the agent keeps no copy).
func (m *xdplbMode) reset(context.Context, *env) error {
	return dataplane.New(m.maps).ResetFlows()
}

func (m *xdplbMode) observe(context.Context, *env) (*observation, error) {
	dp := dataplane.New(m.maps)
	counters, err := dp.Counters()
	if err != nil {
		return nil, err
	}
	o := &observation{counters: map[string]uint64{}, ctMax: int(m.maps.Conntrack.MaxEntries()), natMax: int(m.maps.NAT.MaxEntries() + m.maps.SNATSlots.MaxEntries())}
	for i, c := range counters {
		if i < len(m.names) {
			o.counters[m.names[i]] = c.Packets
		}
	}
	if o.ctEntries, err = dp.FlowEntries(); err != nil {
		return nil, fmt.Errorf("count conntrack: %w", err)
	}
	if o.natEnts, err = dp.ReverseEntries(); err != nil {
		return nil, fmt.Errorf("count reverse NAT halves: %w", err)
	}
	return o, nil
}

// replyTuples reads the reverse NAT halves: their keys are the replies.
func (m *xdplbMode) replyTuples(_ context.Context, e *env, limit int) ([]traffic.Tuple, error) {
	var out []traffic.Tuple
	err := dataplane.New(m.maps).ReverseHalves(func(key xdp.NatKey, _ xdp.NatEntry) bool {
		if key.Proto == e.proto && xdp.NetToAddr(key.Daddr) == EdgeNodeAddr {
			out = append(out, traffic.Tuple{Src: xdp.NetToAddr(key.Saddr), Dst: xdp.NetToAddr(key.Daddr),
				SrcPort: xdp.NetToPort(key.Sport), DstPort: xdp.NetToPort(key.Dport)})
		}
		return len(out) < limit
	})
	return out, err
}

// ---- kube-proxy ------------------------------------------------------------

// kubeProxyMode runs the real kube-proxy in the edge node against the real
// API server holding the same Services.
type kubeProxyMode struct {
	proxyMode string // iptables, nftables or ipvs
	args      []string
	proc      *child.Process
	undo      func() error
}

func (m *kubeProxyMode) name() string { return "kube-proxy-" + m.proxyMode }

func (m *kubeProxyMode) unavailable(ctx context.Context, e *env) string {
	if e.kubeProxy == "" {
		return "kube-proxy " + k8sbin.KubernetesVersion + " could not be built (see the run's log)"
	}
	// Every mode needs nft to leave netfilter as it found it.
	if _, err := exec.LookPath("nft"); err != nil {
		return "nft is not installed (Debian package nftables)"
	}
	switch m.proxyMode {
	case "iptables":
		for _, bin := range []string{"iptables", "iptables-save", "iptables-restore"} {
			if _, err := exec.LookPath(bin); err != nil {
				return bin + " is not installed (Debian package iptables)"
			}
		}
		return iptablesUnavailable(e.topo.Edge)
	case "ipvs":
		if why := ipvsUnavailable(e); why != "" {
			return why
		}
		// The IPVS mode masquerades and filters with iptables.
		return iptablesUnavailable(e.topo.Edge)
	}
	return ""
}

// ipvsUnavailable says why IPVS cannot be measured, or "".
func ipvsUnavailable(e *env) string {
	if _, err := e.topo.Edge.Exec("test", "-e", "/proc/net/ip_vs"); err == nil {
		if _, err := exec.LookPath("ipset"); err != nil {
			return "ipset is not installed (kube-proxy's IPVS mode needs it)"
		}
		return ""
	}
	switch kernelConfig("CONFIG_IP_VS") {
	case "n":
		return "IPVS is not built into this kernel (CONFIG_IP_VS is not set)"
	case "m":
		return "the ip_vs module is not loaded (load it with modprobe ip_vs to measure IPVS)"
	}
	return "IPVS is not available in this kernel (/proc/net/ip_vs does not exist)"
}

// kernelConfig returns y, m or n for a kernel option, "" when unknown.
func kernelConfig(option string) string {
	f, err := os.Open("/proc/config.gz")
	if err != nil {
		return ""
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return ""
	}
	defer zr.Close()
	sc := bufio.NewScanner(zr)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "# "+option+" is not set":
			return "n"
		case strings.HasPrefix(line, option+"="):
			return strings.TrimPrefix(line, option+"=")
		}
	}
	return ""
}

func (m *kubeProxyMode) detail() string {
	return "kube-proxy " + k8sbin.KubernetesVersion + " " + strings.Join(m.args, " ")
}

// cleanup runs kube-proxy --cleanup, then deletes the netfilter tables
// the edge node did not have before the first mode. kube-proxy removes its
// rules and chains but keeps what the kubelet would use (KUBE-FIREWALL),
// and iptables keeps every table it made (ip and ip6 filter, nat, mangle)
// with its built-in chains, hooked into forwarding even when empty: the
// next mode must find the node as it was.
func (m *kubeProxyMode) cleanup(ctx context.Context, e *env) error {
	out, err := e.topo.Edge.Exec(e.kubeProxy, "--cleanup", "--proxy-mode", m.proxyMode, "--v=0")
	if err != nil {
		// It reports an error when there was nothing to remove for a mode
		// this kernel lacks (IPVS); what matters is what is left.
		e.log.Debug("kube-proxy --cleanup", "mode", m.proxyMode, "err", err, "output", out)
	}
	return restoreNetfilter(e.topo.Edge, e.netfilter)
}

func (m *kubeProxyMode) start(ctx context.Context, e *env, set ServiceSet) error {
	if e.cluster == nil {
		c, err := startCluster(ctx, filepath.Join(e.dir, "apiserver"), e.topo.Edge, e.controlCPUs, e.log)
		if err != nil {
			return err
		}
		e.cluster = c
	}
	if err := e.cluster.sync(ctx, set); err != nil {
		return err
	}
	if err := m.cleanup(ctx, e); err != nil {
		return err
	}
	undo, err := e.topo.PassXDP()
	if err != nil {
		return err
	}
	m.undo = undo
	m.args = []string{
		"--proxy-mode", m.proxyMode, "--hostname-override", edgeNode, "--cluster-cidr", "10.244.0.0/16",
		"--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0",
		"--conntrack-tcp-timeout-close-wait", "0",
		"--healthz-bind-address", "127.0.0.1:10256", "--metrics-bind-address", "127.0.0.1:10249",
		"--v", "1",
	}
	full := append([]string{"--kubeconfig", e.cluster.kubeconfig()}, m.args...)
	t0 := time.Now()
	p, err := e.startInNamespace(e.topo.Edge, filepath.Join(e.dir, m.name()+".log"), e.kubeProxy, full...)
	if err != nil {
		return err
	}
	m.proc = p
	e.log.Info("kube-proxy started", "mode", m.proxyMode, "services", set.Count+2, "took", time.Since(t0).Round(time.Millisecond))
	return nil
}

func (m *kubeProxyMode) alive() error { return checkRunning(m.proc) }

func (m *kubeProxyMode) probeTargets() []targetKind { return allTargets }

var allTargets = []targetKind{targetRemote, targetLocal, targetOne}

func (m *kubeProxyMode) stop(ctx context.Context, e *env) error {
	var errs []error
	if m.proc != nil {
		if err := m.proc.Stop(15 * time.Second); err != nil {
			errs = append(errs, err)
		}
		m.proc = nil
	}
	errs = append(errs, m.cleanup(ctx, e))
	if m.undo != nil {
		errs = append(errs, m.undo())
		m.undo = nil
	}
	errs = append(errs, e.flushConntrack())
	return errors.Join(errs...)
}

func (m *kubeProxyMode) prepare(context.Context, *env, scenario) error { return nil }

func (m *kubeProxyMode) reset(_ context.Context, e *env) error { return e.flushConntrack() }

func (m *kubeProxyMode) observe(_ context.Context, e *env) (*observation, error) {
	c, err := kernelConntrack(e)
	if err != nil {
		return nil, err
	}
	return &observation{kernel: c}, nil
}

func (m *kubeProxyMode) replyTuples(_ context.Context, e *env, limit int) ([]traffic.Tuple, error) {
	return conntrackReplies(e, limit)
}
