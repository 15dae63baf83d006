package xdp_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

var (
	podAddr     = netip.MustParseAddr("10.244.0.5") // the local pod of the fixture
	hairpinAddr = netip.MustParseAddr("169.254.42.1")
)

// clusterService: ClusterIP 10.96.0.10:80/TCP and :53/UDP with the given
// backends (ids from 51).
func clusterService(proto uint8, port uint16, backends ...dataplane.Backend) service {
	s := service{
		svcID: 9, tableID: 9,
		frontends: []dataplane.FrontendKey{{Addr: clusterIP, Port: port, Proto: proto}},
		backends:  map[uint32]dataplane.Backend{},
	}
	for i, b := range backends {
		s.backends[uint32(51+i)] = b
		s.table = append(s.table, uint32(51+i))
	}
	return s
}

func TestPodToClusterIPKeepsPodAddress(t *testing.T) {
	f := newFixture(t)
	f.program(clusterService(packet.TCP, 80, backendRemote1))
	in := tcpFrame(podAddr, 34567, clusterIP, 80, packet.SYN, "hi")
	in.SrcMAC = localPodMAC
	var verdict uint32
	var raw []byte
	f.expectCounters(map[string]uint64{"new_flow": 1, "tc_redirect": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0)
	})
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d, want redirect", int32(verdict))
	}
	out := decode(t, raw)
	if out.Src != podAddr || out.SrcPort != 34567 {
		t.Errorf("source %s:%d, want the pod's own %s:34567", out.Src, out.SrcPort, podAddr)
	}
	if out.Dst != remotePod1 || out.DstPort != podPort {
		t.Errorf("destination %s:%d, want %s:%d", out.Dst, out.DstPort, remotePod1, podPort)
	}
	if out.TTL != 63 || string(out.Payload) != "hi" {
		t.Errorf("TTL %d payload %q", out.TTL, out.Payload)
	}

	// The remote backend's reply comes in on the NIC and goes back to the
	// pod, from the ClusterIP.
	reply := packet.Frame{SrcMAC: gwMAC, Src: remotePod1, Dst: podAddr, Proto: packet.TCP, TTL: 64,
		SrcPort: podPort, DstPort: 34567, Flags: packet.SYN | packet.ACK, Payload: []byte("ho")}
	f.expectCounters(map[string]uint64{"reverse_nat": 1, "tc_redirect": 1}, func() {
		verdict, raw = f.runTC(f.dp.TCProgram(), reply.Bytes(), f.nic1)
	})
	if verdict != tcActRedirect {
		t.Fatalf("reply verdict %d, want redirect", int32(verdict))
	}
	back := decode(t, raw)
	if back.Src != clusterIP || back.SrcPort != 80 || back.Dst != podAddr || back.DstPort != 34567 {
		t.Errorf("reply %s:%d -> %s:%d", back.Src, back.SrcPort, back.Dst, back.DstPort)
	}
}

func TestPodHairpinIsSNATed(t *testing.T) {
	f := newFixture(t)
	f.program(clusterService(packet.UDP, 53, dataplane.Backend{Addr: podAddr, Port: 5353, Local: true}))
	in := udpFrame(podAddr, 40001, clusterIP, 53, "q")
	verdict, raw := f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0)
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d", int32(verdict))
	}
	out := decode(t, raw)
	if out.Src != hairpinAddr || out.Dst != podAddr || out.DstPort != 5353 {
		t.Fatalf("hairpin %s:%d -> %s:%d, want %s -> %s:5353", out.Src, out.SrcPort, out.Dst, out.DstPort, hairpinAddr, podAddr)
	}
	// The pod's answer to the hairpin address comes back out of the pod.
	reply := udpFrame(podAddr, 5353, hairpinAddr, out.SrcPort, "a")
	verdict, raw = f.runTC(f.dp.PodProgram(), reply.Bytes(), f.pod0)
	if verdict != tcActRedirect {
		t.Fatalf("reply verdict %d", int32(verdict))
	}
	back := decode(t, raw)
	if back.Src != clusterIP || back.SrcPort != 53 || back.Dst != podAddr || back.DstPort != 40001 {
		t.Fatalf("hairpin reply %s:%d -> %s:%d", back.Src, back.SrcPort, back.Dst, back.DstPort)
	}
}

