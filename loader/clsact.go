package loader

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Kernels before 6.6 have no tcx: the TC program is attached as a
// direct-action cls_bpf filter on a clsact qdisc instead. The filter uses
// its own priority and handle, so filters of other tools are left alone.
const (
	clsactFilterPriority = 1
	clsactFilterHandle   = 0x78646c62 // "xdlb"
	clsactFilterName     = "xdplb_nic_ingress"
)

func attachClsact(ifindex int, prog *ebpf.Program) error {
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
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Handle:    clsactFilterHandle,
			Protocol:  unix.ETH_P_ALL,
			Priority:  clsactFilterPriority,
		},
		Fd:           prog.FD(),
		Name:         clsactFilterName,
		DirectAction: true,
	}
	if err := netlink.FilterReplace(filter); err != nil {
		return fmt.Errorf("add cls_bpf filter: %w", err)
	}
	return nil
}

// detachClsact removes our filter, if present; the qdisc stays because
// other tools may use it.
func detachClsact(ifindex int) error {
	filters, err := netlink.FilterList(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: ifindex}},
		netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Name == clsactFilterName {
			if err := netlink.FilterDel(f); err != nil {
				return err
			}
		}
	}
	return nil
}
