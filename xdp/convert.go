package xdp

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// The datapath keeps addresses and ports in network byte order. The
// generated structs hold them in uint32/uint16 fields, which the kernel
// copies byte for byte; these helpers convert so that the bytes in memory
// are the wire bytes.

// IPv4ToNet returns the field value for an IPv4 address (0 for non-IPv4).
func IPv4ToNet(ip net.IP) uint32 {
	v4 := ip.To4()
	if v4 == nil {
		return 0
	}
	return binary.NativeEndian.Uint32(v4)
}

// AddrToNet returns the field value for an IPv4 netip.Addr.
func AddrToNet(a netip.Addr) uint32 {
	if !a.Is4() {
		return 0
	}
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// NetToAddr converts a field value back to an address.
func NetToAddr(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// PortToNet returns the field value for a port.
func PortToNet(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}

// NetToPort converts a field value back to a port number.
func NetToPort(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}
