package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

// isNICHook reports whether a link pinned on this hook is a NIC's.
func isNICHook(hook string) bool {
	return hook == HookXDP || hook == HookTCIngress || hook == HookTCEgress
}

// renamingPrefix marks the pin of a NIC link while SettleNICPins renames it.
const renamingPrefix = "renaming-"

// nicPin is one pinned link of a NIC attachment.
type nicPin struct {
	file string  // pin file name, in linksDir
	pin  LinkPin // what the file name says: the hook, mode and the interface name it was pinned under
	// ifindex is the device the link is attached to now; 0 when that
	// device is gone (the kernel detached the link, the pin holds a
	// defunct one) or the link cannot be read (err says why).
	ifindex int
	err     error
}

// nicPins lists the pinned links of NIC attachments, with the device
// each is attached to now.
func nicPins(pinRoot string) ([]nicPin, error) {
	dir := linksDir(pinRoot)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var pins []nicPin
	for _, e := range entries {
		// A pin SettleNICPins was renaming when it stopped is one too.
		name := strings.TrimPrefix(e.Name(), renamingPrefix)
		pin, ok := ParseLinkPin(name)
		if !ok || !isNICHook(pin.Hook) {
			continue
		}
		p := nicPin{file: e.Name(), pin: pin}
		p.ifindex, p.err = pinnedLinkIfindex(filepath.Join(dir, e.Name()))
		pins = append(pins, p)
	}
	return pins, nil
}

// pinnedLinkIfindex returns the device a pinned XDP or tcx link is attached
// to, 0 if none (defunct); an error if the link cannot be read.
func pinnedLinkIfindex(path string) (int, error) {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		return 0, err
	}
	defer l.Close()
	ifindex, known := linkIfindex(l)
	if !known {
		return 0, fmt.Errorf("pinned link %s: cannot read its device", filepath.Base(path))
	}
	return ifindex, nil
}

// linkIfindex returns the device an XDP or tcx link is attached to, 0 if
// none (defunct); known is false if the link's info cannot be read.
func linkIfindex(l link.Link) (ifindex int, known bool) {
	info, err := l.Info()
	if err != nil {
		return 0, false
	}
	if x := info.XDP(); x != nil {
		return int(x.Ifindex), true
	}
	if t := info.TCX(); t != nil {
		return int(t.Ifindex), true
	}
	return 0, false
}

// unpinLink removes a link's pin, which detaches its program unless
// something else holds the link. A pin that does not open as a link (a
// map pinned under its name, say) is removed all the same.
func unpinLink(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", path, rmErr)
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	return nil
}

// SettleNICPins makes the pins of NIC links, which are named after the
// interface, name the device each link is attached to now; call it before
// attaching. The pins of a link whose device is gone (the kernel detached
// it) are removed: an interface deleted and created again under its old
// name is then attached afresh, where updating the defunct link would
// fail. The pins of a device renamed since are renamed too: attaching to
// it by its new name updates its links in place, where a new XDP link
// would fail on the program already there (and a second TC program would
// run). A renamed device not to be attached to any more is then detached
// by DetachNICsExcept. A pin whose link cannot be read for another reason
// than its absence is left as it is, and named in the error.
func (d *Datapath) SettleNICPins() error {
	pins, err := nicPins(d.opts.PinRoot)
	if err != nil {
		return err
	}
	dir := linksDir(d.opts.PinRoot)
	type move struct{ from, tmp, to, ifname, newName string }
	var moves []move
	var errs []error
	for _, p := range pins {
		path := filepath.Join(dir, p.file)
		// The device is gone when the link has none (defunct), or the
		// one it has is no more, or when there is no link (a pin
		// removed meanwhile, or dangling). A pin that cannot be read
		// otherwise (not permitted, say) is left as it is.
		var dev netlink.Link
		switch {
		case errors.Is(p.err, os.ErrNotExist):
		case p.err != nil:
			errs = append(errs, fmt.Errorf("interface %s: %w", p.pin.Ifname, p.err))
			continue
		case p.ifindex != 0:
			dev, err = netlink.LinkByIndex(p.ifindex)
			var notFound netlink.LinkNotFoundError
			if err != nil && !errors.As(err, &notFound) {
				errs = append(errs, fmt.Errorf("interface %s: device %d of pinned link %s: %w", p.pin.Ifname, p.ifindex, p.file, err))
				continue
			}
		}
		if dev == nil {
			if err := unpinLink(path); err != nil {
				errs = append(errs, fmt.Errorf("interface %s: %w", p.pin.Ifname, err))
				continue
			}
			d.log.Info("dropped the pinned link of an interface that is gone", "interface", p.pin.Ifname, "pin", p.file)
			continue
		}
		if name := dev.Attrs().Name; name != p.pin.Ifname || strings.HasPrefix(p.file, renamingPrefix) {
			moves = append(moves, move{from: path, tmp: filepath.Join(dir, renamingPrefix+strings.TrimPrefix(p.file, renamingPrefix)),
				to: LinkPin{Hook: p.pin.Hook, Mode: p.pin.Mode, Ifname: name}.path(d.opts.PinRoot), ifname: p.pin.Ifname, newName: name})
		}
	}
	// In two steps, so that names swapped between devices move too.
	for i, m := range moves {
		if err := os.Rename(m.from, m.tmp); err != nil {
			errs = append(errs, fmt.Errorf("interface %s: rename pin: %w", m.ifname, err))
			moves[i].tmp = ""
		}
	}
	for _, m := range moves {
		if m.tmp == "" {
			continue
		}
		if _, err := os.Stat(m.to); err == nil {
			// The device has a link of this kind under its new name
			// already: this one is surplus.
			if err := unpinLink(m.tmp); err != nil {
				errs = append(errs, fmt.Errorf("interface %s: %w", m.newName, err))
			}
			continue
		}
		if err := os.Rename(m.tmp, m.to); err != nil {
			errs = append(errs, fmt.Errorf("interface %s: rename pin: %w", m.ifname, err))
			continue
		}
		d.log.Info("pinned link follows its renamed interface", "from", m.ifname, "interface", m.newName)
	}
	return errors.Join(errs...)
}

