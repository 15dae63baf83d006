package maglev

import "math/bits"

// sipHash24 is SipHash-2-4 (Aumasson and Bernstein) of msg under the 128-bit
// key (k0, k1), where k0 holds key bytes 0-7 and k1 key bytes 8-15, both
// little-endian. It reads the string directly so hashing an ID allocates
// nothing.
func sipHash24(k0, k1 uint64, msg string) uint64 {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v2 := k0 ^ 0x6c7967656e657261
	v3 := k1 ^ 0x7465646279746573

	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13)
		v1 ^= v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16)
		v3 ^= v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21)
		v3 ^= v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17)
		v1 ^= v2
		v2 = bits.RotateLeft64(v2, 32)
	}

	n := len(msg)
	p := msg
	for len(p) >= 8 {
		m := le64(p)
		v3 ^= m
		round()
		round()
		v0 ^= m
		p = p[8:]
	}
	// The last block holds the remaining bytes and the message length
	// modulo 256 in its top byte.
	last := uint64(n) << 56
	for i := len(p) - 1; i >= 0; i-- {
		last |= uint64(p[i]) << (8 * uint(i))
	}
	v3 ^= last
	round()
	round()
	v0 ^= last

	v2 ^= 0xff
	round()
	round()
	round()
	round()
	return v0 ^ v1 ^ v2 ^ v3
}

// le64 decodes the first 8 bytes of s as a little-endian integer.
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}
