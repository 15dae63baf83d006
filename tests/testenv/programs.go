package testenv

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// PassingTCProgram loads a TC program that returns TC_ACT_UNSPEC (the
// packet goes on as if there were no program), for tests that need some
// program of their own on a hook. It is closed when the test ends.
func PassingTCProgram(t testing.TB) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, -1, asm.DWord), asm.Return()},
	})
	if err != nil {
		t.Fatalf("load a TC program: %v", err)
	}
	t.Cleanup(func() { prog.Close() })
	return prog
}
