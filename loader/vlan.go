package loader

import (
	"fmt"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// HiddenVLANs returns the 802.1Q VLAN devices on ifname whose frames XDP sees
// without their tag: the NIC strips VLAN tags in hardware (ethtool's
// rx-vlan-offload) and hands XDP the bare frame, which it cannot tell from
// untagged traffic (TC sees the tag in the skb and leaves such frames to
// the stack). Nil when the offload is off or no VLAN sits on ifname.
func HiddenVLANs(ifname string) ([]string, error) {
	nic, err := netlink.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", ifname, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var vlans []string
	for _, l := range links {
		// 802.1ad devices are left out: rx-vlan-offload strips 802.1Q
		// tags only (S-tags have a flag of their own, which
		// ETHTOOL_GFLAGS does not report).
		if v, ok := l.(*netlink.Vlan); ok && v.ParentIndex == nic.Attrs().Index && v.VlanProtocol != netlink.VLAN_PROTOCOL_8021AD {
			vlans = append(vlans, v.Name)
		}
	}
	if len(vlans) == 0 {
		return nil, nil
	}
	stripped, err := RxVLANOffload(ifname)
	if err != nil || !stripped {
		return nil, err
	}
	return vlans, nil
}

// ethFlagRxVLAN is ETH_FLAG_RXVLAN of ETHTOOL_GFLAGS: rx-vlan-offload.
const ethFlagRxVLAN = 1 << 8

// RxVLANOffload reports whether ifname strips VLAN tags of received
// frames in hardware (ethtool's rx-vlan-offload).
func RxVLANOffload(ifname string) (bool, error) {
	value := struct{ cmd, data uint32 }{cmd: unix.ETHTOOL_GFLAGS}
	if err := ethtoolIoctl(ifname, unsafe.Pointer(&value)); err != nil {
		return false, fmt.Errorf("interface %s: read offload flags: %w", ifname, err)
	}
	return value.data&ethFlagRxVLAN != 0, nil
}

// ifreqData is struct ifreq with a pointer in its union, as SIOCETHTOOL
// takes it.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(unsafe.Pointer(nil))]byte
}

// ethtoolIoctl runs the SIOCETHTOOL command that data points to.
func ethtoolIoctl(ifname string, data unsafe.Pointer) error {
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("name longer than %d bytes", unix.IFNAMSIZ-1)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	ifr := ifreqData{data: data}
	copy(ifr.name[:], ifname)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}
