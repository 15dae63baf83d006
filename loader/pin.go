package loader

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/xdp"
)

// ensureBPFFS makes sure root is on a bpffs, mounting one there if not.
// A bpffs mounted here is private to this mount namespace (a pod's, say):
// the pins go with it, so restarts and upgrades cannot adopt them, and it
// says so with a warning.
func ensureBPFFS(root string, log *slog.Logger) error {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fmt.Errorf("bpffs root %s: %w", root, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w (needs CAP_SYS_ADMIN, or mount it beforehand)", root, err)
	}
	log.Warn("no bpffs at the pin root: mounted a private one, whose pins do not outlive this mount namespace "+
		"(in a pod: the pod), so a restarted agent starts over with empty maps; mount bpffs there on the node",
		"path", root)
	return nil
}

// migrations copy what a resized map holds into its replacement: live
// flow state, and the desired state the control plane wrote. The latter
// matters as much: tracked flows name their backend by id and frontends
// their Maglev tables, and the new programs run before the agent's first
// sync (which waits for the API server): a backends array that started
// empty would turn every tracked flow into a "backend gone" reset. The
// packet counters are copied too (a version with a new reason has a
// larger array; reasons are only ever appended). Maps without a migration
// (per-service counters, SNAT bucket hands laid out for the old options)
// start empty.
func migrations(opts Options, hints *ebpf.Map) map[string]migration {
	return map[string]migration{
		"stats": copyPerCPUArray[xdp.NicCounter],

		"conntrack":      copyRecentFirst[xdp.NicCtKey](ctLastSeen),
		"ct_unconfirmed": copyRecentFirst[xdp.NicCtKey](ctLastSeen),
		// Without its offset, a flow the SYN proxy opened cannot go on.
		"synproxy_flows":  copyEntries[xdp.NicCtKey, xdp.NicSynproxySeq],
		"nat":             copyRecentFirst[xdp.NicNatKey](natLastSeen),
		"nat_unconfirmed": copyRecentFirst[xdp.NicNatKey](natLastSeen),
		"affinity":        copyRecentFirst[xdp.NicAffinityKey](func(e *xdp.NicAffinityEntry) uint64 { return e.LastSeenNs }),
		"snat_slots":      func(from, to *ebpf.Map) (int, int, error) { return copySNATSlots(from, to, opts, hints) },

		"frontends":          copyEntries[xdp.NicFrontendKey, xdp.NicFrontend],
		"backends":           copyEntries[uint32, xdp.NicBackend],
		"maglev_tables":      copyInnerMaps,
		"source_ranges":      copyEntries[xdp.NicSourceRangeKey, uint8],
		"snat_backend_hands": copyEntries[uint32, uint32],
		"svc_names":          copyEntries[uint32, xdp.NicSvcName],
		// The SNAT source address of each NIC: the new programs run
		// before the NICs are registered again (valuesGrow).
		"ifaces": copyGrownValues,
	}
}

// valuesGrow are the maps whose value struct only ever gains fields at its
// end: an older version's entries are copied into the start of the new
// values (copyGrownValues), the fields it did not have left zero.
var valuesGrow = map[string]bool{"ifaces": true}

// copyGrownValues copies every entry of from into to, each value's bytes
// into the start of a zeroed value of to's (possibly larger) size.
func copyGrownValues(from, to *ebpf.Map) (copied, skipped int, err error) {
	key := make([]byte, from.KeySize())
	value := make([]byte, from.ValueSize())
	grown := make([]byte, to.ValueSize())
	iter := from.Iterate()
	for iter.Next(&key, &value) {
		clear(grown)
		copy(grown, value)
		if err := to.Put(key, grown); err != nil {
			skipped++
			continue
		}
		copied++
	}
	return copied, skipped, iter.Err()
}

// natLastSeen dates a reverse half for copyRecentFirst.
func natLastSeen(e *xdp.NicNatEntry) uint64 { return e.LastSeenNs }

