package xdp_test

import (
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

// Flow state under pressure: new flows wait in a table of their own until
// confirmed, so no burst of them, spoofed or not, costs a confirmed flow
// its entry, and a SNAT port stays with its flow until the flow is over.

// replyTo is the backend's answer to a frame the datapath sent it.
func replyTo(sent packet.Frame, flags uint8) packet.Frame {
	return packet.Frame{Src: sent.Dst, Dst: sent.Src, Proto: sent.Proto, TTL: 64,
		SrcPort: sent.DstPort, DstPort: sent.SrcPort, Flags: flags}
}

// openOneBackendFlow programs oneRemoteBackend and sends a client's SYN to
// it: the SYN, and the frame that left for the backend (SNATed).
func openOneBackendFlow(t *testing.T, f *fixture) (in, sent packet.Frame) {
	t.Helper()
	f.program(oneRemoteBackend())
	in = tcpFrame(clientAddr, 7001, nodeAddr, 30100, packet.SYN, "")
	r := f.run(in.Bytes(), f.nic0)
	f.expectVerdict(r, xdpRedirect)
	return in, decode(t, r.out)
}

// handshake completes the TCP handshake of the flow whose SYN in was sent
// on as sent: the backend's SYN-ACK comes back, the client's ACK follows.
func (f *fixture) handshake(in, sent packet.Frame) {
	f.t.Helper()
	f.expectVerdict(f.run(replyTo(sent, packet.SYN|packet.ACK).Bytes(), f.nic1), xdpRedirect)
	ack := in
	ack.Flags = packet.ACK
	f.expectVerdict(f.run(ack.Bytes(), f.nic0), xdpRedirect)
}

// mustFlow reads a tracked flow, failing the test when it is not tracked.
func (f *fixture) mustFlow(k dataplane.FlowKey) dataplane.Flow {
	f.t.Helper()
	fl, ok := f.flow(k)
	if !ok {
		f.t.Fatalf("flow %v -> %v not tracked", k.Client, k.Frontend)
	}
	return fl
}

// evictFlow deletes a flow's forward entry as an LRU eviction would, from
// the table that holds it.
func (f *fixture) evictFlow(k dataplane.FlowKey) {
	f.t.Helper()
	confirmed, unconfirmed := f.inTable(k)
	table := f.dp.Maps.Conntrack
	switch {
	case unconfirmed && !confirmed:
		table = f.dp.Maps.CtUnconfirmed
	case !confirmed:
		f.t.Fatalf("evict flow %v -> %v: not tracked", k.Client, k.Frontend)
	}
	if err := table.Delete(ctKeyOf(k)); err != nil {
		f.t.Fatal(err)
	}
}

// ageFlowStart dates a flow's start (and its last packet) back by d.
func (f *fixture) ageFlowStart(k dataplane.FlowKey, d time.Duration) {
	f.t.Helper()
	for _, table := range []*ebpf.Map{f.dp.Maps.Conntrack, f.dp.Maps.CtUnconfirmed} {
		var e xdp.CtEntry
		if table.Lookup(ctKeyOf(k), &e) != nil {
			continue
		}
		e.CreatedNs -= uint64(d)
		e.LastSeenNs -= uint64(d)
		if err := table.Put(ctKeyOf(k), e); err != nil {
			f.t.Fatal(err)
		}
		return
	}
	f.t.Fatalf("flow %v -> %v not tracked", k.Client, k.Frontend)
}

// inTable tells whether a flow's key is in conntrack (confirmed) and in
// ct_unconfirmed.
func (f *fixture) inTable(k dataplane.FlowKey) (confirmed, unconfirmed bool) {
	f.t.Helper()
	var e xdp.CtEntry
	confirmed = f.dp.Maps.Conntrack.Lookup(ctKeyOf(k), &e) == nil
	unconfirmed = f.dp.Maps.CtUnconfirmed.Lookup(ctKeyOf(k), &e) == nil
	return confirmed, unconfirmed
}

// A flow is confirmed once its backend answered: a TCP flow by its
// client's ACK after the backend's SYN-ACK, a UDP flow by a packet either
// way once it is a stream (answered, and active 2 s after it began).
func TestFlowsAreConfirmedByTheirBackendsAnswer(t *testing.T) {
	const (
		reply  = "reply"  // the backend answers
		client = "client" // the client sends again
		later  = "later"  // the flow began 3 s ago
	)
	for _, tc := range []struct {
		name          string
		steps         []string // after the client's first packet
		replyFlags    uint8
		clientFlags   uint8
		wantConfirmed bool
	}{
		{name: "TCP handshake", steps: []string{reply, client}, replyFlags: packet.SYN | packet.ACK, clientFlags: packet.ACK, wantConfirmed: true},
		{name: "TCP SYN-ACK alone", steps: []string{reply}, replyFlags: packet.SYN | packet.ACK},
		{name: "TCP client ACK without an answer", steps: []string{client, client}, clientFlags: packet.ACK},
		{name: "TCP answered by a RST", steps: []string{reply, client}, replyFlags: packet.RST, clientFlags: packet.ACK},
		{name: "UDP query answered", steps: []string{reply, client}},
		{name: "UDP stream, client's packet", steps: []string{reply, later, client}, wantConfirmed: true},
		{name: "UDP stream, backend's packet", steps: []string{reply, later, reply}, wantConfirmed: true},
		{name: "UDP never answered", steps: []string{client, later, client}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			var in packet.Frame
			if tc.name[:3] == "UDP" {
				f.program(udpService())
				in = udpFrame(clientAddr, 5353, nodeAddr, 30053, "query")
			} else {
				f.program(oneRemoteBackend())
				in = tcpFrame(clientAddr, 7001, nodeAddr, 30100, packet.SYN, "")
			}
			r := f.run(in.Bytes(), f.nic0)
			f.expectVerdict(r, xdpRedirect)
			sent := decode(t, r.out)
			key := flowKeyOf(in)
			if c, u := f.inTable(key); c || !u {
				t.Fatalf("new flow in conntrack %v, in ct_unconfirmed %v; want only the latter", c, u)
			}
			for _, step := range tc.steps {
				switch step {
				case reply:
					f.run(replyTo(sent, tc.replyFlags).Bytes(), f.nic1)
				case later:
					f.ageFlowStart(key, 3*time.Second)
				default:
					next := in
					next.Flags = tc.clientFlags
					f.run(next.Bytes(), f.nic0)
				}
			}
			confirmed, unconfirmed := f.inTable(key)
			if confirmed != tc.wantConfirmed || unconfirmed == tc.wantConfirmed {
				t.Fatalf("in conntrack %v, in ct_unconfirmed %v; want confirmed %v", confirmed, unconfirmed, tc.wantConfirmed)
			}
			fl := f.mustFlow(key)
			if fl.Unconfirmed == tc.wantConfirmed {
				t.Errorf("flow marked unconfirmed %v", fl.Unconfirmed)
			}
			if got := f.counters()["ct_confirmed"]; got != map[bool]uint64{true: 1}[tc.wantConfirmed] {
				t.Errorf("ct_confirmed %d", got)
			}
			// The reverse half says the same, so that its replies take the
			// fast path once the flow is confirmed.
			var revFlags uint8
			if found, err := f.maps.UpdateReverse(fl, func(e *xdp.NatEntry) { revFlags = e.Flags }); err != nil || !found {
				t.Fatalf("reverse half: found %v, %v", found, err)
			}
			if unmarked := revFlags&uint8(xdp.CtFlagsCT_F_UNCONFIRMED) == 0; unmarked != tc.wantConfirmed {
				t.Errorf("reverse half flags %#x, want confirmed %v", revFlags, tc.wantConfirmed)
			}
		})
	}
}

