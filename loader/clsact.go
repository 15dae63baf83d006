package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernels before 6.6 have no tcx: the TC programs are attached as
// direct-action cls_bpf filters on a clsact qdisc instead. The filters use
// their own priority and handle, so filters of other tools are left alone.
const (
	clsactFilterPriority   = 1
	clsactFilterHandle     = 0x78646c62 // "xdlb"
	clsactFilterName       = "xdplb_nic_ingress"
	clsactEgressFilterName = "xdplb_host_reply"
)

func attachClsact(ifindex int, prog *ebpf.Program, dir tcDirection) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := netlink.QdiscReplace(qdisc); err != nil {
		return fmt.Errorf("add clsact qdisc: %w", err)
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex,
			Parent:    dir.clsactParent,
			Handle:    clsactFilterHandle,
			Protocol:  unix.ETH_P_ALL,
			Priority:  clsactFilterPriority,
		},
		Fd:           prog.FD(),
		Name:         dir.clsactName,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("add cls_bpf filter: %w", err)
	}
	return nil
}

// detachClsact removes our filters, if present; the qdisc stays because
// other tools may use it.
func detachClsact(ifindex int) error {
	for _, dir := range []tcDirection{tcIngress, tcEgress} {
		if err := detachClsactFilter(ifindex, dir, netlink.FilterDel); err != nil {
			return err
		}
	}
	return nil
}

// detachClsactFilter removes our filter on one hook, if present, with del
// (netlink.FilterDel).
func detachClsactFilter(ifindex int, dir tcDirection, del func(netlink.Filter) error) error {
	f, err := clsactFilter(ifindex, dir)
	if err != nil || f == nil {
		return err
	}
	return del(f)
}

// clsactFilter returns our filter on one hook; nil if there is none (or
// no clsact qdisc).
func clsactFilter(ifindex int, dir tcDirection) (*netlink.BpfFilter, error) {
	filters, err := netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}},
		dir.clsactParent)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, err
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == dir.clsactName {
			return bf, nil
		}
	}
	return nil, nil
}

// rememberClsact records for Revert the program our filter on the hook
// runs, or that there is none.
func (d *Datapath) rememberClsact(ifindex int, dir tcDirection, what string) error {
	if !d.recording() {
		return nil
	}
	f, err := clsactFilter(ifindex, dir)
	if err != nil {
		return fmt.Errorf("list TC filters: %w", err)
	}
	var prev *ebpf.Program
	if f != nil {
		if prev, err = ebpf.NewProgramFromID(ebpf.ProgramID(f.Id)); err != nil {
			return fmt.Errorf("the program of TC filter %s: %w", f.Name, err)
		}
	}
	d.onRevert(what, prev, func() error {
		if prev == nil {
			return detachClsactFilter(ifindex, dir, d.opts.faults.filterDel)
		}
		return attachClsact(ifindex, prev, dir)
	})
	return nil
}
