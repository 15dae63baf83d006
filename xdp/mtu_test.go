package xdp_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// A packet too big for the device it would leave by is answered with an
// ICMP fragmentation needed that quotes it as it arrived (DF set), so path
// MTU discovery works through the translation, or is translated and left
// to the stack to fragment (DF clear). Every way a flow's packets go out is
// checked: a new flow, a cached next hop, a fresh route lookup, replies.
func TestTooBigPacketsTellTheSenderTheMTU(t *testing.T) {
	const mtu = 1280
	big := strings.Repeat("x", mtu)         // 1320 bytes of IPv4
	exact := strings.Repeat("x", mtu-20-20) // exactly the MTU

	// client sends TCP to the NodePort; Maglev picks the remote backend 1.
	clientFrame := func(t *testing.T, flags uint8, payload string) packet.Frame {
		in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, flags, payload)
		in.SrcPort = findClientPort(t, webService(), in, 1)
		return in
	}
	// reply is the backend's answer to the SNATed frame that left.
	reply := func(sent packet.Frame, payload string) packet.Frame {
		return packet.Frame{SrcMAC: gwMAC, Src: sent.Dst, Dst: sent.Src, Proto: packet.TCP, TTL: 64,
			SrcPort: sent.DstPort, DstPort: sent.SrcPort, Flags: packet.ACK, Seq: 9000, Ack: 1001,
			Payload: []byte(payload), DontFrag: true}
	}

	// startFlow sends the client's SYN and returns the SNATed frame that left.
	startFlow := func(t *testing.T, f *fixture) packet.Frame {
		return decode(t, f.run(clientFrame(t, packet.SYN, "").Bytes(), f.nic0).out)
	}
	for _, tc := range []struct {
		name     string
		link     string // the device whose MTU drops to mtu
		setup    func(t *testing.T, f *fixture) (sent packet.Frame)
		packet   func(t *testing.T, f *fixture, sent packet.Frame) (in packet.Frame, ifindex int)
		verdict  uint32
		counters map[string]uint64
		from     netip.Addr // ICMP source; invalid: no ICMP expected
		// The SNAT address the flow keeps for its later packets: the
		// device's its backend is routed through, even when the first
		// packet was too big for it. Invalid: not checked.
		natAddr netip.Addr
	}{
		{
			name: "new flow",
			link: "nic1",
			packet: func(t *testing.T, f *fixture, _ packet.Frame) (packet.Frame, int) {
				return clientFrame(t, packet.SYN, big), f.nic0
			},
			verdict: xdpTX, counters: map[string]uint64{"new_flow": 1, "reject_too_big": 1}, from: nodeAddr,
			natAddr: nic1Addr,
		},
		{
			name:  "established flow, cached next hop",
			link:  "nic1",
			setup: startFlow,
			packet: func(t *testing.T, f *fixture, _ packet.Frame) (packet.Frame, int) {
				return clientFrame(t, packet.ACK, big), f.nic0
			},
			verdict: xdpTX, counters: map[string]uint64{"reject_too_big": 1}, from: nodeAddr,
		},
		{
			name:  "established flow, exactly the MTU",
			link:  "nic1",
			setup: startFlow,
			packet: func(t *testing.T, f *fixture, _ packet.Frame) (packet.Frame, int) {
				return clientFrame(t, packet.ACK, exact), f.nic0
			},
			verdict: xdpRedirect, counters: map[string]uint64{"redirect": 1},
		},
		{
			name: "new UDP flow, DF clear",
			link: "nic1",
			packet: func(t *testing.T, f *fixture, _ packet.Frame) (packet.Frame, int) {
				f.program(udpService())
				return udpFrame(clientAddr, 5000, nodeAddr, 30053, big), f.nic0
			},
			verdict: xdpPass, counters: map[string]uint64{"new_flow": 1, "pass_frag_needed": 1},
			natAddr: nic1Addr,
		},
		{
			name:  "reply, route looked up",
			link:  "nic0",
			setup: startFlow,
			packet: func(t *testing.T, f *fixture, sent packet.Frame) (packet.Frame, int) {
				return reply(sent, big), f.nic1
			},
			verdict: xdpTX, counters: map[string]uint64{"reverse_nat": 1, "reject_too_big": 1}, from: nic1Addr,
		},
		{
			name: "reply, cached next hop",
			link: "nic0",
			setup: func(t *testing.T, f *fixture) packet.Frame {
				sent := startFlow(t, f)
				f.expectVerdict(f.run(reply(sent, "").Bytes(), f.nic1), xdpRedirect)
				return sent
			},
			packet: func(t *testing.T, f *fixture, sent packet.Frame) (packet.Frame, int) {
				return reply(sent, big), f.nic1
			},
			verdict: xdpTX, counters: map[string]uint64{"reverse_nat": 1, "reject_too_big": 1}, from: nic1Addr,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(webService())
			f.ns.IP("link", "set", tc.link, "mtu", strconv.Itoa(mtu))
			var sent packet.Frame
			if tc.setup != nil {
				sent = tc.setup(t, f)
			}
			in, ifindex := tc.packet(t, f, sent)
			var r result
			f.expectCounters(tc.counters, func() { r = f.run(in.Bytes(), ifindex) })
			f.expectVerdict(r, tc.verdict)
			if tc.natAddr.IsValid() {
				if flow, ok := f.flow(flowKeyOf(in)); !ok || flow.NAT.Addr() != tc.natAddr {
					t.Errorf("flow tracked %v with SNAT address %s, want %s", ok, flow.NAT.Addr(), tc.natAddr)
				}
			}
			if !tc.from.IsValid() {
				out := decode(t, r.out)
				if len(out.Payload) != len(in.Payload) || out.Src == in.Src && out.Dst == in.Dst {
					t.Errorf("%s:%d -> %s:%d with %d bytes, want the packet translated whole",
						out.Src, out.SrcPort, out.Dst, out.DstPort, len(out.Payload))
				}
				return
			}
			out := decode(t, r.out)
			if out.Proto != packet.ICMP || out.ICMPType != 3 || out.ICMPCode != 4 {
				t.Fatalf("answer is proto %d type %d code %d, want ICMP fragmentation needed",
					out.Proto, out.ICMPType, out.ICMPCode)
			}
			if got := binary.BigEndian.Uint16(out.ICMPRest[2:4]); got != mtu {
				t.Errorf("next-hop MTU %d, want %d", got, mtu)
			}
			if out.Src != tc.from || out.Dst != in.Src {
				t.Errorf("ICMP %s -> %s, want %s -> %s", out.Src, out.Dst, tc.from, in.Src)
			}
			if !bytes.Equal(out.DstMAC, in.SrcMAC) {
				t.Errorf("ICMP to MAC %s, want the sender's %s", out.DstMAC, in.SrcMAC)
			}
			if !bytes.Equal(out.Payload, in.IPv4Header()) {
				t.Errorf("quote\n got %x\nwant the packet as it arrived %x", out.Payload, in.IPv4Header())
			}
		})
	}
}

