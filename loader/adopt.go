// Adopting the maps an earlier agent pinned, so flows and state survive
// restarts and upgrades; maps whose shape changed are replaced (replace.go)
// and their entries copied (migrate.go).

package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

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
	err := readEntriesWhile(slots, func(index *uint32, slot *xdp.SnatSlot) bool {
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

func loadPinnedMap(path string) (*ebpf.Map, error) {
	return ebpf.LoadPinnedMap(path, nil)
}
