package loader_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
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

// On a kernel without tcx (before 6.6) pod interfaces are attached
// through clsact filters, which pin nothing: a mark lets PodInterfaces
// list them (the agent forgets those it lists when pod interfaces are
// turned off, or are gone), and ForgetPod removes the filters and the
// mark, but not those of a NIC of the datapath. A failed start that
// attached a pod interface removes both.
func TestForgetPodRemovesClsactFilters(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "cpod")
	peer := testenv.NewNetns(t, "cpodp")
	testenv.Veth(t, ns, "x0", peer, "x1")
	testenv.Veth(t, ns, "vpod.1", peer, "p1")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0")
	root := testenv.BPFFS(t)
	opts := loader.WithoutTCX(smallOptions(root))
	// Our filters on the interface, both hooks; runs in the namespace's
	// thread, so failures are returned.
	filters := func(ifname string) (int, error) {
		dev, err := netlink.LinkByName(ifname)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
			list, err := netlink.FilterList(dev, parent)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no clsact qdisc
			}
			if err != nil {
				return 0, err
			}
			for _, f := range list {
				if bf, ok := f.(*netlink.BpfFilter); ok && strings.HasPrefix(bf.Name, "xdplb_") {
					n++
				}
			}
		}
		return n, nil
	}
	expect := func(when string, pods []string, filtersOn map[string]int) error {
		got, err := loader.PodInterfaces(root)
		if err != nil {
			return err
		}
		if !slices.Equal(got, pods) {
			t.Errorf("%s: PodInterfaces = %v, want %v", when, got, pods)
		}
		for ifname, want := range filtersOn {
			n, err := filters(ifname)
			if err != nil {
				return err
			}
			if n != want {
				t.Errorf("%s: %d xdplb filters on %s, want %d", when, n, ifname, want)
			}
		}
		return nil
	}
	if err := ns.Do(func() error {
		failing, err := loader.Load(opts, nil)
		if err != nil {
			return err
		}
		defer failing.Close()
		if err := failing.AttachPod("vpod.1"); err != nil {
			return err
		}
		if err := expect("attached by a start", []string{"vpod.1"}, map[string]int{"vpod.1": 2}); err != nil {
			return err
		}
		if err := failing.Revert(); err != nil {
			return err
		}
		if err := expect("after the start failed", nil, map[string]int{"vpod.1": 0}); err != nil {
			return err
		}

		dp, err := loadertest.Load(opts, nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		if att, err := dp.AttachNIC("x0", loader.XDPGeneric); err != nil || att.TCMode != "clsact" {
			return fmt.Errorf("AttachNIC: %+v, %v; want TC through clsact", att, err)
		}
		if err := dp.AttachPod("vpod.1"); err != nil {
			return err
		}
		if err := expect("attached", []string{"vpod.1"}, map[string]int{"vpod.1": 2, "x0": 2}); err != nil {
			return err
		}
		if err := dp.ForgetPod("vpod.1"); err != nil {
			return err
		}
		if err := dp.ForgetPod("x0"); err != nil {
			return err
		}
		return expect("forgotten", nil, map[string]int{"vpod.1": 0, "x0": 2})
	}); err != nil {
		t.Fatal(err)
	}
}
