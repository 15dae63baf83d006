package loader

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// privilegeError is a call the kernel refused with EPERM: the process
// lacks the capabilities to create maps or load programs.
type privilegeError struct {
	what  string // what failed: "create map conntrack", "load XDP program"
	needs string // the capabilities missing, if not those of bpf()
	err   error
}

// bpfCapabilities are what bpf() needs of the process.
const bpfCapabilities = "CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN"

// Error is one line naming what failed and what is missing. The library's
// own text is left out: its hint about RLIMIT_MEMLOCK misleads, as the
// loader lifts that limit first where the kernel charges maps to it.
func (e *privilegeError) Error() string {
	needs := e.needs
	if needs == "" {
		needs = bpfCapabilities
	}
	return e.what + ": missing privilege: needs " + needs +
		" (run as root, or grant them as deploy/daemonset.yaml does)"
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

// explainMemlockError wraps a failure to lift RLIMIT_MEMLOCK. EPERM is a
// process without CAP_SYS_RESOURCE on a kernel that charges maps to the
// limit, or one without the bpf() capabilities on any kernel (the library
// then cannot tell how maps are charged).
func explainMemlockError(err error) error {
	what := "lift RLIMIT_MEMLOCK for BPF maps (kernels before 5.11 charge maps to it)"
	if errors.Is(err, unix.EPERM) {
		return &privilegeError{what: what, needs: bpfCapabilities + ", and CAP_SYS_RESOURCE before Linux 5.11", err: err}
	}
	return fmt.Errorf("%s: %w", what, err)
}
