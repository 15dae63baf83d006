// Package traffic is the perf suite's traffic: a packet generator and the
// sinks that count what arrives.
//
// The generator is xdp_gen (xdp/baseline/xdp.c) run with BPF_PROG_TEST_RUN in
// live-frames mode: the kernel hands each frame to the program, which writes
// a whole header template into it, gives it the 5-tuple of the next flow,
// fixes the checksums and returns XDP_TX, so the frame leaves through the
// device named in the run's context for real. Flows are either computed
// (source addresses and ports counted up from a base, optionally spread over
// several destinations) or taken from a table of explicit tuples (replies to
// tracked flows). Where the kernel has pktgen (/proc/net/pktgen), [Pktgen]
// drives it through pktgen.sh instead.
//
// A sink is xdp_sink attached to the receiving device: it counts frames per
// CPU and drops them.
package traffic

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/xdplb/xdplb/tests/packet"
)

// Protocols the generator sends.
const (
	TCP = packet.TCP
	UDP = packet.UDP
)

// HeaderLen is how many bytes of every frame the generator rewrites: the
// whole of the Ethernet, IPv4 and TCP or UDP headers. It is also the
// smallest frame it sends.
const HeaderLen = 64

// MaxTuples is the size of the explicit tuple table.
const MaxTuples = 65536

// Tuple is one flow's addresses and ports, as the generator sends them.
type Tuple struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

func (t Tuple) String() string {
	return fmt.Sprintf("%s -> %s", netip.AddrPortFrom(t.Src, t.SrcPort), netip.AddrPortFrom(t.Dst, t.DstPort))
}

// Spec says what to send.
type Spec struct {
	SrcMAC, DstMAC net.HardwareAddr
	Proto          uint8 // TCP or UDP
	TCPFlags       uint8 // e.g. packet.SYN for new connections, packet.ACK otherwise
	Size           int   // frame length without FCS; at least HeaderLen
	// TOS is the IPv4 TOS byte of every frame: a DSCP marks generated
	// traffic apart from real connections to the same address (see
	// Sink.PassTo).
	TOS uint8

	// Computed flows: flow i comes from Src + (i / SrcPorts) % SrcAddrs,
	// port SrcPortMin + i % SrcPorts, and goes to Dst + (i % DstAddrs) *
	// DstStride, port DstPort. New flows (Flows 0) take their destination
	// from the sending CPU's own frame count instead (see FrameTuple), so
	// every sending thread reaches every destination.
	Src        netip.Addr
	SrcAddrs   uint32 // default 1
	SrcPortMin uint16 // default 1024
	SrcPorts   uint32 // default 65536 - SrcPortMin
	Dst        netip.Addr
	DstAddrs   uint32 // default 1
	DstStride  uint32 // default 1
	DstPort    uint16

	// Flows is the number of distinct 5-tuples to cycle through; 0 makes
	// every frame a new flow (until the sequence wraps after SrcAddrs *
	// SrcPorts frames).
	Flows uint32

	// Tuples, if set, replaces the computed flows: frame i gets
	// Tuples[i % len(Tuples)]. Flows is then len(Tuples).
	Tuples []Tuple
}

func (s Spec) withDefaults() Spec {
	if s.SrcAddrs == 0 {
		s.SrcAddrs = 1
	}
	if s.SrcPortMin == 0 {
		s.SrcPortMin = 1024
	}
	if s.SrcPorts == 0 {
		s.SrcPorts = 65536 - uint32(s.SrcPortMin)
	}
	if s.DstAddrs == 0 {
		s.DstAddrs = 1
	}
	if s.DstStride == 0 {
		s.DstStride = 1
	}
	if s.Size == 0 {
		s.Size = HeaderLen
	}
	return s
}

