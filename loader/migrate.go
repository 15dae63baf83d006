// Migrating a pinned map into its replacement: which maps copy how, and
// the copies (recent flows first, growing values, SNAT slots re-placed).

package loader

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

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
		"stats": copyPerCPUArray[xdp.Counter],

		"conntrack":      copyRecentFirst[xdp.CtKey](ctLastSeen),
		"ct_unconfirmed": copyRecentFirst[xdp.CtKey](ctLastSeen),
		// Without its offset, a flow the SYN proxy opened cannot go on.
		"synproxy_flows":  copyEntries[xdp.CtKey, xdp.SynproxySeq],
		"nat":             copyRecentFirst[xdp.NatKey](natLastSeen),
		"nat_unconfirmed": copyRecentFirst[xdp.NatKey](natLastSeen),
		"affinity":        copyRecentFirst[xdp.AffinityKey](func(e *xdp.AffinityEntry) uint64 { return e.LastSeenNs }),
		"snat_slots":      func(from, to *ebpf.Map) (int, int, error) { return copySNATSlots(from, to, opts, hints) },

		"frontends":          copyEntries[xdp.FrontendKey, xdp.Frontend],
		"backends":           copyEntries[uint32, xdp.Backend],
		"maglev_tables":      copyInnerMaps,
		"source_ranges":      copyEntries[xdp.SourceRangeKey, uint8],
		"snat_backend_hands": copyEntries[uint32, uint32],
		"svc_names":          copyEntries[uint32, xdp.SvcName],
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
func natLastSeen(e *xdp.NatEntry) uint64 { return e.LastSeenNs }

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

// copyBatch is how many entries a migration reads, or writes, per system
// call.
const copyBatch = 4096

// ctLastSeen is when a conntrack entry's flow was last seen, for
// copyRecentFirst. An entry the agent ended is dated far back, with a
// date that may have wrapped below zero (see dataplane.DeleteFlow): it
// counts as the oldest of all, copied first and left out first.
func ctLastSeen(e *xdp.CtEntry) uint64 {
	if e.Flags&uint8(xdp.CtFlagsCT_F_ENDED) != 0 {
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
	var slot xdp.SnatSlot
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
		var there xdp.SnatSlot
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
// next bucket in turn if it names none (snat_bucket_assign in snat.h also
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
