package xdp_test

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

const (
	nodePort = 30080
	lbPort   = 80
	podPort  = 8080
	seed     = 0x5eed1b // loader.DefaultOptions().HashSeed
)

var (
	backendRemote1 = dataplane.Backend{Addr: remotePod1, Port: podPort}
	backendRemote2 = dataplane.Backend{Addr: remotePod2, Port: podPort}
	backendLocal   = dataplane.Backend{Addr: localPod, Port: podPort, Local: true}
)

// webService: NodePort 30080/TCP and LB 203.0.113.10:80/TCP, policy
// Cluster, two remote backends and a local one.
func webService() service {
	return service{
		svcID: 1, tableID: 1,
		frontends: []dataplane.FrontendKey{
			{Addr: nodeAddr, Port: nodePort, Proto: packet.TCP},
			{Addr: lbIP, Port: lbPort, Proto: packet.TCP},
		},
		flags:    dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
		backends: map[uint32]dataplane.Backend{1: backendRemote1, 2: backendRemote2, 3: backendLocal},
		table:    []uint32{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1},
	}
}

func tcpFrame(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, flags uint8, payload string) packet.Frame {
	return packet.Frame{
		SrcMAC: clientMAC, Src: src, Dst: dst, Proto: packet.TCP, TTL: 64,
		SrcPort: sport, DstPort: dport, Flags: flags, Seq: 1000, Ack: 5000,
		Payload: []byte(payload), DontFrag: true, ID: 7,
	}
}

func udpFrame(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, payload string) packet.Frame {
	return packet.Frame{
		SrcMAC: clientMAC, Src: src, Dst: dst, Proto: packet.UDP, TTL: 64,
		SrcPort: sport, DstPort: dport, Payload: []byte(payload),
	}
}

// expectedBackend is the Maglev slot the datapath must choose.
func expectedBackend(s service, fr packet.Frame) uint32 {
	h := xdp.FlowHash(netip.AddrPortFrom(fr.Src, fr.SrcPort), netip.AddrPortFrom(fr.Dst, fr.DstPort), fr.Proto, seed)
	return s.table[h%uint32(len(s.table))]
}

// findClientPort returns a client port whose flow hashes to the wanted
// backend id.
func findClientPort(t *testing.T, s service, fr packet.Frame, want uint32) uint16 {
	t.Helper()
	for p := uint16(20000); p < 30000; p++ {
		fr.SrcPort = p
		if expectedBackend(s, fr) == want {
			return p
		}
	}
	t.Fatalf("no client port maps to backend %d", want)
	return 0
}

func TestNonServicePassesUntouched(t *testing.T) {
	f := newFixture(t)
	f.program(webService())
	cases := []struct {
		name  string
		frame []byte
		stat  string
	}{
		{"tcp to another port", tcpFrame(clientAddr, 1234, nodeAddr, 22, packet.SYN, "").Bytes(), "pass_not_service"},
		{"udp to another address", udpFrame(clientAddr, 1234, netip.MustParseAddr("192.0.2.99"), nodePort, "x").Bytes(), "pass_not_service"},
		{"tcp to the SNAT range without state", tcpFrame(remotePod1, podPort, nic1Addr, snatMin+5, packet.ACK, "").Bytes(), "pass_not_service"},
		{"arp", append(append(append([]byte{}, packet.NodeMAC...), clientMAC...), 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1), "pass_not_ipv4"},
		{"icmp echo", packet.Frame{Src: clientAddr, Dst: nodeAddr, Proto: packet.ICMP, ICMPType: 8}.Bytes(), "pass_icmp"},
		{"gre", packet.Frame{Src: clientAddr, Dst: nodeAddr, Proto: 47, Payload: make([]byte, 8)}.Bytes(), "pass_not_service"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			f.expectCounters(map[string]uint64{tc.stat: 1}, func() {
				r := f.run(tc.frame, f.nic0)
				f.expectVerdict(r, xdpPass)
				if !bytes.Equal(r.out, tc.frame) {
					t.Fatalf("frame changed:\n got %x\nwant %x", r.out, tc.frame)
				}
			})
		})
	}
}

