// Package packet builds and decodes the Ethernet/IPv4 frames the datapath
// tests feed to the BPF programs. It computes every length and checksum
// from scratch, independently of the datapath's incremental updates, so a
// test that compares the two catches a wrong checksum.
package packet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
)

// IP protocol numbers.
const (
	ICMP = 1
	TCP  = 6
	UDP  = 17
)

// TCP flags.
const (
	FIN = 0x01
	SYN = 0x02
	RST = 0x04
	PSH = 0x08
	ACK = 0x10
)

// Frame is an Ethernet + IPv4 frame with a TCP, UDP or ICMP payload.
type Frame struct {
	SrcMAC, DstMAC net.HardwareAddr

	Src, Dst   netip.Addr
	TOS        uint8
	TTL        uint8 // 0 means 64
	ID         uint16
	DontFrag   bool
	MoreFrags  bool
	FragOffset uint16 // in 8-byte units
	IPOptions  []byte // must be a multiple of 4 bytes
	Proto      uint8

	SrcPort, DstPort uint16

	// TCP
	Flags    uint8
	Seq, Ack uint32
	Window   uint16
	// TCPOptions follow the 20-byte header: a multiple of 4 bytes.
	TCPOptions []byte

	// UDP: send a zero checksum ("none").
	NoUDPChecksum bool

	// ICMP
	ICMPType, ICMPCode uint8
	ICMPRest           [4]byte // the 4 bytes after the checksum

	Payload []byte

	// Set by Decode: the checksums found in the frame.
	IPChecksum, L4Checksum uint16
	// Set by Decode: the IPv4 total length field.
	TotalLen uint16
}

// Default MAC addresses for frames built in tests.
var (
	ClientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	NodeMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
)

