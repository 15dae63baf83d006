package loader_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// What the control plane wrote survives a map resize: the new programs run
// before the agent's first sync, and tracked flows name their backend by
// id, so an emptied backends array would reset them all.
func TestResizeKeepsWhatTheControlPlaneWrote(t *testing.T) {
	fk := dataplane.FrontendKey{Addr: netip.MustParseAddr("192.0.2.10"), Port: 80, Proto: 6}
	fe := dataplane.Frontend{SvcID: 2, TableID: 3, InternalTableID: 3, Flags: dataplane.FrontendExternal}
	remote := dataplane.Backend{Addr: netip.MustParseAddr("10.244.1.5"), Port: 8080}
	local := dataplane.Backend{Addr: netip.MustParseAddr("10.244.2.9"), Port: 8080, Local: true}
	table := []uint32{5, 40, 5, 40, 5, 40, 5}
	sourceRange := dataplane.SourceRange{SvcID: 2, Prefix: netip.MustParsePrefix("198.51.100.0/24")}

	for _, tc := range []struct {
		name   string
		resize func(*loader.Options)
		// fits40: backend id 40 still fits the resized array.
		fits40 bool
	}{
		{"every size doubled", func(o *loader.Options) {
			o.BackendsMax, o.ServicesMax, o.FrontendsMax, o.SourceRangesMax = 2*o.BackendsMax, 2*o.ServicesMax, 2*o.FrontendsMax, 2*o.SourceRangesMax
		}, true},
		{"backends only", func(o *loader.Options) { o.BackendsMax = 2 * o.BackendsMax }, true},
		{"services only", func(o *loader.Options) { o.ServicesMax = 2 * o.ServicesMax }, true},
		{"backends shrunk below an id", func(o *loader.Options) { o.BackendsMax = 32 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := smallOptions(testenv.BPFFS(t))
			dp, err := loader.Load(opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			d := dataplane.New(&dp.Maps)
			for _, err := range []error{
				d.PutBackend(5, remote), d.PutBackend(40, local), d.PutTable(3, table), d.PutFrontend(fk, fe),
				d.PutSourceRange(sourceRange.SvcID, sourceRange.Prefix), d.PutServiceName(2, "default/web:http"),
			} {
				if err != nil {
					t.Fatal(err)
				}
			}
			dp.Close()

			tc.resize(&opts)
			dp, err = loader.Load(opts, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer dp.Close()
			d = dataplane.New(&dp.Maps)

			backends, err := d.Backends()
			if err != nil {
				t.Fatal(err)
			}
			want := map[uint32]dataplane.Backend{5: remote, 40: local}
			if !tc.fits40 {
				delete(want, 40)
			}
			if len(backends) != len(want) || backends[5] != want[5] || backends[40] != want[40] {
				t.Errorf("backends after the resize %v, want %v", backends, want)
			}
			if got, err := d.Table(3); err != nil || !slices.Equal(got, table) {
				t.Errorf("Maglev table 3 after the resize %v (%v), want %v", got, err, table)
			}
			if got, err := d.Frontends(); err != nil || len(got) != 1 || got[fk] != fe {
				t.Errorf("frontends after the resize %v (%v), want %v: %v", got, err, fk, fe)
			}
			if got, err := d.SourceRanges(); err != nil || !slices.Equal(got, []dataplane.SourceRange{sourceRange}) {
				t.Errorf("source ranges after the resize %v (%v), want %v", got, err, sourceRange)
			}
			if got, err := d.ServiceNames(); err != nil || got[2] != "default/web:http" {
				t.Errorf("service names after the resize %v (%v)", got, err)
			}
			var b xdp.NicBackend
			if err := dp.Maps.Backends.Lookup(uint32(5), &b); err != nil || dp.Maps.Backends.MaxEntries() != opts.BackendsMax {
				t.Errorf("backends array: %d entries (%v), want %d", dp.Maps.Backends.MaxEntries(), err, opts.BackendsMax)
			}
		})
	}
}

// Maglev tables pinned by a version that kept them in a hash of maps are
// taken over by the array of maps, under the same ids: the frontends that
// name them keep their backends until the agent's first sync.
func TestTablesPinnedInAHashOfMapsAreKept(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loader.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	table := []uint32{5, 40, 5, 40, 5, 40, 5}
	d := dataplane.New(&dp.Maps)
	if err := d.PutTable(3, table); err != nil {
		t.Fatal(err)
	}
	var innerID uint32
	if err := dp.Maps.MaglevTables.Lookup(uint32(3), &innerID); err != nil {
		t.Fatal(err)
	}
	inner, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
	if err != nil {
		t.Fatal(err)
	}
	defer inner.Close()
	innerInfo, err := inner.Info()
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()

	// The earlier layout: the same tables in a HASH_OF_MAPS.
	path := filepath.Join(loader.Dir(root), "maps", "maglev_tables")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	old, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.HashOfMaps, KeySize: 4, ValueSize: 4, MaxEntries: 8,
		InnerMap: &ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1,
			Flags: innerInfo.Flags}})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := old.Put(uint32(3), inner); err != nil {
		t.Fatal(err)
	}
	if err := old.Pin(path); err != nil {
		t.Fatal(err)
	}

	dp, err = loader.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if typ := dp.Maps.MaglevTables.Type(); typ != ebpf.ArrayOfMaps {
		t.Errorf("maglev_tables is a %v, want an array of maps", typ)
	}
	d = dataplane.New(&dp.Maps)
	if got, err := d.Table(3); err != nil || !slices.Equal(got, table) {
		t.Errorf("Maglev table 3 after the upgrade %v (%v), want %v", got, err, table)
	}
	if ids, err := d.TableIDs(); err != nil || !slices.Equal(ids, []uint32{3}) {
		t.Errorf("tables after the upgrade %v (%v), want [3]", ids, err)
	}
}
