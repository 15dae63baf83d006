package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
)

// A pod interface has two pinned links: the pod program (TC ingress:
// what the pod sends) and the host reply program (TC egress: what the
// node sends the pod).
const (
	podLinkPrefix      = "tc-pod-"
	podReplyLinkPrefix = "tc-podreply-"
)

func podLinkPath(pinRoot, ifname string) string {
	return filepath.Join(linksDir(pinRoot), podLinkPrefix+PinIfname(ifname))
}

func podReplyLinkPath(pinRoot, ifname string) string {
	return filepath.Join(linksDir(pinRoot), podReplyLinkPrefix+PinIfname(ifname))
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
	if _, err := d.attachTC(d.pod, podLinkPath(d.opts.PinRoot, ifname), ifname, ifindex, tcIngress); err != nil {
		return err
	}
	if _, err := d.attachTC(d.hostReply, podReplyLinkPath(d.opts.PinRoot, ifname), ifname, ifindex,
		tcEgress); err != nil {
		return err
	}
	return nil
}

// ForgetPod removes the pins of a pod interface's links. When the
// interface is gone its programs went with it; otherwise this detaches
// them.
func (d *Datapath) ForgetPod(ifname string) error {
	var errs []error
	for _, path := range []string{podLinkPath(d.opts.PinRoot, ifname), podReplyLinkPath(d.opts.PinRoot, ifname)} {
		if err := unpinLink(path); err != nil {
			errs = append(errs, fmt.Errorf("pod interface %s: %w", ifname, err))
		}
	}
	return errors.Join(errs...)
}

// PodInterfaces lists the pod interfaces with a pinned link.
func PodInterfaces(pinRoot string) ([]string, error) {
	entries, err := os.ReadDir(linksDir(pinRoot))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	// Either pin names the interface: one whose other pin could not be
	// removed is still listed, so it is forgotten again.
	var out []string
	for _, e := range entries {
		for _, prefix := range []string{podLinkPrefix, podReplyLinkPrefix} {
			if pinned, ok := strings.CutPrefix(e.Name(), prefix); ok && !slices.Contains(out, IfnameOfPin(pinned)) {
				out = append(out, IfnameOfPin(pinned))
			}
		}
	}
	return out, nil
}
