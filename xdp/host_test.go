package xdp_test

import (
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// hostBackend is a hostNetwork endpoint on the fixture node: it listens on
// the node's own address.
var hostBackend = dataplane.Backend{Addr: nodeAddr, Port: 8443, Local: true, Host: true}

// TestBackendAtANodeAddress follows flows to a backend at an address of
// this node through every hook: the packets are translated and handed to
// the stack (no route lookup, which would answer "not forwarded" for a
// local address), and the node's replies are translated back by the host
// reply program on their way out, through the NIC to a client outside and
// through a pod interface to a pod here.
func TestBackendAtANodeAddress(t *testing.T) {
	f := newFixture(t)
	const lbPort = 443
	f.program(service{
		svcID: 7, tableID: 7,
		frontends: []dataplane.FrontendKey{
			{Addr: nodeAddr, Port: 30202, Proto: packet.TCP},
			{Addr: lbIP, Port: lbPort, Proto: packet.TCP},
			{Addr: clusterIP, Port: lbPort, Proto: packet.TCP},
		},
		flags:    dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
		backends: map[uint32]dataplane.Backend{33: hostBackend},
		table:    []uint32{33},
	})
	if err := f.maps.SetHostBackendPorts([]uint16{hostBackend.Port}); err != nil {
		t.Fatal(err)
	}
	hostReply := f.dp.HostReplyProgram()

	// reply is the host's packet back to a client of the flow in.
	reply := func(in packet.Frame, flags uint8, payload string) packet.Frame {
		return packet.Frame{
			SrcMAC: f.nic0MAC, DstMAC: in.SrcMAC, Src: hostBackend.Addr, Dst: in.Src, Proto: in.Proto, TTL: 64,
			SrcPort: hostBackend.Port, DstPort: in.SrcPort, Flags: flags, Seq: 9000, Ack: in.Seq + 1,
			Payload: []byte(payload), DontFrag: true, ID: 99,
		}
	}
	expectToHost := func(t *testing.T, out, in packet.Frame) {
		t.Helper()
		if out.Src != in.Src || out.SrcPort != in.SrcPort || out.Dst != hostBackend.Addr ||
			out.DstPort != hostBackend.Port || string(out.Payload) != string(in.Payload) {
			t.Errorf("to the host as %s:%d -> %s:%d %q, want %s:%d -> %s",
				out.Src, out.SrcPort, out.Dst, out.DstPort, out.Payload, in.Src, in.SrcPort, hostBackend)
		}
		if out.TTL != in.TTL {
			t.Errorf("TTL %d, want %d: delivered, not forwarded", out.TTL, in.TTL)
		}
	}
	expectFromFrontend := func(t *testing.T, verdict uint32, raw []byte, r packet.Frame, fe netip.AddrPort) {
		t.Helper()
		if verdict != tcActOK {
			t.Fatalf("host reply verdict %d, want TC_ACT_OK", int32(verdict))
		}
		out := decode(t, raw)
		if netip.AddrPortFrom(out.Src, out.SrcPort) != fe || out.Dst != r.Dst || out.DstPort != r.DstPort ||
			string(out.Payload) != string(r.Payload) {
			t.Errorf("reply left as %s:%d -> %s:%d %q, want %s -> %s:%d", out.Src, out.SrcPort, out.Dst,
				out.DstPort, out.Payload, fe, r.Dst, r.DstPort)
		}
	}

	for _, tc := range []struct {
		name       string
		frontend   netip.AddrPort
		clientPort uint16
	}{
		{"NodePort", netip.AddrPortFrom(nodeAddr, 30202), 7004},
		{"LoadBalancer IP", netip.AddrPortFrom(lbIP, lbPort), 7008},
	} {
		t.Run(tc.name+" from outside through XDP", func(t *testing.T) {
			f.t = t
			syn := tcpFrame(clientAddr, tc.clientPort, tc.frontend.Addr(), tc.frontend.Port(), packet.SYN, "")
			var r result
			f.expectCounters(map[string]uint64{"pass_to_host": 1, "new_flow": 1, "drop_no_route": 0}, func() {
				r = f.run(syn.Bytes(), f.nic0)
			})
			f.expectVerdict(r, xdpPass)
			expectToHost(t, decode(t, r.out), syn)

			synAck := reply(syn, packet.SYN|packet.ACK, "")
			f.expectCounters(map[string]uint64{"host_reply": 1}, func() {
				verdict, raw := f.runTC(hostReply, synAck.Bytes(), f.nic0)
				expectFromFrontend(t, verdict, raw, synAck, tc.frontend)
			})

			// The tracked flow: the same way, without a new entry.
			ack := tcpFrame(clientAddr, tc.clientPort, tc.frontend.Addr(), tc.frontend.Port(), packet.ACK, "GET /")
			// Its handshake done, the flow is confirmed.
			f.expectCounters(map[string]uint64{"pass_to_host": 1, "new_flow": 0, "ct_confirmed": 1}, func() {
				r = f.run(ack.Bytes(), f.nic0)
			})
			f.expectVerdict(r, xdpPass)
			expectToHost(t, decode(t, r.out), ack)
		})
	}

	t.Run("from outside through TC (XDP off)", func(t *testing.T) {
		f.t = t
		syn := tcpFrame(clientAddr, 7005, nodeAddr, 30202, packet.SYN, "")
		f.expectCounters(map[string]uint64{"pass_to_host": 1, "new_flow": 1}, func() {
			verdict, raw := f.runTC(f.dp.TCProgram(), syn.Bytes(), f.nic0)
			if verdict != tcActOK {
				t.Fatalf("verdict %d, want TC_ACT_OK", int32(verdict))
			}
			expectToHost(t, decode(t, raw), syn)
		})
	})

	t.Run("from a pod here to the ClusterIP", func(t *testing.T) {
		f.t = t
		syn := tcpFrame(podAddr, 34000, clusterIP, lbPort, packet.SYN, "")
		syn.SrcMAC = localPodMAC
		f.expectCounters(map[string]uint64{"pass_to_host": 1, "new_flow": 1}, func() {
			verdict, raw := f.runTC(f.dp.PodProgram(), syn.Bytes(), f.pod0)
			if verdict != tcActOK {
				t.Fatalf("verdict %d, want TC_ACT_OK", int32(verdict))
			}
			expectToHost(t, decode(t, raw), syn)
		})
		synAck := reply(syn, packet.SYN|packet.ACK, "")
		f.expectCounters(map[string]uint64{"host_reply": 1}, func() {
			verdict, raw := f.runTC(hostReply, synAck.Bytes(), f.pod0)
			expectFromFrontend(t, verdict, raw, synAck, netip.AddrPortFrom(clusterIP, lbPort))
		})
	})

	t.Run("the host's other packets leave untouched", func(t *testing.T) {
		f.t = t
		syn := tcpFrame(clientAddr, 7006, nodeAddr, 30202, packet.SYN, "")
		f.run(syn.Bytes(), f.nic0)
		for _, tc := range []struct {
			name  string
			frame packet.Frame
		}{
			{"from the backend's port to no client of it", reply(tcpFrame(farClient, 7006, nodeAddr, 30202, packet.SYN, ""), packet.ACK, "x")},
			{"from another port", func() packet.Frame {
				r := reply(syn, packet.ACK, "x")
				r.SrcPort = 22
				return r
			}()},
			{"UDP from the backend's port", func() packet.Frame {
				r := udpFrame(nodeAddr, hostBackend.Port, clientAddr, 7006, "x")
				r.SrcMAC = f.nic0MAC
				return r
			}()},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f.t = t
				f.expectCounters(map[string]uint64{"host_reply": 0}, func() {
					verdict, raw := f.runTC(hostReply, tc.frame.Bytes(), f.nic0)
					if verdict != tcActUnspec || !sameBytes(raw, tc.frame.Bytes()) {
						t.Errorf("verdict %d, changed %v; want TC_ACT_UNSPEC, untouched", int32(verdict),
							!sameBytes(raw, tc.frame.Bytes()))
					}
				})
			})
		}
	})

	// A router near the client reports a reply too big for its way on:
	// the error reaches the host, quoting the reply as the host sent it,
	// so path MTU discovery works through the translation.
	for _, tc := range []struct {
		name string
		run  func(icmp packet.Frame) (pass bool, out []byte)
	}{
		{"XDP", func(icmp packet.Frame) (bool, []byte) {
			r := f.run(icmp.Bytes(), f.nic0)
			return r.verdict == xdpPass, r.out
		}},
		{"TC (XDP off)", func(icmp packet.Frame) (bool, []byte) {
			verdict, raw := f.runTC(f.dp.TCProgram(), icmp.Bytes(), f.nic0)
			return verdict == tcActOK, raw
		}},
	} {
		t.Run("ICMP error about a reply, "+tc.name, func(t *testing.T) {
			f.t = t
			syn := tcpFrame(clientAddr, 7011, lbIP, lbPort, packet.SYN, "")
			f.run(syn.Bytes(), f.nic0)
			router := netip.MustParseAddr("192.0.2.254")
			icmp := icmpError(gw0MAC, router, lbIP, 4, replyOf(syn))
			var pass bool
			var raw []byte
			f.expectCounters(map[string]uint64{"icmp_translated": 1, "pass_to_host": 1}, func() {
				pass, raw = tc.run(icmp)
			})
			if !pass {
				t.Fatal("the error was not handed to the stack")
			}
			out := decode(t, raw)
			if out.Src != router || out.Dst != hostBackend.Addr {
				t.Errorf("error %s -> %s, want %s -> %s", out.Src, out.Dst, router, hostBackend.Addr)
			}
			if src, dst := quoteOf(t, out); src != netip.AddrPortFrom(hostBackend.Addr, hostBackend.Port) ||
				dst != netip.AddrPortFrom(clientAddr, 7011) {
				t.Errorf("quote %s -> %s, want the host's own reply %s -> %s:7011", src, dst, hostBackend, clientAddr)
			}
		})
	}

	t.Run("fragments of a reply", func(t *testing.T) {
		f.t = t
		query := udpFrame(clientAddr, 7012, lbIP, lbPort, "q")
		f.program(service{
			svcID: 10, tableID: 10,
			frontends: []dataplane.FrontendKey{{Addr: lbIP, Port: lbPort, Proto: packet.UDP}},
			flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
			backends:  map[uint32]dataplane.Backend{33: hostBackend},
			table:     []uint32{33},
		})
		f.expectVerdict(f.run(query.Bytes(), f.nic0), xdpPass)
		fragment := func(sport uint16, offset uint16, more bool) packet.Frame {
			fr := udpFrame(hostBackend.Addr, sport, clientAddr, 7012, "part of a large answer")
			fr.SrcMAC, fr.ID, fr.MoreFrags, fr.FragOffset = f.nic0MAC, 4242, more, offset
			return fr
		}
		// A later fragment carries no UDP header to verify: read its
		// source from the IPv4 header, whose checksum must hold.
		source := func(raw []byte) netip.Addr {
			t.Helper()
			if len(raw) < 34 || packet.Checksum(raw[14:34]) != 0 {
				t.Fatalf("fragment's IPv4 header broken: %x", raw)
			}
			return netip.AddrFrom4([4]byte(raw[26:30]))
		}
		send := func(fr packet.Frame) (uint32, []byte) {
			return f.runTC(hostReply, fr.Bytes(), f.nic0)
		}
		first := fragment(hostBackend.Port, 0, true)
		if verdict, raw := send(first); verdict != tcActOK || decode(t, raw).Src != lbIP {
			t.Fatalf("first fragment: verdict %d, want it from %s", int32(verdict), lbIP)
		}
		later := fragment(hostBackend.Port, 8, false)
		if verdict, raw := send(later); verdict != tcActOK || source(raw) != lbIP {
			t.Errorf("later fragment: verdict %d, want it from %s like its first", int32(verdict), lbIP)
		}
		// The same datagram id again, from a port no backend has: its
		// fragments are the host's own and leave untouched.
		other := fragment(5000, 0, true)
		if verdict, raw := send(other); verdict != tcActUnspec || !sameBytes(raw, other.Bytes()) {
			t.Errorf("first fragment of another datagram: verdict %d, changed", int32(verdict))
		}
		if verdict, raw := send(later); verdict != tcActUnspec || !sameBytes(raw, later.Bytes()) {
			t.Errorf("later fragment of another datagram: verdict %d, changed %v", int32(verdict),
				!sameBytes(raw, later.Bytes()))
		}
	})

	t.Run("a SYN-ACK of a flow no longer tracked is the host's own", func(t *testing.T) {
		f.t = t
		syn := tcpFrame(clientAddr, 7013, nodeAddr, 30202, packet.SYN, "")
		f.run(syn.Bytes(), f.nic0)
		key := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7013),
			Frontend: netip.AddrPortFrom(nodeAddr, 30202), Proto: packet.TCP}
		f.evictFlow(key) // the forward half only
		// The client now connects to the node address directly.
		synAck := reply(syn, packet.SYN|packet.ACK, "")
		f.expectCounters(map[string]uint64{"host_reply": 0}, func() {
			verdict, raw := f.runTC(hostReply, synAck.Bytes(), f.nic0)
			if verdict != tcActUnspec || !sameBytes(raw, synAck.Bytes()) {
				t.Errorf("verdict %d: an answer to a direct connection was translated", int32(verdict))
			}
		})
	})

	t.Run("replies of a port not marked are not looked for", func(t *testing.T) {
		f.t = t
		syn := tcpFrame(clientAddr, 7007, nodeAddr, 30202, packet.SYN, "")
		f.run(syn.Bytes(), f.nic0)
		if err := f.maps.SetHostBackendPorts(nil); err != nil {
			t.Fatal(err)
		}
		defer f.maps.SetHostBackendPorts([]uint16{hostBackend.Port})
		synAck := reply(syn, packet.SYN|packet.ACK, "")
		verdict, raw := f.runTC(hostReply, synAck.Bytes(), f.nic0)
		if verdict != tcActUnspec || !sameBytes(raw, synAck.Bytes()) {
			t.Errorf("verdict %d: a reply from an unmarked port was translated", int32(verdict))
		}
	})
}

