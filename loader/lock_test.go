package loader_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// A process holding the lock is found with its pid; when it dies without
// releasing it (SIGKILL), the kernel does, and an agent takes the pins.
func TestPinLockDiesWithItsHolder(t *testing.T) {
	root := testenv.BPFFS(t)
	if err := os.Mkdir(filepath.Join(root, "xdplb"), 0o700); err != nil {
		t.Fatal(err)
	}
	holder, kill := loadertest.HoldPinLock(t, root)

	held, pid, err := loader.PinsLocked(root)
	if err != nil || !held || pid != holder {
		t.Fatalf("PinsLocked = %v, pid %d, %v; want held by pid %d", held, pid, err, holder)
	}
	l, err := loader.TryLockPins(root)
	var busy *loader.PinsInUseError
	if !errors.As(err, &busy) || busy.PID != holder {
		l.Unlock()
		t.Fatalf("TryLockPins under a holder: %v, want a PinsInUseError naming pid %d", err, holder)
	}
	if msg := err.Error(); !strings.Contains(msg, fmt.Sprintf("pid %d", holder)) || !strings.Contains(msg, root) {
		t.Errorf("error %q does not name the holder's pid and the pin root", msg)
	}

	kill()
	if held, _, err := loader.PinsLocked(root); err != nil || held {
		t.Fatalf("after the holder was killed: PinsLocked = %v, %v; want free", held, err)
	}
	l, err = loader.LockPins(root, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("lock after the holder was killed: %v", err)
	}
	l.Unlock()
}

// A command's probe of the lock (a `status` run at the same instant) is
// not taken for an agent by another command: it waits the probe out.
func TestAProbeIsNotAnAgent(t *testing.T) {
	root := testenv.BPFFS(t)
	if err := os.Mkdir(filepath.Join(root, "xdplb"), 0o700); err != nil {
		t.Fatal(err)
	}
	probe, err := loader.TryLockPins(root)
	if err != nil || probe == nil {
		t.Fatalf("probe: %v", err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(100 * time.Millisecond)
		probe.Unlock()
		close(released)
	}()
	held, pid, err := loader.PinsLocked(root)
	<-released
	if err != nil || held {
		t.Errorf("PinsLocked during another command's probe = %v (pid %d), %v; want free", held, pid, err)
	}
}
