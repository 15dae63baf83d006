package child

import (
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestStop(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		grace      time.Duration
		wantKilled bool
	}{
		{"ends on SIGTERM", "echo ready; sleep 30", 5 * time.Second, false},
		{"ignores SIGTERM", `trap "" TERM; echo ready; while :; do sleep 0.1; done`, 200 * time.Millisecond, true},
		{"zero grace kills at once", "echo ready; sleep 30", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Start("sh", exec.Command("sh", "-c", tt.script), filepath.Join(t.TempDir(), "log"))
			if err != nil {
				t.Fatal(err)
			}
			waitForLog(t, p, "ready") // the shell has set its trap
			err = p.Stop(tt.grace)
			if got := errors.Is(err, ErrKilled); got != tt.wantKilled {
				t.Fatalf("Stop(%s) = %v, want killed=%v", tt.grace, err, tt.wantKilled)
			}
			if !tt.wantKilled && err != nil {
				t.Fatalf("Stop(%s) = %v", tt.grace, err)
			}
			if !p.Exited() || p.Err() == nil {
				t.Fatalf("after Stop: exited=%v err=%v, want an ended child with its signal", p.Exited(), p.Err())
			}
			if err := p.Stop(tt.grace); err != nil {
				t.Errorf("second Stop = %v, want nil", err)
			}
		})
	}
}

func TestLogAndExit(t *testing.T) {
	log := filepath.Join(t.TempDir(), "log")
	p, err := Start("counter", exec.Command("sh", "-c", "for i in 1 2 3 4 5; do echo line$i; done; echo oops >&2; exit 3"), log)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("child did not end")
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || exit.ExitCode() != 3 {
		t.Errorf("Err() = %v, want exit status 3", p.Err())
	}
	if got, want := p.LogTail(3), "line4\nline5\noops"; got != want {
		t.Errorf("LogTail(3) = %q, want %q", got, want)
	}
	if head := FileTail(log, 10); !strings.Contains(head, "starting sh -c") {
		t.Errorf("log lacks its header line:\n%s", head)
	}
}

func TestStartFailure(t *testing.T) {
	_, err := Start("missing", exec.Command("/nonexistent/binary"), filepath.Join(t.TempDir(), "log"))
	if err == nil || !strings.Contains(err.Error(), "starting missing") {
		t.Fatalf("Start of a missing binary = %v, want an error naming it", err)
	}
}

// waitForLog waits until p's log ends with line.
func waitForLog(t *testing.T, p *Process, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasSuffix(p.LogTail(1), line) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the log:\n%s", line, p.LogTail(10))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartOnBindsTheChild(t *testing.T) {
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	last := -1
	for c := 0; c < 1024; c++ {
		if allowed.IsSet(c) {
			last = c
		}
	}
	// The child reports its own binding: that of the shell, inherited.
	script := `grep Cpus_allowed_list /proc/self/status; echo ready; sleep 30`
	p, err := StartOn("sh", exec.Command("sh", "-c", script), filepath.Join(t.TempDir(), "log"), []int{last})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Second)
	waitForLog(t, p, "ready")
	if want := fmt.Sprintf("Cpus_allowed_list:\t%d\n", last); !strings.Contains(p.LogTail(5), want) {
		t.Errorf("child's log %q, want %q", p.LogTail(5), want)
	}
}
