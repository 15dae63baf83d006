// Attaching the datapath to a NIC and detaching it: the XDP program
// (attach_xdp.go), the TC programs (attach_tc.go), and the interface's
// entry in the maps.

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
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/xdp"
)

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
	entry := xdp.Iface{Addr: xdp.IPv4ToNet(addr)}
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
