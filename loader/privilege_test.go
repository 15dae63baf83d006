package loader_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// withoutCapabilities runs fn on an OS thread whose effective capability
// set is empty, as a process without CAP_BPF, CAP_NET_ADMIN and
// CAP_SYS_ADMIN would run (capabilities are per thread; the permitted set
// stays, so the thread gets them back afterwards).
func withoutCapabilities(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var saved [2]unix.CapUserData
		if err := unix.Capget(&hdr, &saved[0]); err != nil {
			t.Errorf("capget: %v", err)
			return
		}
		dropped := saved
		dropped[0].Effective, dropped[1].Effective = 0, 0
		if err := unix.Capset(&hdr, &dropped[0]); err != nil {
			t.Errorf("capset: %v", err)
			return
		}
		fn()
		if err := unix.Capset(&hdr, &saved[0]); err != nil {
			// Left locked: the runtime retires the thread.
			t.Errorf("restore capabilities: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	<-done
}

// TestLoadWithoutPrivilegeSaysSo checks that a load refused for lack of
// privilege says so in one line, naming what failed and the capabilities
// needed, instead of a bare "operation not permitted".
func TestLoadWithoutPrivilegeSaysSo(t *testing.T) {
	warm := testenv.BPFFS(t)
	// A privileged load first: the library's feature probes are cached
	// for the process, and must not be cached as "unsupported" below.
	dp, err := loadertest.Load(smallOptions(warm), nil)
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()

	for _, tc := range []struct {
		name string
		run  func(root string) error
	}{
		{"load", func(root string) error {
			dp, err := loadertest.Load(smallOptions(root), nil)
			if err == nil {
				dp.Close()
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testenv.BPFFS(t)
			var err error
			withoutCapabilities(t, func() { err = tc.run(root) })
			if err == nil {
				t.Fatal("succeeded without capabilities")
			}
			msg := err.Error()
			if !errors.Is(err, unix.EPERM) || strings.Contains(msg, "\n") ||
				!strings.Contains(msg, "missing privilege") || !strings.Contains(msg, "CAP_BPF") ||
				!strings.Contains(msg, "CAP_SYS_ADMIN") || !strings.Contains(msg, "root") {
				t.Errorf("error %q: want one line naming what failed and the missing privilege (CAP_BPF ... CAP_SYS_ADMIN, or root)", msg)
			}
		})
	}
}

// TestPrivateBPFFSIsLogged checks that a load that must mount its own
// bpffs (the node has none at the pin root) warns that the pins will not
// outlive it.
func TestPrivateBPFFSIsLogged(t *testing.T) {
	testenv.RequirePrivileged(t)
	for _, tc := range []struct {
		name     string
		onBPFFS  bool
		wantWarn bool
	}{
		{"node bpffs", true, false},
		{"no bpffs", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var root string
			if tc.onBPFFS {
				root = testenv.BPFFS(t)
			} else {
				root = t.TempDir()
				t.Cleanup(func() {
					var st unix.Statfs_t
					if unix.Statfs(root, &st) == nil && st.Type == unix.BPF_FS_MAGIC {
						if err := unix.Unmount(root, unix.MNT_DETACH); err != nil {
							t.Errorf("unmount %s: %v", root, err)
						}
					}
				})
			}
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			dp, err := loadertest.Load(smallOptions(root), log)
			if err != nil {
				t.Fatal(err)
			}
			dp.Close()
			got := strings.Contains(buf.String(), "level=WARN") && strings.Contains(buf.String(), "bpffs") &&
				strings.Contains(buf.String(), root)
			if got != tc.wantWarn {
				t.Errorf("log:\n%s\nwant a warning about a private bpffs at %s: %v", buf.String(), root, tc.wantWarn)
			}
		})
	}
}

// TestLoadLiftsMemlockFirst checks that a load lifts RLIMIT_MEMLOCK before
// it creates anything (kernels before 5.11 charge maps to it, and refuse
// them with EPERM over it), and that a failure to says so in one line:
// EPERM names the capability that limit needs besides those of bpf().
func TestLoadLiftsMemlockFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"not permitted", unix.EPERM, []string{"lift RLIMIT_MEMLOCK", "missing privilege", "CAP_BPF", "CAP_SYS_RESOURCE"}},
		{"other", unix.EINVAL, []string{"lift RLIMIT_MEMLOCK for BPF maps", "invalid argument"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testenv.BPFFS(t)
			opts := loader.WithMemlockError(smallOptions(root), fmt.Errorf("failed to set memlock rlimit: %w", tc.err))
			dp, err := loadertest.Load(opts, nil)
			if err == nil {
				dp.Close()
				t.Fatal("loaded without lifting RLIMIT_MEMLOCK")
			}
			if !errors.Is(err, tc.err) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line wrapping %v", err, tc.err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q, want %q in it", err, want)
				}
			}
			if _, err := os.Stat(loader.Dir(root)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("pin directory created before the limit was lifted (%v)", err)
			}
		})
	}
}
