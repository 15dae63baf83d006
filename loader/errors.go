package loader

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// privilegeError is a bpf() call the kernel refused with EPERM: the
// process lacks the capabilities to create maps or load programs.
type privilegeError struct {
	what string // what failed: "create map conntrack", "load XDP program"
	err  error
}

// Error is one line naming what failed and what is missing. The library's
// own text is left out: on a kernel with memory-cgroup accounting its
// hint about RLIMIT_MEMLOCK misleads.
func (e *privilegeError) Error() string {
	return e.what + ": missing privilege: needs CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN " +
		"(run as root, or grant them as deploy/daemonset.yaml does)"
}

func (e *privilegeError) Unwrap() error { return e.err }

// explainBPFError wraps the error of a bpf() operation with what failed,
// and turns EPERM into a privilegeError, as explainXDPError does for
// attach failures.
func explainBPFError(what string, err error) error {
	if errors.Is(err, unix.EPERM) {
		return &privilegeError{what: what, err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}
