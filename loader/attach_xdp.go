// XDP on a NIC: modes, attaching through a pinned bpf_link (best effort:
// native, else generic), and what an earlier attachment left to restore.

package loader

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// XDPMode selects how the XDP program is attached.
type XDPMode string

const (
	// XDPNative runs the program in the driver: the fast path.
	XDPNative XDPMode = "native"
	// XDPGeneric runs it in the stack after the skb is built; works on
	// any device, at a fraction of the speed.
	XDPGeneric XDPMode = "generic"
	// XDPBestEffort tries native and falls back to generic.
	XDPBestEffort XDPMode = "best-effort"
	// XDPOff attaches no XDP program: the TC program on the NIC does all
	// the work (slower; for comparison, or drivers where XDP misbehaves).
	XDPOff XDPMode = "off"
)

// XDPModes lists the accepted modes, for flag validation.
var XDPModes = []XDPMode{XDPNative, XDPGeneric, XDPBestEffort, XDPOff}

// ParseXDPMode checks a mode name.
func ParseXDPMode(s string) (XDPMode, error) {
	for _, m := range XDPModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown XDP mode %q (allowed: native, generic, best-effort, off)", s)
}

// maxSingleBufferMTU is roughly the largest MTU a single-page XDP buffer
// holds (4 KiB page minus headroom and shared info); drivers differ a little.
const maxSingleBufferMTU = 3498

// detachXDP removes an XDP program of ours from the interface, if any.
func (d *Datapath) detachXDP(ifname string) error {
	for _, have := range []XDPMode{XDPNative, XDPGeneric} {
		path := xdpLinkPath(d.opts.PinRoot, have, ifname)
		l, err := link.LoadPinnedLink(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("interface %s: open pinned XDP link: %w", ifname, err)
		}
		err = l.Unpin()
		l.Close()
		if err != nil {
			return fmt.Errorf("interface %s: unpin XDP link: %w", ifname, err)
		}
		d.log.Info("XDP program detached", "interface", ifname)
	}
	return nil
}

// rememberXDP records for Revert the XDP program of ours the interface
// runs, and in which mode, or that it runs none.
func (d *Datapath) rememberXDP(ifname string, attrs *netlink.LinkAttrs) error {
	if !d.recording() {
		return nil
	}
	var mode XDPMode
	var prev *ebpf.Program
	for _, have := range []XDPMode{XDPNative, XDPGeneric} {
		l, err := link.LoadPinnedLink(xdpLinkPath(d.opts.PinRoot, have, ifname), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("interface %s: open pinned XDP link: %w", ifname, err)
		}
		prev, err = linkProgram(l)
		l.Close()
		if err != nil {
			return fmt.Errorf("interface %s: the XDP program it runs: %w", ifname, err)
		}
		mode = have
		break
	}
	d.onRevert("interface "+ifname+" XDP", prev, func() error { return d.restoreXDP(ifname, attrs, mode, prev) })
	return nil
}

// restoreXDP makes the interface run prog in mode through a pinned link,
// updating that link if it is there; with prog nil, it detaches the XDP
// programs of ours.
func (d *Datapath) restoreXDP(ifname string, attrs *netlink.LinkAttrs, mode XDPMode, prog *ebpf.Program) error {
	if prog != nil {
		path := xdpLinkPath(d.opts.PinRoot, mode, ifname)
		if _, err := os.Stat(path); err == nil {
			return updatePinnedLink(path, prog)
		}
	}
	for _, m := range []XDPMode{XDPNative, XDPGeneric} {
		if err := unpinLink(xdpLinkPath(d.opts.PinRoot, m, ifname)); err != nil {
			return err
		}
	}
	if prog == nil {
		return nil
	}
	return d.attachXDPMode(prog, ifname, attrs, mode)
}

func (d *Datapath) attachXDP(ifname string, attrs *netlink.LinkAttrs, mode XDPMode) (XDPMode, error) {
	// The mode an earlier attachment had, if this call detached it.
	var previous XDPMode
	// Adopt an existing attachment: update the program in place.
	for _, have := range []XDPMode{XDPNative, XDPGeneric} {
		path := xdpLinkPath(d.opts.PinRoot, have, ifname)
		l, err := link.LoadPinnedLink(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("interface %s: open pinned XDP link: %w", ifname, err)
		}
		if mode == have || mode == XDPBestEffort {
			defer l.Close()
			if err := l.Update(d.nic); err != nil {
				return "", fmt.Errorf("interface %s: replace XDP program: %w", ifname, err)
			}
			d.log.Info("XDP program replaced in place", "interface", ifname, "mode", have)
			if mode == XDPBestEffort && have == XDPGeneric {
				// Trying native would take XDP off the interface
				// first (the two cannot run together), and a native
				// attach resets the rings of many drivers: a restart
				// does neither unasked.
				d.log.Warn("interface runs generic XDP: best-effort keeps the generic attachment an earlier start "+
					"fell back to and does not try native again; to move it to native XDP, restart once with "+
					"--xdp-mode native (TC ingress handles its traffic while XDP moves), or run `xdplb detach` first",
					"interface", ifname)
			}
			return have, nil
		}
		// The requested mode differs: the old link must go first.
		d.log.Warn("XDP mode changes, re-attaching", "interface", ifname, "from", have, "to", mode)
		if err := l.Unpin(); err != nil {
			l.Close()
			return "", fmt.Errorf("interface %s: unpin XDP link: %w", ifname, err)
		}
		l.Close()
		previous = have
	}

	if mode == XDPBestEffort {
		return d.attachXDPBestEffort(ifname, attrs)
	}
	err := d.attachXDPMode(d.nic, ifname, attrs, mode)
	if err == nil {
		return mode, nil
	}
	// The interface had XDP in another mode: it keeps it, with this
	// datapath's program, rather than being left without.
	if previous != "" {
		if restoreErr := d.attachXDPMode(d.nic, ifname, attrs, previous); restoreErr != nil {
			return "", fmt.Errorf("%w; restoring %s mode failed too: %w", err, previous, restoreErr)
		}
		return "", fmt.Errorf("%w (XDP stays attached in %s mode)", err, previous)
	}
	return "", err
}

