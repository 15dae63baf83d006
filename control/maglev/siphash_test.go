package maglev

import "testing"

// Reference vectors of SipHash-2-4: key 00 01 .. 0f, message 00 01 .. n-1.
func TestSipHash24Vectors(t *testing.T) {
	want := map[int]uint64{
		0:  0x726fdb47dd0e0e31,
		1:  0x74f839c593dc67fd,
		2:  0x0d6c8009d9a94f5a,
		3:  0x85676696d7fb7e2d,
		4:  0xcf2794e0277187b7,
		5:  0x18765564cd99a68d,
		6:  0xcbc9466e58fee3ce,
		7:  0xab0200f58b01d137,
		8:  0x93f5f5799a932462,
		9:  0x9e0082df0ba9e4b0,
		10: 0x7a5dbbc594ddb9f3,
		11: 0xf4b32f46226bada7,
		12: 0x751e8fbc860ee5fb,
		13: 0x14ea5627c0843d90,
		14: 0xf723ca908e7af2ee,
		15: 0xa129ca6149be45e5,
		16: 0x3f2acc7f57c29bdb,
	}
	const k0, k1 = 0x0706050403020100, 0x0f0e0d0c0b0a0908
	msg := make([]byte, 64)
	for i := range msg {
		msg[i] = byte(i)
	}
	for n, w := range want {
		if got := sipHash24(k0, k1, string(msg[:n])); got != w {
			t.Errorf("sipHash24(len %d) = %#016x, want %#016x", n, got, w)
		}
	}
}
