package xdp_test

import (
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// Datapath benchmarks run the programs through BPF_PROG_TEST_RUN with the
// kernel timing the repetitions, next to two baselines measured in the same
// run: a program that only returns XDP_PASS and one that parses
// Ethernet/IPv4/TCP, swaps MACs and returns XDP_TX. Paths that rewrite the
// packet run behind xdp_restore, which copies the original frame back
// before every repetition (the kernel reuses one buffer); its own cost,
// measured by restoring and tail-calling xdp_pass, is subtracted. A path,
// its restore cost and the baseline of its ratio are measured in turn, part
// by part, so all three see the same machine. Verdict
// counters are checked after each run so a benchmark that silently takes
// an early exit fails instead of reporting a flattering figure.

type benchEnv struct {
	f        *fixture
	baseline *baseline.XDPObjects
	// baselines by name, for paths measured in turn with one.
	baselines map[string]benchRun
}

func newBenchEnv(b *testing.B, conntrackMax, frontendsMax uint32) *benchEnv {
	b.Helper()
	// The default SNAT range: 21k ports per backend.
	defaults := loader.DefaultOptions()
	f := newFixtureSized(b, conntrackMax, frontendsMax, withSNATPorts(defaults.SNATPorts))
	spec, err := baseline.LoadXDP()
	if err != nil {
		b.Fatal(err)
	}
	// The LRU floor map is shaped like conntrack; size it the same.
	spec.Maps["lru_floor"].MaxEntries = conntrackMax
	var objs baseline.XDPObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		b.Fatalf("load baseline programs: %v", err)
	}
	b.Cleanup(func() { objs.Close() })
	// The fixture routes by destination alone: an agent would let new
	// flows reuse their backend's route.
	if err := f.maps.AllowRouteReuse(dataplane.Now() + 24*time.Hour); err != nil {
		b.Fatal(err)
	}
	// Baselines run on a packet for no service (the MAC swap parses it
	// as TCP all the same).
	nonService := tcpFrame(clientAddr, 1234, nodeAddr, 22, packet.ACK, "").Bytes()
	return &benchEnv{f: f, baseline: &objs, baselines: map[string]benchRun{
		"baseline_pass":    {prog: objs.XdpPass, frame: nonService},
		"baseline_macswap": {prog: objs.XdpMacswap, frame: nonService},
	}}
}

// benchSlices is how many parts a benchmark's repetitions are split into.
// The machines are shared: a neighbour's burst can inflate one part, so a
// path's figure is its fastest part, for baselines and paths alike.
const benchSlices = 5

// benchRun is a program to time and the frame it runs on. A run behind
// xdp_restore has the restore's own cost beside it (overhead: the same
// template restored, then xdp_pass), measured in turn with it and
// subtracted from its figure.
type benchRun struct {
	prog     *ebpf.Program
	frame    []byte
	overhead *benchRun
	// scale multiplies the repetitions of each part (0 counts as 1): a
	// baseline taken in turn with a slower path runs as long as the
	// path does, which spreads the fixed cost of each BPF_PROG_TEST_RUN
	// call as thin on both sides.
	scale int
}

// measure runs each of runs `repeat` times on its frame inside the fixture
// namespace, in benchSlices parts taken in turn (a part of the first, a
// part of the second, ...), and returns each one's time per run in its
// fastest part. Taken in turn, runs compared in a ratio see the same
// machine: measured one after the other, a busy spell on a shared host
// during one of them moved ratios by 2x. The time is taken around each
// BPF_PROG_TEST_RUN call, which the kernel's own whole-nanosecond figure
// would round too coarsely for the baselines.
func (e *benchEnv) measure(b *testing.B, runs []benchRun, repeat int) []float64 {
	b.Helper()
	best := make([]float64, len(runs))
	for i := range best {
		best[i] = math.Inf(1)
	}
	err := e.f.ns.Do(func() error {
		for left := repeat; left > 0; {
			n := max(repeat/benchSlices, 1)
			n = min(n, left)
			left -= n
			for i, r := range runs {
				reps := n * max(r.scale, 1)
				// As if it arrived on the client-facing NIC.
				opts := &ebpf.RunOptions{Data: r.frame, Repeat: uint32(reps),
					Context: xdpMD{DataEnd: uint32(len(r.frame)), IngressIfindex: uint32(e.f.nic0)}}
				start := time.Now()
				ret, err := r.prog.Run(opts)
				elapsed := time.Since(start)
				if err != nil {
					return err
				}
				if ret == xdpAborted {
					return fmt.Errorf("program aborted")
				}
				best[i] = min(best[i], float64(elapsed.Nanoseconds())/float64(reps))
			}
		}
		return nil
	})
	if err != nil {
		b.Fatalf("benchmark run: %v", err)
	}
	return best
}