// attachXDPBestEffort attaches the NIC program in native mode, or in
// generic mode where the device cannot run it natively. Any other failure
// of the native attach (another program attached, missing privilege, a
// pin that failed) is returned as it is: generic XDP would hide it.
func (d *Datapath) attachXDPBestEffort(ifname string, attrs *netlink.LinkAttrs) (XDPMode, error) {
	nativeErr := d.attachXDPMode(d.nic, ifname, attrs, XDPNative)
	if nativeErr == nil {
		return XDPNative, nil
	}
	var native *xdpAttachError
	if !errors.As(nativeErr, &native) || !native.noNativeSupport() {
		return "", nativeErr
	}
	genericErr := d.attachXDPMode(d.nic, ifname, attrs, XDPGeneric)
	if genericErr == nil {
		d.log.Warn("native XDP unavailable, using generic", "interface", ifname, "reason", native.cause)
		return XDPGeneric, nil
	}
	var generic *xdpAttachError
	if !errors.As(genericErr, &generic) {
		return "", fmt.Errorf("%w (native XDP: %s)", genericErr, native.cause)
	}
	return "", &bestEffortError{native: native, generic: generic}
}

// attachXDPMode attaches prog (the NIC program, or one Revert puts back)
// to the interface in mode m (native or generic) through a pinned link. A
// refused attach is an *xdpAttachError.
func (d *Datapath) attachXDPMode(prog *ebpf.Program, ifname string, attrs *netlink.LinkAttrs, m XDPMode) error {
	flags := link.XDPDriverMode
	if m == XDPGeneric {
		flags = link.XDPGenericMode
	}
	l, err := link.AttachXDP(link.XDPOptions{
		Program:   prog,
		Interface: attrs.Index,
		Flags:     flags,
	})
	if err != nil {
		return explainXDPError(ifname, m, attrs, err)
	}
	defer l.Close() // detaches it, unless pinned
	if err := l.Pin(xdpLinkPath(d.opts.PinRoot, m, ifname)); err != nil {
		return fmt.Errorf("interface %s: pin XDP link: %w", ifname, err)
	}
	return nil
}

// xdpAttachError is an XDP attach the kernel refused.
type xdpAttachError struct {
	ifname string
	mode   XDPMode
	cause  string // what went wrong, in words
	hint   string // what to do about it, if anything
	err    error
}

// Error is one line naming the interface, the mode and the cause.
func (e *xdpAttachError) Error() string {
	return fmt.Sprintf("interface %s: attach XDP (%s): %s%s", e.ifname, e.mode, e.cause, e.hint)
}

func (e *xdpAttachError) Unwrap() error { return e.err }

// noNativeSupport reports whether a native attach failed because the
// device cannot run this program natively: no driver support
// (EOPNOTSUPP, or ENOTSUPP from some drivers), or an MTU above what a
// single-buffer XDP frame holds (drivers return EINVAL, veth ERANGE;
// EINVAL also covers other device setups a driver refuses, such as an
// enslaved device). Generic XDP runs there.
func (e *xdpAttachError) noNativeSupport() bool {
	return e.mode == XDPNative && (errors.Is(e.err, unix.EOPNOTSUPP) || errors.Is(e.err, errENOTSUPP) ||
		errors.Is(e.err, unix.EINVAL) || errors.Is(e.err, unix.ERANGE))
}

// errENOTSUPP is the kernel's internal ENOTSUPP, which some drivers return.
const errENOTSUPP = unix.Errno(524)

// bestEffortError is a best-effort attach that failed in both modes.
type bestEffortError struct {
	native, generic *xdpAttachError
}

// Error is one line naming the interface and each mode's cause.
func (e *bestEffortError) Error() string {
	return fmt.Sprintf("interface %s: attach XDP (best-effort): native: %s; generic: %s",
		e.native.ifname, e.native.cause, e.generic.cause)
}

func (e *bestEffortError) Unwrap() []error { return []error{e.native, e.generic} }

// explainXDPError turns an attach failure into an *xdpAttachError, whose
// text is one readable line.
func explainXDPError(ifname string, mode XDPMode, attrs *netlink.LinkAttrs, err error) error {
	e := &xdpAttachError{ifname: ifname, mode: mode, cause: err.Error(), err: err}
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		e.cause = "missing privilege (needs CAP_BPF and CAP_NET_ADMIN)"
	case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
		e.cause = "another XDP program is already attached"
		e.hint = " (remove it, or run `xdplb detach` if it is ours)"
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, errENOTSUPP) || errors.Is(err, ebpf.ErrNotSupported):
		e.cause = "the driver does not support this XDP mode"
		if mode == XDPNative {
			e.hint = " (try --xdp-mode=generic or best-effort)"
		}
	case attrs.MTU > maxSingleBufferMTU && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ERANGE)):
		e.cause = fmt.Sprintf("MTU %d is too large for single-buffer XDP (at most about %d)", attrs.MTU, maxSingleBufferMTU)
	case errors.Is(err, unix.EINVAL) && attrs.Slave != nil:
		e.cause = "XDP is not supported on this bonded/enslaved device"
		e.hint = ": attach to the master or use generic mode"
	}
	return e
}
