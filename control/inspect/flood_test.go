package inspect

import (
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// `xdplb status` reports a flood of new flows once the table of
// unconfirmed flows is FloodPercent full, naming the service ports that
// hold most of it; below that it says nothing.
func TestStatusReportsAFloodOfNewFlows(t *testing.T) {
	testenv.RequirePrivileged(t)
	dp, err := loadertest.Load(loadertest.SmallOptions(testenv.BPFFS(t)), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	d := dataplane.New(&dp.Maps)
	if err := d.PutServiceNames(map[uint32]string{1: "default/shop:http/TCP", 2: "default/dns:dns/UDP"}); err != nil {
		t.Fatal(err)
	}
	capacity := int(dp.Maps.CtUnconfirmed.MaxEntries())
	add := func(from, n int, svc uint32) {
		t.Helper()
		for i := from; i < from+n; i++ {
			k := xdp.CtKey{Saddr: uint32(i + 1), Daddr: 2, Sport: 3, Dport: 4, Proto: 6}
			v := xdp.CtEntry{SvcId: svc, Flags: uint8(xdp.CtFlagsCT_F_UNCONFIRMED)}
			if err := dp.Maps.CtUnconfirmed.Put(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	report := func() *Flood {
		t.Helper()
		occ, err := d.Occupancy()
		if err != nil {
			t.Fatal(err)
		}
		maps := []MapUse{{Name: "ct_unconfirmed", Entries: occ["ct_unconfirmed"], Capacity: uint32(capacity),
			Percent: 100 * float64(occ["ct_unconfirmed"]) / float64(capacity)}}
		fl, err := flood(d, maps)
		if err != nil {
			t.Fatal(err)
		}
		return fl
	}

	below := capacity*FloodPercent/100 - 10
	add(0, below-20, 1)
	add(below-20, 20, 2)
	if fl := report(); fl != nil {
		t.Fatalf("flood reported at %d of %d unconfirmed flows: %+v", below, capacity, fl)
	}
	add(below, 20, 1)
	fl := report()
	if fl == nil || fl.Percent < FloodPercent {
		t.Fatalf("no flood reported at %d of %d unconfirmed flows: %+v", below+20, capacity, fl)
	}
	want := []FloodPort{{"default/shop:http/TCP", below}, {"default/dns:dns/UDP", 20}}
	if len(fl.Ports) != 2 || fl.Ports[0] != want[0] || fl.Ports[1] != want[1] {
		t.Errorf("flood ports %+v, want %+v", fl.Ports, want)
	}
}