// restoring makes xdp_restore replay frame before tail-calling target, and
// xdp_restore_alongside replay it before xdp_pass: the run's overhead.
func (e *benchEnv) restoring(b *testing.B, target *ebpf.Program, frame []byte, varySource bool) benchRun {
	b.Helper()
	if len(frame) > len(baseline.XDPFrameTemplate{}.Data) {
		b.Fatalf("frame of %d bytes does not fit the template", len(frame))
	}
	tmpl := baseline.XDPFrameTemplate{Len: uint32(len(frame))}
	if varySource {
		tmpl.VarySource = 1
	}
	copy(tmpl.Data[:], frame)
	for _, slot := range []struct {
		templates, progs *ebpf.Map
		prog             *ebpf.Program
	}{
		{e.baseline.BenchTemplate, e.baseline.BenchProgs, target},
		{e.baseline.BenchTemplateAlongside, e.baseline.BenchProgsAlongside, e.baseline.XdpPass},
	} {
		if err := slot.templates.Put(uint32(0), tmpl); err != nil {
			b.Fatal(err)
		}
		if err := slot.progs.Put(uint32(0), slot.prog); err != nil {
			b.Fatalf("install tail-call target: %v", err)
		}
	}
	return benchRun{prog: e.baseline.XdpRestore, frame: frame,
		overhead: &benchRun{prog: e.baseline.XdpRestoreAlongside, frame: frame}}
}

// benchResults collects ns/packet per path for the ratio summary, and
// for paths measured in turn with a baseline, that baseline's figure.
type benchResults struct {
	mu     sync.Mutex
	ns     map[string]float64
	paired map[string]pairedBaseline
}

// pairedBaseline is a baseline's figure from the parts taken in turn with
// one path's.
type pairedBaseline struct {
	name string
	ns   float64
}

func newBenchResults() *benchResults {
	return &benchResults{ns: map[string]float64{}, paired: map[string]pairedBaseline{}}
}

func (r *benchResults) set(name string, ns float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ns[name] = ns
}

// get returns a path's figure; 0 when it has none.
func (r *benchResults) get(name string) float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ns[name]
}

func (r *benchResults) setPaired(path string, baseline pairedBaseline) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.paired[path] = baseline
}

