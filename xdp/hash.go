package xdp

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// hash3Words mirrors hash_3words in include/hash.h (lookup3's final mix).
func hash3Words(a, b, c, seed uint32) uint32 {
	a += 0xdeadbeef + seed
	b += 0xdeadbeef + seed
	c += 0xdeadbeef + seed
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return c
}

func addrWord(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

// FlowHash is the datapath's hash of a 5-tuple (flow_hash in
// include/hash.h): a new flow takes Maglev slot FlowHash % M.
func FlowHash(src, dst netip.AddrPort, proto uint8, seed uint32) uint32 {
	return hash3Words(addrWord(src.Addr()), addrWord(dst.Addr()),
		uint32(src.Port())<<16|uint32(dst.Port()), seed+uint32(proto))
}

// ClientHash is the datapath's hash of a client address (client_hash in
// include/hash.h), used for ClientIP session affinity.
func ClientHash(client netip.Addr, seed uint32) uint32 {
	return hash3Words(addrWord(client), 0, 0, seed)
}

// SNATSlotLocked is the lock bit of a snat_slot's generation
// (SNAT_SLOT_LOCKED in include/nat.h): set only while a program claims or
// releases the slot's port.
const SNATSlotLocked = 1 << 31

// SNATSlot is the index in the snat_slots map of the reverse half of a
// SNAT flow (snat_slot_of in include/nat.h): the reply tuple from backend
// to natAddr:port, with buckets copies of the SNAT range [portMin, portMax].
func SNATSlot(backend netip.AddrPort, natAddr netip.Addr, port uint16, proto uint8,
	portMin, portMax uint16, buckets uint32) uint32 {
	bucket := uint32(0)
	if buckets > 1 {
		bucket = FlowHash(backend, netip.AddrPortFrom(natAddr, 0), proto, 0) % buckets
	}
	return bucket*(uint32(portMax)-uint32(portMin)+1) + uint32(port-portMin)
}
