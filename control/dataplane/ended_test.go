package dataplane_test

import (
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/xdp"
)

// Ending flows whose backend was removed deletes their entries: on a full
// LRU conntrack a rewrite would take a fresh node, another live flow's.
func TestEndingFlowsOnAFullConntrackKeepsLiveOnes(t *testing.T) {
	const size = 4096
	dp, d := loadSmall(t, func(o *loader.Options) { o.ConntrackMax = size })
	now := uint64(dataplane.Now())
	for i := range 2 * size {
		k := xdp.CtKey{Saddr: uint32(i + 1), Daddr: 2, Sport: 3, Dport: 80, Proto: 6}
		if err := dp.Maps.Conntrack.Put(k, xdp.CtEntry{BackendId: uint32(i), CreatedNs: now, LastSeenNs: now}); err != nil {
			t.Fatal(err)
		}
	}
	var flows []dataplane.Flow
	d.Flows(func(f dataplane.Flow) bool { flows = append(flows, f); return true })
	toEnd := flows[:len(flows)/4]
	for _, f := range toEnd {
		if _, err := d.DeleteFlow(f); err != nil {
			t.Fatal(err)
		}
	}
	live := 0
	d.Flows(func(f dataplane.Flow) bool {
		if !f.Ended {
			live++
		}
		return true
	})
	if lost := len(flows) - len(toEnd) - live; lost > 0 {
		t.Errorf("ending %d of %d flows lost %d others", len(toEnd), len(flows), lost)
	}
}

// An entry the agent ended is dated far back, below zero on a node up for
// less than that (see DeleteFlow). A migration into a smaller conntrack
// leaves it out before any live flow, however its date reads as a number.
func TestMigrationLeavesEndedFlowsOutFirst(t *testing.T) {
	const before, after, live, ended = 256, 128, 96, 64
	dp, _ := loadSmall(t, func(o *loader.Options) { o.ConntrackMax = before })
	now := uint64(dataplane.Now())
	for i := range live + ended {
		k := xdp.CtKey{Saddr: uint32(i + 1), Daddr: 2, Sport: 3, Dport: 80, Proto: 6}
		v := xdp.CtEntry{BackendId: uint32(i), CreatedNs: now - 1000, LastSeenNs: now - uint64(i)}
		if i >= live {
			v.Flags |= uint8(xdp.CtFlagsCT_F_ENDED)
			v.LastSeenNs = now - dataplane.EndedAge
		}
		if err := dp.Maps.Conntrack.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	opts := dp.Options()
	opts.ConntrackMax = after
	moved, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer moved.Close()
	var k xdp.CtKey
	var v xdp.CtEntry
	keptLive := 0
	for it := moved.Maps.Conntrack.Iterate(); it.Next(&k, &v); {
		if v.Flags&uint8(xdp.CtFlagsCT_F_ENDED) == 0 {
			keptLive++
		}
	}
	if keptLive != live {
		t.Errorf("the migration kept %d of %d live flows (room for %d)", keptLive, live, after)
	}
}