// run benchmarks one path; check verifies the verdict counters. The path
// is measured in turn with its restore overhead, if any, and with the
// baseline its ratio is against (its name in results), if given; the
// ratio then uses the baseline's figure from those same parts.
//
// Each BPF_PROG_TEST_RUN call costs a fixed time besides its repetitions
// (milliseconds on some machines of this kind). The restore overhead,
// subtracted from the path, carries the same share of it as the path; the
// baseline, many times faster, runs that many times more repetitions per
// part (scaled by the previous round's figures), or that share would
// inflate it and flatter the ratio: at the same repetitions, 6 ns of MAC
// swap measured as 28 ns beside a new flow.
func (e *benchEnv) run(b *testing.B, results *benchResults, name string, path benchRun,
	baseline string, check func(delta map[string]uint64, n int) error) {
	scale := 1
	b.Run(name, func(b *testing.B) {
		runs := []benchRun{path}
		if path.overhead != nil {
			runs = append(runs, *path.overhead)
		}
		if baseline != "" {
			base := e.baselines[baseline]
			base.scale = scale
			runs = append(runs, base)
		}
		before := e.f.counters()
		best := e.measure(b, runs, b.N)
		after := e.f.counters()
		delta := map[string]uint64{}
		for k, v := range after {
			delta[k] = v - before[k]
		}
		if check != nil {
			if err := check(delta, b.N); err != nil {
				b.Fatalf("%s: %v (counters moved: %v)", name, err, nonZero(delta))
			}
		}
		ns := best[0]
		if path.overhead != nil {
			ns = max(ns-best[1], 0)
			b.ReportMetric(best[1], "restore-ns/pkt")
		}
		b.ReportMetric(ns, "ns/pkt")
		b.ReportMetric(0, "ns/op")
		results.set(name, ns)
		if baseline != "" {
			base := best[len(best)-1]
			results.setPaired(name, pairedBaseline{name: baseline, ns: base})
			// The next, longer round's baseline parts take as long as
			// the path's (with its restore: what one call of it takes per
			// repetition), by the baseline's own run where there was one
			// (long enough for the fixed cost to vanish).
			if own := results.get(baseline); own > 0 {
				base = own
			}
			if base > 0 {
				scale = max(1, int(math.Round(best[0]/base)))
			}
		}
	})
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// expect checks that counter name moved once per run.
func expect(names ...string) func(map[string]uint64, int) error {
	return func(delta map[string]uint64, n int) error {
		for _, name := range names {
			if delta[name] < uint64(n) {
				return fmt.Errorf("counter %s moved %d times in %d runs", name, delta[name], n)
			}
		}
		return nil
	}
}

func BenchmarkDatapath(b *testing.B) {
	results := newBenchResults()
	e := newBenchEnv(b, 65536, 256)
	f := e.f
	web := benchService(100)
	f.program(web)
	nic := f.dp.XDPProgram()

	// Fill conntrack and the table of unconfirmed flows to capacity
	// first, so new flows evict.
	fillConntrack(b, f, 65536)

	nonService := tcpFrame(clientAddr, 1234, nodeAddr, 22, packet.ACK, "").Bytes()
	est := tcpFrame(clientAddr, 33000, nodeAddr, nodePort, packet.ACK, "")
	estFrame := est.Bytes()
	// Establish the flow (its handshake confirms it) and learn its SNAT
	// port for the reply.
	first := f.establish(b, est)
	reply := packet.Frame{SrcMAC: gwMAC, Src: first.Dst, Dst: first.Src, Proto: packet.TCP,
		SrcPort: first.DstPort, DstPort: first.SrcPort, Flags: packet.ACK}.Bytes()
	newFlow := tcpFrame(netip.MustParseAddr("198.18.0.1"), 40000, nodeAddr, nodePort, packet.SYN, "").Bytes()
	// The same, to a backend reached through the NIC the client came in
	// on (a single-NIC node): the packet leaves with XDP_TX, as the MAC
	// swap does, rather than by a redirect to another device.
	f.ns.IP("route", "add", "10.244.9.0/24", "via", "192.0.2.254")
	oneNIC := benchService(50)
	oneNIC.svcID, oneNIC.tableID = 2, 2
	oneNIC.frontends = []dataplane.FrontendKey{{Addr: nodeAddr, Port: nodePort + 1, Proto: packet.TCP}}
	moved := map[uint32]dataplane.Backend{}
	for id, be := range oneNIC.backends {
		a := be.Addr.As4()
		a[2] = 9
		be.Addr = netip.AddrFrom4(a)
		moved[id+100] = be
	}
	oneNIC.backends = moved
	for i := range oneNIC.table {
		oneNIC.table[i] += 100
	}
	f.program(oneNIC)
	estTX := tcpFrame(clientAddr, 33001, nodeAddr, nodePort+1, packet.ACK, "")
	f.establish(b, estTX)

	e.run(b, results, "baseline_pass", e.baselines["baseline_pass"], "", nil)
	e.run(b, results, "baseline_macswap", e.baselines["baseline_macswap"], "", nil)
	e.run(b, results, "non_service", benchRun{prog: nic, frame: nonService}, "baseline_pass", expect("pass_not_service"))
	// A host service's port among the SNAT ports (kubelet's): XDP looks
	// for a SNAT flow's reply first.
	hostService := tcpFrame(clientAddr, 1234, nodeAddr, 10250, packet.ACK, "").Bytes()
	e.run(b, results, "non_service_snat_port", benchRun{prog: nic, frame: hostService}, "baseline_pass", expect("pass_not_service"))
	e.run(b, results, "established_snat", e.restoring(b, nic, estFrame, false), "baseline_macswap", expect("redirect"))
	e.run(b, results, "established_snat_tx", e.restoring(b, nic, estTX.Bytes(), false), "baseline_macswap", expect("tx"))
	e.run(b, results, "reply_reverse_nat", e.restoring(b, nic, reply, false), "baseline_macswap", expect("reverse_nat"))
	e.run(b, results, "new_flow_ct_full", e.restoring(b, nic, newFlow, true), "baseline_macswap", expect("new_flow"))
	// A spoofed SYN under a SYN flood: answered with a cookie, no state.
	// Its sources are none of the new flows' above, which the SYN of a
	// tracked tuple would follow.
	f.setSYNCookies(loader.SYNCookiesAlways, 0)
	spoofedSYN := tcpFrame(netip.MustParseAddr("10.128.0.1"), 40000, nodeAddr, nodePort, packet.SYN, "")
	spoofedSYN.TCPOptions = packet.MSSOption(1460)
	e.run(b, results, "syn_cookie", e.restoring(b, nic, spoofedSYN.Bytes(), true), "baseline_macswap", expect("syncookie_sent"))
	f.setSYNCookies(loader.SYNCookiesOff, 0)
	// The floor: one insert into a full LRU map shaped like conntrack.
	floor := e.restoring(b, e.baseline.XdpLruInsert, newFlow, true)
	e.measure(b, []benchRun{floor}, 65536+4096)
	e.run(b, results, "lru_insert_floor", floor, "baseline_macswap", nil)

	summary(b, results, []ratio{
		{"non_service", "baseline_pass", 2},
		{"non_service_snat_port", "baseline_pass", 2},
		{"established_snat", "baseline_macswap", 6},
		{"established_snat_tx", "baseline_macswap", 6},
		{"reply_reverse_nat", "baseline_macswap", 6},
		{"new_flow_ct_full", "baseline_macswap", 40},
		{"syn_cookie", "baseline_macswap", 15},
		{"lru_insert_floor", "baseline_macswap", 0},
		{"new_flow_ct_full", "lru_insert_floor", 0},
	})
}

// BenchmarkDatapathScale shows that per-packet cost does not grow with the
// number of frontends or the conntrack fill level.
func BenchmarkDatapathScale(b *testing.B) {
	results := newBenchResults()
	e := newBenchEnv(b, 1<<20+4096, 131072)
	f := e.f
	f.program(benchService(100))
	nic := f.dp.XDPProgram()
	est := tcpFrame(clientAddr, 33000, nodeAddr, nodePort, packet.ACK, "")
	f.establish(b, est)
	restore := e.restoring(b, nic, est.Bytes(), false)

	e.run(b, results, "established/frontends=1/conntrack=1", restore, "", expect("redirect"))
	addFrontends(b, f, 100000)
	e.run(b, results, "established/frontends=100k/conntrack=1", restore, "", expect("redirect"))
	fillConntrack(b, f, 1<<20)
	e.run(b, results, "established/frontends=100k/conntrack=1M", restore, "", expect("redirect"))

	summary(b, results, []ratio{
		{"established/frontends=100k/conntrack=1", "established/frontends=1/conntrack=1", 1.1},
		{"established/frontends=100k/conntrack=1M", "established/frontends=100k/conntrack=1", 1.1},
	})
}

// benchService: the web NodePort with n remote backends.
func benchService(n int) service {
	s := webService()
	s.backends = map[uint32]dataplane.Backend{}
	s.table = nil
	for i := 0; i < n; i++ {
		id := uint32(100 + i)
		s.backends[id] = dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 244, 1, byte(10 + i)}), Port: podPort}
	}
	for i := 0; i < 16381; i++ {
		s.table = append(s.table, uint32(100+i%n))
	}
	return s
}