// copyEntries is the migration of a map of K to V that the control plane
// fills: every entry that holds a value (an array's slots are all there;
// the zero value is an empty one) and fits the new map is copied. Entries
// that do not fit (an id beyond a smaller array) are counted as skipped;
// the control plane gives their owners new ones.
func copyEntries[K any, V comparable](from, to *ebpf.Map) (copied, skipped int, err error) {
	w := newBatchWriter[K, V](to)
	var empty V
	err = readEntries(from, func(k *K, v *V) {
		if *v != empty {
			w.add(*k, *v)
		}
	})
	w.flush()
	if err != nil {
		return w.copied, w.skipped, fmt.Errorf("read entries: %w", err)
	}
	return w.copied, w.skipped, nil
}

// copyPerCPUArray is the migration of a per-CPU array of V: each index
// both arrays have is copied, every CPU's value; those beyond a smaller
// array are skipped.
func copyPerCPUArray[V any](from, to *ebpf.Map) (copied, skipped int, err error) {
	n := min(from.MaxEntries(), to.MaxEntries())
	var values []V
	for i := range n {
		if err := from.Lookup(i, &values); err != nil {
			return copied, skipped, fmt.Errorf("read index %d: %w", i, err)
		}
		if err := to.Put(i, values); err != nil {
			return copied, skipped, fmt.Errorf("write index %d: %w", i, err)
		}
		copied++
	}
	return copied, int(from.MaxEntries() - n), nil
}

// copyInnerMaps is the migration of maglev_tables: the new outer map
// takes the same inner tables, which live on as long as a map holds them.
//
// The old map is read in batches: an array of maps has two ids for each
// possible service port, and reading them one at a time costs two system
// calls each (~14 s at the largest --services-max).
func copyInnerMaps(from, to *ebpf.Map) (copied, skipped int, err error) {
	err = readEntries(from, func(tableID, innerID *uint32) {
		inner, err := ebpf.NewMapFromID(ebpf.MapID(*innerID))
		if err != nil {
			skipped++ // replaced since it was read
			return
		}
		err = to.Put(*tableID, inner)
		inner.Close()
		if err != nil {
			skipped++
			return
		}
		copied++
	})
	if err != nil {
		return copied, skipped, fmt.Errorf("read entries: %w", err)
	}
	return copied, skipped, nil
}

// A migration copies what it can of one map into another of the same
// key and value layout.
type migration func(from, to *ebpf.Map) (copied, skipped int, err error)

// errSlotsUnhinted is why SNAT slots pinned by a version without bucket
// hints are moved: that version placed them by a hash of their backend.
var errSlotsUnhinted = errors.New("SNAT slots placed without bucket hints")