// Bytes serialises the frame, computing lengths and checksums.
func (f Frame) Bytes() []byte {
	src, dst := f.SrcMAC, f.DstMAC
	if src == nil {
		src = ClientMAC
	}
	if dst == nil {
		dst = NodeMAC
	}
	l4 := f.l4Bytes()
	ihl := 20 + len(f.IPOptions)
	out := make([]byte, 14+ihl+len(l4))
	copy(out[0:6], dst)
	copy(out[6:12], src)
	binary.BigEndian.PutUint16(out[12:14], 0x0800)

	ip := out[14 : 14+ihl]
	ip[0] = 0x40 | byte(ihl/4)
	ip[1] = f.TOS
	binary.BigEndian.PutUint16(ip[2:4], uint16(ihl+len(l4)))
	binary.BigEndian.PutUint16(ip[4:6], f.ID)
	frag := f.FragOffset & 0x1fff
	if f.DontFrag {
		frag |= 0x4000
	}
	if f.MoreFrags {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(ip[6:8], frag)
	ip[8] = f.TTL
	if ip[8] == 0 {
		ip[8] = 64
	}
	ip[9] = f.Proto
	s, d := f.Src.As4(), f.Dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	copy(ip[20:], f.IPOptions)
	binary.BigEndian.PutUint16(ip[10:12], Checksum(ip))

	copy(out[14+ihl:], l4)
	l4 = out[14+ihl:]
	switch f.Proto {
	case TCP:
		binary.BigEndian.PutUint16(l4[16:18], pseudoChecksum(s, d, TCP, l4))
	case UDP:
		if !f.NoUDPChecksum {
			c := pseudoChecksum(s, d, UDP, l4)
			if c == 0 {
				c = 0xffff
			}
			binary.BigEndian.PutUint16(l4[6:8], c)
		}
	case ICMP:
		binary.BigEndian.PutUint16(l4[2:4], Checksum(l4))
	}
	return out
}

func (f Frame) l4Bytes() []byte {
	switch f.Proto {
	case TCP:
		hlen := 20 + len(f.TCPOptions)
		b := make([]byte, hlen+len(f.Payload))
		binary.BigEndian.PutUint16(b[0:2], f.SrcPort)
		binary.BigEndian.PutUint16(b[2:4], f.DstPort)
		binary.BigEndian.PutUint32(b[4:8], f.Seq)
		binary.BigEndian.PutUint32(b[8:12], f.Ack)
		b[12] = byte(hlen/4) << 4
		b[13] = f.Flags
		w := f.Window
		if w == 0 && f.Flags&RST == 0 {
			w = 65535
		}
		binary.BigEndian.PutUint16(b[14:16], w)
		copy(b[20:], f.TCPOptions)
		copy(b[hlen:], f.Payload)
		return b
	case UDP:
		b := make([]byte, 8+len(f.Payload))
		binary.BigEndian.PutUint16(b[0:2], f.SrcPort)
		binary.BigEndian.PutUint16(b[2:4], f.DstPort)
		binary.BigEndian.PutUint16(b[4:6], uint16(len(b)))
		copy(b[8:], f.Payload)
		return b
	case ICMP:
		b := make([]byte, 8+len(f.Payload))
		b[0], b[1] = f.ICMPType, f.ICMPCode
		copy(b[4:8], f.ICMPRest[:])
		copy(b[8:], f.Payload)
		return b
	default:
		return append([]byte(nil), f.Payload...)
	}
}

// IPv4Header returns the IPv4 header plus the first 8 bytes after it: what
// an ICMP error quotes.
func (f Frame) IPv4Header() []byte {
	b := f.Bytes()
	ihl := int(b[14]&0x0f) * 4
	end := 14 + ihl + 8
	if end > len(b) {
		end = len(b)
	}
	return b[14:end]
}

// Decode parses a frame built by Bytes (or rewritten by the datapath).
// It does not check checksums; see Verify.
func Decode(b []byte) (Frame, error) {
	var f Frame
	if len(b) < 34 {
		return f, fmt.Errorf("frame of %d bytes is too short for Ethernet+IPv4", len(b))
	}
	f.DstMAC = append(net.HardwareAddr(nil), b[0:6]...)
	f.SrcMAC = append(net.HardwareAddr(nil), b[6:12]...)
	if et := binary.BigEndian.Uint16(b[12:14]); et != 0x0800 {
		return f, fmt.Errorf("ethertype %#04x is not IPv4", et)
	}
	ip := b[14:]
	if ip[0]>>4 != 4 {
		return f, fmt.Errorf("IP version %d", ip[0]>>4)
	}
	ihl := int(ip[0]&0x0f) * 4
	if ihl < 20 || len(ip) < ihl {
		return f, fmt.Errorf("bad IHL %d", ihl)
	}
	f.TOS = ip[1]
	f.TotalLen = binary.BigEndian.Uint16(ip[2:4])
	if int(f.TotalLen) > len(ip) || int(f.TotalLen) < ihl {
		return f, fmt.Errorf("total length %d does not fit %d bytes", f.TotalLen, len(ip))
	}
	f.ID = binary.BigEndian.Uint16(ip[4:6])
	frag := binary.BigEndian.Uint16(ip[6:8])
	f.DontFrag = frag&0x4000 != 0
	f.MoreFrags = frag&0x2000 != 0
	f.FragOffset = frag & 0x1fff
	f.TTL = ip[8]
	f.Proto = ip[9]
	f.IPChecksum = binary.BigEndian.Uint16(ip[10:12])
	f.Src = netip.AddrFrom4([4]byte(ip[12:16]))
	f.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
	if ihl > 20 {
		f.IPOptions = append([]byte(nil), ip[20:ihl]...)
	}
	l4 := ip[ihl:f.TotalLen]
	switch f.Proto {
	case TCP:
		if len(l4) < 20 {
			return f, errors.New("truncated TCP header")
		}
		f.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		f.DstPort = binary.BigEndian.Uint16(l4[2:4])
		f.Seq = binary.BigEndian.Uint32(l4[4:8])
		f.Ack = binary.BigEndian.Uint32(l4[8:12])
		f.Flags = l4[13]
		f.Window = binary.BigEndian.Uint16(l4[14:16])
		f.L4Checksum = binary.BigEndian.Uint16(l4[16:18])
		doff := int(l4[12]>>4) * 4
		if doff < 20 || doff > len(l4) {
			return f, fmt.Errorf("bad TCP data offset %d", doff)
		}
		if doff > 20 {
			f.TCPOptions = append([]byte(nil), l4[20:doff]...)
		}
		f.Payload = append([]byte(nil), l4[doff:]...)
	case UDP:
		if len(l4) < 8 {
			return f, errors.New("truncated UDP header")
		}
		f.SrcPort = binary.BigEndian.Uint16(l4[0:2])
		f.DstPort = binary.BigEndian.Uint16(l4[2:4])
		f.L4Checksum = binary.BigEndian.Uint16(l4[6:8])
		f.NoUDPChecksum = f.L4Checksum == 0
		f.Payload = append([]byte(nil), l4[8:]...)
	case ICMP:
		if len(l4) < 8 {
			return f, errors.New("truncated ICMP header")
		}
		f.ICMPType, f.ICMPCode = l4[0], l4[1]
		f.L4Checksum = binary.BigEndian.Uint16(l4[2:4])
		copy(f.ICMPRest[:], l4[4:8])
		f.Payload = append([]byte(nil), l4[8:]...)
	default:
		f.Payload = append([]byte(nil), l4...)
	}
	return f, nil
}

// MSSOption is the TCP option that announces a maximum segment size.
func MSSOption(mss uint16) []byte {
	return []byte{2, 4, byte(mss >> 8), byte(mss)}
}

// MSS returns the maximum segment size a frame's TCP options announce,
// 0 without one.
func (f Frame) MSS() uint16 {
	for o := f.TCPOptions; len(o) > 0; {
		switch {
		case o[0] == 0: // end of options
			return 0
		case o[0] == 1: // no-operation
			o = o[1:]
		case len(o) < 2 || int(o[1]) < 2 || int(o[1]) > len(o):
			return 0
		case o[0] == 2 && o[1] == 4:
			return binary.BigEndian.Uint16(o[2:4])
		default:
			o = o[o[1]:]
		}
	}
	return 0
}

// Verify recomputes the IPv4 header checksum and the TCP, UDP or ICMP
// checksum of a frame from scratch and reports any mismatch.
func Verify(b []byte) error {
	if len(b) < 34 {
		return fmt.Errorf("frame of %d bytes is too short", len(b))
	}
	ip := b[14:]
	ihl := int(ip[0]&0x0f) * 4
	if len(ip) < ihl {
		return errors.New("truncated IPv4 header")
	}
	if c := Checksum(ip[:ihl]); c != 0 {
		return fmt.Errorf("IPv4 header checksum wrong (residue %#04x)", c)
	}
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total > len(ip) {
		return fmt.Errorf("total length %d exceeds %d bytes", total, len(ip))
	}
	l4 := ip[ihl:total]
	s, d := [4]byte(ip[12:16]), [4]byte(ip[16:20])
	switch ip[9] {
	case TCP:
		if c := pseudoSum(s, d, TCP, l4); c != 0xffff {
			return fmt.Errorf("TCP checksum wrong (sum %#04x)", c)
		}
	case UDP:
		if len(l4) >= 8 && binary.BigEndian.Uint16(l4[6:8]) != 0 {
			if c := pseudoSum(s, d, UDP, l4); c != 0xffff {
				return fmt.Errorf("UDP checksum wrong (sum %#04x)", c)
			}
		}
	case ICMP:
		if c := Checksum(l4); c != 0 {
			return fmt.Errorf("ICMP checksum wrong (residue %#04x)", c)
		}
	}
	return nil
}

// Checksum is the Internet checksum (RFC 1071) of b.
func Checksum(b []byte) uint16 {
	return ^fold(sum(b, 0))
}

func sum(b []byte, acc uint32) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		acc += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		acc += uint32(b[len(b)-1]) << 8
	}
	return acc
}

func fold(acc uint32) uint16 {
	for acc > 0xffff {
		acc = acc&0xffff + acc>>16
	}
	return uint16(acc)
}

func pseudoSum(src, dst [4]byte, proto uint8, l4 []byte) uint16 {
	acc := sum(src[:], 0)
	acc = sum(dst[:], acc)
	acc += uint32(proto) + uint32(len(l4))
	return fold(sum(l4, acc))
}

func pseudoChecksum(src, dst [4]byte, proto uint8, l4 []byte) uint16 {
	return ^pseudoSum(src, dst, proto, l4)
}
