package xdp_test

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// A frame of a VLAN reaches the TC program with its tag already taken out
// of the frame and kept in the skb: the core does that before the ingress
// hook, on every device. XDP leaves a frame that carries a tag to the
// stack, and TC must too: served like untagged traffic and redirected,
// the packet would leave on the backend's device tagged with the client's
// VLAN. A priority tag (VLAN id 0) is untagged traffic, and served. The program runs attached to the fixture's NIC here (a test run
// cannot give an skb a tag), with a capture on the far side of nic1.
func TestTCLeavesVLANTaggedFramesToTheStack(t *testing.T) {
	f := newFixture(t)
	f.program(service{
		svcID: 4, tableID: 4,
		frontends: []dataplane.FrontendKey{{Addr: lbIP, Port: 80, Proto: packet.UDP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
		backends:  map[uint32]dataplane.Backend{21: {Addr: remotePod1, Port: 53}},
		table:     []uint32{21},
	})
	if err := f.ns.Do(func() error {
		l, err := link.AttachTCX(link.TCXOptions{Program: f.dp.TCProgram(), Attach: ebpf.AttachTCXIngress, Interface: f.nic0})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	capture := openCapture(t, f, "p-nic1")

	// send sends a frame with the 802.1Q tag control information tci,
	// or untagged when tci is negative.
	send := func(payload string, tci int) {
		t.Helper()
		in := udpFrame(farClient, 5555, lbIP, 80, payload)
		in.DstMAC = f.nic0MAC
		frame := in.Bytes()
		if tci >= 0 {
			tag := []byte{0x81, 0x00, byte(tci >> 8), byte(tci)}
			frame = append(append(append([]byte(nil), frame[:12]...), tag...), frame[12:]...)
		}
		if err := f.peer.Do(func() error {
			l, err := netlink.LinkByName("p-nic0")
			if err != nil {
				return err
			}
			fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6})
		}); err != nil {
			t.Fatal(err)
		}
	}

	// Untagged, the frame is served: it leaves nic1 towards the backend.
	send("untagged", -1)
	got, ok := capture.next("untagged")
	if !ok {
		t.Fatal("the untagged frame did not reach the backend's side")
	}
	if got.dst != netip.AddrPortFrom(remotePod1, 53) || got.vlan != 0 {
		t.Fatalf("untagged frame left nic1 to %s, VLAN %d; want %s:53 untagged", got.dst, got.vlan, remotePod1)
	}

	// A priority tag (priority 5, VLAN id 0) marks untagged traffic: the
	// frame is served all the same.
	send("priority", 5<<13)
	if got, ok := capture.next("priority"); !ok || got.dst != netip.AddrPortFrom(remotePod1, 53) || got.vlan != 0 {
		t.Errorf("priority-tagged frame: left nic1 %v, to %s, VLAN %d; want it served like the untagged one", ok, got.dst, got.vlan)
	}

	// Tagged with VLAN 100, the same frame is left to the stack, which has
	// no such VLAN here and drops it: nothing leaves nic1, nothing is
	// translated.
	before := f.counters()
	send("tagged", 5<<13|100)
	if got, ok := capture.next("tagged"); ok {
		t.Errorf("the VLAN 100 frame was translated and left nic1 to %s with VLAN %d; want it left to the stack", got.dst, got.vlan)
	}
	after := f.counters()
	for _, name := range []string{"new_flow", "tc_redirect", "tc_neigh_redirect"} {
		if d := after[name] - before[name]; d != 0 {
			t.Errorf("counter %s moved by %d for the tagged frame, want 0", name, d)
		}
	}
}

// capture reads the frames leaving towards the peer namespace on one veth.
type capture struct {
	t  *testing.T
	fd int
}

// captured is a UDP datagram a capture saw.
type captured struct {
	dst  netip.AddrPort
	vlan uint16 // the frame's VLAN id, 0 if untagged
}

func openCapture(t *testing.T, f *fixture, peerDev string) *capture {
	t.Helper()
	c := &capture{t: t}
	proto := int(htons(unix.ETH_P_ALL))
	if err := f.peer.Do(func() error {
		l, err := netlink.LinkByName(peerDev)
		if err != nil {
			return err
		}
		if c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(c.fd, unix.SOL_PACKET, unix.PACKET_AUXDATA, 1); err != nil {
			return err
		}
		if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 1}); err != nil {
			return err
		}
		return unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: uint16(proto), Ifindex: l.Attrs().Index})
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(c.fd) })
	return c
}

// next waits up to a second for an IPv4 UDP datagram that carries payload;
// other frames are skipped.
func (c *capture) next(payload string) (captured, bool) {
	buf, oob := make([]byte, 2048), make([]byte, 256)
	for {
		n, oobn, _, _, err := unix.Recvmsg(c.fd, buf, oob, 0)
		if err != nil {
			return captured{}, false
		}
		const ip, udp = 14, 14 + 20
		if n < udp+8 || binary.BigEndian.Uint16(buf[12:]) != unix.ETH_P_IP || buf[ip+9] != packet.UDP ||
			string(buf[udp+8:n]) != payload {
			continue
		}
		got := captured{dst: netip.AddrPortFrom(netip.AddrFrom4([4]byte(buf[ip+16:ip+20])), binary.BigEndian.Uint16(buf[udp+2:]))}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			c.t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA {
				aux := (*unix.TpacketAuxdata)(unsafe.Pointer(&m.Data[0]))
				if aux.Status&unix.TP_STATUS_VLAN_VALID != 0 {
					got.vlan = aux.Vlan_tci & 0xfff
				}
			}
		}
		return got, true
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