// adoptPinnedMaps checks every pinned map against the spec. A compatible
// map is left for the collection loader to adopt. An incompatible one (a
// size flag changed) gets a replacement: a new map into which flow state
// and the control plane's entries are copied (migrations); counters start
// over. SNAT slots are also moved when there are no bucket hints to adopt
// (a version before them placed the slots by a hash of their backend).
// Moving the slots hands out buckets in the hints: in new hints, or in a
// copy of the pinned ones that replaces them like a resized map.
//
// Nothing is pinned or unpinned here: the replacements are returned, for
// the collection loader to use in place of the pins, and their commit
// (Datapath.CommitPins) swaps the pins once the new datapath runs. Until
// then the pins name the maps the running datapath uses, so a start that
// fails (a map that cannot be opened or created, a program the verifier
// refuses, an attach) leaves them as they were, and the next start copies
// from them again.
func adoptPinnedMaps(spec *ebpf.CollectionSpec, dir string, opts Options, log *slog.Logger) (_ *mapReplacements, err error) {
	r := &mapReplacements{dir: dir, log: log, faults: opts.faults}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	hints, fresh, err := openSNATBucketHints(spec, dir)
	if err != nil {
		return nil, err
	}
	if fresh {
		// Swapped last: had the swap stopped before it, the next load
		// would find no hints again and still move the slots.
		r.hints = &replacement{name: snatBucketHints, m: hints, why: "no SNAT bucket hints to adopt"}
	} else {
		defer hints.Close()
	}
	migrate := migrations(opts, hints)
	for _, name := range slices.Sorted(maps.Keys(spec.Maps)) {
		ms := spec.Maps[name]
		if ms.Pinning != ebpf.PinByName || name == snatBucketHints {
			continue
		}
		path := filepath.Join(dir, name)
		old, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, explainBPFError("open pinned map "+path, err)
		}
		incompatible := ms.Compatible(old)
		if incompatible == nil && name == "snat_slots" && fresh {
			incompatible = errSlotsUnhinted
		}
		if incompatible == nil && name == "snat_slots" {
			// Of the same size, but laid out for another range.
			incompatible = misplacedSNATSlot(old, opts)
		}
		if incompatible == nil {
			old.Close()
			continue
		}
		if name == "snat_slots" && !fresh {
			// Moving the slots gives a bucket to each backend that has
			// none, in the hints: the running datapath reads the pinned
			// ones until the commit, and after a start that fails, so
			// the move writes into a copy, swapped in at the commit.
			hintsCopy, err := fillReplacement(snatBucketHints, spec.Maps[snatBucketHints], hints,
				copyEntries[uint32, uint32], log)
			if err != nil {
				old.Close()
				return nil, err
			}
			hintsCopy.why = "the SNAT slots move (" + incompatible.Error() + "): backends without a bucket get one"
			// In name order, before snat_slots: swapped first, so that a
			// commit cut short leaves the old slots, which the next load
			// moves again by these hints, not moved slots without them.
			r.maps = append(r.maps, hintsCopy)
			migrate = migrations(opts, hintsCopy.m)
		}
		repl, err := fillReplacement(name, ms, old, migrate[name], log)
		old.Close()
		if err != nil {
			return nil, err
		}
		repl.why = incompatible.Error()
		r.maps = append(r.maps, repl)
	}
	return r, nil
}

const snatBucketHints = "snat_bucket_hints"

// misplacedSNATSlot says where a claimed slot among the first few of
// slots is not where opts's layout puts its port (the slot of port p in
// bucket b is b * range + p - min), or is nil. A range shifted, or wider
// with fewer buckets, can keep the map's size, and slots left where the
// earlier layout put them would answer no reply. The slots themselves
// tell, not the pinned configuration: a load writes the new range there
// before its commit, and an agent killed in between leaves the slots as
// they were. A layout change misplaces nearly every slot, so a few
// suffice, one of them past the first bucket (an empty map of a million
// slots is read in ~0.1 s).
// Unreadable slots count as placed.
func misplacedSNATSlot(slots *ebpf.Map, opts Options) error {
	const enough = 64
	width := opts.SNATPorts.Len()
	var misplaced error
	seen, beyondFirst := 0, false
	err := readEntriesWhile(slots, func(index *uint32, slot *xdp.NicSnatSlot) bool {
		if slot.Key.Proto == 0 {
			return true
		}
		port := xdp.NetToPort(slot.Key.Dport)
		if offset, ok := opts.SNATPorts.Offset(port); !ok || width == 0 || *index%width != offset {
			misplaced = fmt.Errorf("SNAT slot %d holds port %d, which ports %s put elsewhere",
				*index, port, opts.SNATPorts)
			return false
		}
		seen++
		// A bucket past the first tells a changed width (a second
		// range added) that the first bucket's slots do not.
		beyondFirst = beyondFirst || *index >= width
		return seen < enough || !beyondFirst
	})
	if err != nil {
		return nil
	}
	return misplaced
}

