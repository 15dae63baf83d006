package xdp_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// quoteOf reads the addresses and ports an ICMP error's quote names.
func quoteOf(t *testing.T, icmp packet.Frame) (src, dst netip.AddrPort) {
	t.Helper()
	q := icmp.Payload
	if len(q) < 28 {
		t.Fatalf("quote of %d bytes", len(q))
	}
	if packet.Checksum(q[:20]) != 0 {
		t.Error("quoted IPv4 header checksum wrong")
	}
	src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[12:16])), binary.BigEndian.Uint16(q[20:22]))
	dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(q[16:20])), binary.BigEndian.Uint16(q[22:24]))
	return src, dst
}

// icmpError is an ICMP destination unreachable from src to dst quoting
// the packet about.
func icmpError(mac []byte, src, dst netip.Addr, code uint8, about packet.Frame) packet.Frame {
	return packet.Frame{SrcMAC: mac, Src: src, Dst: dst, Proto: packet.ICMP, TTL: 64, ICMPType: 3,
		ICMPCode: code, ICMPRest: [4]byte{0, 0, 0x05, 0x00}, Payload: about.IPv4Header()}
}

// icmpWant is what a translated ICMP error must look like.
type icmpWant struct {
	from, to   netip.Addr     // the error's own addresses
	qsrc, qdst netip.AddrPort // the quoted packet's: what the other end sent
}

// expectTranslatedICMP checks a translated error (raw) against what the
// error as sent (in) and want say: type, code and the rest of the ICMP
// header kept, its own addresses and the quote's rewritten.
func expectTranslatedICMP(t *testing.T, raw []byte, in packet.Frame, want icmpWant) {
	t.Helper()
	out := decode(t, raw)
	if out.Proto != packet.ICMP || out.ICMPType != in.ICMPType || out.ICMPCode != in.ICMPCode ||
		out.ICMPRest != in.ICMPRest {
		t.Errorf("ICMP type %d code %d rest %x, want them kept", out.ICMPType, out.ICMPCode, out.ICMPRest)
	}
	if out.Src != want.from || out.Dst != want.to {
		t.Errorf("error %s -> %s, want %s -> %s", out.Src, out.Dst, want.from, want.to)
	}
	if src, dst := quoteOf(t, out); src != want.qsrc || dst != want.qdst {
		t.Errorf("quote %s -> %s, want %s -> %s (what the other end sent)", src, dst, want.qsrc, want.qdst)
	}
}

// startRemoteFlow sends a client's SYN to the NodePort that Maglev gives
// the remote backend 1 and returns it and the SNATed frame that left.
func startRemoteFlow(t *testing.T, f *fixture) (in, sent packet.Frame) {
	t.Helper()
	in = tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "")
	in.SrcPort = findClientPort(t, webService(), in, 1)
	return in, decode(t, f.run(in.Bytes(), f.nic0).out)
}

// replyOf is the reply the client received for in: from the frontend.
func replyOf(in packet.Frame) packet.Frame {
	return packet.Frame{Src: in.Dst, Dst: in.Src, Proto: in.Proto, TTL: 64,
		SrcPort: in.DstPort, DstPort: in.SrcPort, Flags: packet.SYN | packet.ACK}
}

// An ICMP error about a flow that is over (idle past its timeout) is not
// translated: the flow's other end may use the tuple for another
// connection by now. It goes to the stack as it came.
func TestICMPErrorsAboutFlowsThatAreOverPass(t *testing.T) {
	router := netip.MustParseAddr("192.0.2.254")
	gw := netip.MustParseAddr("10.1.0.2")
	for _, tc := range []struct {
		name  string
		error func(in, sent packet.Frame) packet.Frame
		nic   func(f *fixture) int
	}{
		{"about a reply to the client", func(in, _ packet.Frame) packet.Frame {
			return icmpError(gw0MAC, router, nodeAddr, 4, replyOf(in))
		}, func(f *fixture) int { return f.nic0 }},
		{"about a packet to the backend", func(_, sent packet.Frame) packet.Frame {
			return icmpError(gwMAC, gw, sent.Src, 4, sent)
		}, func(f *fixture) int { return f.nic1 }},
	} {
		for _, over := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/over=%v", tc.name, over), func(t *testing.T) {
				f := newFixture(t)
				f.program(webService())
				in, sent := startRemoteFlow(t, f)
				if over {
					f.setTimeouts(time.Millisecond, time.Millisecond, time.Millisecond)
					time.Sleep(20 * time.Millisecond)
				}
				icmp := tc.error(in, sent)
				want, verdict := map[string]uint64{"icmp_translated": 1, "redirect": 1}, uint32(xdpRedirect)
				if over {
					want, verdict = map[string]uint64{"pass_icmp": 1}, xdpPass
				}
				var r result
				f.expectCounters(want, func() { r = f.run(icmp.Bytes(), tc.nic(f)) })
				f.expectVerdict(r, verdict)
				if over && !bytes.Equal(r.out, icmp.Bytes()) {
					t.Errorf("the error about a flow that is over was changed")
				}
			})
		}
	}
}

