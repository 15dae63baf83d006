package loader

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/tests/testenv"
)

// The clsact fallback (kernels without tcx) attaches the TC programs as
// named direct-action filters on the ingress and egress hooks, and
// detachClsact removes exactly those, leaving other tools' filters.
func TestClsactFallbackBothDirections(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "cls")
	peer := testenv.NewNetns(t, "clsp")
	testenv.Veth(t, ns, "c0", peer, "c1")

	prog := testenv.PassingTCProgram(t)

	// Filter names on each hook; runs in the namespace's thread, so
	// failures are returned.
	names := func(ifindex int, parent uint32) ([]string, error) {
		filters, err := netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, parent)
		if err != nil {
			return nil, err
		}
		var out []string
		for _, f := range filters {
			if bf, ok := f.(*netlink.BpfFilter); ok {
				out = append(out, bf.Name)
			}
		}
		slices.Sort(out)
		return out, nil
	}
	err := ns.Do(func() error {
		dev, err := netlink.LinkByName("c0")
		if err != nil {
			return err
		}
		ifindex := dev.Attrs().Index
		for _, dir := range []tcDirection{tcIngress, tcEgress} {
			if err := attachClsact(ifindex, prog, dir); err != nil {
				return fmt.Errorf("attach %s: %w", dir.name, err)
			}
		}
		// Another tool's filter on egress.
		other := &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_EGRESS,
				Handle: 1, Protocol: 0x0003, Priority: 7},
			Fd: prog.FD(), Name: "other_tool", DirectAction: true,
		}
		if err := netlink.FilterAdd(other); err != nil {
			return err
		}
		in, err := names(ifindex, netlink.HANDLE_MIN_INGRESS)
		if err != nil {
			return err
		}
		out, err := names(ifindex, netlink.HANDLE_MIN_EGRESS)
		if err != nil {
			return err
		}
		if !slices.Equal(in, []string{clsactFilterName}) || !slices.Equal(out, []string{"other_tool", clsactEgressFilterName}) {
			return fmt.Errorf("filters after attaching: ingress %v, egress %v", in, out)
		}
		// Attaching again replaces ours, adds none.
		if err := attachClsact(ifindex, prog, tcEgress); err != nil {
			return err
		}
		if out, err = names(ifindex, netlink.HANDLE_MIN_EGRESS); err != nil || len(out) != 2 {
			return fmt.Errorf("egress filters after attaching again: %v (%v)", out, err)
		}

		if err := detachClsact(ifindex); err != nil {
			return err
		}
		if in, err = names(ifindex, netlink.HANDLE_MIN_INGRESS); err != nil {
			return err
		}
		if out, err = names(ifindex, netlink.HANDLE_MIN_EGRESS); err != nil {
			return err
		}
		if len(in) != 0 || !slices.Equal(out, []string{"other_tool"}) {
			return fmt.Errorf("filters after detaching: ingress %v, egress %v; want only the other tool's", in, out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// What an attach through clsact changed is put back: the filter that ran
// an earlier program runs it again, one attached where there was none is
// removed.
func TestClsactFiltersArePutBack(t *testing.T) {
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "clr")
	peer := testenv.NewNetns(t, "clrp")
	testenv.Veth(t, ns, "c0", peer, "c1")
	earlier, later := testenv.PassingTCProgram(t), testenv.PassingTCProgram(t)
	info, err := earlier.Info()
	if err != nil {
		t.Fatal(err)
	}
	earlierID, _ := info.ID()

	// Runs in the namespace's thread: failures are returned.
	err = ns.Do(func() error {
		dev, err := netlink.LinkByName("c0")
		if err != nil {
			return err
		}
		ifindex := dev.Attrs().Index
		if err := attachClsact(ifindex, earlier, tcIngress); err != nil {
			return err
		}
		d := &Datapath{}
		for _, dir := range []tcDirection{tcIngress, tcEgress} {
			if err := d.rememberClsact(ifindex, dir, dir.name); err != nil {
				return err
			}
			if err := attachClsact(ifindex, later, dir); err != nil {
				return err
			}
		}
		for _, s := range slices.Backward(d.revertSteps) {
			if err := s.putBack(); err != nil {
				return err
			}
		}
		d.forgetRevertSteps()
		in, err := clsactFilter(ifindex, tcIngress)
		if err != nil {
			return err
		}
		if in == nil || ebpf.ProgramID(in.Id) != earlierID {
			t.Errorf("ingress filter after the undo: %+v, want one running program %d", in, earlierID)
		}
		out, err := clsactFilter(ifindex, tcEgress)
		if err != nil {
			return err
		}
		if out != nil {
			t.Errorf("egress filter after the undo: %+v, want none", out)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
