package e2e

// Golden tests of the introspection commands (status, services,
// conntrack, lookup, maglev, version, detach) against a real agent in the
// sandbox, in their table and JSON forms. Values that legitimately vary
// between runs (program and link ids, pids, times, ages, the temporary
// bpffs path, SNAT ports) are normalised; client ports are fixed, so the
// Maglev choices and everything else stay deterministic.
//
// Regenerate the golden files with
//
//	go test ./tests/e2e -run TestCLI -update

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/tests/topology"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files under testdata/golden")

// Client ports of the flows the golden outputs show.
const (
	portHTTP      = 42001 // HTTP to shop's LB IP, completed: a closed flow
	portLine      = 42003 // long-lived line connection: an established flow
	portDNS       = 42006 // UDP to shop's LB IP
	portSticky    = 42005 // HTTP to sticky (ClientIP affinity)
	portNew       = 42010 // never used: a new flow
	portStickyNew = 42011
	portSweep     = 42100 // ports of lookup-versus-connection checks
)

// cliServices are the Services of the golden tests: one of each kind the
// commands tell apart.
func cliServices(remote, local []*topology.Pod) []topology.Service {
	lb := func(n int) []string { return []string{topology.LBIP(n).String()} }
	http := func(nodePort int32) []topology.ServicePort {
		return []topology.ServicePort{{Name: "http", Port: 80, TargetPort: topology.HTTPPort, NodePort: nodePort}}
	}
	return []topology.Service{
		// Remote and local backends, TCP and UDP.
		{Name: "shop", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.11", LBIPs: lb(0),
			Ports: []topology.ServicePort{
				{Name: "http", Port: 80, TargetPort: topology.HTTPPort, NodePort: 30081},
				{Name: "lines", Port: 9000, TargetPort: topology.LinePort, NodePort: 30082},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: topology.UDPPort, NodePort: 30053},
			},
			Endpoints: []*topology.Pod{remote[0], remote[1], local[0]}},
		// Only a terminating endpoint: it still gets new flows.
		{Name: "drain", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.12", LBIPs: lb(1), Ports: http(30091),
			Terminating: []*topology.Pod{remote[2]}},
		// No endpoints: refused.
		{Name: "empty", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.13", LBIPs: lb(2), Ports: http(30092)},
		// externalTrafficPolicy Local without a local endpoint: dropped.
		{Name: "edge-only", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.14", LBIPs: lb(3), Local: true,
			Ports: http(30093), Endpoints: []*topology.Pod{remote[0]}},
		// ClientIP affinity.
		{Name: "sticky", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.15", LBIPs: lb(4), Affinity: true,
			Ports: http(30094), Endpoints: []*topology.Pod{remote[0], remote[1]}},
	}
}

// cliResult is one run of the CLI.
type cliResult struct {
	args           []string
	stdout, stderr string
	code           int
}

// xdplb runs the CLI in the edge node against the sandbox's pins.
func (s *sandbox) xdplb(args ...string) cliResult {
	s.t.Helper()
	full := args
	if args[0] != "version" {
		full = append([]string{args[0], "--bpffs-root", s.topo.BPFFS}, args[1:]...)
	}
	cmd := s.topo.Edge.Command(binary, full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	r := cliResult{args: args}
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		s.t.Fatalf("xdplb %v: %v", args, err)
	}
	r.stdout, r.stderr = out.String(), errb.String()
	return r
}

// ok runs the CLI and fails the test unless it succeeds.
func (s *sandbox) ok(args ...string) cliResult {
	s.t.Helper()
	r := s.xdplb(args...)
	if r.code != 0 {
		s.t.Fatalf("xdplb %s: exit %d\n%s%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// transcript renders runs as a shell session.
func transcript(rs ...cliResult) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString("\n")
		}
		fmt.Fprintf(&b, "$ xdplb %s\n%s", strings.Join(r.args, " "), r.stdout)
		if r.code != 0 || r.stderr != "" {
			fmt.Fprintf(&b, "[exit %d, stderr]\n%s", r.code, r.stderr)
		}
	}
	return b.String()
}

