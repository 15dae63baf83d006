package suite

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/netns"
)

// Name prefixes of everything a run creates outside its output directory.
const (
	nsPrefix    = "xlb-perf-"
	bpffsPrefix = "xlb-perf-bpffs-"
)

// lockRun makes sure one perf run at a time uses the machine: two would
// disturb each other's figures. It waits for ctx at most.
func lockRun(ctx context.Context, log *slog.Logger) (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), "xdplb-perf.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open run lock: %w", err)
	}
	logged := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return func() {
				unix.Flock(int(f.Fd()), unix.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !logged {
			log.Info("waiting for another perf run to finish", "lock", path)
			logged = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another perf run: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// removeStale removes the namespaces and bpffs mounts of an earlier run
// that was killed before it could clean up. Only call it holding the run
// lock: then nothing else uses them.
func removeStale(log *slog.Logger) error {
	var errs []error
	out, err := netns.Run("ip", "netns", "list")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], nsPrefix) {
			continue
		}
		log.Warn("removing a namespace left by an earlier run", "namespace", f[0])
		errs = append(errs, (&netns.NS{Name: f[0]}).Delete())
	}
	mounts, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer mounts.Close()
	sc := bufio.NewScanner(mounts)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		dir := f[4]
		if filepath.Dir(dir) != filepath.Clean(os.TempDir()) || !strings.HasPrefix(filepath.Base(dir), bpffsPrefix) {
			continue
		}
		log.Warn("unmounting a bpffs left by an earlier run", "dir", dir)
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", dir, err))
			continue
		}
		os.Remove(dir)
	}
	return errors.Join(errs...)
}