func TestPodRefusedWithoutEndpoints(t *testing.T) {
	f := newFixture(t)
	f.program(clusterService(packet.TCP, 80))
	f.program(clusterService(packet.UDP, 53))
	in := tcpFrame(podAddr, 34568, clusterIP, 80, packet.SYN, "")
	in.SrcMAC = localPodMAC
	var verdict uint32
	var raw []byte
	f.expectCounters(map[string]uint64{"reject_tcp": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0)
	})
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d, want the RST redirected back", int32(verdict))
	}
	rst := decode(t, raw)
	if rst.Flags != packet.RST|packet.ACK || rst.Src != clusterIP || rst.Dst != podAddr || rst.Ack != in.Seq+1 {
		t.Fatalf("RST %+v", rst)
	}
	if !bytes.Equal(rst.DstMAC, localPodMAC) {
		t.Errorf("RST to MAC %s, want the pod's %s", rst.DstMAC, localPodMAC)
	}
	// A RST is never answered with one.
	podRST := in
	podRST.Flags = packet.RST
	f.expectCounters(map[string]uint64{"drop_client_rst": 1}, func() {
		verdict, _ = f.runTC(f.dp.PodProgram(), podRST.Bytes(), f.pod0)
	})
	if verdict != tcActShot {
		t.Errorf("verdict %d for the pod's RST, want a drop", int32(verdict))
	}
	uin := udpFrame(podAddr, 34569, clusterIP, 53, "query")
	f.expectCounters(map[string]uint64{"reject_icmp": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), uin.Bytes(), f.pod0)
	})
	icmp := decode(t, raw)
	if verdict != tcActRedirect || icmp.Proto != packet.ICMP || icmp.ICMPType != 3 || icmp.ICMPCode != 3 {
		t.Fatalf("UDP refusal: verdict %d, %+v", int32(verdict), icmp)
	}
	if !bytes.Equal(icmp.Payload, uin.IPv4Header()) {
		t.Errorf("ICMP quote %x, want %x", icmp.Payload, uin.IPv4Header())
	}
	// With IP options, the quote leaves them out and its header says so
	// (length and checksum), or the receiver would look for the ports
	// past the end of the quote.
	withOptions := uin
	withOptions.IPOptions = []byte{0x01, 0x01, 0x01, 0x00}
	f.expectCounters(map[string]uint64{"reject_icmp": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), withOptions.Bytes(), f.pod0)
	})
	icmp = decode(t, raw)
	if verdict != tcActRedirect || icmp.ICMPType != 3 || !bytes.Equal(icmp.Payload, uin.IPv4Header()) {
		t.Errorf("refusal of a datagram with IP options: verdict %d, quote %x, want %x",
			int32(verdict), icmp.Payload, uin.IPv4Header())
	}
}

// A pod's tracked TCP flow whose backend went away gets a RST, counted
// once, as rst_backend_gone.
func TestPodFlowToGoneBackendIsReset(t *testing.T) {
	f := newFixture(t)
	svc := clusterService(packet.TCP, 80, backendRemote1)
	f.program(svc)
	in := tcpFrame(podAddr, 34570, clusterIP, 80, packet.SYN, "")
	in.SrcMAC = localPodMAC
	if verdict, _ := f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0); verdict != tcActRedirect {
		t.Fatalf("first packet: verdict %d, want redirect", int32(verdict))
	}
	f.maps.DeleteBackend(51)
	f.program(service{svcID: svc.svcID, tableID: svc.tableID, frontends: svc.frontends})

	ack := in
	ack.Flags = packet.ACK
	var verdict uint32
	var raw []byte
	f.expectCounters(map[string]uint64{"rst_backend_gone": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), ack.Bytes(), f.pod0)
	})
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d, want the RST redirected back", int32(verdict))
	}
	if rst := decode(t, raw); rst.Flags&packet.RST == 0 || rst.Dst != podAddr {
		t.Fatalf("want a RST to the pod, got flags %#x to %s", rst.Flags, rst.Dst)
	}
}

