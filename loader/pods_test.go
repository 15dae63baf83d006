package loader_test

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
)

// A pod interface deleted and created again under its name (a CNI names a
// pod's interface after the pod, so a pod that comes back, or one
// recreated while no agent watched, gets the old name) carries the pod
// program again: the pinned link of the old device is dropped, not
// updated (which fails on a link whose device is gone).
func TestPodInterfaceRecreatedUnderItsNameIsAttachedAgain(t *testing.T) {
	// Runs in the namespace's thread: failures are returned, not t.Fatal.
	attachIn(t, func(dp *loader.Datapath) error {
		recreate := func() (int, error) {
			if old, err := netlink.LinkByName("pod0"); err == nil {
				if err := netlink.LinkDel(old); err != nil {
					return 0, err
				}
			}
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pod0"}, PeerName: "pod0peer"}
			if err := netlink.LinkAdd(veth); err != nil {
				return 0, err
			}
			dev, err := netlink.LinkByName("pod0")
			if err != nil {
				return 0, err
			}
			return dev.Attrs().Index, nil
		}
		// One program each way: the pod program on what the pod sends,
		// the host reply program on what the node sends it.
		expectPrograms := func(ifindex int, when string, want int) error {
			for _, attach := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
				q, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: attach})
				if err != nil {
					return err
				}
				if n := len(q.Programs); n != want {
					t.Errorf("%s: %d tcx programs (%s) on the pod interface, want %d", when, n, attach, want)
				}
			}
			return nil
		}
		expectOneProgram := func(ifindex int, when string) error { return expectPrograms(ifindex, when, 1) }

		first, err := recreate()
		if err != nil {
			return err
		}
		if err := dp.AttachPod("pod0"); err != nil {
			return err
		}
		if err := expectOneProgram(first, "first attach"); err != nil {
			return err
		}
		second, err := recreate()
		if err != nil {
			return err
		}
		if second == first {
			return fmt.Errorf("the recreated interface kept ifindex %d", first)
		}
		if err := dp.AttachPod("pod0"); err != nil {
			return fmt.Errorf("attach to the recreated pod interface: %w", err)
		}
		if err := expectOneProgram(second, "recreated"); err != nil {
			return err
		}
		// Attaching again updates that link in place.
		if err := dp.AttachPod("pod0"); err != nil {
			return err
		}
		if err := expectOneProgram(second, "attached twice"); err != nil {
			return err
		}
		if err := dp.ForgetPod("pod0"); err != nil {
			return err
		}
		return expectPrograms(second, "forgotten", 0)
	})
}