func addFrontends(b *testing.B, f *fixture, n int) {
	b.Helper()
	keys := make([]xdp.FrontendKey, 0, n)
	vals := make([]xdp.Frontend, 0, n)
	for i := 0; i < n; i++ {
		keys = append(keys, xdp.FrontendKey{
			Addr: xdp.AddrToNet(netip.AddrFrom4([4]byte{172, 16, byte(i >> 8), byte(i)})),
			Port: xdp.PortToNet(uint16(1000 + i%1000)), Proto: packet.TCP,
		})
		vals = append(vals, xdp.Frontend{SvcId: 1, TableId: 1, Flags: dataplane.FrontendExternal})
	}
	for start := 0; start < n; start += 8192 {
		end := min(start+8192, n)
		if _, err := f.dp.Maps.Frontends.BatchUpdate(keys[start:end], vals[start:end], nil); err != nil {
			b.Fatalf("add %d frontends: %v", n, err)
		}
	}
}

// establish opens the TCP flow of ack (an ACK of its client's) with a
// whole handshake, so it is confirmed, and returns the SYN as sent on.
func (f *fixture) establish(b *testing.B, ack packet.Frame) packet.Frame {
	b.Helper()
	syn := ack
	syn.Flags = packet.SYN
	r := f.run(syn.Bytes(), f.nic0)
	if r.verdict != xdpRedirect && r.verdict != xdpTX {
		b.Fatalf("SYN of %v: verdict %s", flowKeyOf(syn).Client, verdictName(r.verdict))
	}
	sent := decode(b, r.out)
	f.run(replyTo(sent, packet.SYN|packet.ACK).Bytes(), f.nic1)
	f.run(ack.Bytes(), f.nic0)
	if fl, ok := f.flow(flowKeyOf(ack)); !ok || fl.Unconfirmed {
		b.Fatalf("flow of %v not confirmed by its handshake", flowKeyOf(ack).Client)
	}
	return sent
}