// A flood of new flows from spoofed sources, ten times the size of
// conntrack (each flow's packet sent twice), costs no confirmed flow its
// entry, its backend or its port.
func TestFloodOfNewFlowsKeepsConfirmedFlows(t *testing.T) {
	const conntrackMax, established = 1024, 200
	for _, proto := range []uint8{packet.TCP, packet.UDP} {
		t.Run(map[uint8]string{packet.TCP: "SYN flood", packet.UDP: "UDP flood"}[proto], func(t *testing.T) {
			f := newFixtureSized(t, conntrackMax, 256)
			web := webService()
			f.program(web)
			dns := udpService()
			f.program(dns)
			frontend := netip.AddrPortFrom(nodeAddr, nodePort)
			if proto == packet.UDP {
				frontend = netip.AddrPortFrom(dns.frontends[0].Addr, dns.frontends[0].Port)
			}

			type conn struct {
				in   packet.Frame
				flow dataplane.Flow
			}
			var conns []conn
			for i := range established {
				var in packet.Frame
				if proto == packet.TCP {
					in = tcpFrame(clientAddr, uint16(10000+i), frontend.Addr(), frontend.Port(), packet.SYN, "")
				} else {
					in = udpFrame(clientAddr, uint16(10000+i), frontend.Addr(), frontend.Port(), "query")
				}
				r := f.run(in.Bytes(), f.nic0)
				if r.verdict != xdpRedirect && r.verdict != xdpPass {
					t.Fatalf("flow %d: verdict %s", i, verdictName(r.verdict))
				}
				fl := f.mustFlow(flowKeyOf(in))
				if fl.NAT.IsValid() {
					sent := decode(t, r.out)
					if proto == packet.TCP {
						f.handshake(in, sent)
					} else {
						// A stream: answered, and still going 2 s on.
						f.run(replyTo(sent, 0).Bytes(), f.nic1)
						f.ageFlowStart(flowKeyOf(in), 3*time.Second)
						f.run(in.Bytes(), f.nic0)
					}
					fl = f.mustFlow(flowKeyOf(in))
					if fl.Unconfirmed {
						t.Fatalf("flow %d not confirmed by its handshake", i)
					}
					conns = append(conns, conn{in, fl})
				}
			}
			if len(conns) < established/2 {
				t.Fatalf("only %d of %d flows went to remote backends", len(conns), established)
			}

			rng := rand.New(rand.NewPCG(1, 2))
			for range 10 * conntrackMax {
				src := netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(256)), byte(rng.IntN(256))})
				var flood packet.Frame
				if proto == packet.TCP {
					flood = tcpFrame(src, uint16(1024+rng.IntN(60000)), frontend.Addr(), frontend.Port(), packet.SYN, "")
				} else {
					flood = udpFrame(src, uint16(1024+rng.IntN(60000)), frontend.Addr(), frontend.Port(), "x")
				}
				flood.SrcMAC = gw0MAC
				// Twice, as a retransmission: the second copy marks
				// the flow recently used in an LRU map.
				f.run(flood.Bytes(), f.nic0)
				f.run(flood.Bytes(), f.nic0)
			}

			for i, c := range conns {
				next := c.in
				if proto == packet.TCP {
					next.Flags = packet.ACK | packet.PSH
					next.Payload = []byte("GET / HTTP/1.1")
				}
				before := f.counters()["new_flow"]
				r := f.run(next.Bytes(), f.nic0)
				if r.verdict != xdpRedirect {
					t.Fatalf("established flow %d after the flood: verdict %s", i, verdictName(r.verdict))
				}
				out := decode(t, r.out)
				if got := netip.AddrPortFrom(out.Src, out.SrcPort); got != c.flow.NAT {
					t.Fatalf("established flow %d left from %v after the flood, was %v", i, got, c.flow.NAT)
				}
				if got := netip.AddrPortFrom(out.Dst, out.DstPort); got != c.flow.Backend {
					t.Fatalf("established flow %d went to %v after the flood, was %v", i, got, c.flow.Backend)
				}
				if f.counters()["new_flow"] != before {
					t.Fatalf("established flow %d started a new flow after the flood", i)
				}
			}
			expectUniqueReplyTuples(t, f)
		})
	}
}