// An error about a packet to a backend whose flow's forward entry was
// evicted is translated while the backend exists (a reply would rebuild
// the entry), and left alone once it is gone (no reply would).
func TestICMPErrorsAboutEvictedFlowsFollowTheirBackend(t *testing.T) {
	gw := netip.MustParseAddr("10.1.0.2")
	for _, backendGone := range []bool{false, true} {
		t.Run(fmt.Sprintf("backendGone=%v", backendGone), func(t *testing.T) {
			f := newFixture(t)
			f.program(webService())
			in, sent := startRemoteFlow(t, f)
			key := dataplane.FlowKey{Client: netip.AddrPortFrom(clientAddr, in.SrcPort),
				Frontend: netip.AddrPortFrom(nodeAddr, nodePort), Proto: packet.TCP}
			f.evictFlow(key)
			want, verdict := map[string]uint64{"icmp_translated": 1, "redirect": 1}, uint32(xdpRedirect)
			if backendGone {
				f.maps.DeleteBackend(1)
				want, verdict = map[string]uint64{"pass_icmp": 1}, xdpPass
			}
			var r result
			f.expectCounters(want, func() { r = f.run(icmpError(gwMAC, gw, sent.Src, 4, sent).Bytes(), f.nic1) })
			f.expectVerdict(r, verdict)
		})
	}
}

// An ICMP error about a translated flow reaches the other end of the flow
// as an error about the packet that end sent, whichever way the packet went
// and whichever hook sees the error: errors about packets to backends go
// to the client, errors about replies go to the backend.
func TestICMPErrorsReachTheOtherEnd(t *testing.T) {
	router := netip.MustParseAddr("192.0.2.254")
	gw := netip.MustParseAddr("10.1.0.2")
	for _, tc := range []struct {
		name string
		// flow starts the flow and returns the ICMP error to send, the
		// hook to send it to ("xdp", "nic" or "pod"), its ingress and
		// what must come out.
		flow     func(t *testing.T, f *fixture) (icmp packet.Frame, hook string, ifindex int, want icmpWant)
		counters map[string]uint64
	}{
		{
			name: "router about a reply to an outside client, XDP",
			flow: func(t *testing.T, f *fixture) (packet.Frame, string, int, icmpWant) {
				in, sent := startRemoteFlow(t, f)
				return icmpError(gw0MAC, router, nodeAddr, 4, replyOf(in)), "xdp", f.nic0, icmpWant{
					from: router, to: remotePod1,
					qsrc: netip.AddrPortFrom(remotePod1, podPort),
					qdst: netip.AddrPortFrom(sent.Src, sent.SrcPort),
				}
			},
			counters: map[string]uint64{"icmp_translated": 1, "redirect": 1},
		},
		{
			name: "client about a reply (port unreachable), XDP",
			flow: func(t *testing.T, f *fixture) (packet.Frame, string, int, icmpWant) {
				in, sent := startRemoteFlow(t, f)
				return icmpError(clientMAC, clientAddr, nodeAddr, 3, replyOf(in)), "xdp", f.nic0, icmpWant{
					from: nic1Addr, to: remotePod1,
					qsrc: netip.AddrPortFrom(remotePod1, podPort),
					qdst: netip.AddrPortFrom(sent.Src, sent.SrcPort),
				}
			},
			counters: map[string]uint64{"icmp_translated": 1, "redirect": 1},
		},
		{
			name: "router about a packet to a backend, XDP off",
			flow: func(t *testing.T, f *fixture) (packet.Frame, string, int, icmpWant) {
				in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "")
				in.SrcPort = findClientPort(t, webService(), in, 1)
				verdict, raw := f.runTC(f.dp.TCProgram(), in.Bytes(), f.nic0)
				if verdict != tcActRedirect {
					t.Fatalf("SYN verdict %d, want redirect", int32(verdict))
				}
				sent := decode(t, raw)
				return icmpError(gwMAC, gw, sent.Src, 4, sent), "nic", f.nic1, icmpWant{
					from: gw, to: clientAddr,
					qsrc: netip.AddrPortFrom(clientAddr, in.SrcPort),
					qdst: netip.AddrPortFrom(nodeAddr, nodePort),
				}
			},
			counters: map[string]uint64{"icmp_translated": 1, "tc_redirect": 1},
		},
		{
			name: "local backend about a client's packet (port unreachable)",
			flow: func(t *testing.T, f *fixture) (packet.Frame, string, int, icmpWant) {
				in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, "")
				in.SrcPort = findClientPort(t, webService(), in, 3) // the local pod
				f.expectVerdict(f.run(in.Bytes(), f.nic0), xdpPass)
				// What the pod received: DNATed, the client's address kept.
				got := in
				got.Dst, got.DstPort = localPod, podPort
				return icmpError(localPodMAC, localPod, clientAddr, 3, got), "pod", f.pod0, icmpWant{
					from: nodeAddr, to: clientAddr,
					qsrc: netip.AddrPortFrom(clientAddr, in.SrcPort),
					qdst: netip.AddrPortFrom(nodeAddr, nodePort),
				}
			},
			counters: map[string]uint64{"icmp_translated": 1, "tc_redirect": 1},
		},
		{
			name: "pod client about a reply from a ClusterIP",
			flow: func(t *testing.T, f *fixture) (packet.Frame, string, int, icmpWant) {
				f.program(clusterService(packet.TCP, 80, backendRemote1))
				in := tcpFrame(podAddr, 34567, clusterIP, 80, packet.SYN, "")
				in.SrcMAC = localPodMAC
				if verdict, _ := f.runTC(f.dp.PodProgram(), in.Bytes(), f.pod0); verdict != tcActRedirect {
					t.Fatalf("SYN verdict %d, want redirect", int32(verdict))
				}
				return icmpError(localPodMAC, podAddr, clusterIP, 3, replyOf(in)), "pod", f.pod0, icmpWant{
					from: podAddr, to: remotePod1,
					qsrc: netip.AddrPortFrom(remotePod1, podPort),
					qdst: netip.AddrPortFrom(podAddr, 34567),
				}
			},
			counters: map[string]uint64{"icmp_translated": 1, "tc_redirect": 1},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(webService())
			icmp, hook, ifindex, want := tc.flow(t, f)
			var raw []byte
			f.expectCounters(tc.counters, func() {
				switch hook {
				case "xdp":
					r := f.run(icmp.Bytes(), ifindex)
					if r.verdict != xdpRedirect {
						t.Errorf("verdict %s, want REDIRECT", verdictName(r.verdict))
					}
					raw = r.out
				default:
					prog := map[string]*ebpf.Program{"nic": f.dp.TCProgram(), "pod": f.dp.PodProgram()}[hook]
					var verdict uint32
					verdict, raw = f.runTC(prog, icmp.Bytes(), ifindex)
					if verdict != tcActRedirect {
						t.Errorf("verdict %d, want redirect", int32(verdict))
					}
				}
			})
			expectTranslatedICMP(t, raw, icmp, want)
		})
	}
}