// normaliser replaces what varies between runs.
type normaliser struct {
	bpffs string
}

var (
	reTime      = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	reAgo       = regexp.MustCompile(`\(\d[0-9hms.]* ago\)`)
	rePid       = regexp.MustCompile(`pid \d+`)
	reSyncs     = regexp.MustCompile(`\b\d+ syncs?\b`)
	reAgeIdle   = regexp.MustCompile(`\b(age|idle) \d+s\b`)
	reCtAge     = regexp.MustCompile(`(?m)^((?:tcp|udp) .*\s)\d+s(\s+)\d+s(\s)`)
	reSNAT      = regexp.MustCompile(`198\.51\.100\.1:(?:[1-9]\d{3}|[12]\d{4}|[4-6]\d{4})\b`)
	reProgID    = regexp.MustCompile(`(?m)^(\S+\s+(?:xdp|tc-ingress|tc-egress|tc-pod|tc-podreply|cgroup)\s+\S+\s+\S+\s+)\d+`)
	reJSONNum   = regexp.MustCompile(`"(agentPid|programId|linkId|syncs|ageSeconds|idleSeconds)": \d+`)
	reCounters  = regexp.MustCompile(`(?s)\n\nCOUNTER +PACKETS +BYTES\n.*$`)
	reJSONCtrs  = regexp.MustCompile(`(?s)"counters": \[.*?\n  \]`)
	reGoVersion = regexp.MustCompile(`go1\.[\w.+-]+`)
	rePlatform  = regexp.MustCompile(`\b(linux)/\w+`)
	reDigest    = regexp.MustCompile(`(digest |"digest": ")[0-9a-f]{16}`)
	reInsns     = regexp.MustCompile(`(\d+ instructions|"instructions": \d+)`)
	reCommit    = regexp.MustCompile(`(?m)^(commit: .*|  "(commit|commitTime|modified)": .*)\n`)
	reSpaces    = regexp.MustCompile(` {2,}`)
	reHeader    = regexp.MustCompile(`^[A-Z]+( {2,}[A-Z]+)+$`)
)

func (n normaliser) apply(s string) string {
	s = strings.ReplaceAll(s, n.bpffs, "<bpffs>")
	s = reTime.ReplaceAllString(s, "<time>")
	s = reAgo.ReplaceAllString(s, "(<age> ago)")
	s = rePid.ReplaceAllString(s, "pid <pid>")
	s = reSyncs.ReplaceAllString(s, "<n> syncs")
	s = reAgeIdle.ReplaceAllString(s, "$1 <n>s")
	s = reCtAge.ReplaceAllString(s, "${1}<n>s$2<n>s$3")
	s = reSNAT.ReplaceAllString(s, "198.51.100.1:<snat>")
	s = reProgID.ReplaceAllString(s, "$1<id>")
	s = reJSONNum.ReplaceAllString(s, `"$1": "<n>"`)
	s = reCounters.ReplaceAllString(s, "\n\n(counters: checked separately)\n")
	s = reJSONCtrs.ReplaceAllString(s, `"counters": "checked separately"`)
	s = reGoVersion.ReplaceAllString(s, "<go>")
	s = rePlatform.ReplaceAllString(s, "$1/<arch>")
	s = reDigest.ReplaceAllString(s, "$1<digest>")
	s = reInsns.ReplaceAllStringFunc(s, func(m string) string {
		if strings.HasPrefix(m, `"`) {
			return `"instructions": "<n>"`
		}
		return "<n> instructions"
	})
	s = reCommit.ReplaceAllString(s, "")
	return realign(s)
}