// TestHostReplyLeavesPodBackendsAlone: the reply of a pod backend on this
// node (translated by the pod program as it leaves the pod) is not the
// host's, even from a port a host backend uses, and passes the NIC's
// egress untouched if it ever gets there untranslated.
func TestHostReplyLeavesPodBackendsAlone(t *testing.T) {
	f := newFixture(t)
	podBackend := dataplane.Backend{Addr: localPod, Port: hostBackend.Port, Local: true}
	f.program(service{
		svcID: 8, tableID: 8,
		frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30203, Proto: packet.TCP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
		backends:  map[uint32]dataplane.Backend{34: podBackend},
		table:     []uint32{34},
	})
	if err := f.maps.SetHostBackendPorts([]uint16{podBackend.Port}); err != nil {
		t.Fatal(err)
	}
	syn := tcpFrame(clientAddr, 7010, nodeAddr, 30203, packet.SYN, "")
	f.expectCounters(map[string]uint64{"new_flow": 1, "pass_to_stack": 1, "pass_to_host": 0}, func() {
		f.run(syn.Bytes(), f.nic0)
	})
	synAck := packet.Frame{SrcMAC: localPodMAC, Src: localPod, Dst: clientAddr, Proto: packet.TCP, TTL: 64,
		SrcPort: podBackend.Port, DstPort: 7010, Flags: packet.SYN | packet.ACK, Seq: 1, Ack: 1001}
	verdict, raw := f.runTC(f.dp.HostReplyProgram(), synAck.Bytes(), f.nic0)
	if verdict != tcActUnspec || !sameBytes(raw, synAck.Bytes()) {
		t.Errorf("verdict %d: a pod backend's reply was taken for the host's", int32(verdict))
	}
}

