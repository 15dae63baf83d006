package reconcile_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/xdp"
)

// A purge collects stale flows in one walk and deletes them after it. A
// flow the datapath re-created on a collected tuple meanwhile (UDP
// re-chooses at once when its backend is gone) is live and must stay.
func TestPurgeKeepsAFlowRecreatedDuringTheWalk(t *testing.T) {
	dp := newDatapath(t)
	gone := netip.MustParseAddr("10.244.1.10")
	live := netip.MustParseAddr("10.244.1.20")
	key := xdp.CtKey{Saddr: xdp.AddrToNet(netip.MustParseAddr("198.51.100.1")), Daddr: xdp.AddrToNet(nodeIP),
		Sport: xdp.PortToNet(1001), Dport: xdp.PortToNet(30080), Proto: dataplane.UDP}
	stale := xdp.CtEntry{SvcId: 1, BackendId: 7, BackendAddr: xdp.AddrToNet(gone), BackendPort: xdp.PortToNet(8080),
		CreatedNs: 1000}
	fresh := xdp.CtEntry{SvcId: 1, BackendId: 8, BackendAddr: xdp.AddrToNet(live), BackendPort: xdp.PortToNet(8080),
		CreatedNs: 2000}
	if err := dp.Maps().Conntrack.Put(key, stale); err != nil {
		t.Fatal(err)
	}
	// The sweep's check runs inside the walk: the datapath replaces the
	// entry right after the walk has read it.
	still := func(d reconcile.Departure) bool {
		if d.Backend.Addr != gone {
			return false // the live backend is still the port's
		}
		if err := dp.Maps().Conntrack.Put(key, fresh); err != nil {
			t.Fatal(err)
		}
		return true
	}
	purged, err := reconcile.PurgeFlows(context.Background(), dp, reconcile.Stale{Sweep: true}, still)
	if err != nil {
		t.Fatal(err)
	}
	var left xdp.CtEntry
	if err := dp.Maps().Conntrack.Lookup(key, &left); err != nil {
		t.Fatalf("the flow to %s re-created during the purge was deleted: %v", live, err)
	}
	if left.BackendId != fresh.BackendId {
		t.Errorf("tuple carries backend %d, want the re-created flow's %d", left.BackendId, fresh.BackendId)
	}
	if purged.Flows != 0 {
		t.Errorf("purge reports %d flows deleted, want 0", purged.Flows)
	}
}