// openSNATBucketHints opens the pinned snat_bucket_hints map, or creates an
// empty one (fresh) when there is none or it does not fit the spec: the
// SNAT slots are then placed anew (copySNATSlots), and the new map
// replaces the pinned one with the other replacements.
func openSNATBucketHints(spec *ebpf.CollectionSpec, dir string) (hints *ebpf.Map, fresh bool, err error) {
	ms, ok := spec.Maps[snatBucketHints]
	if !ok {
		return nil, false, fmt.Errorf("XDP object has no map %q", snatBucketHints)
	}
	path := filepath.Join(dir, snatBucketHints)
	old, err := ebpf.LoadPinnedMap(path, nil)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, false, explainBPFError("open pinned map "+path, err)
	case ms.Compatible(old) == nil:
		return old, false, nil
	default:
		old.Close()
	}
	unpinned := ms.Copy()
	unpinned.Pinning = ebpf.PinNone
	hints, err = ebpf.NewMap(unpinned)
	if err != nil {
		return nil, false, explainBPFError("create map "+snatBucketHints, err)
	}
	return hints, true, nil
}

// retiredMaps are maps earlier versions pinned that this one no longer has.
func retiredMaps() []string {
	return []string{
		"snat_hands", // per-bucket SNAT hands, now snat_bucket_hands and snat_backend_hands
	}
}

// unpinRetiredMaps removes the pins of retiredMaps(), once this version has
// loaded, so they do not hold kernel memory until the next detach. A pin
// that is not a map is left alone; failures are logged, not fatal.
func unpinRetiredMaps(dir string, log *slog.Logger) {
	for _, name := range retiredMaps() {
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			log.Warn("a retired map's pin could not be opened; left in place", "path", path, "err", err)
			continue
		}
		m.Close()
		if err := os.Remove(path); err != nil {
			log.Warn("could not unpin a retired map", "path", path, "err", err)
			continue
		}
		log.Info("unpinned a map this version no longer uses", "map", name)
	}
}

// replacement is a new map filled from a pinned one it is to replace.
type replacement struct {
	name            string
	m               *ebpf.Map
	why             string // why the pinned map is replaced
	copied, skipped int    // entries copied, and not
}

// fillReplacement creates an unpinned map of spec ms and copies into it what
// migrate can of old.
func fillReplacement(name string, ms *ebpf.MapSpec, old *ebpf.Map, migrate migration,
	log *slog.Logger) (*replacement, error) {
	spec := ms.Copy()
	spec.Pinning = ebpf.PinNone // pinned at the commit, in place of the old one
	fresh, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, explainBPFError("recreate map "+name, err)
	}
	r := &replacement{name: name, m: fresh}
	switch {
	case migrate == nil:
	case old.KeySize() != spec.KeySize:
		log.Warn("resized map starts empty: its key layout changed, so its entries cannot be copied", "map", name,
			"reason", fmt.Sprintf("key size changed from %d to %d bytes", old.KeySize(), spec.KeySize))
	case old.ValueSize() < spec.ValueSize && valuesGrow[name]:
		var err error
		r.copied, r.skipped, err = migrate(old, fresh)
		if err != nil {
			log.Warn("copy into a map with larger values ended early", "map", name, "error", err)
		}
	case old.ValueSize() != spec.ValueSize:
		log.Warn("resized map starts empty: its value layout changed, so its entries cannot be copied", "map", name,
			"reason", fmt.Sprintf("value size changed from %d to %d bytes", old.ValueSize(), spec.ValueSize))
	default:
		var err error
		r.copied, r.skipped, err = migrate(old, fresh)
		if err != nil {
			log.Warn("copy into a resized map ended early", "map", name, "error", err)
		}
	}
	return r, nil
}

// mapReplacements are the filled replacements of a load's incompatible
// pinned maps, not pinned yet.
type mapReplacements struct {
	dir  string         // the maps' pin directory
	maps []*replacement // in name order (with a copy of the SNAT bucket hints the slots moved by)
	// hints are fresh SNAT bucket hints, if there were none to adopt:
	// swapped last.
	hints *replacement
	log   *slog.Logger
	// faults is the load's: the renames that move pins go through it.
	faults *faults
}

// byName returns the replacement maps by name, for the collection loader.
func (r *mapReplacements) byName() map[string]*ebpf.Map {
	out := map[string]*ebpf.Map{}
	for _, repl := range r.all() {
		out[repl.name] = repl.m
	}
	return out
}

