package loader

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

// A pod interface has two pinned links: the pod program (TC ingress:
// what the pod sends) and the host reply program (TC egress: what the
// node sends the pod).
func podLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCPod, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}

func podReplyLinkPath(pinRoot, ifname string) string {
	return LinkPin{Hook: HookTCPodReply, Mode: tcxMode, Ifname: ifname}.path(pinRoot)
}

// AttachPod attaches the pod program and the host reply program to the
// host side of a pod interface. Attaching again updates in place. Before
// CommitPins, what it changes is recorded for Revert.
func (d *Datapath) AttachPod(ifname string) error {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("pod interface %s: %w", ifname, err)
	}
	ifindex := dev.Attrs().Index
	// The mark's step is recorded before the attaches, so that Revert
	// (latest first) comes to it after it put back their filters; and it
	// keeps the mark while a filter of ours is left on the device: one
	// without its mark is listed by nothing, so never forgotten.
	marked := false
	mark := clsactPodMark(d.opts.PinRoot, ifname)
	d.onRevert("pod interface "+ifname+" clsact mark", nil, func() error {
		if !marked {
			return nil
		}
		return removeMarkUnlessFiltered(mark, ifindex)
	})
	for _, h := range []struct {
		prog *ebpf.Program
		path string
		dir  tcDirection
	}{
		{d.pod, podLinkPath(d.opts.PinRoot, ifname), tcIngress},
		{d.hostReply, podReplyLinkPath(d.opts.PinRoot, ifname), tcEgress},
	} {
		mode, err := d.attachTC(h.prog, h.path, ifname, ifindex, h.dir)
		if err != nil {
			return err
		}
		if mode == "clsact" {
			made, err := markClsactPod(d.opts.PinRoot, ifname)
			if err != nil {
				return fmt.Errorf("pod interface %s: %w", ifname, err)
			}
			marked = marked || made
		}
	}
	return nil
}

// markClsactPod marks a pod interface attached through clsact; made says
// whether the mark is new.
func markClsactPod(pinRoot, ifname string) (made bool, err error) {
	if err := os.MkdirAll(clsactPodsDir(pinRoot), 0o700); err != nil {
		return false, fmt.Errorf("mark as attached through clsact: %w", err)
	}
	err = os.Mkdir(clsactPodMark(pinRoot, ifname), 0o700)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("mark as attached through clsact: %w", err)
	}
	return true, nil
}

// removeMarkUnlessFiltered removes the clsact mark of a pod interface
// unless a filter of ours is left on either hook of the device.
func removeMarkUnlessFiltered(mark string, ifindex int) error {
	for _, dir := range []tcDirection{tcIngress, tcEgress} {
		f, err := clsactFilter(ifindex, dir)
		if err != nil {
			return fmt.Errorf("keep mark %s: list TC filters: %w", mark, err)
		}
		if f != nil {
			return nil
		}
	}
	return removeMark(mark)
}

func removeMark(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove mark %s: %w", path, err)
	}
	return nil
}

// ForgetPod detaches a pod interface: it removes the pins of its links,
// and its clsact filters (kernels without tcx) and their mark. When the
// interface is gone its programs went with it. The filters of an
// interface this datapath is attached to as a NIC (one that had a pod
// interface's name before) are the NIC's: they stay.
func (d *Datapath) ForgetPod(ifname string) error {
	var errs []error
	for _, path := range []string{podLinkPath(d.opts.PinRoot, ifname), podReplyLinkPath(d.opts.PinRoot, ifname)} {
		if err := unpinLink(path); err != nil {
			errs = append(errs, fmt.Errorf("pod interface %s: %w", ifname, err))
		}
	}
	var notFound netlink.LinkNotFoundError
	dev, err := netlink.LinkByName(ifname)
	switch {
	case errors.As(err, &notFound):
	case err != nil:
		errs = append(errs, fmt.Errorf("pod interface %s: %w", ifname, err))
	case d.isNIC(dev.Attrs().Index):
	default:
		if err := detachClsact(dev.Attrs().Index); err != nil {
			errs = append(errs, fmt.Errorf("pod interface %s: remove TC filters: %w", ifname, err))
		}
	}
	if len(errs) == 0 {
		// Kept while filters may be left, so that it is forgotten again.
		if err := removeMark(clsactPodMark(d.opts.PinRoot, ifname)); err != nil {
			errs = append(errs, fmt.Errorf("pod interface %s: %w", ifname, err))
		}
	}
	return errors.Join(errs...)
}

// isNIC reports whether the datapath is attached to the device as a NIC
// (AttachNIC makes it an XDP redirect target).
func (d *Datapath) isNIC(ifindex int) bool {
	var v uint32
	return d.Maps.TxPorts.Lookup(uint32(ifindex), &v) == nil
}

// PodInterfaces lists the pod interfaces with a pinned link, or a mark
// of an attach through clsact.
func PodInterfaces(pinRoot string) ([]string, error) {
	var out []string
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	links, err := readDirIfAny(linksDir(pinRoot))
	if err != nil {
		return nil, err
	}
	// Either pin names the interface: one whose other pin could not be
	// removed is still listed, so it is forgotten again.
	for _, e := range links {
		if pin, ok := ParseLinkPin(e.Name()); ok && (pin.Hook == HookTCPod || pin.Hook == HookTCPodReply) {
			add(pin.Ifname)
		}
	}
	marks, err := readDirIfAny(clsactPodsDir(pinRoot))
	if err != nil {
		return nil, err
	}
	for _, e := range marks {
		add(IfnameOfPin(e.Name()))
	}
	return out, nil
}

// readDirIfAny is os.ReadDir, with no entries where there is no directory.
func readDirIfAny(dir string) ([]os.DirEntry, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return entries, err
}
