package loader_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
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
		dp, err := loadertest.Load(opts, nil)
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

// A failed start's Revert puts the earlier socket programs back: on their
// links, updated in place, and where the start moved them to another
// cgroup, on the links there.
func TestRevertPutsBackTheSocketPrograms(t *testing.T) {
	testenv.RequirePrivileged(t)
	root := loader.FindCgroup2Root()
	if root == "" {
		testenv.Unavailable(t, "no cgroup v2 hierarchy")
	}
	for _, tc := range []struct {
		name  string
		moved bool // the failed start attaches to another cgroup
	}{{"same cgroup", false}, {"moved to another cgroup", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cgroups := []string{}
			for _, name := range []string{"a", "b"} {
				path := filepath.Join(root, fmt.Sprintf("xdplb-revert-%s-%d", name, os.Getpid()))
				if err := os.Mkdir(path, 0o755); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { os.Remove(path) })
				cgroups = append(cgroups, path)
			}
			connectPrograms := func(path string) []ebpf.ProgramID {
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
				var ids []ebpf.ProgramID
				for _, p := range q.Programs {
					ids = append(ids, p.ID)
				}
				return ids
			}
			opts := smallOptions(testenv.BPFFS(t))
			running, err := loadertest.Load(opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { loader.Detach(opts.PinRoot) })
			defer running.Close()
			if err := running.AttachHostSockets(cgroups[0]); err != nil {
				t.Fatal(err)
			}
			before := connectPrograms(cgroups[0])
			if len(before) != 1 {
				t.Fatalf("connect programs %v, want one", before)
			}

			dp, err := loader.Load(opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			target := cgroups[0]
			if tc.moved {
				target = cgroups[1]
			}
			if err := dp.AttachHostSockets(target); err != nil {
				t.Fatal(err)
			}
			if got := connectPrograms(target); len(got) != 1 || got[0] == before[0] {
				t.Fatalf("after the attach: connect programs %v, want one other than %v", got, before)
			}
			err = dp.Revert()
			dp.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got := connectPrograms(target); !slices.Equal(got, before) {
				t.Errorf("after the revert: connect programs %v, want the earlier %v", got, before)
			}
		})
	}
}
