package traffic

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp/baseline"
)

var (
	srcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	dstMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

func newFlows() Spec {
	return Spec{
		SrcMAC: srcMAC, DstMAC: dstMAC, Proto: TCP, TCPFlags: packet.SYN,
		Src: netip.MustParseAddr("100.64.0.0"), SrcAddrs: 4, SrcPortMin: 1000, SrcPorts: 3,
		Dst: netip.MustParseAddr("172.16.0.1"), DstAddrs: 2, DstStride: 10, DstPort: 80,
	}
}

func TestSpecValidate(t *testing.T) {
	if err := newFlows().Validate(); err != nil {
		t.Fatalf("valid spec: %v", err)
	}
	for name, mod := range map[string]func(*Spec){
		"protocol":       func(s *Spec) { s.Proto = 1 },
		"small frame":    func(s *Spec) { s.Size = 60 },
		"jumbo frame":    func(s *Spec) { s.Size = 9000 },
		"no MAC":         func(s *Spec) { s.DstMAC = nil },
		"IPv6":           func(s *Spec) { s.Src = netip.MustParseAddr("2001:db8::1") },
		"ports overflow": func(s *Spec) { s.SrcPortMin, s.SrcPorts = 65000, 1000 },
		"dst overflow":   func(s *Spec) { s.Dst, s.DstAddrs = netip.MustParseAddr("255.255.255.250"), 10 },
		"tuple table":    func(s *Spec) { s.Tuples = make([]Tuple, MaxTuples+1) },
	} {
		s := newFlows()
		mod(&s)
		if err := s.Validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

func TestTemplate(t *testing.T) {
	for _, c := range []struct {
		proto uint8
		size  int
	}{{TCP, 64}, {TCP, 1514}, {UDP, 64}, {UDP, 200}} {
		s := newFlows()
		s.Proto, s.Size = c.proto, c.size
		f := s.Template()
		if len(f) != c.size {
			t.Errorf("%d/%d: template of %d bytes", c.proto, c.size, len(f))
		}
		if err := packet.Verify(f); err != nil {
			t.Errorf("%d/%d: %v", c.proto, c.size, err)
		}
		d, err := packet.Decode(f)
		if err != nil {
			t.Fatal(err)
		}
		first := s.Tuple(0)
		if d.Src != first.Src || d.Dst != first.Dst || d.SrcPort != first.SrcPort || d.DstPort != 80 || d.Proto != c.proto {
			t.Errorf("%d/%d: template carries %v, want flow 0 %v", c.proto, c.size, d, first)
		}
		if c.proto == UDP && d.L4Checksum != 0 {
			t.Errorf("UDP template with checksum %#x: the generator would not fix it", d.L4Checksum)
		}
	}
}

// A marked spec's frames carry its TOS byte, with the IPv4 checksum
// that covers it: the sinks tell the generated flood by it.
func TestTemplateCarriesTOS(t *testing.T) {
	s := newFlows()
	s.TOS = 0x20
	f := s.Template()
	if err := packet.Verify(f); err != nil {
		t.Fatal(err)
	}
	d, err := packet.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if d.TOS != 0x20 {
		t.Errorf("template TOS %#x, want 0x20", d.TOS)
	}
}

func TestTupleSequence(t *testing.T) {
	s := newFlows()
	if n := s.DistinctFlows(); n != 12 {
		t.Fatalf("DistinctFlows = %d, want 4 addresses x 3 ports", n)
	}
	seen := map[Tuple]bool{}
	for i := uint64(0); i < 12; i++ {
		tp := s.Tuple(i)
		if seen[tp] {
			t.Fatalf("flow %d repeats %v", i, tp)
		}
		seen[tp] = true
		if tp.SrcPort < 1000 || tp.SrcPort > 1002 {
			t.Errorf("flow %d: source port %d out of range", i, tp.SrcPort)
		}
		if tp.Dst != netip.MustParseAddr("172.16.0.1") && tp.Dst != netip.MustParseAddr("172.16.0.11") {
			t.Errorf("flow %d: destination %s is not a target", i, tp.Dst)
		}
	}
	if s.Tuple(12) != s.Tuple(0) {
		t.Error("the sequence should wrap after every tuple was used")
	}
	s.Flows = 5
	if s.Tuple(5) != s.Tuple(0) || s.DistinctFlows() != 5 {
		t.Error("Flows = 5 should cycle over 5 tuples")
	}
	s.Tuples = []Tuple{{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), SrcPort: 1, DstPort: 2}}
	if s.Tuple(7) != s.Tuples[0] || s.DistinctFlows() != 1 {
		t.Error("a tuple table replaces computed flows")
	}
}

func TestPktgen(t *testing.T) {
	s := newFlows()
	s.Proto, s.Flows = UDP, 8
	args := strings.Join(s.PktgenArgs("eth0", 2, 1000), " ")
	for _, want := range []string{"-i eth0", "-s 60", "-d 172.16.0.1-172.16.0.11", "-m 02:00:00:00:00:02", "-p 80",
		"-t 2", "-n 1000", "-S 100.64.0.0-100.64.0.3", "-P 1000-1002", "-F 8"} {
		if !strings.Contains(args, want) {
			t.Errorf("pktgen.sh arguments %q lack %q", args, want)
		}
	}
	sent, errs, err := parsePktgenOutput("noise\neth0@0 sent 1000 errors 1\neth0@1 sent 998 errors 0\n")
	if err != nil || sent != 1998 || errs != 1 {
		t.Errorf("parsePktgenOutput = %d, %d, %v", sent, errs, err)
	}
	if _, _, err := parsePktgenOutput("pktgen.sh: no pktgen thread for CPU 0\n"); err == nil {
		t.Error("output without threads must be an error")
	}
	if err := NewPktgen(nil, "eth0", "pktgen.sh").Configure(newFlows()); err == nil {
		t.Error("pktgen must refuse TCP")
	}
}

// generatorFor loads the generator for a dummy device in a test namespace.
func generatorFor(t *testing.T) *Generator {
	t.Helper()
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "gen")
	ns.IP("link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ns.IP("link", "set", "eth0", "up")
	g, err := NewGenerator(ns.NS, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	return g
}

// decodeFrame checks a generated frame against its spec and returns its tuple.
func decodeFrame(t *testing.T, s Spec, frame []byte) Tuple {
	t.Helper()
	if err := packet.Verify(frame); err != nil {
		t.Fatalf("generated frame: %v\n% x", err, frame)
	}
	want := s.Template()
	// Everything but addresses, ports and checksums is the template's.
	masked := func(b []byte) []byte {
		b = bytes.Clone(b)
		for _, r := range [][2]int{{24, 38}} { // IP checksum, addresses, ports
			clear(b[r[0]:r[1]])
		}
		if s.Proto == TCP {
			clear(b[50:52])
		}
		return b
	}
	if !bytes.Equal(masked(frame), masked(want)) {
		t.Fatalf("frame differs from the template beyond the tuple:\n got % x\nwant % x", frame, want)
	}
	d, err := packet.Decode(frame)
	if err != nil {
		t.Fatal(err)
	}
	return Tuple{Src: d.Src, Dst: d.Dst, SrcPort: d.SrcPort, DstPort: d.DstPort}
}

// TestGeneratorRewritesEveryHeader runs xdp_gen with BPF_PROG_TEST_RUN (not
// in live mode) on frames whose headers are garbage, as a live-frames page
// comes back after a forwarding path rewrote it, and checks each frame it
// builds byte by byte, with checksums recomputed from scratch.
func TestGeneratorRewritesEveryHeader(t *testing.T) {
	g := generatorFor(t)
	for _, c := range []struct {
		name  string
		proto uint8
		size  int
	}{{"tcp-64", TCP, 64}, {"tcp-512", TCP, 512}, {"udp-64", UDP, 64}, {"udp-1514", UDP, 1514}} {
		t.Run(c.name, func(t *testing.T) {
			s := newFlows()
			s.Proto, s.Size = c.proto, c.size
			// At least three new flows per CPU slot, however many CPUs.
			s.SrcPorts = max(s.SrcPorts, uint32(3*g.slots))
			if err := g.Configure(s); err != nil {
				t.Fatal(err)
			}
			// A new flow's source comes from the spec's sources, its
			// destination from its destinations (which one depends on
			// the CPU's sequence: the destinations subtest checks that).
			sources, dsts := map[netip.AddrPort]bool{}, map[netip.Addr]bool{}
			for i := uint64(0); i < s.DistinctFlows(); i++ {
				tp := s.Tuple(i)
				sources[netip.AddrPortFrom(tp.Src, tp.SrcPort)], dsts[tp.Dst] = true, true
			}
			seen := map[netip.AddrPort]bool{}
			// New flows: as many frames as the spec has tuples per CPU slot.
			frames := int(s.DistinctFlows()) / g.slots
			if frames == 0 {
				t.Fatalf("the spec's %d flows give none of %d CPU slots a frame: widen it", s.DistinctFlows(), g.slots)
			}
			for i := 0; i < frames; i++ {
				frame, err := g.Once()
				if err != nil {
					t.Fatal(err)
				}
				tp := decodeFrame(t, s, frame)
				src := netip.AddrPortFrom(tp.Src, tp.SrcPort)
				if !sources[src] || !dsts[tp.Dst] || tp.DstPort != s.DstPort {
					t.Fatalf("frame %d carries %v, not a flow of the spec", i, tp)
				}
				if seen[src] {
					t.Fatalf("frame %d repeats the source of an earlier flow: %v", i, tp)
				}
				seen[src] = true
			}
		})
	}

	// One sending thread must reach every destination, and frames of
	// different CPUs must still be different flows.
	t.Run("destinations", func(t *testing.T) {
		cpus, err := allowedCPUs()
		if err != nil {
			t.Fatal(err)
		}
		s := newFlows()
		s.SrcPorts, s.DstAddrs, s.DstStride = 1000, 16, 7
		if err := g.Configure(s); err != nil {
			t.Fatal(err)
		}
		seen := map[Tuple]bool{}
		sources := map[netip.AddrPort]bool{}
		for k, cpu := range cpus[:min(len(cpus), 2)] {
			dsts := map[netip.Addr]bool{}
			for i := 0; i < 3*int(s.DstAddrs); i++ {
				var frame []byte
				var seq uint64
				err := pinned(cpu, func() error {
					var err error
					if seq, err = g.cpuSeq(cpu); err != nil {
						return err
					}
					frame, err = g.Once()
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				tp := decodeFrame(t, s, frame)
				if want := s.FrameTuple(seq, cpu, g.slots); tp != want {
					t.Fatalf("CPU %d, frame %d of its sequence: %v, want %v", cpu, seq, tp, want)
				}
				src := netip.AddrPortFrom(tp.Src, tp.SrcPort)
				if seen[tp] || sources[src] {
					t.Fatalf("CPU %d repeats flow %v (thread %d)", cpu, tp, k)
				}
				seen[tp], sources[src] = true, true
				dsts[tp.Dst] = true
			}
			if len(dsts) != int(s.DstAddrs) {
				t.Errorf("one thread on CPU %d reached %d of %d destinations", cpu, len(dsts), s.DstAddrs)
			}
			for j := uint32(0); j < s.DstAddrs; j++ {
				if d := AddrAdd(s.Dst, j*s.DstStride); !dsts[d] {
					t.Errorf("CPU %d never sent to %s", cpu, d)
				}
			}
		}
	})

	t.Run("cycle", func(t *testing.T) {
		s := newFlows()
		s.Flows = 3
		if err := g.Configure(s); err != nil {
			t.Fatal(err)
		}
		seen := map[Tuple]int{}
		for i := 0; i < 30; i++ {
			frame, err := g.Once()
			if err != nil {
				t.Fatal(err)
			}
			seen[decodeFrame(t, s, frame)]++
		}
		if len(seen) != 3 {
			t.Errorf("3 flows cycled, saw %d: %v", len(seen), seen)
		}
	})

	t.Run("tuples", func(t *testing.T) {
		s := newFlows()
		s.TCPFlags = packet.ACK
		for i := 0; i < 5; i++ {
			s.Tuples = append(s.Tuples, Tuple{Src: netip.MustParseAddr("10.244.2.10"), Dst: netip.MustParseAddr("198.18.1.1"),
				SrcPort: 8080, DstPort: uint16(40000 + 7*i)})
		}
		if err := g.Configure(s); err != nil {
			t.Fatal(err)
		}
		var got []Tuple
		for i := 0; i < 10; i++ {
			frame, err := g.Once()
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, decodeFrame(t, s, frame))
		}
		for _, tp := range got {
			if !slices.Contains(s.Tuples, tp) {
				t.Errorf("frame carries %v, not in the table", tp)
			}
		}
	})
}

// cpuSeq is how many frames the generator has built on one CPU: the
// sequence number of the next one there.
func (g *Generator) cpuSeq(cpu int) (uint64, error) {
	var per []baseline.XDPGenState
	if err := g.objs.GenCounters.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read generator counters: %w", err)
	}
	if cpu >= len(per) {
		return 0, fmt.Errorf("CPU %d: the generator counts %d CPUs", cpu, len(per))
	}
	return per[cpu].Seq, nil
}

func TestSplitCPUs(t *testing.T) {
	for _, tc := range []struct {
		cpus            []int
		threads         int
		generator, rest []int
	}{
		{[]int{0, 1}, 1, []int{0}, []int{1}},
		{[]int{0, 1}, 0, []int{0}, []int{1}}, // at least one thread
		{[]int{0, 1}, 2, []int{0, 1}, nil},
		{[]int{0, 1}, 3, []int{0, 1}, nil}, // threads share CPUs
		{[]int{2, 5, 7}, 1, []int{2}, []int{5, 7}},
	} {
		gen, rest := splitCPUs(tc.cpus, tc.threads)
		if !slices.Equal(gen, tc.generator) || !slices.Equal(rest, tc.rest) {
			t.Errorf("splitCPUs(%v, %d) = %v, %v; want %v, %v", tc.cpus, tc.threads, gen, rest, tc.generator, tc.rest)
		}
	}
}

// A sink told to pass an address hands that address's frames to the stack
// uncounted, except those marked with its TOS, and counts and drops the
// rest; told to pass nothing, it counts everything again.
func TestSinkPassesRealConnections(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "sink")
	ns.IP("link", "add", "eth0", "type", "veth", "peer", "name", "eth1")
	ns.IP("link", "set", "eth0", "up")
	ns.IP("link", "set", "eth1", "up")
	s, err := NewSink(ns.NS, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	real := netip.MustParseAddr("10.244.2.250")
	frame := func(dst netip.Addr, tos uint8) []byte {
		return packet.Frame{Src: netip.MustParseAddr("198.18.1.1"), Dst: dst, TOS: tos, Proto: packet.TCP,
			SrcPort: 40000, DstPort: 8080, Flags: packet.SYN}.Bytes()
	}
	const xdpDrop, xdpPass = 1, 2
	for _, c := range []struct {
		name  string
		pass  netip.Addr
		frame []byte
		want  uint32
	}{
		{"to the address", real, frame(real, 0), xdpPass},
		{"marked, to the address", real, frame(real, 0x20), xdpDrop},
		{"elsewhere", real, frame(netip.MustParseAddr("10.244.2.10"), 0), xdpDrop},
		{"passing nothing", netip.Addr{}, frame(real, 0), xdpDrop},
	} {
		if err := s.PassTo(c.pass, 0x20); err != nil {
			t.Fatal(err)
		}
		before, err := s.Packets()
		if err != nil {
			t.Fatal(err)
		}
		ret, err := s.objs.XdpSink.Run(&ebpf.RunOptions{Data: c.frame})
		if err != nil {
			t.Fatal(err)
		}
		after, err := s.Packets()
		if err != nil {
			t.Fatal(err)
		}
		counted := after - before
		if ret != c.want || (ret == xdpDrop) != (counted == 1) {
			t.Errorf("%s: verdict %d with %d counted, want %d (counted only when dropped)", c.name, ret, counted, c.want)
		}
	}
}