// Losing a forward entry never frees its SNAT port: while the flow may be
// alive (its backend exists, its reverse half is within its timeout), no
// new flow gets the port, and the backend's next reply rebuilds the flow
// for its own client.
func TestEvictedFlowKeepsItsSNATPort(t *testing.T) {
	const ports = 4
	f := newFixture(t, withSNATRange(snatMin, snatMin+ports-1))
	in, sent := openOneBackendFlow(t, f)
	f.handshake(in, sent)
	flow := f.mustFlow(flowKeyOf(in))
	if err := f.dp.Maps.Conntrack.Delete(ctKeyOf(flow.Key())); err != nil {
		t.Fatal(err)
	}

	// Every other port goes to a new client; the evicted flow's never.
	for c := range 2 * ports {
		other := tcpFrame(clientAddr, uint16(8000+c), nodeAddr, 30100, packet.SYN, "")
		r := f.run(other.Bytes(), f.nic0)
		if r.verdict != xdpRedirect {
			continue // no port left: counted as drop_nat_exhausted
		}
		if got := decode(t, r.out).SrcPort; got == flow.NAT.Port() {
			t.Fatalf("client %d got SNAT port %d of a flow whose forward entry was evicted", c, got)
		}
	}
	if f.counters()["drop_nat_exhausted"] == 0 {
		t.Fatalf("%d new flows over %d ports: none was refused", 2*ports, ports)
	}

	// The backend's reply rebuilds the flow, for its own client.
	f.ageReverse(flow)
	r := f.run(replyTo(sent, packet.ACK).Bytes(), f.nic1)
	f.expectVerdict(r, xdpRedirect)
	if back := decode(t, r.out); back.Dst != clientAddr || back.DstPort != in.SrcPort {
		t.Fatalf("reply went to %v:%d, want the flow's client %v:%d", back.Dst, back.DstPort, clientAddr, in.SrcPort)
	}
	if again := f.mustFlow(flow.Key()); again.NAT != flow.NAT || again.Unconfirmed {
		t.Fatalf("rebuilt flow %+v, was %+v", again, flow)
	}
	expectUniqueReplyTuples(t, f)

	// Past its timeout by its reverse half, the port is free again.
	if err := f.dp.Maps.Conntrack.Delete(ctKeyOf(flow.Key())); err != nil {
		t.Fatal(err)
	}
	f.ageReverseBy(flow, 7*time.Hour) // past the established timeout
	taken := false
	for c := range 2 * ports {
		other := tcpFrame(clientAddr, uint16(9000+c), nodeAddr, 30100, packet.SYN, "")
		if r := f.run(other.Bytes(), f.nic0); r.verdict == xdpRedirect && decode(t, r.out).SrcPort == flow.NAT.Port() {
			taken = true
			break
		}
	}
	if !taken {
		t.Fatalf("the port of a flow past its timeout was never given out again")
	}
}