func TestUntranslatableFramesPassUntouched(t *testing.T) {
	f := newFixture(t)
	f.program(webService())
	withOptions := tcpFrame(clientAddr, 1234, nodeAddr, nodePort, packet.SYN, "")
	withOptions.IPOptions = []byte{0x94, 0x04, 0, 0} // router alert
	firstFragment := udpFrame(clientAddr, 1234, nodeAddr, nodePort, "frag")
	firstFragment.MoreFrags = true
	laterFragment := udpFrame(clientAddr, 1234, nodeAddr, nodePort, "frag")
	laterFragment.FragOffset = 185
	full := tcpFrame(clientAddr, 1234, nodeAddr, nodePort, packet.SYN, "")
	truncatedTCP := full.Bytes()[:14+20+10]
	badLength := full.Bytes()
	binary.BigEndian.PutUint16(badLength[14+2:], 1500) // total length beyond the frame
	shortIHL := full.Bytes()
	shortIHL[14] = 0x44
	// An ICMP header in the frame's padding, past the IPv4 total length.
	shortICMP := packet.Frame{Src: clientAddr, Dst: nodeAddr, Proto: packet.ICMP, ICMPType: 3}.Bytes()
	binary.BigEndian.PutUint16(shortICMP[14+2:], 20+4)

	cases := []struct {
		name  string
		frame []byte
		stat  string
	}{
		{"ip options", withOptions.Bytes(), "pass_ip_options"},
		{"first fragment", firstFragment.Bytes(), "pass_fragment"},
		{"later fragment", laterFragment.Bytes(), "pass_fragment"},
		{"truncated tcp header", truncatedTCP, "pass_malformed"},
		{"total length beyond frame", badLength, "pass_malformed"},
		{"ihl below 5", shortIHL, "pass_malformed"},
		{"icmp header past the total length", shortICMP, "pass_malformed"},
		{"ethernet header only", []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 0x08, 0x00}, "pass_malformed"},
		{"truncated ipv4", full.Bytes()[:14+12], "pass_malformed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			f.expectCounters(map[string]uint64{tc.stat: 1}, func() {
				r := f.run(tc.frame, f.nic0)
				f.expectVerdict(r, xdpPass)
				if !bytes.Equal(r.out, tc.frame) {
					t.Fatalf("frame changed:\n got %x\nwant %x", r.out, tc.frame)
				}
			})
		})
	}
	flows := 0
	if err := f.maps.Flows(func(dataplane.Flow) bool { flows++; return true }); err != nil {
		t.Fatal(err)
	}
	if flows != 0 {
		t.Fatalf("%d flows tracked for untranslatable frames", flows)
	}
}

func TestNewFlowToRemoteBackendIsSNATed(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	f.program(svc)
	in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "hello")
	in.SrcPort = findClientPort(t, svc, in, 2)

	var r result
	f.expectCounters(map[string]uint64{"new_flow": 1, "redirect": 1}, func() {
		r = f.run(in.Bytes(), f.nic0)
	})
	f.expectVerdict(r, xdpRedirect)
	out := decode(t, r.out)
	if out.Dst != remotePod2 || out.DstPort != podPort {
		t.Errorf("destination %s:%d, want %s:%d", out.Dst, out.DstPort, remotePod2, podPort)
	}
	if out.Src != nic1Addr {
		t.Errorf("source %s, want the egress address %s (SNAT)", out.Src, nic1Addr)
	}
	if out.SrcPort < snatMin || out.SrcPort > snatMax {
		t.Errorf("SNAT port %d outside %d-%d", out.SrcPort, snatMin, snatMax)
	}
	if !bytes.Equal(out.DstMAC, gwMAC) || !bytes.Equal(out.SrcMAC, f.nic1MAC) {
		t.Errorf("MACs %s -> %s, want %s -> %s", out.SrcMAC, out.DstMAC, f.nic1MAC, gwMAC)
	}
	if out.TTL != 63 {
		t.Errorf("TTL %d, want 63", out.TTL)
	}
	if string(out.Payload) != "hello" || out.Seq != in.Seq || out.Flags != in.Flags {
		t.Errorf("TCP payload or header changed: %+v", out)
	}

	flow, ok, err := f.maps.Flow(dataplane.FlowKey{
		Client: netip.AddrPortFrom(clientAddr, in.SrcPort), Frontend: netip.AddrPortFrom(nodeAddr, nodePort), Proto: packet.TCP,
	})
	if err != nil || !ok {
		t.Fatalf("flow not tracked: %v", err)
	}
	if flow.BackendID != 2 || flow.NAT != netip.AddrPortFrom(nic1Addr, out.SrcPort) {
		t.Errorf("tracked flow %+v", flow)
	}
	if sc, _ := f.maps.ServiceCounters(1); sc.NewFlows != 1 || sc.Packets != 1 {
		t.Errorf("service counters %+v, want 1 packet, 1 new flow", sc)
	}

	// The next packet of the flow keeps backend and SNAT port.
	next := in
	next.Flags = packet.ACK
	f.expectCounters(map[string]uint64{"redirect": 1}, func() {
		r = f.run(next.Bytes(), f.nic0)
	})
	out2 := decode(t, r.out)
	if out2.Dst != out.Dst || out2.SrcPort != out.SrcPort {
		t.Errorf("established packet went to %s:%d from port %d, first to %s:%d from %d",
			out2.Dst, out2.DstPort, out2.SrcPort, out.Dst, out.DstPort, out.SrcPort)
	}

	// The reply from the backend is translated back to the client.
	reply := packet.Frame{
		SrcMAC: gwMAC, Src: remotePod2, Dst: nic1Addr, Proto: packet.TCP, TTL: 64,
		SrcPort: podPort, DstPort: out.SrcPort, Flags: packet.SYN | packet.ACK, Seq: 9, Ack: 1001,
		Payload: []byte("world"),
	}
	f.expectCounters(map[string]uint64{"reverse_nat": 1, "redirect": 1}, func() {
		r = f.run(reply.Bytes(), f.nic1)
	})
	f.expectVerdict(r, xdpRedirect)
	back := decode(t, r.out)
	if back.Src != nodeAddr || back.SrcPort != nodePort || back.Dst != clientAddr || back.DstPort != in.SrcPort {
		t.Errorf("reply %s:%d -> %s:%d, want %s:%d -> %s:%d", back.Src, back.SrcPort, back.Dst, back.DstPort,
			nodeAddr, nodePort, clientAddr, in.SrcPort)
	}
	if !bytes.Equal(back.DstMAC, clientMAC) || !bytes.Equal(back.SrcMAC, f.nic0MAC) {
		t.Errorf("reply MACs %s -> %s", back.SrcMAC, back.DstMAC)
	}
	if string(back.Payload) != "world" {
		t.Errorf("reply payload %q", back.Payload)
	}
}