// The TC programs answer too-big packets the same way: a pod's packet to a
// ClusterIP, and a remote backend's reply to it.
func TestTooBigPacketsThroughTCTellTheSenderTheMTU(t *testing.T) {
	const mtu = 1280
	big := strings.Repeat("x", mtu)
	podFrame := func(flags uint8, payload string) packet.Frame {
		in := tcpFrame(podAddr, 34567, clusterIP, 80, flags, payload)
		in.SrcMAC = localPodMAC
		return in
	}
	// startFlow sends the pod's SYN and returns the frame that left.
	startFlow := func(t *testing.T, f *fixture) packet.Frame {
		verdict, raw := f.runTC(f.dp.PodProgram(), podFrame(packet.SYN, "").Bytes(), f.pod0)
		if verdict != tcActRedirect {
			t.Fatalf("SYN verdict %d, want redirect", int32(verdict))
		}
		return decode(t, raw)
	}
	for _, tc := range []struct {
		name     string
		link     string // the device whose MTU drops to mtu
		setup    func(t *testing.T, f *fixture) (sent packet.Frame)
		packet   func(f *fixture, sent packet.Frame) (in packet.Frame, nic bool, ifindex int)
		counters map[string]uint64
		from     netip.Addr
	}{
		{
			name: "new flow from a pod",
			link: "nic1",
			packet: func(f *fixture, _ packet.Frame) (packet.Frame, bool, int) {
				return podFrame(packet.ACK, big), false, f.pod0
			},
			counters: map[string]uint64{"new_flow": 1, "reject_too_big": 1}, from: clusterIP,
		},
		{
			name:  "established flow from a pod, cached next hop",
			link:  "nic1",
			setup: startFlow,
			packet: func(f *fixture, _ packet.Frame) (packet.Frame, bool, int) {
				return podFrame(packet.ACK, big), false, f.pod0
			},
			counters: map[string]uint64{"reject_too_big": 1}, from: clusterIP,
		},
		{
			name:  "reply to a pod",
			link:  "pod0",
			setup: startFlow,
			packet: func(f *fixture, sent packet.Frame) (packet.Frame, bool, int) {
				return packet.Frame{SrcMAC: gwMAC, Src: sent.Dst, Dst: sent.Src, Proto: packet.TCP, TTL: 64,
					SrcPort: sent.DstPort, DstPort: sent.SrcPort, Flags: packet.ACK, Payload: []byte(big),
					DontFrag: true}, true, f.nic1
			},
			counters: map[string]uint64{"reverse_nat": 1, "reject_too_big": 1}, from: podAddr,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(clusterService(packet.TCP, 80, backendRemote1))
			f.ns.IP("link", "set", tc.link, "mtu", strconv.Itoa(mtu))
			var sent packet.Frame
			if tc.setup != nil {
				sent = tc.setup(t, f)
			}
			in, nic, ifindex := tc.packet(f, sent)
			prog := f.dp.PodProgram()
			if nic {
				prog = f.dp.TCProgram()
			}
			var verdict uint32
			var raw []byte
			f.expectCounters(tc.counters, func() { verdict, raw = f.runTC(prog, in.Bytes(), ifindex) })
			if verdict != tcActRedirect {
				t.Fatalf("verdict %d, want redirect (back where it came from)", int32(verdict))
			}
			out := decode(t, raw)
			if out.Proto != packet.ICMP || out.ICMPType != 3 || out.ICMPCode != 4 {
				t.Fatalf("answer is proto %d type %d code %d, want ICMP fragmentation needed",
					out.Proto, out.ICMPType, out.ICMPCode)
			}
			if got := binary.BigEndian.Uint16(out.ICMPRest[2:4]); got != mtu {
				t.Errorf("next-hop MTU %d, want %d", got, mtu)
			}
			if out.Src != tc.from || out.Dst != in.Src {
				t.Errorf("ICMP %s -> %s, want %s -> %s", out.Src, out.Dst, tc.from, in.Src)
			}
			if !bytes.Equal(out.Payload, in.IPv4Header()) {
				t.Errorf("quote\n got %x\nwant the packet as it arrived %x", out.Payload, in.IPv4Header())
			}
		})
	}
}