// A TCP segment without SYN and without state that would need a SNAT port
// claims none: it is dropped and counted, and nothing is tracked.
func TestSegmentWithoutStateClaimsNoSNATPort(t *testing.T) {
	for _, flags := range []uint8{packet.ACK, packet.ACK | packet.PSH, packet.FIN | packet.ACK, packet.RST} {
		f := newFixture(t)
		f.program(oneRemoteBackend())
		in := tcpFrame(clientAddr, 7001, nodeAddr, 30100, flags, "data")
		f.expectCounters(map[string]uint64{"drop_no_flow": 1}, func() {
			f.expectVerdict(f.run(in.Bytes(), f.nic0), xdpDrop)
		})
		if _, ok := f.flow(flowKeyOf(in)); ok {
			t.Errorf("flags %#x: a flow is tracked", flags)
		}
		if n := f.reverseEntries(); n != 0 {
			t.Errorf("flags %#x: %d reverse halves", flags, n)
		}
	}
}

// A reply that finds an unconfirmed flow's forward half evicted rebuilds
// it as it was: unconfirmed, on the transient timeout, confirmed only by
// its client's ACK; not an established flow with the long timeout.
func TestRebuiltFlowKeepsItsConfirmation(t *testing.T) {
	f := newFixture(t)
	in, sent := openOneBackendFlow(t, f)
	key := flowKeyOf(in)
	if err := f.dp.Maps.CtUnconfirmed.Delete(ctKeyOf(key)); err != nil {
		t.Fatal(err)
	}
	f.expectCounters(map[string]uint64{"ct_repaired": 1, "reverse_nat": 1, "redirect": 1}, func() {
		f.run(replyTo(sent, packet.SYN|packet.ACK).Bytes(), f.nic1)
	})
	rebuilt := f.mustFlow(key)
	if !rebuilt.Unconfirmed || dataplane.TCPEstablished(rebuilt.TCPState) {
		t.Fatalf("rebuilt flow unconfirmed %v, state %#x; want unconfirmed, not established", rebuilt.Unconfirmed, rebuilt.TCPState)
	}
	ack := in
	ack.Flags = packet.ACK
	f.expectCounters(map[string]uint64{"ct_confirmed": 1, "redirect": 1}, func() {
		f.run(ack.Bytes(), f.nic0)
	})
	if c, u := f.inTable(key); !c || u {
		t.Fatalf("after the client's ACK: in conntrack %v, in ct_unconfirmed %v", c, u)
	}
}

