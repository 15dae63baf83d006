// TC programs through tcx links where the kernel has them, clsact filters
// where it has not: ingress and egress, pinned per interface.

package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

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
