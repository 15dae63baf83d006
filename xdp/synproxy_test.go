package xdp_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

// The SYN proxy: under a SYN flood, SYNs to an external frontend are
// answered with SYN cookies, and only a client that answers one gets a
// flow, whose sequence numbers are translated between its two halves.

// setSYNCookies rewrites the datapath's SYN cookie mode and threshold.
func (f *fixture) setSYNCookies(mode loader.SYNCookieMode, threshold uint32) {
	f.t.Helper()
	var cfg xdp.DatapathConfig
	if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		f.t.Fatal(err)
	}
	cfg.SynCookies = uint32(mode)
	cfg.SynFloodThreshold = threshold
	if err := f.dp.Maps.Config.Put(uint32(0), cfg); err != nil {
		f.t.Fatal(err)
	}
}

// clientSYN is a client's SYN to the one-backend service, announcing an
// MSS of 1460.
func clientSYN(sport uint16) packet.Frame {
	syn := tcpFrame(clientAddr, sport, nodeAddr, 30100, packet.SYN, "")
	syn.TCPOptions = packet.MSSOption(1460)
	syn.Seq = 1000
	syn.Ack = 0
	return syn
}

// counterDeltas runs fn and returns how far each named counter moved.
func (f *fixture) counterDeltas(fn func(), names ...string) map[string]uint64 {
	f.t.Helper()
	before := f.counters()
	fn()
	after := f.counters()
	out := map[string]uint64{}
	for _, n := range names {
		out[n] = after[n] - before[n]
	}
	return out
}

// proxiedHandshake sends a client's SYN (answered with a cookie) and its
// ACK (opening the backend's side, sent on with verdict): the cookie
// SYN-ACK and the SYN that left for the backend.
func (f *fixture) proxiedHandshake(sport uint16, verdict uint32) (synAck, toBackend packet.Frame) {
	f.t.Helper()
	r := f.run(clientSYN(sport).Bytes(), f.nic0)
	f.expectVerdict(r, xdpTX)
	synAck = decode(f.t, r.out)
	ack := tcpFrame(clientAddr, sport, nodeAddr, 30100, packet.ACK, "")
	ack.Seq, ack.Ack = 1001, synAck.Seq+1
	r = f.run(ack.Bytes(), f.nic0)
	f.expectVerdict(r, verdict)
	return synAck, decode(f.t, r.out)
}

