package loader

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/xdp"
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

// Attachment describes the programs attached to one interface.
type Attachment struct {
	Interface string
	Ifindex   int
	Mode      XDPMode // native or generic: what is in effect
	XDPProgID ebpf.ProgramID
	TCProgID  ebpf.ProgramID
	TCMode    string // "tcx" or "clsact"
}

// AttachNIC attaches the XDP program, the TC ingress program and the host
// reply program (TC egress) to a NIC, through pinned links: an existing
// attachment from an earlier agent is updated in place (no moment without
// a program), a new one is created otherwise. The interface is added to the XDP redirect targets and its
// first IPv4 address becomes its SNAT source. Before CommitPins, what it
// changes is recorded for Revert.
func (d *Datapath) AttachNIC(ifname string, mode XDPMode) (Attachment, error) {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return Attachment{}, fmt.Errorf("interface %s: no such interface", ifname)
		}
		return Attachment{}, fmt.Errorf("interface %s: %w", ifname, err)
	}
	attrs := dev.Attrs()
	att := Attachment{Interface: ifname, Ifindex: attrs.Index}

	if err := d.rememberXDP(ifname, attrs); err != nil {
		return att, err
	}
	if mode == XDPOff {
		if err := d.detachXDP(ifname); err != nil {
			return att, err
		}
		att.Mode = XDPOff
	} else if att.Mode, err = d.attachXDP(ifname, attrs, mode); err != nil {
		return att, err
	}
	if att.TCMode, err = d.attachTCIngress(ifname, attrs.Index); err != nil {
		return att, err
	}
	if _, err = d.attachTC(d.hostReply, tcEgressLinkPath(d.opts.PinRoot, ifname), ifname, attrs.Index,
		tcEgress); err != nil {
		return att, err
	}
	if err := d.registerInterface(dev); err != nil {
		return att, fmt.Errorf("interface %s: %w", ifname, err)
	}
	if info, err := d.nic.Info(); err == nil && mode != XDPOff {
		att.XDPProgID, _ = info.ID()
	}
	if info, err := d.nicIngress.Info(); err == nil {
		att.TCProgID, _ = info.ID()
	}
	return att, nil
}

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

func xdpLinkPath(pinRoot string, mode XDPMode, ifname string) string {
	return LinkPin{Hook: HookXDP, Mode: string(mode), Ifname: ifname}.path(pinRoot)
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

func tcLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCIngress, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}

func tcEgressLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCEgress, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}

// attachTCIngress attaches the NIC's TC ingress program.
func (d *Datapath) attachTCIngress(ifname string, ifindex int) (string, error) {
	return d.attachTC(d.nicIngress, tcLinkPath(d.opts.PinRoot, ifname), ifname, ifindex, tcIngress)
}

// tcDirection is the TC hook a program is attached to.
type tcDirection struct {
	name   string // for messages
	attach ebpf.AttachType
	// clsact fallback: the filter's parent and name (our filters are
	// found by name)
	clsactParent uint32
	clsactName   string
}

var (
	tcIngress = tcDirection{"ingress", ebpf.AttachTCXIngress, netlink.HANDLE_MIN_INGRESS, clsactFilterName}
	tcEgress  = tcDirection{"egress", ebpf.AttachTCXEgress, netlink.HANDLE_MIN_EGRESS, clsactEgressFilterName}
)

// attachTC attaches a TC program with tcx where the kernel has it (first
// in line; other programs keep running after it, as ours continue with
// TC_ACT_UNSPEC), through a link pinned at path; an existing link on the
// device is updated in place. A pinned link on another device, or on
// none (the interface was deleted and one of the same name created, as a
// CNI does for a pod that comes back), is dropped first: updating it would
// fail, or program a device that is not this one. Before CommitPins, what
// it changes is recorded for Revert.
func (d *Datapath) attachTC(prog *ebpf.Program, path, ifname string, ifindex int, dir tcDirection) (string, error) {
	what := fmt.Sprintf("interface %s TC %s (%s)", ifname, dir.name, filepath.Base(path))
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		if on, known := linkIfindex(l); known && on != ifindex {
			l.Close()
			if err := unpinLink(path); err != nil {
				return "", fmt.Errorf("interface %s: %w", ifname, err)
			}
			d.log.Info("dropped a pinned TC link of an earlier device of this name", "interface", ifname,
				"ifindex", ifindex, "link_ifindex", on)
		} else {
			defer l.Close()
			if err := d.rememberLink(l, path, what); err != nil {
				return "", fmt.Errorf("interface %s: %w", ifname, err)
			}
			if err := l.Update(prog); err != nil {
				return "", fmt.Errorf("interface %s: replace TC program: %w", ifname, err)
			}
			return "tcx", nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("interface %s: open pinned TC link: %w", ifname, err)
	}

	l, err := d.opts.faults.attachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   prog,
		Attach:    dir.attach,
		Anchor:    link.Head(),
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
		if err := d.rememberClsact(ifindex, dir, what); err != nil {
			return "", fmt.Errorf("interface %s: %w", ifname, err)
		}
		if err := attachClsact(ifindex, prog, dir); err != nil {
			return "", fmt.Errorf("interface %s: attach TC %s (clsact): %w", ifname, dir.name, err)
		}
		return "clsact", nil
	}
	if err != nil {
		return "", fmt.Errorf("interface %s: attach TC %s: %w", ifname, dir.name, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return "", fmt.Errorf("interface %s: pin TC link: %w", ifname, err)
	}
	d.onRevert(what, nil, func() error { return unpinLink(path) })
	return "tcx", nil
}

