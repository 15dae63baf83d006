package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// TestCommandsSeeAStartingAgent: an agent holds the pins' lock from the
// moment it starts, before it has recorded anything (its record here is
// still that of no agent at all). Meanwhile `status` calls it running and
// starting, `detach` refuses and leaves everything attached, and another
// agent exits 1 before it attaches anything. Once it is gone (killed: the
// kernel drops the lock), detach goes ahead.
func TestCommandsSeeAStartingAgent(t *testing.T) {
	ns := testNetns(t)
	agents := startOnly()
	cleanEnv(t)
	dir := t.TempDir()
	services := filepath.Join(dir, "services.yaml")

	// An earlier agent attached the datapath and stopped.
	root := t.TempDir()
	cleanupRoot(t, ns, root)
	if r := agents.runIn(t, ns, flagCase{set: map[string]string{"cgroup-root": "off"}}.args(root, services)...); r.code != exitOK {
		t.Fatalf("agent: exit %d\n%s", r.code, r.stderr)
	}
	maps, err := loader.OpenPinned(root)
	if err != nil {
		t.Fatal(err)
	}
	err = dataplane.New(maps).PutAgentState(dataplane.AgentState{})
	maps.Close()
	if err != nil {
		t.Fatal(err)
	}
	attached := observe(t, ns, root, testIface)

	pid, stop := loadertest.HoldPinLock(t, root)
	r := runIn(t, ns, "status", "--bpffs-root", root)
	if want := fmt.Sprintf("Agent:     pid %d (running, starting: no sync yet)\n", pid); r.code != exitOK || !strings.Contains(r.stdout, want) {
		t.Errorf("status under a starting agent: exit %d, stderr %q, stdout\n%s\nwant the line %q", r.code, r.stderr, r.stdout, want)
	}
	r = runIn(t, ns, "status", "--bpffs-root", root, "-o", "json")
	var st statusJSON
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || r.code != exitOK {
		t.Fatalf("status -o json: exit %d, %v\n%s", r.code, err, r.stdout)
	}
	if st.AgentPID != uint32(pid) || !st.AgentAlive || !st.AgentStarting {
		t.Errorf("status -o json: agentPid %d, agentAlive %v, agentStarting %v; want %d, true, true",
			st.AgentPID, st.AgentAlive, st.AgentStarting, pid)
	}

	r = runIn(t, ns, "detach", "--bpffs-root", root)
	if want := fmt.Sprintf("xdplb: an agent (pid %d) runs on the pins under %s", pid, root); r.code != exitFailure ||
		!strings.HasPrefix(r.stderr, want) || !strings.Contains(r.stderr, "--force") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("detach under a starting agent: exit %d, %q; want exit 1 and one line starting %q and naming --force", r.code, r.stderr, want)
	}
	if got := observe(t, ns, root, testIface); got.xdpProg != attached.xdpProg || got.tcxProgs != attached.tcxProgs ||
		got.reservedPorts != attached.reservedPorts || !loader.NICAttached(root, testIface) {
		t.Errorf("a refused detach changed the datapath: %+v, was %+v", got, attached)
	}

	// A second agent on the same pins fails before it attaches anything:
	// the interface keeps the programs it has.
	r = agents.runIn(t, ns, flagCase{set: map[string]string{"cgroup-root": "off"}}.args(root, services)...)
	if want := fmt.Sprintf("xdplb: the pins under %s are held by another xdplb process (pid %d): one agent runs per --bpffs-root\n", root, pid); r.code != exitFailure || r.stderr != want {
		t.Errorf("second agent: exit %d, %q; want exit 1 and %q", r.code, r.stderr, want)
	}
	if got := observe(t, ns, root, testIface); got.xdpProg != attached.xdpProg {
		t.Errorf("the second agent replaced the XDP program: %d, was %d", got.xdpProg, attached.xdpProg)
	}

	stop()
	if r := runIn(t, ns, "status", "--bpffs-root", root); r.code != exitOK || !strings.Contains(r.stdout, "Agent:     never ran\n") {
		t.Errorf("status once the agent is gone: exit %d, %q\n%s", r.code, r.stderr, r.stdout)
	}
	if r := runIn(t, ns, "detach", "--bpffs-root", root); r.code != exitOK {
		t.Errorf("detach once the agent is gone: exit %d, %q", r.code, r.stderr)
	}
}

// An agent starting on pins not there yet (the first start on a node):
// status says so rather than only that nothing is pinned.
func TestStatusOfAnAgentStartingWithoutPins(t *testing.T) {
	cleanEnv(t)
	root := testenv.BPFFS(t)
	pid, _ := loadertest.HoldPinLock(t, root)
	r := runIn(t, nil, "status", "--bpffs-root", root)
	want := fmt.Sprintf("xdplb: no xdplb datapath pinned under %s (is the agent running with this --bpffs-root?); "+
		"an agent (pid %d) holds the lock on these pins: it is starting\n", root, pid)
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("status: exit %d, %q; want exit 1 and %q", r.code, r.stderr, want)
	}
}

// The lock says an agent runs; the record says which and how far it got.
// A holder not visible from here (an agent in a pod's pid namespace) is the
// recorded agent; a visible holder that is not the recorded agent is a new
// one, starting.
func TestWithLockHolder(t *testing.T) {
	synced := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	recorded := inspect.Status{AgentPID: 4211, LastSync: &synced, Syncs: 7, Services: 3}
	tests := []struct {
		name         string
		st           inspect.Status
		held         bool
		holder       int
		wantPID      uint32
		wantStarting bool
		wantSyncs    uint64
	}{
		{"no lock: the record as it is", recorded, false, 0, 4211, false, 7},
		{"the recorded agent holds it", withAlive(recorded), true, 4211, 4211, false, 7},
		{"a holder not visible from here", recorded, true, 0, 4211, false, 7},
		{"another process holds it: starting", withAlive(recorded), true, 5000, 5000, true, 0},
		{"the recorded agent is dead, another holds it", recorded, true, 5000, 5000, true, 0},
		{"nothing recorded, a holder not visible", inspect.Status{}, true, 0, 0, true, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := withLockHolder(tc.st, tc.held, tc.holder)
			if got.AgentPID != tc.wantPID || got.AgentStarting != tc.wantStarting || got.Syncs != tc.wantSyncs {
				t.Errorf("pid %d, starting %v, syncs %d; want pid %d, starting %v, syncs %d",
					got.AgentPID, got.AgentStarting, got.Syncs, tc.wantPID, tc.wantStarting, tc.wantSyncs)
			}
			if tc.held && !got.AgentAlive {
				t.Error("a held lock must show the agent as running")
			}
		})
	}
}

func withAlive(st inspect.Status) inspect.Status {
	st.AgentAlive = true
	return st
}