// A pod reaching one backend through two ClusterIPs from one source port:
// the second flow's reply tuple is the first's (a pod's flows are not
// source-NATed), so its SYN is a counted drop and a packet mid-connection
// gets a RST back to the pod.
func TestPodFlowWithATakenReplyTupleIsReset(t *testing.T) {
	f := newFixture(t)
	svc := clusterService(packet.TCP, 80, backendRemote1)
	secondIP := netip.MustParseAddr("10.96.0.20")
	svc.frontends = append(svc.frontends, dataplane.FrontendKey{Addr: secondIP, Port: 80, Proto: packet.TCP})
	f.program(svc)
	first := tcpFrame(podAddr, 34580, clusterIP, 80, packet.SYN, "")
	first.SrcMAC = localPodMAC
	f.expectCounters(map[string]uint64{"new_flow": 1, "tc_redirect": 1}, func() {
		f.runTC(f.dp.PodProgram(), first.Bytes(), f.pod0)
	})

	second := first
	second.Dst = secondIP
	var synVerdict uint32
	f.expectCounters(map[string]uint64{"drop_reply_tuple_taken": 1}, func() {
		synVerdict, _ = f.runTC(f.dp.PodProgram(), second.Bytes(), f.pod0)
	})
	if synVerdict != tcActShot {
		t.Fatalf("SYN: verdict %d, want shot", int32(synVerdict))
	}
	second.Flags = packet.ACK
	var verdict uint32
	var raw []byte
	f.expectCounters(map[string]uint64{"rst_reply_tuple_taken": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), second.Bytes(), f.pod0)
	})
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d, want the RST redirected back", int32(verdict))
	}
	if rst := decode(t, raw); rst.Flags&packet.RST == 0 || rst.Dst != podAddr || rst.Src != secondIP {
		t.Fatalf("want a RST from %s to the pod, got flags %#x from %s to %s", secondIP, rst.Flags, rst.Src, rst.Dst)
	}

	// The first flow's reverse half is evicted and the second flow takes
	// the tuple: the first ends at its next check, with a RST too.
	replyTuple := xdp.NatKey{Saddr: xdp.AddrToNet(remotePod1), Sport: xdp.PortToNet(backendRemote1.Port),
		Daddr: xdp.AddrToNet(podAddr), Dport: xdp.PortToNet(first.SrcPort), Proto: packet.TCP}
	if err := f.deleteReverseByTuple(replyTuple); err != nil {
		t.Fatal(err)
	}
	second.Flags = packet.SYN
	f.expectCounters(map[string]uint64{"new_flow": 1, "tc_redirect": 1}, func() {
		f.runTC(f.dp.PodProgram(), second.Bytes(), f.pod0)
	})
	f.ageFlow(dataplane.FlowKey{Client: netip.AddrPortFrom(podAddr, first.SrcPort),
		Frontend: netip.AddrPortFrom(clusterIP, 80), Proto: packet.TCP})
	first.Flags = packet.ACK
	f.expectCounters(map[string]uint64{"rst_reply_tuple_taken": 1}, func() {
		verdict, raw = f.runTC(f.dp.PodProgram(), first.Bytes(), f.pod0)
	})
	if rst := decode(t, raw); verdict != tcActRedirect || rst.Flags&packet.RST == 0 || rst.Src != clusterIP {
		t.Fatalf("verdict %d, flags %#x from %s: want a RST from %s redirected back",
			int32(verdict), rst.Flags, rst.Src, clusterIP)
	}
}