// DetachNICsExcept detaches the datapath from every NIC an earlier agent
// attached it to that is not in keep (those attached to now), and returns
// their names: their pinned links are removed (which detaches the
// programs), their clsact filters on kernels without tcx too, and they
// are no longer XDP redirect targets (tx_ports) nor SNAT sources
// (ifaces). Call it after attaching to keep, and after SettleNICPins.
func (d *Datapath) DetachNICsExcept(keep []string) ([]string, error) {
	kept := map[uint32]bool{}
	for _, name := range keep {
		dev, err := netlink.LinkByName(name)
		if err != nil {
			return nil, fmt.Errorf("interface %s: %w", name, err)
		}
		kept[uint32(dev.Attrs().Index)] = true
	}
	pins, err := nicPins(d.opts.PinRoot)
	if err != nil {
		return nil, err
	}
	var detached []string
	var errs []error
	gone := map[uint32]bool{}
	for _, p := range pins {
		if slices.Contains(keep, p.pin.Ifname) {
			continue
		}
		if err := unpinLink(filepath.Join(linksDir(d.opts.PinRoot), p.file)); err != nil {
			errs = append(errs, fmt.Errorf("interface %s: %w", p.pin.Ifname, err))
			continue
		}
		if !slices.Contains(detached, p.pin.Ifname) {
			detached = append(detached, p.pin.Ifname)
		}
		if p.ifindex != 0 {
			gone[uint32(p.ifindex)] = true
		}
	}
	// Every NIC attached is registered in tx_ports and ifaces: what is
	// left there besides keep was attached by an earlier agent too (with
	// clsact, which pins nothing, or gone since).
	for _, m := range []*ebpf.Map{d.Maps.TxPorts, d.Maps.Ifaces} {
		var ifindex uint32
		value := make([]byte, m.ValueSize())
		iter := m.Iterate()
		for iter.Next(&ifindex, &value) {
			if !kept[ifindex] {
				gone[ifindex] = true
			}
		}
		if err := iter.Err(); err != nil {
			errs = append(errs, fmt.Errorf("list registered interfaces: %w", err))
		}
	}
	for ifindex := range gone {
		if kept[ifindex] {
			continue // a device pinned under a name it no longer has
		}
		if err := d.Maps.TxPorts.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("interface %d: remove redirect target: %w", ifindex, err))
		}
		if err := d.Maps.Ifaces.Delete(ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("interface %d: remove SNAT address: %w", ifindex, err))
		}
		dev, err := netlink.LinkByIndex(int(ifindex))
		if err != nil {
			continue // gone: its filters went with it
		}
		name := dev.Attrs().Name
		if err := detachClsact(int(ifindex)); err != nil {
			errs = append(errs, fmt.Errorf("interface %s: remove TC filter: %w", name, err))
		}
		if !slices.Contains(detached, name) {
			detached = append(detached, name)
		}
	}
	return detached, errors.Join(errs...)
}