// all returns the replacements in the order they are swapped.
func (r *mapReplacements) all() []*replacement {
	if r.hints == nil {
		return r.maps
	}
	return append(slices.Clip(r.maps), r.hints)
}

// Close releases the replacements' file descriptors: the maps of those
// not committed are freed.
func (r *mapReplacements) Close() {
	for _, repl := range r.all() {
		repl.m.Close()
	}
}

// stagingDir is where a commit pins the replacements, and links the maps
// they replace, before moving them into place. It is not the maps'
// directory, whose names are the maps'; bpffs refuses names with dots.
func stagingDir(mapsDir string) string { return filepath.Join(filepath.Dir(mapsDir), "maps-replacing") }

// commit puts the replacements in place of the pinned maps they replace,
// all of them or none. Every replacement is first pinned in a staging
// directory, and every pinned map it replaces hard-linked there; a
// failure then leaves the pins as they were. Each replacement is then
// renamed over its map's pin, which replaces the pin at once; if one of
// those renames fails, the links put the earlier pins back. The running
// datapath keeps the maps it uses either way: a pin only names a map.
func (r *mapReplacements) commit() (err error) {
	staging := stagingDir(r.dir)
	// A commit cut short (the agent killed) may have left one, holding
	// the maps it replaced: gone now, whether or not this load replaces
	// any map.
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("replace pinned maps: remove %s: %w", staging, err)
	}
	all := r.all()
	if len(all) == 0 {
		return nil
	}
	if err := os.Mkdir(staging, 0o700); err != nil {
		return fmt.Errorf("replace pinned maps: %w", err)
	}
	defer func() {
		// What is left there after a commit are the old maps' links (their
		// pins go), or the replacements not swapped in.
		if rmErr := os.RemoveAll(staging); rmErr != nil && err == nil {
			r.log.Warn("could not remove the staging pins of replaced maps; they hold kernel memory until removed",
				"path", staging, "error", rmErr)
		}
	}()

	hadPin := map[string]bool{}
	for _, repl := range all {
		if err := repl.m.Pin(filepath.Join(staging, repl.name)); err != nil {
			return fmt.Errorf("replace pinned maps: pin new map %s: %w (the pinned maps are unchanged)", repl.name, err)
		}
		err := os.Link(filepath.Join(r.dir, repl.name), filepath.Join(staging, "old-"+repl.name))
		switch {
		case err == nil:
			hadPin[repl.name] = true
		case !errors.Is(err, os.ErrNotExist):
			return fmt.Errorf("replace pinned maps: link old map %s: %w (the pinned maps are unchanged)", repl.name, err)
		}
	}

	for i, repl := range all {
		if err := r.faults.rename(filepath.Join(staging, repl.name), filepath.Join(r.dir, repl.name)); err != nil {
			err = fmt.Errorf("replace pinned maps: move new map %s into place: %w", repl.name, err)
			return r.rollback(all[:i], hadPin, err)
		}
	}
	for _, repl := range all {
		if !hadPin[repl.name] {
			continue // first pinned (SNAT bucket hints a version before them did not have)
		}
		r.log.Warn("pinned map replaced", "map", repl.name, "reason", repl.why,
			"entries_copied", repl.copied, "entries_not_copied", repl.skipped)
	}
	return nil
}

// rollback puts back the pins of the maps the swapped replacements took
// the place of, and returns cause with what state the pins are left in.
func (r *mapReplacements) rollback(swapped []*replacement, hadPin map[string]bool, cause error) error {
	var stuck []string
	for _, repl := range slices.Backward(swapped) {
		path := filepath.Join(r.dir, repl.name)
		var err error
		if hadPin[repl.name] {
			err = r.faults.rename(filepath.Join(stagingDir(r.dir), "old-"+repl.name), path)
		} else {
			err = os.Remove(path)
		}
		if err != nil {
			r.log.Error("could not restore a pinned map after a failed replacement", "map", repl.name, "error", err)
			stuck = append(stuck, repl.name)
		}
	}
	if len(stuck) > 0 {
		slices.Sort(stuck)
		return fmt.Errorf("%w; restoring the earlier pins failed for %s: they name the new maps, not those "+
			"the running datapath uses, and the next start adopts them without what it writes meanwhile "+
			"(`xdplb detach` starts afresh)", cause, strings.Join(stuck, ", "))
	}
	return fmt.Errorf("%w (the pinned maps were restored: unchanged)", cause)
}

