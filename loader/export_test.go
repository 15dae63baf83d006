package loader

import "github.com/cilium/ebpf"

// WithPinRenames returns opts whose load moves pinned maps into place
// through rename.
func WithPinRenames(opts Options, rename func(from, to string) error) Options {
	opts.faults.renamePin = rename
	return opts
}

// SetXDPProgram makes AttachNIC attach prog as the XDP program.
func (d *Datapath) SetXDPProgram(prog *ebpf.Program) { d.nic = prog }

// WithMemlockError returns opts whose load fails to lift RLIMIT_MEMLOCK
// with err.
func WithMemlockError(opts Options, err error) Options {
	opts.faults.liftMemlock = func() error { return err }
	return opts
}