// The node's own ICMP errors about packets of live translated flows that
// it received leave translated by the host reply program: a host
// backend's port unreachable, a local pod's host unreachable. The client
// gets them about the packet it sent, to the frontend; from the frontend
// when the backend itself answers. Other ICMP leaves untouched, and so do
// errors about flows that ended.
func TestNodeICMPErrorsAboutTranslatedFlows(t *testing.T) {
	f := newFixture(t)
	hostDNS := dataplane.Backend{Addr: nodeAddr, Port: 5353, Local: true, Host: true}
	f.program(webService())
	f.program(service{
		svcID: 9, tableID: 9,
		frontends: []dataplane.FrontendKey{{Addr: lbIP, Port: 53, Proto: packet.UDP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
		backends:  map[uint32]dataplane.Backend{40: hostDNS},
		table:     []uint32{40},
	})
	hostReply := f.dp.HostReplyProgram()

	toHost := udpFrame(clientAddr, 7100, lbIP, 53, "query")
	toPod := tcpFrame(clientAddr, 0, lbIP, lbPort, packet.SYN, "")
	toPod.SrcPort = findClientPort(t, webService(), toPod, 3) // the local pod
	ended := udpFrame(clientAddr, 7102, lbIP, 53, "query")
	for _, in := range []packet.Frame{toHost, toPod, ended} {
		if r := f.run(in.Bytes(), f.nic0); r.verdict != xdpPass {
			t.Fatalf("%s:%d -> %s:%d: verdict %s, want PASS to the stack", in.Src, in.SrcPort, in.Dst, in.DstPort,
				verdictName(r.verdict))
		}
	}
	// What the node's stack received.
	deliveredToHost := toHost
	deliveredToHost.Dst, deliveredToHost.DstPort = hostDNS.Addr, hostDNS.Port
	deliveredToPod := toPod
	deliveredToPod.Dst, deliveredToPod.DstPort = localPod, podPort
	// A flow that ended (its conntrack entry evicted; its reverse half
	// lingers): the client may now talk to the node's address directly.
	deliveredEnded := ended
	deliveredEnded.Dst, deliveredEnded.DstPort = hostDNS.Addr, hostDNS.Port
	f.evictFlow(dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, 7102),
		Frontend: netip.AddrPortFrom(lbIP, 53), Proto: packet.UDP})

	for _, tc := range []struct {
		name string
		icmp packet.Frame
		want icmpWant
	}{
		{"port unreachable from a host backend",
			icmpError(f.nic0MAC, nodeAddr, clientAddr, 3, deliveredToHost),
			icmpWant{from: lbIP, to: clientAddr, qsrc: netip.AddrPortFrom(clientAddr, 7100),
				qdst: netip.AddrPortFrom(lbIP, 53)}},
		{"host unreachable for a local pod, from the node's own address",
			icmpError(f.nic0MAC, nodeAddr, clientAddr, 1, deliveredToPod),
			icmpWant{from: nodeAddr, to: clientAddr, qsrc: netip.AddrPortFrom(clientAddr, toPod.SrcPort),
				qdst: netip.AddrPortFrom(lbIP, lbPort)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.t = t
			var verdict uint32
			var raw []byte
			f.expectCounters(map[string]uint64{"icmp_translated": 1}, func() {
				verdict, raw = f.runTC(hostReply, tc.icmp.Bytes(), f.nic0)
			})
			if verdict != tcActOK {
				t.Fatalf("verdict %d, want TC_ACT_OK", int32(verdict))
			}
			expectTranslatedICMP(t, raw, tc.icmp, tc.want)
		})
	}

	untracked := deliveredToHost
	untracked.SrcPort = 7101
	for _, tc := range []struct {
		name string
		icmp packet.Frame
	}{
		{"an error about an untracked packet", icmpError(f.nic0MAC, nodeAddr, clientAddr, 3, untracked)},
		{"an error about a packet of a flow that ended", icmpError(f.nic0MAC, nodeAddr, clientAddr, 3, deliveredEnded)},
		{"an echo reply", packet.Frame{SrcMAC: f.nic0MAC, Src: nodeAddr, Dst: clientAddr, Proto: packet.ICMP, TTL: 64,
			ICMPType: 0, Payload: []byte("ping")}},
	} {
		t.Run(tc.name+" leaves untouched", func(t *testing.T) {
			f.t = t
			f.expectCounters(map[string]uint64{}, func() {
				verdict, raw := f.runTC(hostReply, tc.icmp.Bytes(), f.nic0)
				if verdict != tcActUnspec || !sameBytes(raw, tc.icmp.Bytes()) {
					t.Errorf("verdict %d, changed %v; want TC_ACT_UNSPEC, untouched", int32(verdict),
						!sameBytes(raw, tc.icmp.Bytes()))
				}
			})
		})
	}
}

