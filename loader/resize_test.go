package loader_test

import (
	"errors"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
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
			dp, err := loadertest.Load(opts, nil)
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
			dp, err = loadertest.Load(opts, nil)
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
			var b xdp.Backend
			if err := dp.Maps.Backends.Lookup(uint32(5), &b); err != nil || dp.Maps.Backends.MaxEntries() != opts.BackendsMax {
				t.Errorf("backends array: %d entries (%v), want %d", dp.Maps.Backends.MaxEntries(), err, opts.BackendsMax)
			}
		})
	}
}

// A smaller --services-max leaves out the Maglev tables of ids beyond it
// (their ports get new ids at the agent's first sync; until then the
// datapath drops their new flows: drop_bad_table) and keeps the others.
func TestTablesBeyondASmallerServicesMaxAreLeftOut(t *testing.T) {
	opts := smallOptions(testenv.BPFFS(t))
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	d := dataplane.New(&dp.Maps)
	table := []uint32{5, 5, 5}
	for _, id := range []uint32{2, 9} {
		if err := d.PutTable(id, table); err != nil {
			t.Fatal(err)
		}
	}
	dp.Close()

	opts.ServicesMax = 4 // tables 0-7
	dp, err = loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	d = dataplane.New(&dp.Maps)
	if got, err := d.Table(2); err != nil || !slices.Equal(got, table) {
		t.Errorf("table 2 after the resize %v (%v), want %v", got, err, table)
	}
	if ids, err := d.TableIDs(); err != nil || !slices.Equal(ids, []uint32{2}) {
		t.Errorf("tables after the resize %v (%v), want only table 2", ids, err)
	}
}

// Maglev tables pinned by a version that kept them in a hash of maps are
// taken over by the array of maps, under the same ids: the frontends that
// name them keep their backends until the agent's first sync.
func TestTablesPinnedInAHashOfMapsAreKept(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loadertest.Load(opts, nil)
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

	dp, err = loadertest.Load(opts, nil)
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

// expectPins checks that the maps pinned under root are want, and that no
// staging pins are left next to them.
func expectPins(t *testing.T, root string, want map[string]ebpf.MapID) {
	t.Helper()
	got := loadertest.PinnedMapIDs(t, root)
	for _, name := range slices.Sorted(maps.Keys(want)) {
		if got[name] != want[name] {
			t.Errorf("map %s pinned as id %d, want the pin left to id %d", name, got[name], want[name])
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("map %s pinned, want no pin", name)
		}
	}
	entries, err := os.ReadDir(loader.Dir(root))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "maps" && e.Name() != "links" {
			t.Errorf("%s left in %s", e.Name(), loader.Dir(root))
		}
	}
}

// doubled returns opts with every size flag doubled: almost every pinned
// map needs replacing.
func doubled(opts loader.Options) loader.Options {
	opts.ConntrackMax, opts.NATMax, opts.AffinityMax = 2*opts.ConntrackMax, 2*opts.NATMax, 2*opts.AffinityMax
	opts.ServicesMax, opts.FrontendsMax = 2*opts.ServicesMax, 2*opts.FrontendsMax
	opts.BackendsMax, opts.SourceRangesMax = 2*opts.BackendsMax, 2*opts.SourceRangesMax
	return opts
}

// A start that cannot replace every resized map replaces none: the pins
// keep naming the maps the running datapath uses, so an agent that fails
// to start, again and again, does not leave them to copies that miss the
// flows the datapath tracks meanwhile, and the start that succeeds copies
// from the maps in use.
func TestFailedResizeLeavesThePinsAsTheyWere(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	running, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Close()
	before := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 80, Proto: 6}
	if err := running.Maps.Conntrack.Put(before, xdp.CtEntry{BackendId: 7}); err != nil {
		t.Fatal(err)
	}
	// Something that is not a map where svc_stats, which a larger
	// --services-max resizes too, is pinned.
	bad := filepath.Join(loader.Dir(root), "maps", "svc_stats")
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	pinned := loadertest.PinnedMapIDs(t, root)

	bigger := doubled(opts)
	for range 3 {
		dp, err := loadertest.Load(bigger, nil)
		if err == nil {
			dp.Close()
			t.Fatal("loaded over a pin that is not a map")
		}
		if !strings.Contains(err.Error(), "svc_stats") {
			t.Errorf("error %q does not name svc_stats", err)
		}
		expectPins(t, root, pinned)
	}

	// The running datapath tracks a flow meanwhile.
	meanwhile := xdp.CtKey{Saddr: 5, Daddr: 2, Sport: 6, Dport: 80, Proto: 6}
	if err := running.Maps.Conntrack.Put(meanwhile, xdp.CtEntry{BackendId: 8}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	dp, err := loadertest.Load(bigger, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if got := dp.Maps.Conntrack.MaxEntries(); got != bigger.ConntrackMax {
		t.Fatalf("conntrack has %d entries, want %d", got, bigger.ConntrackMax)
	}
	for key, backend := range map[xdp.CtKey]uint32{before: 7, meanwhile: 8} {
		var e xdp.CtEntry
		if err := dp.Maps.Conntrack.Lookup(key, &e); err != nil || e.BackendId != backend {
			t.Errorf("flow %+v in the resized conntrack: %+v (%v), want backend %d", key, e, err, backend)
		}
	}
}

// A replacement that cannot be moved into place fails the start, and the
// pins of the maps replaced before it are put back: the pins are left as
// they were, or the error names those that could not be restored.
func TestFailedSwapRestoresThePins(t *testing.T) {
	errInjected := errors.New("injected")
	for _, tc := range []struct {
		name string
		fail []string // the renames that fail, by the name they move
		// stuck: the maps whose pin is left to a new map.
		stuck []string
		want  []string // in the error
	}{
		{"the restore works", []string{"nat"}, nil,
			[]string{"move new map nat into place", "injected", "pinned maps were restored"}},
		{"a restore fails too", []string{"nat", "old-backends"}, []string{"backends"},
			[]string{"move new map nat into place", "restoring the earlier pins failed for backends:"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testenv.BPFFS(t)
			opts := smallOptions(root)
			loadEarlier(t, opts)
			pinned := loadertest.PinnedMapIDs(t, root)

			failing := loader.WithPinRenames(doubled(opts), func(from, to string) error {
				if slices.Contains(tc.fail, filepath.Base(from)) {
					return errInjected
				}
				return os.Rename(from, to)
			})
			dp, err := loadertest.Load(failing, nil)
			if err == nil {
				dp.Close()
				t.Fatal("loaded with a pin that could not be moved")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q, want %q in it", err, want)
				}
			}
			if !errors.Is(err, errInjected) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q: want one line wrapping the cause", err)
			}
			now := loadertest.PinnedMapIDs(t, root)
			for _, name := range tc.stuck {
				if now[name] == pinned[name] {
					t.Errorf("map %s: the failed restore left its pin as it was", name)
				}
				pinned[name] = now[name]
			}
			expectPins(t, root, pinned)
		})
	}
}