// A SYN on a half-closed connection's tuple (a FIN one way only) is not a
// new connection: it follows the flow, whose backend may still send.
func TestSYNDoesNotTakeOverAHalfClosedFlow(t *testing.T) {
	f := newFixture(t)
	in, sent := openOneBackendFlow(t, f)
	f.handshake(in, sent)
	fin := in
	fin.Flags = packet.FIN | packet.ACK
	f.expectVerdict(f.run(fin.Bytes(), f.nic0), xdpRedirect)
	flow := f.mustFlow(flowKeyOf(in))

	var r result
	f.expectCounters(map[string]uint64{"redirect": 1}, func() {
		r = f.run(in.Bytes(), f.nic0)
	})
	if out := decode(t, r.out); netip.AddrPortFrom(out.Src, out.SrcPort) != flow.NAT {
		t.Fatalf("SYN on a half-closed tuple left from %v:%d, the flow's port is %v", out.Src, out.SrcPort, flow.NAT)
	}
	// Closed both ways, the tuple is free for a new connection.
	f.expectVerdict(f.run(replyTo(sent, packet.FIN|packet.ACK).Bytes(), f.nic1), xdpRedirect)
	f.expectCounters(map[string]uint64{"ct_expired": 1, "new_flow": 1, "redirect": 1}, func() {
		f.run(in.Bytes(), f.nic0)
	})
}

// replyTuple is the tuple a flow's backend answers it with.
type replyTuple struct {
	backend, peer netip.AddrPort
	proto         uint8
}