// The host reply program runs on every packet the node sends, and TCP
// keeps a clone of each segment it sends: a program that writes packet
// data directly gets a prologue from the kernel that un-clones (copies)
// every cloned packet first. The host reply program writes only through
// helpers, so it has none. The pod program, which writes directly, shows
// what the prologue looks like: a byte load of the skb's cloned bit from
// the context, masked and tested, then a call to bpf_skb_pull_data.
func TestHostReplyNeverUnclonesPackets(t *testing.T) {
	f := newFixture(t)
	unclones := func(p *ebpf.Program) bool {
		t.Helper()
		info, err := p.Info()
		if err != nil {
			t.Fatal(err)
		}
		insns, err := info.Instructions()
		if err != nil {
			t.Fatal(err)
		}
		return len(insns) > 2 && insns[0].OpCode == asm.LoadMemOp(asm.Byte) && insns[0].Src == asm.R1 &&
			insns[1].OpCode.ALUOp() == asm.And && insns[2].OpCode.JumpOp() == asm.JEq
	}
	if !unclones(f.dp.PodProgram()) {
		t.Fatal("the pod program shows no un-clone prologue: the check below cannot tell")
	}
	if unclones(f.dp.HostReplyProgram()) {
		t.Error("the host reply program un-clones every packet it runs on: it writes packet data directly")
	}
}
