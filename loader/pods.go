package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
)

const podLinkPrefix = "tc-pod-"

func podLinkPath(pinRoot, ifname string) string {
	return filepath.Join(linksDir(pinRoot), podLinkPrefix+ifname)
}

// AttachPod attaches the pod program to the host side of a pod interface
// (TC ingress: what the pod sends). Attaching again updates in place.
func (d *Datapath) AttachPod(ifname string) error {
	dev, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("pod interface %s: %w", ifname, err)
	}
	if _, err := d.attachTC(d.pod, podLinkPath(d.opts.PinRoot, ifname), ifname, dev.Attrs().Index); err != nil {
		return err
	}
	return nil
}

// ForgetPod removes the pin of a pod interface's link. When the interface
// is gone its program went with it; otherwise this detaches it.
func (d *Datapath) ForgetPod(ifname string) error {
	path := podLinkPath(d.opts.PinRoot, ifname)
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		// A link whose interface vanished may fail to load: drop the pin.
		if rmErr := os.Remove(path); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) {
			return fmt.Errorf("pod interface %s: remove pin: %w", ifname, rmErr)
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("pod interface %s: unpin: %w", ifname, err)
	}
	return nil
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
	var out []string
	for _, e := range entries {
		if name, ok := strings.CutPrefix(e.Name(), podLinkPrefix); ok {
			out = append(out, name)
		}
	}
	return out, nil
}
