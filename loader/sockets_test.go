package loader_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
)

// The socket programs follow --cgroup-root across restarts: a new path
// moves them there, and an agent without one removes those an earlier
// agent left (which would otherwise steer the node's sockets with an
// earlier build's code and maps).
func TestHostSocketsFollowTheCgroupRoot(t *testing.T) {
	testenv.RequirePrivileged(t)
	root := loader.FindCgroup2Root()
	if root == "" {
		testenv.Unavailable(t, "no cgroup v2 hierarchy")
	}
	cgroup := func(name string) string {
		path := filepath.Join(root, fmt.Sprintf("xdplb-test-%s-%d", name, os.Getpid()))
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
		return path
	}
	connectPrograms := func(path string) int {
		t.Helper()
		dir, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		q, err := link.QueryPrograms(link.QueryOptions{Target: int(dir.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
		if err != nil {
			t.Fatal(err)
		}
		return len(q.Programs)
	}
	first, second := cgroup("a"), cgroup("b")
	opts := smallOptions(testenv.BPFFS(t))
	load := func() *loader.Datapath {
		t.Helper()
		dp, err := loader.Load(opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { dp.Close() })
		return dp
	}

	if err := load().AttachHostSockets(first); err != nil {
		t.Fatal(err)
	}
	if n := connectPrograms(first); n != 1 {
		t.Fatalf("%d connect programs on the cgroup, want 1", n)
	}
	// Restarted on the same cgroup: updated in place, still one.
	if err := load().AttachHostSockets(first); err != nil {
		t.Fatal(err)
	}
	if n := connectPrograms(first); n != 1 {
		t.Fatalf("%d connect programs after a restart, want 1", n)
	}

	// Restarted with another cgroup root.
	if err := load().AttachHostSockets(second); err != nil {
		t.Fatal(err)
	}
	if a, b := connectPrograms(first), connectPrograms(second); a != 0 || b != 1 {
		t.Fatalf("after moving: %d connect programs on the old cgroup, %d on the new; want 0 and 1", a, b)
	}

	// Restarted without one.
	removed, err := load().DetachHostSockets()
	if err != nil || removed != 4 {
		t.Fatalf("DetachHostSockets removed %d (%v), want all 4", removed, err)
	}
	if n := connectPrograms(second); n != 0 {
		t.Errorf("%d connect programs left after detaching", n)
	}
	if removed, err := load().DetachHostSockets(); err != nil || removed != 0 {
		t.Errorf("DetachHostSockets with nothing attached: %d, %v", removed, err)
	}
}