func TestSYNCookieHandshakeIsProxiedToTheBackend(t *testing.T) {
	f := newFixture(t)
	f.program(oneRemoteBackend())
	f.setSYNCookies(loader.SYNCookiesAlways, 0)
	key := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7001),
		Frontend: netip.AddrPortFrom(nodeAddr, 30100), Proto: packet.TCP}

	// The SYN is answered at once, from the frontend, and leaves nothing.
	var r result
	moved := f.counterDeltas(func() { r = f.run(clientSYN(7001).Bytes(), f.nic0) },
		"syncookie_sent", "new_flow", "tx")
	f.expectVerdict(r, xdpTX)
	synAck := decode(t, r.out)
	if synAck.Src != nodeAddr || synAck.SrcPort != 30100 || synAck.Dst != clientAddr || synAck.DstPort != 7001 ||
		synAck.Flags != packet.SYN|packet.ACK || synAck.Ack != 1001 || synAck.MSS() != 1460 ||
		synAck.DstMAC.String() != clientMAC.String() {
		t.Fatalf("cookie SYN-ACK %+v: want nodeAddr:30100 -> client:7001, SYN|ACK, ack 1001, MSS 1460, to the client's MAC", synAck)
	}
	if moved["syncookie_sent"] != 1 || moved["new_flow"] != 0 || moved["tx"] != 0 {
		t.Errorf("counters moved %v: want syncookie_sent 1 (its own verdict), no new flow", moved)
	}
	if _, ok := f.flow(key); ok {
		t.Fatal("a SYN answered with a cookie left a flow")
	}

	// An ACK with a wrong cookie opens nothing.
	bad := tcpFrame(clientAddr, 7001, nodeAddr, 30100, packet.ACK, "")
	bad.Seq, bad.Ack = 1001, synAck.Seq+2
	f.expectCounters(map[string]uint64{"drop_no_flow": 1}, func() {
		f.expectVerdict(f.run(bad.Bytes(), f.nic0), xdpDrop)
	})

	// The right one opens the backend's side with the client's SYN.
	ack := bad
	ack.Ack = synAck.Seq + 1
	moved = f.counterDeltas(func() { r = f.run(ack.Bytes(), f.nic0) }, "syncookie_valid", "new_flow")
	f.expectVerdict(r, xdpRedirect)
	syn := decode(t, r.out)
	if syn.Flags != packet.SYN || syn.Seq != 1000 || syn.MSS() != 1460 || syn.Dst != remotePod1 ||
		syn.DstPort != podPort || syn.Src != nic1Addr || len(syn.Payload) != 0 {
		t.Fatalf("SYN to the backend %+v: want SYN seq 1000 MSS 1460 from the node to backend 1", syn)
	}
	if moved["syncookie_valid"] != 1 || moved["new_flow"] != 1 {
		t.Errorf("counters moved %v: want syncookie_valid 1, new_flow 1", moved)
	}
	fl := f.mustFlow(key)
	if fl.Backend != netip.AddrPortFrom(remotePod1, podPort) || !fl.Unconfirmed {
		t.Fatalf("flow %+v: want unconfirmed, to backend 1", fl)
	}

	// The backend's SYN-ACK is answered here with the client's ACK.
	const backendISN = 777000
	synAckIn := replyTo(syn, packet.SYN|packet.ACK)
	synAckIn.Seq, synAckIn.Ack = backendISN, 1001
	synAckIn.TCPOptions = packet.MSSOption(1400)
	synAckIn.SrcMAC, synAckIn.DstMAC = gwMAC, f.nic1MAC
	moved = f.counterDeltas(func() { r = f.run(synAckIn.Bytes(), f.nic1) }, "synproxy_ack", "reverse_nat")
	f.expectVerdict(r, xdpTX)
	ackOut := decode(t, r.out)
	if ackOut.Flags != packet.ACK || ackOut.Seq != 1001 || ackOut.Ack != backendISN+1 ||
		ackOut.Src != nic1Addr || ackOut.SrcPort != syn.SrcPort || ackOut.Dst != remotePod1 ||
		ackOut.DstPort != podPort || ackOut.DstMAC.String() != gwMAC.String() {
		t.Fatalf("ACK to the backend %+v: want ACK seq 1001 ack %d on the flow's reply tuple", ackOut, backendISN+1)
	}
	if moved["synproxy_ack"] != 1 || moved["reverse_nat"] != 0 {
		t.Errorf("counters moved %v: want synproxy_ack 1 and nothing sent to the client", moved)
	}
	// Both handshakes are complete: the flow is confirmed, though its
	// client may not send again for a long while.
	if confirmed, _ := f.inTable(key); !confirmed {
		t.Fatal("the flow is not confirmed once the proxy answered its backend")
	}

	// From now on each side sees its own sequence numbers.
	data := tcpFrame(clientAddr, 7001, nodeAddr, 30100, packet.ACK|packet.PSH, "hello")
	data.Seq, data.Ack = 1001, synAck.Seq+1
	r = f.run(data.Bytes(), f.nic0)
	f.expectVerdict(r, xdpRedirect)
	if out := decode(t, r.out); out.Seq != 1001 || out.Ack != backendISN+1 || string(out.Payload) != "hello" {
		t.Fatalf("client data at the backend: seq %d ack %d %q, want seq 1001 ack %d", out.Seq, out.Ack, out.Payload, backendISN+1)
	}
	answer := replyTo(syn, packet.ACK|packet.PSH)
	answer.Seq, answer.Ack, answer.Payload = backendISN+1, 1006, []byte("world")
	r = f.run(answer.Bytes(), f.nic1)
	f.expectVerdict(r, xdpRedirect)
	if out := decode(t, r.out); out.Seq != synAck.Seq+1 || out.Ack != 1006 || out.Dst != clientAddr ||
		out.SrcPort != 30100 || string(out.Payload) != "world" {
		t.Fatalf("backend data at the client %+v: want seq %d (the cookie's) ack 1006", out, synAck.Seq+1)
	}

	// A retransmitted SYN-ACK (the ACK was lost) is answered again.
	r = f.run(synAckIn.Bytes(), f.nic1)
	f.expectVerdict(r, xdpTX)
	if again := decode(t, r.out); again.Seq != 1001 || again.Ack != backendISN+1 {
		t.Errorf("ACK for a retransmitted SYN-ACK: seq %d ack %d", again.Seq, again.Ack)
	}
}