// A swap of pinned maps cut short (the agent killed between its renames
// and its cleanup) leaves the maps it replaced linked in a staging
// directory, holding their memory. The next load removes it, also when it
// replaces no map itself.
func TestLoadRemovesAnInterruptedSwapsLeftovers(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	loadEarlier(t, opts)
	staging := filepath.Join(loader.Dir(root), "maps-replacing")
	if err := os.Mkdir(staging, 0o700); err != nil {
		t.Fatal(err)
	}
	leftover, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer leftover.Close()
	if err := leftover.Pin(filepath.Join(staging, "old-conntrack")); err != nil {
		t.Fatal(err)
	}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if _, err := os.Stat(staging); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the interrupted swap's staging directory is still there: %v", err)
	}
}

// Moving the SNAT slots to a new layout gives backends buckets in the
// hints; the running datapath reads the pinned hints until the commit. A
// start that moves them and fails (reverted, not committed) leaves the
// pinned hints as they were, or replies to the running datapath's SNAT
// flows would look for their slots in another bucket; one that commits
// pins the hints its slots were moved by.
func TestFailedResizeLeavesTheSNATHints(t *testing.T) {
	root := testenv.BPFFS(t)
	opts, dp, backend, node, slot := loadWithSNATSlot(t, root)
	// The last bucket: one the new layout no longer has, so the move
	// gives the backend another.
	hint, buckets := putSlotInLastBucket(t, dp, backend, node, slot)
	var next uint32
	if err := dp.Maps.SNATBucketHints.Lookup(uint32(xdp.SNATHintNext), &next); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	pinned := loadertest.PinnedMapIDs(t, root)

	bigger := opts
	bigger.SNATPorts = xdp.SNATPorts{{Min: 40000, Max: 49999}}
	if bigger.SNATBuckets() >= buckets {
		t.Fatalf("the new layout has %d buckets, want fewer than %d", bigger.SNATBuckets(), buckets)
	}
	for range 2 {
		failing, err := loader.Load(bigger, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The start fails after the load (an attach, the cgroup, ...).
		if err := failing.Revert(); err != nil {
			t.Fatal(err)
		}
		failing.Close()
		expectPins(t, root, pinned)
		running, err := loader.OpenPinned(root)
		if err != nil {
			t.Fatal(err)
		}
		var got, gotNext uint32
		if err := running.SNATBucketHints.Lookup(hint, &got); err != nil {
			t.Fatal(err)
		}
		if err := running.SNATBucketHints.Lookup(uint32(xdp.SNATHintNext), &gotNext); err != nil {
			t.Fatal(err)
		}
		running.Close()
		if got != buckets || gotNext != next {
			t.Fatalf("after a failed start the pinned hint of %s is %d and the turn %d, want %d and %d as they were",
				backend, got, gotNext, buckets, next)
		}
	}

	dp, err := loadertest.Load(bigger, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	expectSlotAtHint(t, dp, backend, node, slot)
	info, err := dp.Maps.SNATBucketHints.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	if now := loadertest.PinnedMapIDs(t, root)["snat_bucket_hints"]; now != id || now == pinned["snat_bucket_hints"] {
		t.Errorf("after the commit the SNAT bucket hints pinned are map %d, want the new datapath's %d (before: %d)",
			now, id, pinned["snat_bucket_hints"])
	}
}
