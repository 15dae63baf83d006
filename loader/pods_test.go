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
	filters := xdplbFilters
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

// xdplbFilters counts our clsact filters on the interface, both hooks.
// It runs in a namespace's thread, so failures are returned.
func xdplbFilters(ifname string) (int, error) {
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

// A failed start that attached a pod interface through clsact, and could
// not remove one of the filters it put on it, keeps the interface's mark:
// PodInterfaces still lists it, so that it is forgotten later (a filter
// without its mark would be listed by nothing). The filter removed and
// the mark go when both are removed.
func TestFailedStartKeepsTheClsactMarkOfAFilterLeft(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "cmark")
	peer := testenv.NewNetns(t, "cmarkp")
	testenv.Veth(t, ns, "vpod.1", peer, "p1")
	testenv.Veth(t, ns, "vpod.2", peer, "p2")
	testenv.Veth(t, ns, "vpod.3", peer, "p3")
	root := testenv.BPFFS(t)
	opts := loader.WithoutTCX(smallOptions(root))
	errInjected := errors.New("injected")
	// Runs in the namespace's thread: failures are returned.
	if err := ns.Do(func() error {
		var listed []string
		for _, tc := range []struct {
			pod string
			// failOn is the hook whose filter Revert cannot remove; 0: none.
			failOn uint32
		}{
			{"vpod.1", netlink.HANDLE_MIN_INGRESS},
			{"vpod.2", netlink.HANDLE_MIN_EGRESS},
			{"vpod.3", 0},
		} {
			faulty := loader.WithFilterDel(opts, func(f netlink.Filter) error {
				if f.Attrs().Parent == tc.failOn {
					return errInjected
				}
				return netlink.FilterDel(f)
			})
			failing, err := loader.Load(faulty, nil)
			if err != nil {
				return err
			}
			if err := failing.AttachPod(tc.pod); err != nil {
				failing.Close()
				return err
			}
			err = failing.Revert()
			failing.Close()
			switch {
			case tc.failOn == 0 && err != nil:
				return fmt.Errorf("%s: Revert: %w", tc.pod, err)
			case tc.failOn != 0 && !errors.Is(err, errInjected):
				t.Errorf("%s: Revert = %v, want the injected error", tc.pod, err)
			}
			wantFilters := 0
			if tc.failOn != 0 {
				wantFilters = 1
				listed = append(listed, tc.pod)
			}
			got, err := loader.PodInterfaces(root)
			if err != nil {
				return err
			}
			if !slices.Equal(got, listed) {
				t.Errorf("%s reverted: PodInterfaces = %v, want %v", tc.pod, got, listed)
			}
			n, err := xdplbFilters(tc.pod)
			if err != nil {
				return err
			}
			if n != wantFilters {
				t.Errorf("%s reverted: %d xdplb filters, want %d", tc.pod, n, wantFilters)
			}
		}

		// The interfaces listed are forgotten: the filters left go, and
		// their marks.
		dp, err := loadertest.Load(opts, nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		got, err := loader.PodInterfaces(root)
		if err != nil {
			return err
		}
		for _, pod := range got {
			if err := dp.ForgetPod(pod); err != nil {
				return err
			}
		}
		if got, err := loader.PodInterfaces(root); err != nil || len(got) != 0 {
			t.Errorf("forgotten: PodInterfaces = %v, %v; want none", got, err)
		}
		for _, pod := range []string{"vpod.1", "vpod.2", "vpod.3"} {
			if n, err := xdplbFilters(pod); err != nil || n != 0 {
				t.Errorf("forgotten: %d xdplb filters on %s, %v; want none", n, pod, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
