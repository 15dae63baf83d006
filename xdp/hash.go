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
// (SNAT_SLOT_LOCKED in include/snat.h): set only while a program claims or
// releases the slot's port.
const SNATSlotLocked = 1 << 31

// SNATBucketHints is how many bucket hints snat_bucket_hints holds; its
// entry SNATHintNext counts the buckets handed out (enum snat_hints in
// include/maps.h).
const (
	SNATBucketHints = uint32(SnatHintsSNAT_BUCKET_HINTS)
	SNATHintNext    = uint32(SnatHintsSNAT_HINT_NEXT)
)

// SNATHint is the entry in snat_bucket_hints that says which bucket holds
// the reply tuples from backend to natAddr (snat_hint_of in include/snat.h).
func SNATHint(backend netip.AddrPort, natAddr netip.Addr, proto uint8) uint32 {
	return FlowHash(backend, netip.AddrPortFrom(natAddr, 0), proto, 0) % SNATBucketHints
}

// SNATHintBucket reads a snat_bucket_hints value: the bucket it names, and
// false when it names none of the buckets there are.
func SNATHintBucket(hint, buckets uint32) (uint32, bool) {
	if hint == 0 || hint > buckets {
		return 0, false
	}
	return hint - 1, true
}