// rememberLink records for Revert the program the link pinned at path
// runs, before it is updated in place.
func (d *Datapath) rememberLink(l link.Link, path, what string) error {
	if !d.recording() {
		return nil
	}
	prev, err := linkProgram(l)
	if err != nil {
		return fmt.Errorf("the program %s runs: %w", filepath.Base(path), err)
	}
	d.onRevert(what, prev, func() error { return updatePinnedLink(path, prev) })
	return nil
}

// registerInterface makes the device an XDP redirect target and records
// its SNAT source address.
func (d *Datapath) registerInterface(dev netlink.Link) error {
	ifindex := uint32(dev.Attrs().Index)
	if err := d.Maps.TxPorts.Put(ifindex, ifindex); err != nil {
		return fmt.Errorf("add redirect target: %w", err)
	}
	addr, err := FirstIPv4(dev)
	if err != nil {
		return err
	}
	entry := xdp.NicIface{Addr: xdp.IPv4ToNet(addr)}
	extra, err := d.snatExtraAddrsOf(dev, addr)
	if err != nil {
		return err
	}
	for i, a := range extra {
		entry.ExtraAddrs[i] = xdp.AddrToNet(a)
	}
	entry.ExtraCount = uint32(len(extra))
	if err := d.Maps.Ifaces.Put(ifindex, entry); err != nil {
		return fmt.Errorf("record interface address: %w", err)
	}
	return nil
}

// snatExtraAddrsOf is which of the extra SNAT addresses the device has,
// besides first (its SNAT source address).
func (d *Datapath) snatExtraAddrsOf(dev netlink.Link, first net.IP) ([]netip.Addr, error) {
	if d.opts.SNATExtraAddrs == ([MaxSNATExtraAddrs]netip.Addr{}) {
		return nil, nil
	}
	addrs, err := netlink.AddrList(dev, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	has := map[netip.Addr]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && !a.IP.Equal(first) {
			has[ip] = true
		}
	}
	var extra []netip.Addr
	for _, a := range d.opts.SNATExtraAddrs {
		if a.IsValid() && has[a] {
			extra = append(extra, a)
		}
	}
	return extra, nil
}

// FirstIPv4 returns the first IPv4 address of a device, or nil if it has none.
func FirstIPv4(dev netlink.Link) (net.IP, error) {
	addrs, err := netlink.AddrList(dev, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if ip := a.IP.To4(); ip != nil && !strings.HasPrefix(a.Label, "xdplb") {
			return ip, nil
		}
	}
	return nil, nil
}

// RefreshInterface re-reads an attached interface's address (its SNAT
// source) after an address change.
func (d *Datapath) RefreshInterface(ifname string) error {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	return d.registerInterface(dev)
}

// NICAttached reports whether an earlier agent left the datapath attached
// to the interface: a pinned XDP or TC link, or the device registered as
// a NIC in the pinned maps (TC programs attached through clsact, on
// kernels without tcx, pin nothing). A pin or map that cannot be looked
// up for another reason than its absence counts as one: an interface it
// calls not attached is detached after a failed start.
func NICAttached(pinRoot, ifname string) bool {
	for _, p := range []string{
		xdpLinkPath(pinRoot, XDPNative, ifname),
		xdpLinkPath(pinRoot, XDPGeneric, ifname),
		tcLinkPath(pinRoot, ifname),
		tcEgressLinkPath(pinRoot, ifname),
	} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			return true
		}
	}
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return false // no device, nothing attached to it
	}
	registered, err := pinnedNICs(pinRoot)
	return err != nil || slices.Contains(registered, uint32(dev.Attrs().Index))
}

// DatapathAttached reports whether an earlier agent left the datapath
// attached anywhere under pinRoot: a pinned link (an interface or the
// host's sockets), a pod interface's clsact mark, or a NIC registered in
// the pinned maps. Unreadable state counts as attached.
func DatapathAttached(pinRoot string) bool {
	for _, dir := range []string{linksDir(pinRoot), clsactPodsDir(pinRoot)} {
		entries, err := readDirIfAny(dir)
		if err != nil || len(entries) > 0 {
			return true
		}
	}
	registered, err := pinnedNICs(pinRoot)
	return err != nil || len(registered) > 0
}

// pinnedNICs lists the devices registered as NICs (XDP redirect targets)
// in the pinned tx_ports map; none when nothing is pinned.
func pinnedNICs(pinRoot string) ([]uint32, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(mapsDir(pinRoot), "tx_ports"), &ebpf.LoadPinOptions{ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open pinned tx_ports: %w", err)
	}
	defer m.Close()
	var (
		ifindexes []uint32
		ifindex   uint32
		value     = make([]byte, m.ValueSize())
	)
	iter := m.Iterate()
	for iter.Next(&ifindex, &value) {
		ifindexes = append(ifindexes, ifindex)
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("list pinned tx_ports: %w", err)
	}
	return ifindexes, nil
}

// DetachNIC removes the XDP and TC programs of the datapath from one
// interface (undoing AttachNIC).
func (d *Datapath) DetachNIC(ifname string) error {
	var errs []error
	errs = append(errs, d.detachXDP(ifname))
	for _, path := range []string{tcLinkPath(d.opts.PinRoot, ifname), tcEgressLinkPath(d.opts.PinRoot, ifname)} {
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, unpinLink(path))
		}
	}
	if dev, err := netlink.LinkByName(ifname); err == nil {
		// No longer a redirect target, nor a SNAT source.
		d.Maps.TxPorts.Delete(uint32(dev.Attrs().Index))
		d.Maps.Ifaces.Delete(uint32(dev.Attrs().Index))
		errs = append(errs, detachClsact(dev.Attrs().Index))
	}
	return errors.Join(errs...)
}