// expectUniqueReplyTuples checks the invariant every packet sequence must
// keep: no two live flows have the same reply tuple, or their backend
// would see one connection where there are two, and one flow's replies
// would reach the other's client. A flow counts as live until it expired,
// was ended by the agent, or (TCP) closed.
func expectUniqueReplyTuples(t testing.TB, f *fixture) {
	t.Helper()
	var cfg xdp.DatapathConfig
	if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	now := dataplane.Now()
	seen := map[replyTuple]dataplane.FlowKey{}
	err := f.maps.Flows(func(fl dataplane.Flow) bool {
		timeout := time.Duration(cfg.UdpTimeoutNs)
		if fl.Proto == packet.TCP {
			if dataplane.TCPClosed(fl.TCPState) {
				return true
			}
			timeout = time.Duration(cfg.TcpTransientTimeoutNs)
			if fl.Unconfirmed {
				timeout = min(timeout, dataplane.UnconfirmedTCPTimeout)
			} else if dataplane.TCPEstablished(fl.TCPState) {
				timeout = time.Duration(cfg.TcpEstablishedTimeoutNs)
			}
		}
		if fl.Ended || now-fl.LastSeen > timeout {
			return true
		}
		rt := replyTuple{backend: fl.Backend, peer: fl.Client, proto: fl.Proto}
		if fl.NAT.IsValid() {
			rt.peer = fl.NAT
		}
		if other, dup := seen[rt]; dup {
			t.Errorf("flows %v -> %v and %v -> %v share the reply tuple %v <- %v",
				other.Client, other.Frontend, fl.Client, fl.Frontend, rt.backend, rt.peer)
		}
		seen[rt] = fl.Key()
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A client tuple is one origin's at a time: a packet from outside that
// spoofs a pod's flow to a NodePort (the pod's own address and port) is
// dropped, and the pod's flow keeps its entry, backend and reverse half;
// the other way round too.
func TestSpoofedTupleOfTheOtherOriginIsDropped(t *testing.T) {
	for _, spoofed := range []string{"outside spoofs the pod", "pod spoofs an outside client"} {
		t.Run(spoofed, func(t *testing.T) {
			f := newFixture(t)
			web := webService()
			web.backends = map[uint32]dataplane.Backend{1: backendRemote1}
			web.table = []uint32{1}
			f.program(web)
			in := tcpFrame(podAddr, 34100, nodeAddr, nodePort, packet.SYN, "")
			in.SrcMAC = localPodMAC
			// Each sends a frame and tells whether its program dropped it.
			fromPod := func(fr packet.Frame) bool {
				verdict, _ := f.runTC(f.dp.PodProgram(), fr.Bytes(), f.pod0)
				return verdict == tcActShot
			}
			fromOutside := func(fr packet.Frame) bool { return f.run(fr.Bytes(), f.nic0).verdict == xdpDrop }
			owner, spoofer := fromPod, fromOutside
			if spoofed != "outside spoofs the pod" {
				owner, spoofer = fromOutside, fromPod
			}
			owner(in)
			flow := f.mustFlow(flowKeyOf(in))

			for _, flags := range []uint8{packet.SYN, packet.ACK, packet.RST} {
				fake := in
				fake.Flags = flags
				f.expectCounters(map[string]uint64{"drop_tuple_taken": 1}, func() {
					if !spoofer(fake) {
						t.Fatalf("spoofed %#x: not dropped", flags)
					}
				})
			}
			if again := f.mustFlow(flowKeyOf(in)); again.External != flow.External || again.Backend != flow.Backend ||
				again.NAT != flow.NAT || again.Created != flow.Created {
				t.Fatalf("the flow after the spoofed packets: %+v, was %+v", again, flow)
			}
		})
	}
}

// An unconfirmed TCP flow holds its SNAT port for at most
// UnconfirmedTCPTimeout of idleness, not the transient timeout: spoofed
// SYNs below the SYN flood threshold hold a bounded share of a backend's
// ports. With one port, a second client gets it only once the first
// client's half-open flow is past that timeout; a confirmed flow's port is
// held for its whole timeout.
func TestUnconfirmedFlowsHoldTheirPortBriefly(t *testing.T) {
	for _, tc := range []struct {
		name      string
		confirmed bool
		idle      time.Duration
		wantPort  bool
	}{
		{"unconfirmed, idle less than its timeout", false, dataplane.UnconfirmedTCPTimeout - time.Second, false},
		{"unconfirmed, idle past its timeout", false, dataplane.UnconfirmedTCPTimeout + time.Second, true},
		{"confirmed, idle as long", true, dataplane.UnconfirmedTCPTimeout + time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, withSNATRange(snatMin, snatMin))
			f.program(oneRemoteBackend())
			first := tcpFrame(clientAddr, 6001, nodeAddr, 30100, packet.SYN, "")
			sent := decode(t, f.run(first.Bytes(), f.nic0).out)
			if tc.confirmed {
				f.handshake(first, sent)
			}
			f.ageFlowBy(flowKeyOf(first), tc.idle)
			second := tcpFrame(clientAddr, 6002, nodeAddr, 30100, packet.SYN, "")
			r := f.run(second.Bytes(), f.nic0)
			if got := r.verdict == xdpRedirect; got != tc.wantPort {
				t.Fatalf("second client's SYN: verdict %v; want it to get the port: %v", r.verdict, tc.wantPort)
			}
			if tc.wantPort && decode(t, r.out).SrcPort != snatMin {
				t.Errorf("second client got port %d, want %d", decode(t, r.out).SrcPort, snatMin)
			}
		})
	}
}