func TestSYNProxyBeforeTheBackendAnswers(t *testing.T) {
	f := newFixture(t)
	f.program(oneRemoteBackend())
	f.setSYNCookies(loader.SYNCookiesAlways, 0)
	synAck, syn := f.proxiedHandshake(7002, xdpRedirect)

	// Data the client sends meanwhile sends the SYN again (its payload
	// comes again once the backend answered).
	data := tcpFrame(clientAddr, 7002, nodeAddr, 30100, packet.ACK|packet.PSH, "early")
	data.Seq, data.Ack = 1001, synAck.Seq+1
	r := f.run(data.Bytes(), f.nic0)
	f.expectVerdict(r, xdpRedirect)
	if again := decode(t, r.out); again.Flags != packet.SYN || again.Seq != 1000 || len(again.Payload) != 0 ||
		again.SrcPort != syn.SrcPort {
		t.Fatalf("client data before the backend answered: %+v, want the proxy's SYN again", again)
	}

	// A backend segment that is no SYN-ACK to the proxy's SYN is dropped.
	stray := replyTo(syn, packet.ACK)
	stray.Seq, stray.Ack = 5, 1001
	f.expectCounters(map[string]uint64{"drop_synproxy_pending": 1}, func() {
		f.expectVerdict(f.run(stray.Bytes(), f.nic1), xdpDrop)
	})

	// The backend refuses: its RST reaches the client in the client's
	// window (the cookie's sequence space).
	rst := replyTo(syn, packet.RST|packet.ACK)
	rst.Seq, rst.Ack = 0, 1001
	r = f.run(rst.Bytes(), f.nic1)
	f.expectVerdict(r, xdpRedirect)
	if out := decode(t, r.out); out.Flags&packet.RST == 0 || out.Seq != synAck.Seq+1 || out.Dst != clientAddr {
		t.Fatalf("backend's RST at the client %+v: want RST seq %d", out, synAck.Seq+1)
	}
}

// A flow opened by the SYN proxy whose offset was lost cannot be
// translated: it ends, and its client is told.
func TestSYNProxyFlowWithoutItsOffsetEnds(t *testing.T) {
	f := newFixture(t)
	f.program(oneRemoteBackend())
	f.setSYNCookies(loader.SYNCookiesAlways, 0)
	synAck, syn := f.proxiedHandshake(7003, xdpRedirect)
	flow := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7003),
		Frontend: netip.AddrPortFrom(nodeAddr, 30100), Proto: packet.TCP}
	// The backend answers (which confirms the flow), the client sends.
	backendSynAck := replyTo(syn, packet.SYN|packet.ACK)
	backendSynAck.Seq, backendSynAck.Ack = 5000, 1001
	f.expectVerdict(f.run(backendSynAck.Bytes(), f.nic1), xdpTX)
	data := tcpFrame(clientAddr, 7003, nodeAddr, 30100, packet.ACK, "")
	data.Seq, data.Ack = 1001, synAck.Seq+1
	f.expectVerdict(f.run(data.Bytes(), f.nic0), xdpRedirect)

	if err := f.dp.Maps.SYNProxyFlows.Delete(ctKeyOf(flow)); err != nil {
		t.Fatal(err)
	}
	var r result
	f.expectCounters(map[string]uint64{"rst_synproxy_lost": 1}, func() { r = f.run(data.Bytes(), f.nic0) })
	f.expectVerdict(r, xdpTX)
	if rst := decode(t, r.out); rst.Flags&packet.RST == 0 || rst.Dst != clientAddr || rst.Seq != synAck.Seq+1 {
		t.Fatalf("answer %+v: want a RST to the client in its window (seq %d)", rst, synAck.Seq+1)
	}
	if !dataplane.TCPClosing(f.mustFlow(flow).TCPState) {
		t.Error("the flow is not closing after its offset was lost")
	}
}

// With SYN cookies on auto, a service port's SYNs get cookies once the
// handshakes it left incomplete reach the threshold; completed handshakes
// do not count; with cookies off nothing changes.
func TestSYNFloodTurnsCookiesOn(t *testing.T) {
	for _, tc := range []struct {
		name       string
		mode       loader.SYNCookieMode
		completed  bool // each handshake completes before the next SYN
		wantCookie []bool
	}{
		{name: "auto, incomplete handshakes", mode: loader.SYNCookiesAuto,
			wantCookie: []bool{false, false, false, true, true}},
		{name: "auto, completed handshakes", mode: loader.SYNCookiesAuto, completed: true,
			wantCookie: []bool{false, false, false, false, false}},
		{name: "off", mode: loader.SYNCookiesOff,
			wantCookie: []bool{false, false, false, false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(oneRemoteBackend())
			f.setSYNCookies(tc.mode, 3)
			for i, want := range tc.wantCookie {
				in := clientSYN(uint16(8000 + i))
				r := f.run(in.Bytes(), f.nic0)
				if got := r.verdict == xdpTX; got != want {
					t.Fatalf("SYN %d: answered with a cookie %v, want %v (verdict %s)", i, got, want, verdictName(r.verdict))
				}
				if tc.completed {
					f.handshake(in, decode(t, r.out))
				}
			}
		})
	}
}

