package loader

import (
	"encoding/binary"
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

// The socket programs and the hooks they attach to. The inet6 ones serve
// dual-stack sockets that reach IPv4 services through v4-mapped addresses;
// such a socket's unconnected datagrams run sendmsg4 (see sock.c).
var socketHooks = []struct {
	prog   string
	attach ebpf.AttachType
	pin    string
}{
	{"xdplb_connect4", ebpf.AttachCGroupInet4Connect, "cgroup-connect4"},
	{"xdplb_sendmsg4", ebpf.AttachCGroupUDP4Sendmsg, "cgroup-sendmsg4"},
	{"xdplb_recvmsg4", ebpf.AttachCGroupUDP4Recvmsg, "cgroup-recvmsg4"},
	{"xdplb_getpeername4", ebpf.AttachCgroupInet4GetPeername, "cgroup-getpeername4"},
	{"xdplb_connect6", ebpf.AttachCGroupInet6Connect, "cgroup-connect6"},
	{"xdplb_recvmsg6", ebpf.AttachCGroupUDP6Recvmsg, "cgroup-recvmsg6"},
	{"xdplb_getpeername6", ebpf.AttachCgroupInet6GetPeername, "cgroup-getpeername6"},
}

// AttachHostSockets attaches the socket programs to a cgroup v2 directory
// (normally the root), so the node's own processes reach services. They
// act only on sockets of the network namespace the datapath was loaded in.
// Links an earlier agent pinned on the same cgroup are updated in place;
// if any is on another cgroup (--cgroup-root changed), all are detached
// and attached afresh. Either every hook ends up attached or, if one
// fails, none that this call attached stays: a node whose connects are
// translated and whose datagrams are not would be worse than neither.
// Before CommitPins, what it changes is recorded for Revert, which puts an
// earlier program back on the cgroup given here.
func (d *Datapath) AttachHostSockets(cgroupPath string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(cgroupPath, &st); err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	if st.Type != unix.CGROUP2_SUPER_MAGIC {
		return fmt.Errorf("cgroup %s: not a cgroup v2 directory", cgroupPath)
	}
	target, err := cgroupID(cgroupPath)
	if err != nil {
		return fmt.Errorf("cgroup %s: %w", cgroupPath, err)
	}
	if err := d.rememberHostSockets(cgroupPath); err != nil {
		return err
	}
	if d.hostSocketsElsewhere(target) {
		if _, err := d.DetachHostSockets(); err != nil {
			return err
		}
		d.log.Info("socket programs move to another cgroup", "cgroup", cgroupPath)
	}
	var attached []string
	undo := func(err error) error {
		for _, path := range attached {
			unpinLink(path) //nolint:errcheck // best effort: the error returned says what failed
		}
		return err
	}
	for _, h := range socketHooks {
		prog := d.sock.Programs[h.prog]
		if prog == nil {
			return undo(fmt.Errorf("socket object has no program %s", h.prog))
		}
		path := filepath.Join(linksDir(d.opts.PinRoot), h.pin)
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			err = l.Update(prog)
			l.Close()
			if err != nil {
				return undo(fmt.Errorf("replace %s: %w", h.prog, err))
			}
			continue
		} else if !errors.Is(err, os.ErrNotExist) {
			return undo(fmt.Errorf("open pinned link %s: %w", h.pin, err))
		}
		if err := attachPinnedCgroup(cgroupPath, h.attach, prog, path); err != nil {
			return undo(fmt.Errorf("%s: %w", h.prog, err))
		}
		attached = append(attached, path)
	}
	return nil
}

// rememberHostSockets records for Revert the program each socket hook's
// pinned link runs, or that it has none.
func (d *Datapath) rememberHostSockets(cgroupPath string) error {
	if !d.recording() {
		return nil
	}
	for _, h := range socketHooks {
		path := filepath.Join(linksDir(d.opts.PinRoot), h.pin)
		var prev *ebpf.Program
		l, err := link.LoadPinnedLink(path, nil)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("open pinned link %s: %w", h.pin, err)
		default:
			prev, err = linkProgram(l)
			l.Close()
			if err != nil {
				return fmt.Errorf("the program %s runs: %w", h.pin, err)
			}
		}
		d.onRevert("socket hook "+h.pin, prev, func() error {
			if prev == nil {
				return unpinLink(path)
			}
			if _, err := os.Stat(path); err == nil {
				return updatePinnedLink(path, prev)
			}
			// The link was dropped to move the hooks to cgroupPath:
			// prev is attached there.
			return attachPinnedCgroup(cgroupPath, h.attach, prev, path)
		})
	}
	return nil
}

// attachPinnedCgroup attaches prog to a cgroup through a link pinned at
// path.
func attachPinnedCgroup(cgroupPath string, attach ebpf.AttachType, prog *ebpf.Program, path string) error {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: attach, Program: prog})
	if err != nil {
		return fmt.Errorf("attach to cgroup %s: %w", cgroupPath, err)
	}
	defer l.Close()
	if err := l.Pin(path); err != nil {
		return fmt.Errorf("pin %s: %w", filepath.Base(path), err)
	}
	return nil
}

// hostSocketsElsewhere reports whether a pinned socket link is attached to
// a cgroup other than target.
func (d *Datapath) hostSocketsElsewhere(target uint64) bool {
	for _, h := range socketHooks {
		l, err := link.LoadPinnedLink(filepath.Join(linksDir(d.opts.PinRoot), h.pin), nil)
		if err != nil {
			continue
		}
		on, known := linkCgroupID(l)
		l.Close()
		if known && on != target {
			return true
		}
	}
	return false
}

// DetachHostSockets removes the socket programs an earlier agent attached,
// for an agent that runs without them (--cgroup-root off, or no cgroup v2
// found): left in place they would go on steering the node's sockets with
// an earlier build's code and maps. It returns how many it removed.
func (d *Datapath) DetachHostSockets() (int, error) {
	removed := 0
	var errs []error
	for _, h := range socketHooks {
		path := filepath.Join(linksDir(d.opts.PinRoot), h.pin)
		if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := unpinLink(path); err != nil {
			errs = append(errs, fmt.Errorf("detach %s: %w", h.prog, err))
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// cgroupID returns the id of a cgroup v2 directory, as the kernel reports
// it for the links attached there: its file handle (what libbpf reads).
func cgroupID(path string) (uint64, error) {
	handle, _, err := unix.NameToHandleAt(unix.AT_FDCWD, path, 0)
	if err != nil {
		return 0, fmt.Errorf("read cgroup id: %w", err)
	}
	b := handle.Bytes()
	if len(b) != 8 {
		return 0, fmt.Errorf("read cgroup id: file handle of %d bytes, want 8", len(b))
	}
	return binary.NativeEndian.Uint64(b), nil
}

// linkCgroupID returns the cgroup a cgroup link is attached to; known is
// false if the link's info cannot be read.
func linkCgroupID(l link.Link) (id uint64, known bool) {
	info, err := l.Info()
	if err != nil {
		return 0, false
	}
	if c := info.Cgroup(); c != nil {
		return c.CgroupId, true
	}
	return 0, false
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
