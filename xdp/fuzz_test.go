package xdp_test

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/tests/packet"
)

// FuzzXDP feeds arbitrary frames to the XDP program, arriving on the
// client-facing or the node-facing NIC, and checks the invariants:
//   - the program never aborts;
//   - a frame it leaves alone (any pass_* counter other than the two
//     hand-overs of translated frames) comes out byte for byte the same;
//   - a translated frame that was valid going in is valid coming out:
//     checksums verify, and a frame towards a backend goes to one of the
//     service's backends with its payload unchanged.
func FuzzXDP(f *testing.F) {
	web := webService()
	dns := udpService()
	seeds := [][]byte{
		tcpFrame(clientAddr, 1234, nodeAddr, nodePort, packet.SYN, "").Bytes(),
		tcpFrame(clientAddr, 1234, nodeAddr, nodePort, packet.ACK|packet.PSH, "GET / HTTP/1.1").Bytes(),
		tcpFrame(farClient, 999, lbIP, lbPort, packet.SYN, "").Bytes(),
		udpFrame(clientAddr, 5353, nodeAddr, 30053, "query").Bytes(),
		tcpFrame(remotePod1, podPort, nic1Addr, snatMin+3, packet.ACK, "reply").Bytes(),
		tcpFrame(clientAddr, 1234, nodeAddr, 22, packet.SYN, "").Bytes(),
		packet.Frame{Src: remotePod1, Dst: nic1Addr, Proto: packet.ICMP, ICMPType: 3, ICMPCode: 4,
			Payload: tcpFrame(nic1Addr, snatMin+3, remotePod1, podPort, packet.ACK, "").IPv4Header()}.Bytes(),
	}
	for i, s := range seeds {
		f.Add(s, uint8(i%2))
	}

	fx := newFixtureSized(f, 4096, 256)
	fx.program(web)
	fx.program(dns)
	backends := map[netip.Addr]bool{}
	for _, b := range web.backends {
		backends[b.Addr] = true
	}
	for _, b := range dns.backends {
		backends[b.Addr] = true
	}
	untouched := []string{"pass_not_ipv4", "pass_not_service", "pass_ip_options", "pass_fragment",
		"pass_malformed", "pass_internal", "pass_icmp"}

	f.Fuzz(func(t *testing.T, frame []byte, onNIC1 uint8) {
		if len(frame) < 14 || len(frame) > 1514 {
			return
		}
		fx.t = t
		ifindex := fx.nic0
		if onNIC1%2 == 1 {
			ifindex = fx.nic1
		}
		before := fx.counters()
		r := fx.run(frame, ifindex)
		after := fx.counters()
		expectUniqueReplyTuples(t, fx)
		if r.verdict == xdpAborted || r.verdict > xdpRedirect {
			t.Fatalf("verdict %d", r.verdict)
		}
		for _, name := range untouched {
			if after[name] != before[name] {
				if !bytes.Equal(r.out, frame) {
					t.Fatalf("%s, but the frame changed:\n in %x\nout %x", name, frame, r.out)
				}
				return
			}
		}
		if r.verdict == xdpDrop || packet.Verify(frame) != nil {
			return
		}
		if err := packet.Verify(r.out); err != nil {
			t.Fatalf("translated frame invalid: %v\n in %x\nout %x", err, frame, r.out)
		}
		in, err1 := packet.Decode(frame)
		out, err2 := packet.Decode(r.out)
		if err1 != nil || err2 != nil {
			t.Fatalf("decode: %v / %v", err1, err2)
		}
		if after["new_flow"] != before["new_flow"] || (out.Proto != packet.ICMP && backends[out.Dst]) {
			if !backends[out.Dst] {
				t.Fatalf("new flow sent to %s, not a backend", out.Dst)
			}
			if !bytes.Equal(in.Payload, out.Payload) {
				t.Fatalf("payload changed")
			}
		}
	})
}