func TestMaglevChoiceFollowsTable(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	svc.backends[3] = dataplane.Backend{Addr: netip.MustParseAddr("10.244.1.12"), Port: podPort}
	f.program(svc)
	seen := map[netip.Addr]int{}
	for port := uint16(1000); port < 1100; port++ {
		in := tcpFrame(clientAddr, port, lbIP, lbPort, packet.SYN, "")
		r := f.run(in.Bytes(), f.nic0)
		f.expectVerdict(r, xdpRedirect)
		out := decode(t, r.out)
		want := svc.backends[expectedBackend(svc, in)]
		if out.Dst != want.Addr {
			t.Fatalf("port %d: backend %s, want %s", port, out.Dst, want.Addr)
		}
		seen[out.Dst]++
	}
	if len(seen) != 3 {
		t.Fatalf("100 flows reached %d backends, want 3: %v", len(seen), seen)
	}
}

func TestLocalBackendIsDNATedOnlyAndHandedOver(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	f.program(svc)
	in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "")
	in.SrcPort = findClientPort(t, svc, in, 3)
	var r result
	f.expectCounters(map[string]uint64{"new_flow": 1, "pass_to_stack": 1}, func() {
		r = f.run(in.Bytes(), f.nic0)
	})
	f.expectVerdict(r, xdpPass)
	out := decode(t, r.out)
	if out.Src != clientAddr || out.SrcPort != in.SrcPort {
		t.Errorf("client address rewritten to %s:%d; local backends keep it", out.Src, out.SrcPort)
	}
	if out.Dst != localPod || out.DstPort != podPort {
		t.Errorf("destination %s:%d, want %s:%d", out.Dst, out.DstPort, localPod, podPort)
	}
	// The stack must accept it: MACs untouched.
	if !bytes.Equal(out.DstMAC, in.Bytes()[0:6]) {
		t.Errorf("destination MAC rewritten for a packet passed to the stack")
	}
	ifindex, err := handoffIfindex(r.meta)
	if err != nil || ifindex != f.pod0 {
		t.Errorf("handoff to ifindex %d (%v), want pod0 %d", ifindex, err, f.pod0)
	}
}

