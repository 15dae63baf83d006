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
		var err error
		verdict, out, err = runTC(prog, frame, ifindex)
		return err
	})
	if err != nil {
		f.t.Fatalf("run TC program: %v", err)
	}
	return verdict, out
}

// runTC runs a TC program on one frame on the calling thread, which must
// be in the fixture's namespace.
func runTC(prog *ebpf.Program, frame []byte, ifindex int) (uint32, []byte, error) {
	ctx := make([]byte, skbContextSize)
	binary.NativeEndian.PutUint32(ctx[skbIfindexOff:], uint32(ifindex))
	buf := make([]byte, len(frame)+256)
	opts := &ebpf.RunOptions{Data: frame, DataOut: buf, Context: ctx}
	ret, err := prog.Run(opts)
	if err != nil {
		return 0, nil, err
	}
	return ret, append([]byte(nil), opts.DataOut...), nil
}