func TestLocalBackendReplyToExternalClient(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	f.program(svc)
	in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "")
	in.SrcPort = findClientPort(t, svc, in, 3) // the local pod
	f.expectVerdict(f.run(in.Bytes(), f.nic0), xdpPass)
	reply := packet.Frame{SrcMAC: localPodMAC, Src: localPod, Dst: clientAddr, Proto: packet.TCP, TTL: 64,
		SrcPort: podPort, DstPort: in.SrcPort, Flags: packet.SYN | packet.ACK}
	verdict, raw := f.runTC(f.dp.PodProgram(), reply.Bytes(), f.pod0)
	if verdict != tcActRedirect {
		t.Fatalf("verdict %d", int32(verdict))
	}
	out := decode(t, raw)
	if out.Src != nodeAddr || out.SrcPort != nodePort || out.Dst != clientAddr || out.DstPort != in.SrcPort {
		t.Fatalf("reply %s:%d -> %s:%d, want it from the NodePort", out.Src, out.SrcPort, out.Dst, out.DstPort)
	}
}

func TestNICTranslatesOptionsAndFragments(t *testing.T) {
	f := newFixture(t)
	f.program(udpService())
	opts := udpFrame(clientAddr, 6001, nodeAddr, 30053, "with options")
	opts.IPOptions = []byte{0x01, 0x01, 0x01, 0x00}       // NOPs and end of list
	f.expectVerdict(f.run(opts.Bytes(), f.nic0), xdpPass) // XDP leaves it
	verdict, raw := f.runTC(f.dp.TCProgram(), opts.Bytes(), f.nic0)
	if verdict != tcActRedirect {
		t.Fatalf("options: verdict %d", int32(verdict))
	}
	out := decode(t, raw)
	if out.Dst.String()[:8] != "10.244.1" || out.DstPort != 53 || !bytes.Equal(out.IPOptions, opts.IPOptions) {
		t.Fatalf("options: %s:%d options %x", out.Dst, out.DstPort, out.IPOptions)
	}

	// A datagram in two fragments: both go to the same backend.
	firstBytes, second := udpFragments(clientAddr, 6002, nodeAddr, 30053, 4242)
	verdict, raw1 := f.runTC(f.dp.TCProgram(), firstBytes, f.nic0)
	if verdict != tcActRedirect {
		t.Fatalf("first fragment: verdict %d", int32(verdict))
	}
	f.expectCounters(map[string]uint64{"tc_fragment": 1, "tc_redirect": 1}, func() {
		verdict, raw = f.runTC(f.dp.TCProgram(), second, f.nic0)
	})
	if verdict != tcActRedirect {
		t.Fatalf("second fragment: verdict %d", int32(verdict))
	}
	d1, d2 := headerAddrs(raw1), headerAddrs(raw)
	if d1 != d2 {
		t.Fatalf("fragments translated differently: %v and %v", d1, d2)
	}
	if packet.Checksum(raw[14:34]) != 0 {
		t.Error("second fragment's IP checksum is wrong")
	}
}