// copyBatch is how many entries a migration reads, or writes, per system
// call.
const copyBatch = 4096

// ctLastSeen is when a conntrack entry's flow was last seen, for
// copyRecentFirst. An entry the agent ended is dated far back, with a
// date that may have wrapped below zero (see dataplane.DeleteFlow): it
// counts as the oldest of all, copied first and left out first.
func ctLastSeen(e *xdp.NicCtEntry) uint64 {
	if e.Flags&uint8(xdp.NicCtFlagsCT_F_ENDED) != 0 {
		return 0
	}
	return e.LastSeenNs
}

// copyRecentFirst returns a migration for an LRU hash map of K to V,
// whose values record when their flow was last seen: it copies the
// entries in the order they were last seen, oldest first, and leaves out
// the oldest ones that do not fit. The new map's LRU order is then that of
// the flows, and a map shrunk below its flows keeps those seen last (the
// LRU also evicts a little before it is full: those are the oldest
// copied). Values are read when written, so a flow refreshed meanwhile
// keeps its latest state; flows the running datapath creates after the
// first pass are not copied. It holds the keys and times in memory (24
// bytes an entry the old conntrack can hold).
func copyRecentFirst[K any, V any](lastSeen func(*V) uint64) migration {
	return func(from, to *ebpf.Map) (copied, skipped int, err error) {
		type flow struct {
			key  K
			seen uint64
		}
		flows := make([]flow, 0, from.MaxEntries())
		if err := readEntries(from, func(k *K, v *V) {
			flows = append(flows, flow{key: *k, seen: lastSeen(v)})
		}); err != nil {
			return 0, len(flows), fmt.Errorf("read entries: %w", err)
		}
		slices.SortFunc(flows, func(a, b flow) int { return cmp.Compare(a.seen, b.seen) })
		if room := int(to.MaxEntries()); len(flows) > room {
			skipped = len(flows) - room
			flows = flows[skipped:]
		}
		w := newBatchWriter[K, V](to)
		var value V
		for _, f := range flows {
			if err := from.Lookup(f.key, &value); err != nil {
				skipped++ // evicted or ended since
				continue
			}
			w.add(f.key, value)
		}
		w.flush()
		return w.copied, skipped + w.skipped, nil
	}
}

// readEntries calls fn for every entry of m: copyBatch at a time, or one
// at a time on a kernel (or map type) without batch lookups.
func readEntries[K, V any](m *ebpf.Map, fn func(*K, *V)) error {
	return readEntriesWhile(m, func(k *K, v *V) bool {
		fn(k, v)
		return true
	})
}

