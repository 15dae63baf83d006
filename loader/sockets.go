package loader

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultCgroupRoot is where the cgroup v2 hierarchy is mounted.
const DefaultCgroupRoot = "/sys/fs/cgroup"

// The socket programs and the hooks they attach to.
var socketHooks = []struct {
	prog   string
	attach ebpf.AttachType
	pin    string
}{
	{"xdplb_connect4", ebpf.AttachCGroupInet4Connect, "cgroup-connect4"},
	{"xdplb_sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, "cgroup-sendmsg4"},
	{"xdplb_recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, "cgroup-recvmsg4"},
	{"xdplb_getpeername4", ebpf.AttachCgroupInet4GetPeername, "cgroup-getpeername4"},
}

// AttachHostSockets attaches the socket programs to a cgroup v2 directory
// (normally the root), so the node's own processes reach services. They
// act only on sockets of the network namespace the datapath was loaded in.
func (d *Datapath) AttachHostSockets(cgroupPath string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupPath, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup %s: not a cgroup v2 directory", cgroupPath)
	}
	for _, h := range socketHooks {
		prog := d.sock.Programs[h.prog]
		if prog == nil {
			return fmt.Errorf("socket object has no program %s", h.prog)
		}
		path := filepath.Join(linksDir(d.opts.PinRoot), h.pin)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			err = l.Update(prog)
			l.Close()
			if err != nil {
				return fmt.Errorf("replace %s: %w", h.prog, err)
			}
			continue
		} else if !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("open pinned link %s: %w", h.pin, err)
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: h.attach, Program: prog})
		if err != nil {
			return fmt.Errorf("attach %s to cgroup %s: %w", h.prog, cgroupPath, err)
		}
		err = l.Pin(path)
		l.Close()
		if err != nil {
			return fmt.Errorf("pin %s: %w", h.pin, err)
		}
	}
	return nil
}

// netnsCookie identifies the current network namespace (0 if the kernel
// cannot tell, which keeps the socket programs inert).
func netnsCookie() uint64 {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer unix.Close(fd)
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0
	}
	return cookie
}

// FindCgroup2Root returns where the cgroup v2 hierarchy is mounted: the
// unified /sys/fs/cgroup, or /sys/fs/cgroup/unified on hybrid systems;
// "" when neither is.
func FindCgroup2Root() string {
	for _, p := range []string{DefaultCgroupRoot, filepath.Join(DefaultCgroupRoot, "unified")} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	return ""
}
