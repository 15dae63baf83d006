package loader

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// One agent runs per pin root. It holds an exclusive flock(2) on the
// directory <pin root>/xdplb (which holds the pins of every schema
// version) from before it loads anything until it exits; the kernel
// releases the lock when the process ends, however it ends, so a crashed
// agent leaves no stale lock behind. `xdplb detach` takes the same lock
// for as long as it removes the pins, and `xdplb status` tests it. bpffs
// holds no plain files, but a directory can be opened and locked.

// pinLockWait is how long an agent waits for the lock: a `status` holds it
// for an instant, a `detach` while it removes the pins.
const pinLockWait = 2 * time.Second

// pinProbeWait is how long a command waits for the lock before it takes
// its holder for an agent: longer than another command's probe (a
// `status` run at the same instant) holds it.
const pinProbeWait = 250 * time.Millisecond

// PinLock is a held lock on a pin root.
type PinLock struct {
	f *os.File
}

// Unlock releases the lock; nil releases nothing.
func (l *PinLock) Unlock() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the last descriptor releases the flock
		l.f = nil
	}
}

// PinsInUseError says that another process holds the lock on a pin root.
type PinsInUseError struct {
	Root string
	// PID is the holder as this process sees it; 0 when it is not visible
	// (it runs in a pid namespace this one cannot see into).
	PID int
}

func (e *PinsInUseError) Error() string {
	holder := "another xdplb process"
	if e.PID != 0 {
		holder += fmt.Sprintf(" (pid %d)", e.PID)
	}
	return fmt.Sprintf("the pins under %s are held by %s: one agent runs per --bpffs-root", e.Root, holder)
}

// LockPins takes the lock for an agent, waiting up to pinLockWait for a
// short-lived holder. It mounts bpffs at pinRoot first if there is none,
// as Load would: the lock must be on the file system the pins go on.
func LockPins(pinRoot string, log *slog.Logger) (*PinLock, error) {
	if err := ensureBPFFS(pinRoot, log); err != nil {
		return nil, err
	}
	return lockPinsWithin(pinRoot, true, pinLockWait)
}

// TryLockPins takes the lock on pinRoot for a command that must not run
// beside an agent (detach), waiting only for another command's probe. It
// returns a *PinsInUseError if another process holds it, and nil (nothing
// to lock) if no xdplb directory is there.
func TryLockPins(pinRoot string) (*PinLock, error) {
	return lockPinsWithin(pinRoot, false, pinProbeWait)
}

// lockPinsWithin tries to take the lock until wait has passed.
func lockPinsWithin(pinRoot string, create bool, wait time.Duration) (*PinLock, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := tryLockPins(pinRoot, create)
		var busy *PinsInUseError
		if !errors.As(err, &busy) || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// PinsLocked reports whether another process (a running agent, most
// likely) holds the lock on pinRoot, and its pid as this process sees it
// (0 when not visible from here).
func PinsLocked(pinRoot string) (held bool, pid int, err error) {
	l, err := TryLockPins(pinRoot)
	var busy *PinsInUseError
	if errors.As(err, &busy) {
		return true, busy.PID, nil
	}
	l.Unlock()
	return false, 0, err
}

// tryLockPins takes the lock if it is free, creating the directory if
// create is set.
func tryLockPins(pinRoot string, create bool) (*PinLock, error) {
	path := pinLockPath(pinRoot)
	// A detach removes the directory: the lock taken may be on one that
	// is gone, so try again on the one that replaced it.
	for range 10 {
		f, err := os.Open(path)
		if errors.Is(err, os.ErrNotExist) {
			if !create {
				return nil, nil
			}
			if err := os.Mkdir(path, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("lock the pins under %s: %w", pinRoot, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lock the pins under %s: %w", pinRoot, err)
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, &PinsInUseError{Root: pinRoot, PID: lockHolder(path)}
			}
			return nil, fmt.Errorf("lock the pins under %s: %w", pinRoot, err)
		}
		var held, now unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock the pins under %s: %w", pinRoot, err)
		}
		if err := unix.Stat(path, &now); err == nil && now.Dev == held.Dev && now.Ino == held.Ino {
			return &PinLock{f: f}, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock the pins under %s: %s keeps being replaced", pinRoot, path)
}

// lockHolder finds the process holding a flock on path in /proc/locks: its
// pid as this process sees it, 0 if it is not listed.
func lockHolder(path string) int {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0
	}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return 0
	}
	defer f.Close()
	return parseLockHolder(f, st.Dev, st.Ino)
}

// parseLockHolder reads /proc/locks ("1: FLOCK  ADVISORY  WRITE 4211
// 00:2a:2454706 0 EOF": the device in hex major:minor, then the inode)
// for the holder of a flock on the file dev, ino. Waiters ("1: ->
// FLOCK ...") are skipped.
func parseLockHolder(r io.Reader, dev, ino uint64) int {
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		if pid, err := strconv.Atoi(f[4]); err == nil && pid > 0 {
			return pid
		}
	}
	return 0
}