func TestNoEndpointsRefusesTCPWithRST(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	svc.table = nil
	f.program(svc)
	cases := []struct {
		name     string
		flags    uint8
		payload  string
		wantSeq  uint32
		wantAck  uint32
		wantFlag uint8
	}{
		{"syn", packet.SYN, "", 0, 1001, packet.RST | packet.ACK},
		{"ack with data", packet.ACK | packet.PSH, "abc", 5000, 0, packet.RST},
		{"fin without ack", packet.FIN, "ab", 0, 1003, packet.RST | packet.ACK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			in := tcpFrame(farClient, 4321, lbIP, lbPort, tc.flags, tc.payload)
			var r result
			f.expectCounters(map[string]uint64{"reject_tcp": 1}, func() {
				r = f.run(in.Bytes(), f.nic0)
			})
			f.expectVerdict(r, xdpTX)
			out := decode(t, r.out)
			if len(r.out) != 54 {
				t.Errorf("RST frame is %d bytes, want 54", len(r.out))
			}
			if out.Src != lbIP || out.Dst != farClient || out.SrcPort != lbPort || out.DstPort != 4321 {
				t.Errorf("RST %s:%d -> %s:%d", out.Src, out.SrcPort, out.Dst, out.DstPort)
			}
			if out.Flags != tc.wantFlag || out.Seq != tc.wantSeq || out.Ack != tc.wantAck {
				t.Errorf("RST flags %#x seq %d ack %d, want %#x %d %d", out.Flags, out.Seq, out.Ack,
					tc.wantFlag, tc.wantSeq, tc.wantAck)
			}
			if !bytes.Equal(out.DstMAC, clientMAC) || !bytes.Equal(out.SrcMAC, packet.NodeMAC) {
				t.Errorf("RST MACs %s -> %s", out.SrcMAC, out.DstMAC)
			}
			if len(out.Payload) != 0 {
				t.Errorf("RST carries %d payload bytes", len(out.Payload))
			}
		})
	}
	t.Run("rst is not answered", func(t *testing.T) {
		f.t = t
		var r result
		f.expectCounters(map[string]uint64{"drop_client_rst": 1}, func() {
			r = f.run(tcpFrame(farClient, 4321, lbIP, lbPort, packet.RST, "").Bytes(), f.nic0)
		})
		f.expectVerdict(r, xdpDrop)
	})
}

func TestNoEndpointsRefusesUDPWithICMP(t *testing.T) {
	f := newFixture(t)
	f.program(service{
		svcID: 2, tableID: 2,
		frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30053, Proto: packet.UDP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
	})
	in := udpFrame(clientAddr, 5353, nodeAddr, 30053, "query-bytes-here")
	var r result
	f.expectCounters(map[string]uint64{"reject_icmp": 1}, func() {
		r = f.run(in.Bytes(), f.nic0)
	})
	f.expectVerdict(r, xdpTX)
	out := decode(t, r.out)
	if out.Proto != packet.ICMP || out.ICMPType != 3 || out.ICMPCode != 3 {
		t.Fatalf("reply is proto %d type %d code %d, want ICMP port unreachable", out.Proto, out.ICMPType, out.ICMPCode)
	}
	if out.Src != nodeAddr || out.Dst != clientAddr {
		t.Errorf("ICMP %s -> %s", out.Src, out.Dst)
	}
	if !bytes.Equal(out.Payload, in.IPv4Header()) {
		t.Errorf("ICMP quote\n got %x\nwant %x", out.Payload, in.IPv4Header())
	}
	if !bytes.Equal(out.DstMAC, clientMAC) {
		t.Errorf("ICMP to MAC %s, want %s", out.DstMAC, clientMAC)
	}
}

func TestPolicyLocalWithoutLocalBackendDrops(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	svc.table = nil
	svc.flags = dataplane.FrontendExternal | dataplane.FrontendDropIfEmpty
	f.program(svc)
	f.expectCounters(map[string]uint64{"drop_no_local_backend": 1}, func() {
		f.expectVerdict(f.run(tcpFrame(clientAddr, 1111, nodeAddr, nodePort, packet.SYN, "").Bytes(), f.nic0), xdpDrop)
	})
}

func TestSourceRanges(t *testing.T) {
	f := newFixture(t)
	svc := webService()
	svc.flags |= dataplane.FrontendSourceRanges
	f.program(svc)
	if err := f.maps.PutSourceRange(svc.svcID, netip.MustParsePrefix("198.51.100.0/28")); err != nil {
		t.Fatal(err)
	}
	// Another service's range must not open this one.
	if err := f.maps.PutSourceRange(99, netip.MustParsePrefix("192.0.2.0/24")); err != nil {
		t.Fatal(err)
	}
	f.expectCounters(map[string]uint64{"new_flow": 1, "redirect": 1, "tx": 0, "pass_to_stack": 0}, func() {
		in := tcpFrame(farClient, 0, lbIP, lbPort, packet.SYN, "")
		in.SrcPort = findClientPort(t, svc, in, 1)
		f.expectVerdict(f.run(in.Bytes(), f.nic0), xdpRedirect)
	})
	f.expectCounters(map[string]uint64{"drop_source_range": 1}, func() {
		f.expectVerdict(f.run(tcpFrame(clientAddr, 2222, lbIP, lbPort, packet.SYN, "").Bytes(), f.nic0), xdpDrop)
	})
}
