package loader

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
// first IPv4 address becomes its SNAT source.
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
	return filepath.Join(linksDir(pinRoot), fmt.Sprintf("xdp-%s-%s", mode, ifname))
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

	tries := []XDPMode{mode}
	if mode == XDPBestEffort {
		tries = []XDPMode{XDPNative, XDPGeneric}
	}
	var errs []error
	for _, m := range tries {
		if err := d.attachXDPMode(ifname, attrs, m); err != nil {
			errs = append(errs, err)
			continue
		}
		if len(errs) > 0 {
			d.log.Warn("native XDP unavailable, using generic", "interface", ifname, "reason", errs[0])
		}
		return m, nil
	}
	err := errors.Join(errs...)
	// The interface had XDP in another mode: it keeps it, with this
	// datapath's program, rather than being left without.
	if previous != "" {
		if restoreErr := d.attachXDPMode(ifname, attrs, previous); restoreErr != nil {
			return "", fmt.Errorf("%w; restoring %s mode failed too: %w", err, previous, restoreErr)
		}
		return "", fmt.Errorf("%w (XDP stays attached in %s mode)", err, previous)
	}
	return "", err
}

// attachXDPMode attaches the NIC program to the interface in mode m
// through a pinned link.
func (d *Datapath) attachXDPMode(ifname string, attrs *netlink.LinkAttrs, m XDPMode) error {
	flags := link.XDPDriverMode
	if m == XDPGeneric {
		flags = link.XDPGenericMode
	}
	l, err := link.AttachXDP(link.XDPOptions{
		Program:   d.nic,
		Interface: attrs.Index,
		Flags:     flags,
	})
	if err != nil {
		return explainXDPError(ifname, m, attrs, err)
	}
	defer l.Close()
	if err := l.Pin(xdpLinkPath(d.opts.PinRoot, m, ifname)); err != nil {
		return fmt.Errorf("interface %s: pin XDP link: %w", ifname, err)
	}
	return nil
}

// explainXDPError turns an attach failure into one readable line.
func explainXDPError(ifname string, mode XDPMode, attrs *netlink.LinkAttrs, err error) error {
	cause := err.Error()
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		cause = "missing privilege (needs CAP_BPF and CAP_NET_ADMIN)"
	case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
		cause = "another XDP program is already attached (remove it, or run `xdplb detach` if it is ours)"
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, ebpf.ErrNotSupported):
		cause = "the driver does not support this XDP mode (try --xdp-mode=generic or best-effort)"
	case attrs.MTU > maxSingleBufferMTU && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ERANGE)):
		cause = fmt.Sprintf("MTU %d is too large for single-buffer XDP (at most about %d)", attrs.MTU, maxSingleBufferMTU)
	case errors.Is(err, unix.EINVAL) && attrs.Slave != nil:
		cause = "XDP is not supported on this bonded/enslaved device: attach to the master or use generic mode"
	}
	return fmt.Errorf("interface %s: attach XDP (%s): %s", ifname, mode, cause)
}

func tcLinkPath(pinRoot, ifname string) string {
	return filepath.Join(linksDir(pinRoot), "tc-ingress-"+ifname)
}

func tcEgressLinkPath(pinRoot, ifname string) string {
	return filepath.Join(linksDir(pinRoot), "tc-egress-"+ifname)
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
// fail, or program a device that is not this one.
func (d *Datapath) attachTC(prog *ebpf.Program, path, ifname string, ifindex int, dir tcDirection) (string, error) {
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
			if err := l.Update(prog); err != nil {
				return "", fmt.Errorf("interface %s: replace TC program: %w", ifname, err)
			}
			return "tcx", nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("interface %s: open pinned TC link: %w", ifname, err)
	}

	l, err := link.AttachTCX(link.TCXOptions{
		Interface: ifindex,
		Program:   prog,
		Attach:    dir.attach,
		Anchor:    link.Head(),
	})
	if errors.Is(err, ebpf.ErrNotSupported) {
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
	return "tcx", nil
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
	if err := d.Maps.Ifaces.Put(ifindex, entry); err != nil {
		return fmt.Errorf("record interface address: %w", err)
	}
	return nil
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
// to the interface (a pinned XDP or TC link).
func NICAttached(pinRoot, ifname string) bool {
	for _, p := range []string{
		xdpLinkPath(pinRoot, XDPNative, ifname),
		xdpLinkPath(pinRoot, XDPGeneric, ifname),
		tcLinkPath(pinRoot, ifname),
		tcEgressLinkPath(pinRoot, ifname),
	} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// DetachNIC removes the XDP and TC programs of the datapath from one
// interface (undoing AttachNIC).
func (d *Datapath) DetachNIC(ifname string) error {
	var errs []error
	errs = append(errs, d.detachXDP(ifname))
	for _, path := range []string{tcLinkPath(d.opts.PinRoot, ifname), tcEgressLinkPath(d.opts.PinRoot, ifname)} {
		if _, err := os.Stat(path); err == nil {
			errs = append(errs, unpinLink(path))
		}
	}
	if dev, err := netlink.LinkByName(ifname); err == nil {
		d.Maps.TxPorts.Delete(uint32(dev.Attrs().Index))
		errs = append(errs, detachClsact(dev.Attrs().Index))
	}
	return errors.Join(errs...)
}
