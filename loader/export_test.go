package loader

import (
	"testing"

	"github.com/cilium/ebpf"
)

// FailPinRenames makes the renames that move pinned maps into place go
// through rename until the test ends.
func FailPinRenames(t testing.TB, rename func(from, to string) error) {
	t.Helper()
	saved := renamePin
	renamePin = rename
	t.Cleanup(func() { renamePin = saved })
}

// SetXDPProgram makes AttachNIC attach prog as the XDP program.
func (d *Datapath) SetXDPProgram(prog *ebpf.Program) { d.nic = prog }

// FailMemlock makes lifting RLIMIT_MEMLOCK fail with err until the test
// ends.
func FailMemlock(t testing.TB, err error) {
	t.Helper()
	saved := removeMemlock
	removeMemlock = func() error { return err }
	t.Cleanup(func() { removeMemlock = saved })
}
