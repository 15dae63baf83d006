package loadertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/xdplb/xdplb/loader"
)

// HoldPinLock starts another process that holds the lock on the pins under
// pinRoot, as an agent does from the moment it starts, and returns its pid
// and a function that kills it (SIGKILL, as a crash would). It is killed
// when the test ends at the latest.
//
// The holder is util-linux flock(1) on the pin directory; --close keeps
// the lock out of the command it runs, so it dies with flock, and both
// run in a process group of their own, killed together.
func HoldPinLock(t testing.TB, pinRoot string) (pid int, kill func()) {
	t.Helper()
	dir := filepath.Join(pinRoot, "xdplb")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("flock", "--exclusive", "--close", dir, "sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start a pin lock holder: %v", err)
	}
	kill = func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}
	t.Cleanup(kill)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		held, holder, err := loader.PinsLocked(pinRoot)
		if err != nil {
			t.Fatal(err)
		}
		if held && holder == cmd.Process.Pid {
			return cmd.Process.Pid, kill
		}
		if time.Now().After(deadline) {
			t.Fatalf("flock did not take the lock on %s within 5 s", dir)
		}
	}
}