// realign lines the columns of every table (a block starting with an
// upper-case header line) up again after values of another width were
// substituted, the way the CLI's tabwriter does.
func realign(s string) string {
	var out bytes.Buffer
	var tw *tabwriter.Writer
	for _, line := range strings.SplitAfter(s, "\n") {
		body := strings.TrimSuffix(line, "\n")
		if tw == nil && reHeader.MatchString(body) {
			tw = tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
		}
		if tw != nil && (body == "" || strings.HasPrefix(body, "$ ") || strings.HasPrefix(body, "(counters")) {
			tw.Flush()
			tw = nil
		}
		if tw != nil {
			fmt.Fprint(tw, reSpaces.ReplaceAllString(body, "\t")+strings.TrimPrefix(line, body))
			continue
		}
		out.WriteString(line)
	}
	if tw != nil {
		tw.Flush()
	}
	return out.String()
}

// golden compares got with testdata/golden/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", "golden", name)
	if *updateGolden {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./tests/e2e -run TestCLI -update writes it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test ./tests/e2e -run TestCLI -update rewrites it)\n%s",
			path, lineDiff(string(want), got))
	}
}

// lineDiff shows the lines that differ.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			fmt.Fprintf(&b, "line %d:\n  want %q\n  got  %q\n", i+1, wl, gl)
		}
	}
	return b.String()
}

// cliLookup is the part of `xdplb lookup -o json` checked against reality.
type cliLookup struct {
	Verdict string `json:"verdict"`
	Backend string `json:"backend"`
	SNAT    bool   `json:"snat"`
	Tracked *struct {
		Backend string `json:"backend"`
		Usable  bool   `json:"usable"`
	} `json:"tracked"`
}

func (s *sandbox) lookupJSON(proto string, port int, dst string) cliLookup {
	s.t.Helper()
	r := s.ok("lookup", "-o", "json", "--proto", proto, "--src", clientAt(port), "--dst", dst)
	var l cliLookup
	if err := json.Unmarshal([]byte(r.stdout), &l); err != nil {
		s.t.Fatalf("lookup output %q: %v", r.stdout, err)
	}
	return l
}

func clientAt(port int) string { return netip.AddrPortFrom(topology.ClientAddr, uint16(port)).String() }

func lbAt(n, port int) string { return netip.AddrPortFrom(topology.LBIP(n), uint16(port)).String() }

// podAt returns the pod whose address is the host of hostport.
func podAt(pods []*topology.Pod, hostport string) *topology.Pod {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return nil
	}
	for _, p := range pods {
		if p.Addr == ap.Addr() {
			return p
		}
	}
	return nil
}

// predictRemote looks a new flow up and makes sure Maglev sends it to a
// remote pod: the golden outputs are built on these choices.
func (s *sandbox) predictRemote(proto string, port int, dst string) *topology.Pod {
	s.t.Helper()
	l := s.lookupJSON(proto, port, dst)
	p := podAt(s.pods, l.Backend)
	if l.Verdict != "forward" || p == nil || !l.SNAT || l.Tracked != nil {
		s.t.Fatalf("lookup %s from port %d: %+v; want a new flow to a remote pod, SNATed", dst, port, l)
	}
	return p
}

