// Replacing pinned maps: new maps are filled beside the old, then swapped
// in under the pins all together (commit), or the old ones are put back
// (rollback).

package loader

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
)

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