// A first fragment the program leaves to the stack forgets what an
// earlier datagram with the same source, destination, IP id and protocol
// left in the fragments map, so the later fragments go to the stack with
// their first instead of being translated like the earlier datagram's.
// IP ids come round, and the later datagram may well be to a port no
// frontend uses (the node's own DNS, say): translated halves of it would
// reach a backend that never saw its first fragment, and the datagram
// would be lost.
func TestLaterFragmentsFollowTheirOwnFirstFragment(t *testing.T) {
	f := newFixture(t)
	f.program(udpService())
	f.program(clusterService(packet.UDP, 53, backendRemote1))
	for _, tc := range []struct {
		name            string
		prog            *ebpf.Program
		ifindex         int
		src, dst        netip.Addr
		served, unknown uint16 // a frontend's port on dst and one no frontend uses
	}{
		{"NIC", f.dp.TCProgram(), f.nic0, clientAddr, nodeAddr, 30053, 53},
		{"pod interface", f.dp.PodProgram(), f.pod0, podAddr, clusterIP, 53, 54},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			const id = 4242
			first, _ := udpFragments(tc.src, 6002, tc.dst, tc.served, id)
			if verdict, _ := f.runTC(tc.prog, first, tc.ifindex); verdict != tcActRedirect {
				t.Fatalf("first fragment to the frontend: verdict %d, want it translated", int32(verdict))
			}
			first, later := udpFragments(tc.src, 6003, tc.dst, tc.unknown, id)
			verdict, raw := f.runTC(tc.prog, first, tc.ifindex)
			if verdict != tcActUnspec || !bytes.Equal(raw, first) {
				t.Fatalf("first fragment to port %d: verdict %d, changed %v; want it left to the stack",
					tc.unknown, int32(verdict), !bytes.Equal(raw, first))
			}
			f.expectCounters(map[string]uint64{}, func() {
				verdict, raw = f.runTC(tc.prog, later, tc.ifindex)
			})
			if verdict != tcActUnspec || !bytes.Equal(raw, later) {
				t.Errorf("its later fragment: verdict %d, addresses %v (were %v); want it left to the stack untouched like its first",
					int32(verdict), headerAddrs(raw), headerAddrs(later))
			}
		})
	}
}

// udpFragments cuts a UDP datagram (IP id id) into a first fragment with
// the UDP header and 24 bytes of payload and a later one with the other
// 16. The UDP length and checksum cover the whole datagram: it is built
// whole, then cut.
func udpFragments(src netip.Addr, sport uint16, dst netip.Addr, dport, id uint16) (first, later []byte) {
	whole := udpFrame(src, sport, dst, dport, string(make([]byte, 40)))
	whole.ID = id
	b := whole.Bytes()
	first = append([]byte(nil), b[:14+20+8+24]...)
	setFragment(first, true, 0)
	later = append(append([]byte(nil), b[:14+20]...), b[14+20+8+24:]...)
	setFragment(later, false, 4) // offset 32 bytes = 4 units
	return first, later
}

// setFragment rewrites the fragment fields of a frame and its lengths.
func setFragment(b []byte, more bool, offset uint16) {
	ip := b[14:34]
	v := offset
	if more {
		v |= 0x2000
	}
	ip[6], ip[7] = byte(v>>8), byte(v)
	total := uint16(len(b) - 14)
	ip[2], ip[3] = byte(total>>8), byte(total)
	ip[10], ip[11] = 0, 0
	c := packet.Checksum(ip)
	ip[10], ip[11] = byte(c>>8), byte(c)
}

func headerAddrs(b []byte) [2]netip.Addr {
	return [2]netip.Addr{netip.AddrFrom4([4]byte(b[26:30])), netip.AddrFrom4([4]byte(b[30:34]))}
}

func TestTCLeavesOtherTrafficAlone(t *testing.T) {
	f := newFixture(t)
	f.program(webService())
	in := tcpFrame(podAddr, 1234, netip.MustParseAddr("8.8.8.8"), 443, packet.SYN, "")
	for _, prog := range []struct {
		name    string
		ifindex int
	}{{"pod", f.pod0}, {"nic", f.nic0}} {
		p := f.dp.PodProgram()
		if prog.name == "nic" {
			p = f.dp.TCProgram()
		}
		verdict, raw := f.runTC(p, in.Bytes(), prog.ifindex)
		if verdict != tcActUnspec || !bytes.Equal(raw, in.Bytes()) {
			t.Errorf("%s program: verdict %d, changed=%v; want untouched, next program", prog.name, int32(verdict), !bytes.Equal(raw, in.Bytes()))
		}
	}
}