// answeredTooBig reports whether a frame is an ICMP fragmentation needed,
// and the MTU it gives.
func answeredTooBig(t *testing.T, raw []byte) (bool, uint16) {
	t.Helper()
	out := decode(t, raw)
	if out.Proto == packet.ICMP && out.ICMPType == 3 && out.ICMPCode == 4 {
		return true, binary.BigEndian.Uint16(out.ICMPRest[2:4])
	}
	return false, 0
}

// addL3Device gives the fixture a device without a link-layer header (a
// tun, like the IPIP or WireGuard devices of overlays) routing
// 10.244.3.0/24, with its neighbour entry made by sending through it.
func addL3Device(t *testing.T, f *fixture) {
	t.Helper()
	f.ns.IP("tuntap", "add", "dev", "tun0", "mode", "tun")
	f.ns.IP("link", "set", "tun0", "up")
	f.ns.IP("route", "add", "10.244.3.0/24", "dev", "tun0")
	err := f.ns.Do(func() error {
		c, err := net.Dial("udp4", "10.244.3.10:9")
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("x"))
		return err
	})
	if err != nil {
		t.Fatalf("send through tun0: %v", err)
	}
}

// What is measured against what: a packet is measured by its IPv4 length
// (an L3 device has no Ethernet header to count), against the route's MTU
// where a route is looked up, and a vanished device is no reason to answer.
func TestTooBigMeasuresTheRightThings(t *testing.T) {
	l3Backend := dataplane.Backend{Addr: netip.MustParseAddr("10.244.3.10"), Port: podPort}
	gone := dataplane.Backend{Addr: netip.MustParseAddr("10.244.4.10"), Port: podPort, Local: true}
	unresolved := dataplane.Backend{Addr: netip.MustParseAddr("10.244.2.10"), Port: podPort}
	full := strings.Repeat("x", 1500-40) // exactly a 1500 MTU
	big := strings.Repeat("x", 1280)     // 1320 bytes of IPv4

	podSend := func(f *fixture, payload string, flags uint8) (uint32, []byte) {
		in := tcpFrame(podAddr, 34567, clusterIP, 80, flags, payload)
		in.SrcMAC = localPodMAC
		return f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0)
	}
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, f *fixture)
		send    func(f *fixture) (verdict uint32, out []byte)
		tooBig  bool
		newFlow bool   // the packet starts its flow
		counter string // the counter the packet ends in
	}{
		{
			name: "XDP, cached hop on an L3 device, exactly its MTU",
			prepare: func(t *testing.T, f *fixture) {
				addL3Device(t, f)
				s := webService()
				s.backends, s.table = map[uint32]dataplane.Backend{1: l3Backend}, []uint32{1}
				f.program(s)
				f.run(tcpFrame(clientAddr, 41000, nodeAddr, nodePort, packet.SYN, "").Bytes(), f.nic0)
			},
			send: func(f *fixture) (uint32, []byte) {
				r := f.run(tcpFrame(clientAddr, 41000, nodeAddr, nodePort, packet.ACK, full).Bytes(), f.nic0)
				return r.verdict, r.out
			},
			counter: "pass_to_stack", // a tun is no XDP target
		},
		{
			name: "TC, new flow over an L3 device, exactly its MTU",
			prepare: func(t *testing.T, f *fixture) {
				addL3Device(t, f)
				f.program(clusterService(packet.TCP, 80, l3Backend))
			},
			send:    func(f *fixture) (uint32, []byte) { return podSend(f, full, packet.ACK) },
			newFlow: true, counter: "tc_redirect",
		},
		{
			name: "TC, cached hop on an L3 device, exactly its MTU",
			prepare: func(t *testing.T, f *fixture) {
				addL3Device(t, f)
				f.program(clusterService(packet.TCP, 80, l3Backend))
				podSend(f, "", packet.SYN)
			},
			send:    func(f *fixture) (uint32, []byte) { return podSend(f, full, packet.ACK) },
			counter: "tc_redirect",
		},
		{
			name: "XDP, new flow, route MTU below the device's",
			prepare: func(t *testing.T, f *fixture) {
				f.ns.IP("route", "replace", "10.244.1.0/24", "via", "10.1.0.2", "mtu", "lock", "1280")
				s := webService()
				s.backends, s.table = map[uint32]dataplane.Backend{1: backendRemote1}, []uint32{1}
				f.program(s)
			},
			send: func(f *fixture) (uint32, []byte) {
				r := f.run(tcpFrame(clientAddr, 41001, nodeAddr, nodePort, packet.SYN, big).Bytes(), f.nic0)
				return r.verdict, r.out
			},
			tooBig: true, newFlow: true, counter: "reject_too_big",
		},
		{
			name: "TC, new flow, route MTU below the device's",
			prepare: func(t *testing.T, f *fixture) {
				f.ns.IP("route", "replace", "10.244.1.0/24", "via", "10.1.0.2", "mtu", "lock", "1280")
				f.program(clusterService(packet.TCP, 80, backendRemote1))
			},
			send:   func(f *fixture) (uint32, []byte) { return podSend(f, big, packet.ACK) },
			tooBig: true, newFlow: true, counter: "reject_too_big",
		},
		{
			name: "TC, next hop unresolved",
			prepare: func(t *testing.T, f *fixture) {
				f.ns.IP("link", "set", "nic1", "mtu", "1280")
				f.program(clusterService(packet.TCP, 80, unresolved))
			},
			send:   func(f *fixture) (uint32, []byte) { return podSend(f, big, packet.ACK) },
			tooBig: true, newFlow: true, counter: "reject_too_big",
		},
		{
			name: "TC, cached hop's device gone",
			prepare: func(t *testing.T, f *fixture) {
				f.ns.IP("link", "add", "pod1", "type", "veth", "peer", "name", "pod1p")
				f.ns.IP("link", "set", "pod1p", "up")
				f.ns.IP("link", "set", "pod1", "up")
				f.ns.IP("route", "add", "10.244.4.0/24", "dev", "pod1")
				f.ns.IP("neigh", "add", "10.244.4.10", "lladdr", "02:0d:00:00:00:06", "dev", "pod1", "nud", "permanent")
				f.program(clusterService(packet.TCP, 80, gone))
				podSend(f, "", packet.SYN)
				f.ns.IP("link", "del", "pod1")
			},
			send:    func(f *fixture) (uint32, []byte) { return podSend(f, big, packet.ACK) },
			counter: "drop_no_route", // routed afresh: the route went with the device
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.prepare(t, f)
			want := map[string]uint64{tc.counter: 1}
			if tc.newFlow {
				want["new_flow"] = 1
			}
			var out []byte
			f.expectCounters(want, func() { _, out = tc.send(f) })
			if tooBig, mtu := answeredTooBig(t, out); tooBig != tc.tooBig {
				t.Errorf("answered with fragmentation needed: %v (MTU %d), want %v", tooBig, mtu, tc.tooBig)
			}
		})
	}
}