// An ICMP error is translated only when its quote holds the ports of the
// packet it is about. The quote of a later fragment holds payload bytes
// where ports would be, and a quote cut short by the error's IPv4 length
// (the rest of the frame is padding) holds none: both go to the stack as
// they came, even when those bytes match a live flow's ports.
func TestICMPErrorsWithoutQuotedPortsPass(t *testing.T) {
	gw := netip.MustParseAddr("10.1.0.2")
	for _, tc := range []struct {
		name  string
		error func(sent packet.Frame) []byte
	}{
		{"control: the packet itself", func(sent packet.Frame) []byte {
			return icmpError(gwMAC, gw, sent.Src, 4, sent).Bytes()
		}},
		{"a later fragment", func(sent packet.Frame) []byte {
			sent.FragOffset = 185 // byte 1480 of the datagram
			return icmpError(gwMAC, gw, sent.Src, 4, sent).Bytes()
		}},
		{"ports past the IPv4 length", func(sent packet.Frame) []byte {
			b := icmpError(gwMAC, gw, sent.Src, 4, sent).Bytes()
			// IPv4 header, ICMP header and the quote's IPv4 header only.
			ip := b[14:34]
			binary.BigEndian.PutUint16(ip[2:4], 20+8+20)
			ip[10], ip[11] = 0, 0
			binary.BigEndian.PutUint16(ip[10:12], packet.Checksum(ip))
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(webService())
			_, sent := startRemoteFlow(t, f)
			icmp := tc.error(sent)
			want, verdict := map[string]uint64{"pass_icmp": 1}, uint32(xdpPass)
			if strings.HasPrefix(tc.name, "control") {
				want, verdict = map[string]uint64{"icmp_translated": 1, "redirect": 1}, xdpRedirect
			}
			var r result
			f.expectCounters(want, func() { r = f.run(icmp, f.nic1) })
			f.expectVerdict(r, verdict)
			if verdict == xdpPass && !bytes.Equal(r.out, icmp) {
				t.Error("the error was changed")
			}
		})
	}
}
