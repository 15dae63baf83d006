package loader

import (
	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// SetXDPProgram makes AttachNIC attach prog as the XDP program.
func (d *Datapath) SetXDPProgram(prog *ebpf.Program) { d.nic = prog }

// WithPinRenames returns opts whose load moves pinned maps into place
// through rename.
func WithPinRenames(opts Options, rename func(from, to string) error) Options {
	return withFaults(opts, func(f *faults) { f.renamePin = rename })
}

// WithMemlockError returns opts whose load fails to lift RLIMIT_MEMLOCK
// with err.
func WithMemlockError(opts Options, err error) Options {
	return withFaults(opts, func(f *faults) { f.liftMemlock = func() error { return err } })
}

// WithoutTCX returns opts whose load attaches TC programs as on a kernel
// without tcx: through clsact.
func WithoutTCX(opts Options) Options {
	return withFaults(opts, func(f *faults) { f.noTCX = true })
}

// WithFilterDel returns opts whose Revert removes the clsact filters it
// put on through del instead of netlink.FilterDel.
func WithFilterDel(opts Options, del func(netlink.Filter) error) Options {
	return withFaults(opts, func(f *faults) { f.delFilter = del })
}

// withFaults returns opts with a copy of its faults changed by set.
func withFaults(opts Options, set func(*faults)) Options {
	f := faults{}
	if opts.faults != nil {
		f = *opts.faults
	}
	set(&f)
	opts.faults = &f
	return opts
}