// udpFrom sends a datagram from the client's port and returns the name of
// the pod that answered.
func (s *sandbox) udpFrom(port int, dst string) string {
	s.t.Helper()
	c, err := s.topo.Client.ListenPacket("udp4", fmt.Sprintf(":%d", port))
	if err != nil {
		s.t.Fatal(err)
	}
	defer c.Close()
	to, err := net.ResolveUDPAddr("udp4", dst)
	if err != nil {
		s.t.Fatal(err)
	}
	buf := make([]byte, 1500)
	for attempt := 0; attempt < 3; attempt++ {
		if _, err := c.WriteTo([]byte("who"), to); err != nil {
			s.t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFrom(buf)
		if err == nil {
			name, _, _ := strings.Cut(string(buf[:n]), " ")
			return name
		}
	}
	s.t.Fatalf("no UDP answer from %s to port %d", dst, port)
	return ""
}

// lineFrom opens a long-lived connection from the client's port and
// returns it with the name of the pod that answered.
func (s *sandbox) lineFrom(port int, dst string) (net.Conn, string) {
	s.t.Helper()
	c, err := s.topo.Client.Dial("tcp4", dst, net.Dialer{Timeout: 3 * time.Second, LocalAddr: &net.TCPAddr{Port: port}})
	if err != nil {
		s.t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintln(c, "ping")
	buf := make([]byte, 200)
	n, err := c.Read(buf)
	if err != nil {
		c.Close()
		s.t.Fatalf("line connection from port %d: %v", port, err)
	}
	c.SetDeadline(time.Time{})
	name, _, _ := strings.Cut(string(buf[:n]), " ")
	return c, name
}

// TestCLI checks every introspection command against a running agent, then
// after the agent stopped, then after `xdplb detach`.
func TestCLI(t *testing.T) {
	s := newSandbox(t, 3, 1)
	s.write(cliServices(s.pods, s.local)...)
	agent := s.startAgent()
	n := normaliser{bpffs: s.topo.BPFFS}
	ctx := t.Context()

	// Flows from fixed ports, each checked against lookup's prediction
	// before and after.
	httpDst, lineDst, dnsDst, stickyDst := lbAt(0, 80), lbAt(0, 9000), lbAt(0, 53), lbAt(4, 80)
	type flow struct {
		proto, dst string
		port       int
		pod        *topology.Pod
	}
	flows := []flow{{"tcp", httpDst, portHTTP, nil}, {"tcp", lineDst, portLine, nil}, {"udp", dnsDst, portDNS, nil},
		{"tcp", stickyDst, portSticky, nil}}
	var line net.Conn
	for i := range flows {
		f := &flows[i]
		f.pod = s.predictRemote(f.proto, f.port, f.dst)
		var got string
		switch f.port {
		case portLine:
			line, got = s.lineFrom(f.port, f.dst)
			t.Cleanup(func() { line.Close() })
		case portDNS:
			got = s.udpFrom(f.port, f.dst)
		default:
			var err error
			if got, err = s.topo.HTTPGetFrom(ctx, f.dst, f.port); err != nil {
				t.Fatalf("GET %s from port %d: %v", f.dst, f.port, err)
			}
		}
		if got != f.pod.Name {
			t.Errorf("%s %s from port %d reached %s; lookup predicted %s", f.proto, f.dst, f.port, got, f.pod.Name)
		}
		if l := s.lookupJSON(f.proto, f.port, f.dst); l.Tracked == nil || podAt(s.pods, l.Tracked.Backend) != f.pod {
			t.Errorf("lookup after %s %s from port %d: tracked %+v, want the flow to %s", f.proto, f.dst, f.port, l.Tracked, f.pod.Name)
		}
	}
	lookups := func() []cliResult {
		return []cliResult{
			s.ok("lookup", "--src", clientAt(portLine), "--dst", lineDst),
			s.ok("lookup", "--src", clientAt(portHTTP), "--dst", httpDst),
			s.ok("lookup", "--proto", "udp", "--src", clientAt(portDNS), "--dst", dnsDst),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", httpDst),
			s.ok("lookup", "--src", clientAt(portStickyNew), "--dst", stickyDst),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", lbAt(1, 80)),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", lbAt(2, 80)),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", lbAt(3, 80)),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", "10.96.0.11:80"),
			s.ok("lookup", "--src", clientAt(portNew), "--dst", lbAt(9, 80)),
		}
	}
	conntrack := func() []cliResult {
		return []cliResult{
			s.ok("conntrack"),
			s.ok("conntrack", "--service", "default/shop"),
			s.ok("conntrack", "--service", "default/shop:lines/TCP"),
			s.ok("conntrack", "--client", topology.ClientAddr.String(), "--proto", "udp"),
			s.ok("conntrack", "--backend", flows[3].pod.Addr.String()),
			s.ok("conntrack", "--service", "default/empty"),
		}
	}

	t.Run("running", func(t *testing.T) {
		// detach refuses while the agent runs: it would leave an agent
		// that serves nothing and still reports healthy.
		if r := s.xdplb("detach"); r.code != 1 || !strings.Contains(r.stderr, "an agent (pid ") ||
			!strings.Contains(r.stderr, "--force") {
			t.Errorf("detach under a running agent: exit %d, stderr %q; want exit 1 naming the agent and --force", r.code, r.stderr)
		}
		status := s.ok("status")
		checkCounters(t, status.stdout)
		golden(t, "status.txt", n.apply(transcript(status)))
		golden(t, "status.json", n.apply(transcript(s.ok("status", "-o", "json"))))
		golden(t, "services.txt", n.apply(transcript(s.ok("services"))))
		golden(t, "services.json", n.apply(transcript(s.ok("services", "-o", "json"))))
		golden(t, "conntrack.txt", n.apply(transcript(conntrack()...)))
		golden(t, "conntrack.json", n.apply(transcript(s.ok("conntrack", "-o", "json"),
			s.ok("conntrack", "-o", "json", "--service", "default/nothing"))))
		golden(t, "lookup.txt", n.apply(transcript(lookups()...)))
		golden(t, "lookup.json", n.apply(transcript(
			s.ok("lookup", "-o", "json", "--src", clientAt(portLine), "--dst", lineDst),
			s.ok("lookup", "-o", "json", "--src", clientAt(portNew), "--dst", httpDst),
			s.ok("lookup", "-o", "json", "--src", clientAt(portNew), "--dst", lbAt(2, 80)))))
		golden(t, "maglev.txt", n.apply(transcript(s.ok("maglev", "default/shop"), s.ok("maglev", "default/drain"),
			s.ok("maglev", "default/sticky:http/TCP"), s.xdplb("maglev", "default/empty"), s.xdplb("maglev", "default/nope"))))
		golden(t, "maglev.json", n.apply(transcript(s.ok("maglev", "-o", "json", "default/sticky"))))
		golden(t, "version.txt", n.apply(transcript(s.ok("version"))))
		golden(t, "version.json", n.apply(transcript(s.ok("version", "-o", "json"))))
	})

	// More predictions against real connections, a fresh port each (after
	// the golden outputs, which show the four flows above only).
	remoteHits := 0
	for port := portSweep; port < portSweep+12; port++ {
		l := s.lookupJSON("tcp", port, httpDst)
		p := podAt(s.pods, l.Backend)
		if p == nil {
			continue // a local backend: its own tests cover that path
		}
		remoteHits++
		got, err := s.topo.HTTPGetFrom(ctx, httpDst, port)
		if err != nil {
			t.Fatalf("GET %s from port %d: %v", httpDst, port, err)
		}
		if got != p.Name {
			t.Errorf("GET %s from port %d reached %s; lookup predicted %s", httpDst, port, got, p.Name)
		}
	}
	if remoteHits < 4 {
		t.Errorf("only %d of 12 ports were predicted to reach a remote pod", remoteHits)
	}

	// After SIGTERM everything stays: the commands read the same pins and
	// the datapath keeps serving.
	servicesBefore := n.apply(transcript(s.ok("services")))
	conntrackBefore := n.apply(transcript(conntrack()...))
	lookupsBefore := n.apply(transcript(lookups()...))
	if err := agent.Stop(); err != nil {
		t.Fatalf("agent stop: %v", err)
	}
	t.Run("stopped", func(t *testing.T) {
		golden(t, "status-stopped.txt", n.apply(transcript(s.ok("status"))))
		if got := n.apply(transcript(s.ok("services"))); got != servicesBefore {
			t.Errorf("services changed when the agent stopped:\n%s", lineDiff(servicesBefore, got))
		}
		if got := n.apply(transcript(conntrack()...)); got != conntrackBefore {
			t.Errorf("conntrack changed when the agent stopped:\n%s", lineDiff(conntrackBefore, got))
		}
		if got := n.apply(transcript(lookups()...)); got != lookupsBefore {
			t.Errorf("lookup changed when the agent stopped:\n%s", lineDiff(lookupsBefore, got))
		}
		fmt.Fprintln(line, "ping")
		line.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := line.Read(make([]byte, 200)); err != nil {
			t.Errorf("the established connection broke when the agent stopped: %v", err)
		}
	})

	// detach removes every program and pin; then each command says in
	// one line that nothing is pinned.
	t.Run("detached", func(t *testing.T) {
		detach := s.ok("detach")
		var after []cliResult
		for _, args := range [][]string{{"status"}, {"services"}, {"conntrack"}, {"maglev", "default/shop"},
			{"lookup", "--src", clientAt(portNew), "--dst", httpDst}} {
			r := s.xdplb(args...)
			want := fmt.Sprintf("xdplb: no xdplb datapath pinned under %s (is the agent running with this --bpffs-root?)\n", s.topo.BPFFS)
			if r.code != 1 || r.stderr != want || r.stdout != "" {
				t.Errorf("xdplb %v after detach: exit %d, stdout %q, stderr %q; want exit 1 and %q", args, r.code, r.stdout, r.stderr, want)
			}
			after = append(after, r)
		}
		golden(t, "detach.txt", n.apply(transcript(append([]cliResult{detach}, after...)...)))

		out, err := s.topo.Edge.IP("-d", "link", "show", "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "xdp") {
			t.Errorf("eth0 still has an XDP program after detach:\n%s", out)
		}
		for _, ifname := range s.edgeInterfaces() {
			if progs := s.attachedPrograms(ifname); progs != "" {
				t.Errorf("%s after detach: %s", ifname, progs)
			}
		}
		entries, err := os.ReadDir(s.topo.BPFFS)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() == "xdplb" {
				t.Errorf("pins left under %s after detach", filepath.Join(s.topo.BPFFS, e.Name()))
			}
		}
	})
}