// fillConntrack inserts n idle flows from 100.64.0.0/10 clients, and as
// many unconfirmed ones as their table holds.
func fillConntrack(b *testing.B, f *fixture, n int) {
	b.Helper()
	fillFlows(b, f.dp.Maps.Conntrack, n, 0)
	unconfirmed := f.dp.Maps.CtUnconfirmed
	fillFlows(b, unconfirmed, int(unconfirmed.MaxEntries()), uint8(xdp.CtFlagsCT_F_UNCONFIRMED))
}

// fillFlows inserts n idle flows into a table of flows (conntrack or
// ct_unconfirmed), with flags; the unconfirmed ones from other ports.
func fillFlows(b *testing.B, table *ebpf.Map, n int, flags uint8) {
	b.Helper()
	const batch = 8192
	now := uint64(dataplane.Now())
	port := nodePort
	if flags != 0 {
		port = nodePort + 2
	}
	for start := 0; start < n; start += batch {
		m := min(batch, n-start)
		keys := make([]xdp.CtKey, m)
		vals := make([]xdp.CtEntry, m)
		for i := range keys {
			c := uint32(start + i)
			keys[i] = xdp.CtKey{
				Saddr: xdp.AddrToNet(netip.AddrFrom4([4]byte{100, byte(64 + c>>24&0x3f), byte(c >> 16), byte(c >> 8)})),
				Daddr: xdp.AddrToNet(nodeAddr), Sport: xdp.PortToNet(uint16(c)), Dport: xdp.PortToNet(uint16(port)), Proto: packet.TCP,
			}
			vals[i] = xdp.CtEntry{CreatedNs: now, LastSeenNs: now, BackendId: 100, SvcId: 1,
				BackendAddr: xdp.AddrToNet(remotePod1), BackendPort: xdp.PortToNet(podPort), Flags: flags}
		}
		if _, err := table.BatchUpdate(keys, vals, nil); err != nil {
			b.Fatalf("fill flows: %v", err)
		}
	}
}

