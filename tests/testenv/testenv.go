// Package testenv gives tests what they need from the machine: root and a
// BPF-capable kernel, a private bpffs, and network namespaces to build test
// topologies in. Where the machine cannot provide them, tests skip with the
// reason, except in CI (XDPLB_CI=1), where a skip would hide a regression
// and is turned into a failure.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// InCI reports whether the tests run in CI, where nothing may be skipped.
func InCI() bool { return os.Getenv("XDPLB_CI") == "1" }

// Unavailable skips the test, or fails it in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("required in CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequirePrivileged makes sure the test runs as root on Linux.
func RequirePrivileged(t testing.TB) {
	t.Helper()
	if runtime.GOOS != "linux" {
		Unavailable(t, "needs Linux, running on %s", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (BPF, network namespaces)")
	}
}

// RequireCommand makes sure a program is on PATH.
func RequireCommand(t testing.TB, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "needs %s on PATH (make deps installs it)", name)
	}
	return path
}

// BPFFS mounts a private bpffs for the test and unmounts it afterwards.
// It lives in the root mount namespace, so every process of the test
// (also those started with `ip netns exec`) sees the same pins.
func BPFFS(t testing.TB) string {
	t.Helper()
	RequirePrivileged(t)
	dir, err := os.MkdirTemp("", "xdplb-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(dir)
		Unavailable(t, "cannot mount bpffs: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
		os.Remove(dir)
	})
	return dir
}

// Run runs a command and fails the test with its output if it fails.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// RepoRoot returns the repository root (the directory holding go.mod).
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the working directory")
		}
		dir = parent
	}
}