// checkCounters checks the counters that the four golden flows make
// certain, as the golden files leave the counters out (other traffic, such
// as neighbour discovery, also counts).
func checkCounters(t *testing.T, status string) {
	t.Helper()
	_, block, ok := strings.Cut(status, "\nCOUNTER ")
	if !ok {
		t.Fatalf("status shows no counters:\n%s", status)
	}
	counts := map[string]int{}
	for _, line := range strings.Split(block, "\n")[1:] {
		var name string
		var packets int
		if _, err := fmt.Sscan(line, &name, &packets); err == nil {
			counts[name] = packets
		}
	}
	for _, name := range []string{"new_flow", "tx", "reverse_nat"} {
		if counts[name] == 0 {
			t.Errorf("counter %s missing or zero after traffic: %v", name, counts)
		}
	}
}

// attachedPrograms describes the XDP and tcx programs (both directions)
// on an interface of the edge node ("" if none).
func (s *sandbox) attachedPrograms(ifname string) string {
	s.t.Helper()
	var desc []string
	err := s.topo.Edge.Do(func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		if x := l.Attrs().Xdp; x != nil && x.Attached {
			desc = append(desc, fmt.Sprintf("XDP program %d", x.ProgId))
		}
		for _, dir := range []struct {
			name   string
			attach ebpf.AttachType
		}{{"ingress", ebpf.AttachTCXIngress}, {"egress", ebpf.AttachTCXEgress}} {
			q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: dir.attach})
			if err != nil {
				return err
			}
			for _, p := range q.Programs {
				desc = append(desc, fmt.Sprintf("tcx %s program %d", dir.name, p.ID))
			}
		}
		return nil
	})
	if err != nil {
		s.t.Fatalf("%s: %v", ifname, err)
	}
	return strings.Join(desc, ", ")
}

// edgeInterfaces lists the interfaces of the edge node.
func (s *sandbox) edgeInterfaces() []string {
	s.t.Helper()
	var names []string
	err := s.topo.Edge.Do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	if err != nil || len(names) < 3 {
		s.t.Fatalf("edge interfaces %v: %v", names, err)
	}
	return names
}
