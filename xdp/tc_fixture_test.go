package xdp_test

import (
	"encoding/binary"

	"github.com/cilium/ebpf"
)

// TC verdicts.
const (
	tcActUnspec   = ^uint32(0) // -1: continue with the next program
	tcActOK       = 0
	tcActShot     = 2
	tcActRedirect = 7
)

// skbContextSize is sizeof(struct __sk_buff); the kernel accepts a context
// of that size with only a few fields set.
const (
	skbContextSize = 192
	skbIfindexOff  = 40 // __sk_buff.ifindex
)

// runTC feeds one frame to a TC program as if it arrived on ifindex and
// returns the verdict and the frame after the program.
func (f *fixture) runTC(prog *ebpf.Program, frame []byte, ifindex int) (uint32, []byte) {
	f.t.Helper()
	var verdict uint32
	var out []byte
	err := f.ns.Do(func() error {
		ctx := make([]byte, skbContextSize)
		binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], uint32(ifindex))
		buf := make([]byte, len(frame)+256)
		opts := &ebpf.RunOptions{Data: frame, DataOut: buf, Context: ctx}
		ret, err := prog.Run(opts)
		if err != nil {
			return err
		}
		verdict, out = ret, append([]byte(nil), opts.DataOut...)
		return nil
	})
	if err != nil {
		f.t.Fatalf("run TC program: %v", err)
	}
	return verdict, out
}
