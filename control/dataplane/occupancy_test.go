package dataplane_test

import (
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// TestOccupancyCountsFlowMaps fills the flow maps with more entries than
// one read batch holds, installs a few Maglev tables, and checks what
// Occupancy reports, and that ResetFlows empties the flow maps.
func TestOccupancyCountsFlowMaps(t *testing.T) {
	dp, d := loadSmall(t, func(o *loader.Options) {
		o.ConntrackMax, o.NATMax, o.AffinityMax = 16384, 16384, 16384
	})

	const flows, slots = 5000, 4100
	for i := uint32(0); i < flows; i++ {
		if err := dp.Maps.Conntrack.Put(xdp.CtKey{Saddr: i + 1, Proto: 6}, xdp.CtEntry{}); err != nil {
			t.Fatal(err)
		}
		if err := dp.Maps.NAT.Put(xdp.NatKey{Saddr: i + 1, Proto: 6}, xdp.NatEntry{}); err != nil {
			t.Fatal(err)
		}
		if err := dp.Maps.Affinity.Put(xdp.AffinityKey{ClientAddr: i + 1}, xdp.AffinityEntry{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint32(0); i < slots; i++ {
		if err := dp.Maps.SNATSlots.Put(i*3, xdp.SnatSlot{Key: xdp.NatKey{Proto: 17}}); err != nil {
			t.Fatal(err)
		}
	}

	// Tables at scattered ids of the array of maps, the last id included.
	tableIDs := []uint32{1, 7, dp.Maps.MaglevTables.MaxEntries() - 1}
	for _, id := range tableIDs {
		if err := d.PutTable(id, []uint32{1, 1, 1}); err != nil {
			t.Fatal(err)
		}
	}
	if ids, err := d.TableIDs(); err != nil || !slices.Equal(ids, tableIDs) {
		t.Errorf("table ids %v (%v), want %v", ids, err, tableIDs)
	}
	if ids, err := d.TableIDsByLookups(); err != nil || !slices.Equal(ids, tableIDs) {
		t.Errorf("table ids read one slot at a time %v (%v), want %v", ids, err, tableIDs)
	}

	occ, err := d.Occupancy()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"conntrack": flows, "nat": flows, "affinity": flows, "snat_slots": slots, "frontends": 0,
		"maglev_tables": len(tableIDs)} {
		if occ[name] != want {
			t.Errorf("occupancy of %s: %d, want %d", name, occ[name], want)
		}
	}
	if n, err := d.ReverseEntries(); err != nil || n != flows+slots {
		t.Errorf("reverse halves: %d (%v), want %d", n, err, flows+slots)
	}
	if n, err := d.FlowEntries(); err != nil || n != flows {
		t.Errorf("forward halves: %d (%v), want %d", n, err, flows)
	}

	if err := d.ResetFlows(); err != nil {
		t.Fatal(err)
	}
	occ, err = d.Occupancy()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"conntrack", "nat", "affinity", "snat_slots"} {
		if occ[name] != 0 {
			t.Errorf("after ResetFlows, %s holds %d entries", name, occ[name])
		}
	}
}

// MapMemory reports what the kernel charges for each sized map, and for
// the inner Maglev tables together: at least their slots' bytes, growing
// with each table installed and shrinking as one goes.
func TestMapMemoryCountsInnerTables(t *testing.T) {
	_, d := loadSmall(t, nil)
	const slots = 16381
	table := make([]uint32, slots)
	before, err := d.MapMemory()
	if err != nil {
		t.Fatal(err)
	}
	if before["conntrack"] == 0 || before[dataplane.InnerTablesMemory] != 0 {
		t.Fatalf("before any table: conntrack %d bytes, inner tables %d; want some and none",
			before["conntrack"], before[dataplane.InnerTablesMemory])
	}
	for _, id := range []uint32{1, 2} {
		if err := d.PutTable(id, table); err != nil {
			t.Fatal(err)
		}
	}
	two, err := d.MapMemory()
	if err != nil {
		t.Fatal(err)
	}
	if got := two[dataplane.InnerTablesMemory]; got < 2*slots*4 {
		t.Errorf("two tables of %d slots: %d bytes, want at least %d", slots, got, 2*slots*4)
	}
	if err := d.DeleteTable(2); err != nil {
		t.Fatal(err)
	}
	one, err := d.MapMemory()
	if err != nil {
		t.Fatal(err)
	}
	if got := one[dataplane.InnerTablesMemory]; got < slots*4 || got >= two[dataplane.InnerTablesMemory] {
		t.Errorf("one table left: %d bytes, want at least %d and less than two tables' %d",
			got, slots*4, two[dataplane.InnerTablesMemory])
	}
}

// Closed SNAT flows within their timeout hold their ports in quarantine;
// open, unSNATed, UDP and expired flows do not count.
func TestQuarantinedSNATPortsAreClosedFlowsWithinTheirTimeout(t *testing.T) {
	dp, d := loadSmall(t, nil)
	now := uint64(dataplane.Now())
	rst := uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED | xdp.CtTcpStateCT_TCP_RST)
	fins := uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED | xdp.CtTcpStateCT_TCP_FIN | xdp.CtTcpStateCT_TCP_REPLY_FIN)
	halfClosed := uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED | xdp.CtTcpStateCT_TCP_FIN)
	snat := uint8(xdp.CtFlagsCT_F_SNAT)
	unconfirmed := snat | uint8(xdp.CtFlagsCT_F_UNCONFIRMED)
	for i, f := range []struct {
		table *ebpf.Map
		proto uint8
		flags uint8
		state uint8
		idle  time.Duration
		count bool
	}{
		{dp.Maps.Conntrack, 6, snat, rst, time.Second, true},
		{dp.Maps.Conntrack, 6, snat, fins, 30 * time.Second, true},
		{dp.Maps.CtUnconfirmed, 6, unconfirmed, rst, time.Second, true},
		{dp.Maps.Conntrack, 6, snat, fins, 2 * time.Minute, false},   // past the transient timeout
		{dp.Maps.Conntrack, 6, snat, halfClosed, time.Second, false}, // still open one way
		{dp.Maps.Conntrack, 6, 0, rst, time.Second, false},           // no SNAT port
		{dp.Maps.Conntrack, 17, snat, 0, time.Second, false},         // UDP
	} {
		entry := xdp.CtEntry{Flags: f.flags, TcpState: f.state, LastSeenNs: now - uint64(f.idle)}
		if err := f.table.Put(xdp.CtKey{Saddr: uint32(i + 1), Proto: f.proto}, entry); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := d.QuarantinedSNATPorts(); err != nil || n != 3 {
		t.Errorf("%d SNAT ports in quarantine (%v), want 3", n, err)
	}
}
