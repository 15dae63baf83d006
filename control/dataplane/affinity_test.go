package dataplane_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// DeleteAffinities walks the affinity map, then deletes what the walk
// found stale. An entry the datapath gave another backend in between (its
// client was balanced afresh) is kept.
func TestDeleteAffinitiesKeepsAnEntryChangedAfterTheWalk(t *testing.T) {
	dp, d := loadSmall(t, nil)
	gone := netip.MustParseAddrPort("10.244.1.10:8080")
	live := netip.MustParseAddrPort("10.244.1.20:8080")
	entryFor := func(id uint32, b netip.AddrPort) xdp.AffinityEntry {
		return xdp.AffinityEntry{BackendId: id, BackendAddr: xdp.AddrToNet(b.Addr()), BackendPort: xdp.PortToNet(b.Port())}
	}
	changed := xdp.AffinityKey{SvcId: 1, ClientAddr: xdp.AddrToNet(netip.MustParseAddr("198.51.100.1"))}
	unchanged := xdp.AffinityKey{SvcId: 1, ClientAddr: xdp.AddrToNet(netip.MustParseAddr("198.51.100.2"))}
	for _, k := range []xdp.AffinityKey{changed, unchanged} {
		if err := dp.Maps.Affinity.Put(k, entryFor(7, gone)); err != nil {
			t.Fatal(err)
		}
	}
	n, err := d.DeleteAffinities(func(e dataplane.AffinityEntry) bool {
		if e.Backend != gone {
			return false
		}
		if e.Client == xdp.NetToAddr(changed.ClientAddr) {
			// The datapath balances this client afresh right after the
			// walk has read its entry.
			if err := dp.Maps.Affinity.Put(changed, entryFor(8, live)); err != nil {
				t.Fatal(err)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("deleted %d entries, want 1", n)
	}
	var e xdp.AffinityEntry
	if err := dp.Maps.Affinity.Lookup(changed, &e); err != nil || e.BackendId != 8 {
		t.Errorf("the entry balanced afresh during the walk: %+v (%v), want it kept with backend 8", e, err)
	}
	if err := dp.Maps.Affinity.Lookup(unchanged, &e); err == nil {
		t.Errorf("the stale entry is still there: %+v", e)
	}
}
