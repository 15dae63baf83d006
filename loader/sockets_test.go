package loader_test

import (
	"fmt"
	"maps"
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

// socketAttachTypes are the hooks the socket programs attach to: the
// inet4 ones, and the inet6 ones dual-stack sockets reach IPv4 services
// through (their unconnected datagrams run sendmsg4).
var socketAttachTypes = []ebpf.AttachType{
	ebpf.AttachCGroupInet4Connect,
	ebpf.AttachCGroupUDP4Sendmsg,
	ebpf.AttachCGroupUDP4Recvmsg,
	ebpf.AttachCgroupInet4GetPeername,
	ebpf.AttachCGroupInet6Connect,
	ebpf.AttachCGroupUDP6Recvmsg,
	ebpf.AttachCgroupInet6GetPeername,
}

// socketPrograms lists the programs on each socket hook of a cgroup.
func socketPrograms(t *testing.T, path string) map[ebpf.AttachType][]ebpf.ProgramID {
	t.Helper()
	dir, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	out := map[ebpf.AttachType][]ebpf.ProgramID{}
	for _, attach := range socketAttachTypes {
		q, err := link.QueryPrograms(link.QueryOptions{Target: int(dir.Fd()), Attach: attach})
		if err != nil {
			t.Fatalf("query %s: %v", attach, err)
		}
		for _, p := range q.Programs {
			out[attach] = append(out[attach], p.ID)
		}
	}
	return out
}

// expectOnEveryHook fails the test unless each socket hook of a cgroup
// runs n programs.
func expectOnEveryHook(t *testing.T, path string, n int, when string) {
	t.Helper()
	progs := socketPrograms(t, path)
	for _, attach := range socketAttachTypes {
		if got := len(progs[attach]); got != n {
			t.Fatalf("%s: %d programs on %s of %s, want %d", when, got, attach, filepath.Base(path), n)
		}
	}
}

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
	expectOnEveryHook(t, first, 1, "attached")
	// Restarted on the same cgroup: updated in place, still one each.
	attached := socketPrograms(t, first)
	if err := load().AttachHostSockets(first); err != nil {
		t.Fatal(err)
	}
	expectOnEveryHook(t, first, 1, "after a restart")
	for attach, ids := range socketPrograms(t, first) {
		if ids[0] == attached[attach][0] {
			t.Errorf("after a restart %s still runs the earlier program %d", attach, ids[0])
		}
	}

	// Restarted with another cgroup root.
	if err := load().AttachHostSockets(second); err != nil {
		t.Fatal(err)
	}
	expectOnEveryHook(t, first, 0, "the old cgroup after moving")
	expectOnEveryHook(t, second, 1, "the new cgroup after moving")

	// Restarted without one.
	removed, err := load().DetachHostSockets()
	if err != nil || removed != len(socketAttachTypes) {
		t.Fatalf("DetachHostSockets removed %d (%v), want all %d", removed, err, len(socketAttachTypes))
	}
	expectOnEveryHook(t, second, 0, "after detaching")
	if removed, err := load().DetachHostSockets(); err != nil || removed != 0 {
		t.Errorf("DetachHostSockets with nothing attached: %d, %v", removed, err)
	}
}

// A failed start's Revert puts the earlier socket programs back: on their
// links, updated in place, and where the start moved them to another
// cgroup, on the links there. Hooks the earlier agent had no program on
// (one from before the inet6 hooks) are left without one again.
func TestRevertPutsBackTheSocketPrograms(t *testing.T) {
	testenv.RequirePrivileged(t)
	root := loader.FindCgroup2Root()
	if root == "" {
		testenv.Unavailable(t, "no cgroup v2 hierarchy")
	}
	for _, tc := range []struct {
		name      string
		moved     bool // the failed start attaches to another cgroup
		inet4Only bool // the earlier agent attached the inet4 hooks alone
	}{
		{"same cgroup", false, false},
		{"moved to another cgroup", true, false},
		{"earlier agent without the inet6 hooks", false, true},
	} {
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
			expectOnEveryHook(t, cgroups[0], 1, "the running datapath")
			if tc.inet4Only {
				// Unpinned while open, the link is detached at the close
				// (the last reference); a pin removed alone is released
				// later, by a kernel worker.
				for _, hook := range []string{"connect6", "recvmsg6", "getpeername6"} {
					l, err := link.LoadPinnedLink(filepath.Join(loader.Dir(opts.PinRoot), "links", "cgroup-"+hook), nil)
					if err != nil {
						t.Fatal(err)
					}
					err = l.Unpin()
					l.Close()
					if err != nil {
						t.Fatal(err)
					}
				}
			}
			before := socketPrograms(t, cgroups[0])
			if n := len(before[ebpf.AttachCGroupInet6Connect]); tc.inet4Only && n != 0 {
				t.Fatalf("%d connect6 programs left after removing the earlier agent's link", n)
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
			expectOnEveryHook(t, target, 1, "after the attach")
			for attach, ids := range socketPrograms(t, target) {
				if earlier := before[attach]; len(earlier) > 0 && ids[0] == earlier[0] {
					t.Fatalf("after the attach %s runs the earlier program %d, want the new one", attach, ids[0])
				}
			}
			err = dp.Revert()
			dp.Close()
			if err != nil {
				t.Fatal(err)
			}
			if got := socketPrograms(t, target); !maps.EqualFunc(got, before, slices.Equal) {
				t.Errorf("after the revert: programs %v, want the earlier %v", got, before)
			}
		})
	}
}