type ratio struct {
	path, baseline string
	target         float64
}

// summary prints the ratios against the baselines of the same run.
func summary(b *testing.B, r *benchResults, ratios []ratio) {
	b.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var lines []string
	names := make([]string, 0, len(r.ns))
	for n := range r.ns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		lines = append(lines, fmt.Sprintf("  %-45s %8.1f ns/pkt", n, r.ns[n]))
	}
	slow := slowRun(r.ns)
	if slow != "" {
		lines = append(lines, "  "+slow)
	}
	for _, q := range ratios {
		p, base := r.ns[q.path], r.ns[q.baseline]
		against := q.baseline
		if paired, ok := r.paired[q.path]; ok && paired.name == q.baseline {
			base = paired.ns
			against = fmt.Sprintf("%s (%.1f ns, measured in turn)", q.baseline, base)
		}
		if base == 0 {
			continue
		}
		if q.target <= 0 {
			lines = append(lines, fmt.Sprintf("  ratio %-38s %6.2fx %s", q.path, p/base, against))
			continue
		}
		verdict := "ok"
		switch {
		case slow != "":
			verdict = "not judged"
		case p/base > q.target:
			verdict = "ABOVE TARGET"
		}
		lines = append(lines, fmt.Sprintf("  ratio %-38s %6.2fx %s (target <= %.1fx) %s",
			q.path, p/base, against, q.target, verdict))
	}
	// Printed, not logged: the summary is the point of the run.
	fmt.Printf("datapath figures (this run):\n%s\n", strings.Join(lines, "\n"))
}

// usualPassNs is what a program that only returns its verdict takes per
// BPF_PROG_TEST_RUN repetition on a machine of this kind, by baseline name
// (docs/performance.md, "Datapath cost per packet"); 0 for other names.
func usualPassNs(name string) float64 {
	switch name {
	case "baseline_pass":
		return 5
	case "baseline_tc_pass":
		return 15
	}
	return 0
}

// slowRun says why a run's ratios mean nothing, or "". A pass baseline far
// above its usual figure means each repetition carries a large cost of the
// machine's (under nested virtualization XDP_PASS took 26-33 ns; a short
// run spreads the fixed cost of each BPF_PROG_TEST_RUN call, ~16 ms on such
// a machine, over few repetitions), which every path pays too: the
// ratios shrink towards 1 and would meet any target.
func slowRun(ns map[string]float64) string {
	const factor = 3
	names := make([]string, 0, len(ns))
	for n := range ns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if usual := usualPassNs(n); usual > 0 && ns[n] > factor*usual {
			return fmt.Sprintf("WARNING: %s took %.1f ns per run, over %dx its usual %.0f ns: "+
				"BPF_PROG_TEST_RUN carries a large cost of its own here (nested virtualization, "+
				"or runs too short to hide its per-call setup), so the ratios below say nothing about the targets", n, ns[n], factor, usual)
		}
	}
	return ""
}

func TestSlowRunFlagsAnInflatedPassBaseline(t *testing.T) {
	tests := []struct {
		name string
		ns   map[string]float64
		slow bool
	}{
		{"usual XDP figures", map[string]float64{"baseline_pass": 4.8, "new_flow_ct_full": 800}, false},
		{"XDP pass under nested virtualization", map[string]float64{"baseline_pass": 27, "baseline_macswap": 30}, true},
		{"usual TC figures", map[string]float64{"baseline_tc_pass": 15, "established_cluster_ip": 95}, false},
		{"slow TC pass", map[string]float64{"baseline_tc_pass": 50}, true},
		{"no pass baseline", map[string]float64{"established_1_frontend": 40}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := slowRun(tt.ns)
			if (got != "") != tt.slow {
				t.Errorf("slowRun(%v) = %q, want slow %v", tt.ns, got, tt.slow)
			}
		})
	}
}