// readEntriesWhile is readEntries until fn returns false.
func readEntriesWhile[K, V any](m *ebpf.Map, fn func(*K, *V) bool) error {
	keys := make([]K, copyBatch)
	values := make([]V, copyBatch)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		if err != nil && first && n == 0 && !errors.Is(err, ebpf.ErrKeyNotExist) {
			iter := m.Iterate()
			for iter.Next(&keys[0], &values[0]) {
				if !fn(&keys[0], &values[0]) {
					return nil
				}
			}
			return iter.Err()
		}
		for i := range n {
			if !fn(&keys[i], &values[i]) {
				return nil
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// batchWriter writes entries into a map copyBatch at a time, counting
// those written and those the map refused.
type batchWriter[K, V any] struct {
	to              *ebpf.Map
	keys            []K
	values          []V
	copied, skipped int
}

func newBatchWriter[K, V any](to *ebpf.Map) *batchWriter[K, V] {
	return &batchWriter[K, V]{to: to, keys: make([]K, 0, copyBatch), values: make([]V, 0, copyBatch)}
}

func (w *batchWriter[K, V]) add(k K, v V) {
	w.keys = append(w.keys, k)
	w.values = append(w.values, v)
	if len(w.keys) == copyBatch {
		w.flush()
	}
}

func (w *batchWriter[K, V]) flush() {
	if len(w.keys) == 0 {
		return
	}
	n, err := w.to.BatchUpdate(w.keys, w.values, nil)
	if err != nil {
		// Without batch updates (or on a failure among them): one at
		// a time, from where it stopped.
		n = max(n, 0)
		for i := n; i < len(w.keys); i++ {
			if w.to.Put(w.keys[i], w.values[i]) != nil {
				w.skipped++
				continue
			}
			w.copied++
		}
	}
	w.copied += n
	w.keys, w.values = w.keys[:0], w.values[:0]
}

// copySNATSlots moves the claimed SNAT slots of an array laid out for other
// options (SNAT range, NAT size), or placed by an older version, to where
// opts and the bucket hints place them, giving a backend without a bucket
// the next one (as the datapath does on a first claim). A flow whose port
// is outside the new range, or whose new slot is taken, is skipped: its
// forward half claims a new port on its next packet. hints is written to:
// never the pinned map, which the running datapath reads until the commit
// (see adoptPinnedMaps).
func copySNATSlots(from, to *ebpf.Map, opts Options, hints *ebpf.Map) (copied, skipped int, err error) {
	var index uint32
	var slot xdp.NicSnatSlot
	iter := from.Iterate()
	for iter.Next(&index, &slot) {
		if slot.Key.Proto == 0 {
			continue
		}
		port := xdp.NetToPort(slot.Key.Dport)
		if !opts.SNATPorts.Contains(port) {
			skipped++
			continue
		}
		backend := netip.AddrPortFrom(xdp.NetToAddr(slot.Key.Saddr), xdp.NetToPort(slot.Key.Sport))
		bucket, err := assignSNATBucket(hints, xdp.SNATHint(backend, xdp.NetToAddr(slot.Key.Daddr), slot.Key.Proto),
			opts.SNATBuckets())
		if err != nil {
			skipped++
			continue
		}
		at := xdp.SNATSlot(bucket, port, opts.SNATPorts)
		var there xdp.NicSnatSlot
		if err := to.Lookup(at, &there); err != nil || there.Key.Proto != 0 {
			skipped++
			continue
		}
		// A claim under way in the running datapath may have it
		// locked; the copy starts unlocked.
		slot.Generation &^= xdp.SNATSlotLocked
		if err := to.Put(at, slot); err != nil {
			skipped++
			continue
		}
		copied++
	}
	return copied, skipped, iter.Err()
}

// assignSNATBucket returns the bucket that hint names, first giving it the
// next bucket in turn if it names none (snat_bucket_assign in nat.h also
// weighs how idle the next few are; while slots are being moved, none has
// been claimed from yet).
func assignSNATBucket(hints *ebpf.Map, hint, buckets uint32) (uint32, error) {
	var value, next uint32
	if err := hints.Lookup(hint, &value); err != nil {
		return 0, fmt.Errorf("read SNAT bucket hint %d: %w", hint, err)
	}
	if bucket, ok := xdp.SNATHintBucket(value, buckets); ok {
		return bucket, nil
	}
	if err := hints.Lookup(xdp.SNATHintNext, &next); err != nil {
		return 0, fmt.Errorf("read SNAT bucket turn: %w", err)
	}
	if err := hints.Put(xdp.SNATHintNext, next+1); err != nil {
		return 0, fmt.Errorf("write SNAT bucket turn: %w", err)
	}
	bucket := next % buckets
	if err := hints.Put(hint, bucket+1); err != nil {
		return 0, fmt.Errorf("write SNAT bucket hint %d: %w", hint, err)
	}
	return bucket, nil
}

func loadPinnedMap(path string) (*ebpf.Map, error) {
	return ebpf.LoadPinnedMap(path, nil)
}