// A SYN retransmitted by a client whose flow began before the flood
// follows its flow: a cookie would answer it with a sequence number its
// backend does not know.
func TestRetransmittedSYNOfAnEarlierFlowGetsNoCookie(t *testing.T) {
	f := newFixture(t)
	f.program(oneRemoteBackend())
	f.setSYNCookies(loader.SYNCookiesAuto, 3)
	for i := range 3 {
		f.expectVerdict(f.run(clientSYN(uint16(8100+i)).Bytes(), f.nic0), xdpRedirect)
	}
	f.expectVerdict(f.run(clientSYN(8199).Bytes(), f.nic0), xdpTX) // the flood is on
	r := f.run(clientSYN(8100).Bytes(), f.nic0)
	f.expectVerdict(r, xdpRedirect)
	if out := decode(t, r.out); out.Flags != packet.SYN || out.Dst != remotePod1 {
		t.Fatalf("retransmitted SYN %+v: want it sent on to its flow's backend", out)
	}
}

// A backend on this node (externalTrafficPolicy Local): the XDP program
// proxies the handshake as for a remote one, and the TC program on the
// pod's interface answers the pod's SYN-ACK and translates its replies.
func TestSYNProxyToALocalBackend(t *testing.T) {
	f := newFixture(t)
	f.program(service{
		svcID: 5, tableID: 5,
		frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30100, Proto: packet.TCP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendLocalSet | dataplane.FrontendDropIfEmpty,
		backends:  map[uint32]dataplane.Backend{3: backendLocal},
		table:     []uint32{3},
	})
	f.setSYNCookies(loader.SYNCookiesAlways, 0)
	// The pod's interface takes no XDP_REDIRECT: the SYN goes on to it
	// through the TC program (handoff), translated.
	synAck, syn := f.proxiedHandshake(7004, xdpPass)
	if syn.Dst != localPod || syn.Src != clientAddr || syn.Flags != packet.SYN || syn.Seq != 1000 {
		t.Fatalf("SYN to the local backend %+v: want the client's own SYN, DNATed", syn)
	}

	const podISN = 424242
	podSynAck := replyTo(syn, packet.SYN|packet.ACK)
	podSynAck.Seq, podSynAck.Ack = podISN, 1001
	podSynAck.SrcMAC = localPodMAC
	verdict, raw := f.runTC(f.dp.PodProgram(), podSynAck.Bytes(), f.pod0)
	if verdict != tcActRedirect {
		t.Fatalf("pod's SYN-ACK: verdict %d, want a redirect (the proxy's ACK, back into the pod)", int32(verdict))
	}
	key := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7004),
		Frontend: netip.AddrPortFrom(nodeAddr, 30100), Proto: packet.TCP}
	if confirmed, _ := f.inTable(key); !confirmed {
		t.Error("the flow is not confirmed once the proxy answered its backend")
	}
	ack := decode(t, raw)
	if ack.Flags != packet.ACK || ack.Seq != 1001 || ack.Ack != podISN+1 || ack.Src != clientAddr ||
		ack.SrcPort != 7004 || ack.Dst != localPod || ack.DstPort != podPort ||
		ack.DstMAC.String() != localPodMAC.String() {
		t.Fatalf("the proxy's ACK to the pod %+v: want client:7004 -> pod, seq 1001 ack %d", ack, podISN+1)
	}

	data := tcpFrame(clientAddr, 7004, nodeAddr, 30100, packet.ACK|packet.PSH, "hello")
	data.Seq, data.Ack = 1001, synAck.Seq+1
	r := f.run(data.Bytes(), f.nic0)
	f.expectVerdict(r, xdpPass)
	if out := decode(t, r.out); out.Ack != podISN+1 || out.Dst != localPod {
		t.Fatalf("client data at the pod: ack %d to %s, want ack %d", out.Ack, out.Dst, podISN+1)
	}
	answer := replyTo(syn, packet.ACK|packet.PSH)
	answer.Seq, answer.Ack, answer.Payload = podISN+1, 1006, []byte("world")
	verdict, raw = f.runTC(f.dp.PodProgram(), answer.Bytes(), f.pod0)
	if verdict != tcActRedirect {
		t.Fatalf("pod's answer: verdict %d", int32(verdict))
	}
	if out := decode(t, raw); out.Seq != synAck.Seq+1 || out.Src != nodeAddr || out.SrcPort != 30100 ||
		out.Dst != clientAddr || string(out.Payload) != "world" {
		t.Fatalf("pod's answer at the client %+v: want seq %d from the frontend", out, synAck.Seq+1)
	}
}