// Validate reports what makes a spec unusable.
func (s Spec) Validate() error {
	s = s.withDefaults()
	var errs []error
	if s.Proto != TCP && s.Proto != UDP {
		errs = append(errs, fmt.Errorf("protocol %d: want TCP (6) or UDP (17)", s.Proto))
	}
	if s.Size < HeaderLen || s.Size > 1514 {
		errs = append(errs, fmt.Errorf("frame size %d: want %d to 1514 bytes", s.Size, HeaderLen))
	}
	if len(s.SrcMAC) != 6 || len(s.DstMAC) != 6 {
		errs = append(errs, errors.New("source and destination MAC addresses are required"))
	}
	if len(s.Tuples) > MaxTuples {
		errs = append(errs, fmt.Errorf("%d tuples: at most %d", len(s.Tuples), MaxTuples))
	}
	for _, t := range s.Tuples {
		if !t.Src.Is4() || !t.Dst.Is4() {
			errs = append(errs, fmt.Errorf("tuple %s: IPv4 only", t))
			break
		}
	}
	if len(s.Tuples) == 0 {
		if !s.Src.Is4() || !s.Dst.Is4() {
			errs = append(errs, errors.New("IPv4 source and destination addresses are required"))
		}
		if uint32(s.SrcPortMin)+s.SrcPorts > 65536 {
			errs = append(errs, fmt.Errorf("source ports %d+%d exceed 65535", s.SrcPortMin, s.SrcPorts))
		}
		if s.Src.Is4() && uint64(ipv4(s.Src))+uint64(s.SrcAddrs) > 1<<32 {
			errs = append(errs, errors.New("source addresses run past 255.255.255.255"))
		}
		if s.Dst.Is4() && uint64(ipv4(s.Dst))+uint64(s.DstAddrs-1)*uint64(s.DstStride) >= 1<<32 {
			errs = append(errs, errors.New("destination addresses run past 255.255.255.255"))
		}
	}
	return errors.Join(errs...)
}

// Template is the first frame of the spec (flow 0), with valid checksums:
// what the generator writes into every frame before giving it its tuple.
// UDP frames carry no checksum (zero), so only the IPv4 and TCP checksums
// need fixing per frame.
func (s Spec) Template() []byte {
	s = s.withDefaults()
	first := s.Tuple(0)
	hdr := 14 + 20 + 20
	if s.Proto == UDP {
		hdr = 14 + 20 + 8
	}
	f := packet.Frame{
		SrcMAC: s.SrcMAC, DstMAC: s.DstMAC,
		Src: first.Src, Dst: first.Dst, TOS: s.TOS, Proto: s.Proto,
		SrcPort: first.SrcPort, DstPort: first.DstPort,
		Flags: s.TCPFlags, Seq: 1, Ack: 1, Window: 65535,
		NoUDPChecksum: true,
		Payload:       make([]byte, s.Size-hdr),
	}
	if s.Proto == TCP && s.TCPFlags == 0 {
		f.Flags = packet.ACK
	}
	if f.Flags&packet.ACK == 0 {
		f.Ack = 0
	}
	return f.Bytes()
}

// Tuple returns the tuple of flow i, as the generator computes it.
func (s Spec) Tuple(i uint64) Tuple {
	s = s.withDefaults()
	if len(s.Tuples) > 0 {
		return s.Tuples[i%uint64(len(s.Tuples))]
	}
	if s.Flows != 0 {
		i %= uint64(s.Flows)
	}
	src := uint32((i / uint64(s.SrcPorts)) % uint64(s.SrcAddrs))
	dst := uint32(i % uint64(s.DstAddrs))
	return Tuple{
		Src:     addr4(ipv4(s.Src) + src),
		Dst:     addr4(ipv4(s.Dst) + dst*s.DstStride),
		SrcPort: uint16(uint32(s.SrcPortMin) + uint32(i%uint64(s.SrcPorts))),
		DstPort: s.DstPort,
	}
}

// FrameTuple returns the tuple xdp_gen gives the seq-th frame (counting
// from 0) it generates on CPU cpu, with slots CPU slots (the possible
// CPUs). A fixed set of flows is cycled through from an offset per CPU;
// new flows interleave the CPUs' sequences in the flow number (so no two
// frames of any CPUs share a source address and port until the sequence
// wraps) and take their destination from seq itself, so one CPU's frames
// go to every destination in turn.
func (s Spec) FrameTuple(seq uint64, cpu, slots int) Tuple {
	s = s.withDefaults()
	if len(s.Tuples) > 0 || s.Flows != 0 {
		return s.Tuple(seq + uint64(cpu))
	}
	t := s.Tuple(seq*uint64(max(slots, 1)) + uint64(cpu))
	t.Dst = addr4(ipv4(s.Dst) + uint32(seq%uint64(s.DstAddrs))*s.DstStride)
	return t
}

// DistinctFlows is how many tuples a fixed set of flows cycles through, or
// how many new flows (distinct source addresses and ports) the spec gives
// before its sequence wraps.
func (s Spec) DistinctFlows() uint64 {
	s = s.withDefaults()
	if len(s.Tuples) > 0 {
		return uint64(len(s.Tuples))
	}
	all := uint64(s.SrcAddrs) * uint64(s.SrcPorts)
	if s.Flows != 0 && uint64(s.Flows) < all {
		return uint64(s.Flows)
	}
	return all
}

func ipv4(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// AddrAdd returns a + n in IPv4 address space.
func AddrAdd(a netip.Addr, n uint32) netip.Addr { return addr4(ipv4(a) + n) }
