// Fitting service ports into the maps: frontends and source ranges that
// must go in before what they replace is taken out, and what is in.

package reconcile

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
)

// frontendOwner returns the port whose record holds frontend k under the
// service id written for it, "" if none.
func (r *Reconciler) frontendOwner(k dataplane.FrontendKey) string {
	v, ok := r.frontends[k]
	if !ok || v.SvcID == 0 {
		return ""
	}
	key, ok := r.portOfID[v.SvcID]
	if !ok {
		return ""
	}
	if _, has := r.ports[key].frontends[k]; !has {
		return ""
	}
	return key
}

type wantedSet struct {
	frontends map[dataplane.FrontendKey]bool
	ranges    map[dataplane.SourceRange]bool
	tables    map[uint32]bool
}

func (r *Reconciler) wanted() wantedSet {
	w := wantedSet{make(map[dataplane.FrontendKey]bool, len(r.frontends)), map[dataplane.SourceRange]bool{},
		make(map[uint32]bool, len(r.tables))}
	for _, rec := range r.ports {
		for k := range rec.frontends {
			w.frontends[k] = true
		}
		for _, sr := range rec.ranges {
			w.ranges[sr] = true
		}
		for id := range rec.tables {
			w.tables[id] = true
		}
	}
	return w
}

// fitFrontends decides which of the ports in keys (those this Apply
// changes; a nil Service is a port that goes) get their frontends
// written, so that the frontends map never has to take more than it
// holds: a write that fails half-way would leave frontends in the map
// that no record owns. It returns the record of each port refused: its
// previous record, when that is in the maps whole, tables included (the
// port stays as it was), else one with no frontends (the port is not
// programmed); either reports the port in its problems.
//
// The frontends of ports that go make room first (write deletes them
// before it writes any), then ports with frontends in the map take
// theirs before new ports do, so that a full Apply does not swap a
// programmed port for a new one; within each, in the order of keys.
//
// On the first Apply after New no port has a record yet: a port holds the
// pinned frontends of its own that carry its adopted service id (ids), so
// that a restart does not swap a programmed port for another either.
//
// The ports in decided are refused already (by fitRanges, or by a first
// fitFrontends whose ranges were then recounted) and take the
// record given there: a previous version keeps its frontends, an empty
// record releases them.
func (r *Reconciler) fitFrontends(keys []string, byKey map[string]*model.Service, ids map[string]uint32,
	full bool, decided map[string]*portRecord) map[string]*portRecord {
	capacity := int(r.dp.FrontendCapacity())
	// adopted are the ports without a record that hold pinned frontends
	// under their adopted id: what they hold, as a record of only those.
	adopted := map[string]*portRecord{}
	adoptedOwner := map[dataplane.FrontendKey]string{}
	if r.adopted != nil {
		for _, k := range keys {
			svc, id := byKey[k], ids[k]
			if svc == nil || id == 0 || r.ports[k] != nil {
				continue
			}
			for _, f := range svc.Frontends {
				fk := frontendKey(f)
				if fe, ok := r.frontends[fk]; ok && fe.SvcID == id && r.frontendOwner(fk) == "" {
					if adopted[k] == nil {
						adopted[k] = &portRecord{id: id, frontends: map[dataplane.FrontendKey]dataplane.Frontend{}}
					}
					adopted[k].frontends[fk] = fe
					adoptedOwner[fk] = k
				}
			}
		}
	}
	// prev is what port k had before this Apply: its record, or what it
	// adopted.
	prev := func(k string) *portRecord {
		if old := r.ports[k]; old != nil {
			return old
		}
		return adopted[k]
	}
	// moved overrides, for the frontends this Apply moves, which port
	// holds each once it is written ("" for none).
	moved := map[dataplane.FrontendKey]string{}
	// holder reports whether frontend k will be in the map as far as
	// decided yet, and which port holds it ("" for a frontend no port
	// owns, which only a full Apply deletes).
	holder := func(k dataplane.FrontendKey) (string, bool) {
		if port, ok := moved[k]; ok {
			return port, port != ""
		}
		if _, ok := r.frontends[k]; !ok {
			return "", false
		}
		port := r.frontendOwner(k)
		if port == "" {
			port = adoptedOwner[k]
		}
		return port, port != "" || !full
	}
	used := len(r.frontends)
	if full {
		used = 0
		for k := range r.frontends {
			if _, ok := holder(k); ok {
				used++
			}
		}
	}
	// inMap lists the frontends of rec that port holds in the map.
	inMap := func(port string, rec *portRecord) []dataplane.FrontendKey {
		var out []dataplane.FrontendKey
		if rec != nil {
			for k := range rec.frontends {
				if p, ok := holder(k); ok && p == port {
					out = append(out, k)
				}
			}
		}
		return out
	}
	release := func(ks []dataplane.FrontendKey) {
		for _, k := range ks {
			moved[k] = ""
		}
		used -= len(ks)
	}

	var order []string
	programmed := map[string]bool{}
	for _, k := range keys {
		if rec := decided[k]; byKey[k] == nil || rec != nil && len(rec.frontends) == 0 {
			release(inMap(k, prev(k)))
			continue
		}
		if decided[k] != nil {
			continue // keeps its frontends as they are
		}
		order = append(order, k)
		programmed[k] = len(inMap(k, prev(k))) > 0
	}
	slices.SortStableFunc(order, func(a, b string) int {
		switch {
		case programmed[a] && !programmed[b]:
			return -1
		case programmed[b] && !programmed[a]:
			return 1
		}
		return 0
	})

	refused := map[string]*portRecord{}
	want := map[dataplane.FrontendKey]bool{} // the frontends of one port
	for _, k := range order {
		old := r.ports[k]
		held := inMap(k, prev(k))
		clear(want)
		added := 0
		for _, f := range byKey[k].Frontends {
			fk := frontendKey(f)
			if want[fk] {
				continue
			}
			want[fk] = true
			if _, ok := holder(fk); !ok {
				added++
			}
		}
		freed := 0
		for _, fk := range held {
			if !want[fk] {
				freed++
			}
		}
		if used+added-freed <= capacity {
			for _, fk := range held {
				if !want[fk] {
					moved[fk] = ""
				}
			}
			for fk := range want {
				moved[fk] = k
			}
			used += added - freed
			continue
		}
		problem := fmt.Sprintf("service port %s not programmed: its %d frontends do not fit in the frontends map of %d (raise --frontends-max)",
			k, len(want), capacity)
		// A previous version that admits clients the new ranges deny
		// does not stand in for the port: it is closed instead.
		if old != nil && len(old.frontends) > 0 && len(held) == len(old.frontends) && r.tablesInPlace(old) &&
			!old.narrowedBy(byKey[k]) {
			// Its previous version stays, frontends, tables and all.
			kept := *old
			kept.problems = []string{fmt.Sprintf("service port %s not updated: its %d frontends do not fit in the frontends map of %d "+
				"(raise --frontends-max); its previous %d stay", k, len(want), capacity, len(old.frontends))}
			kept.waitsForRoom = true
			refused[k] = &kept
			continue
		}
		release(held)
		refused[k] = &portRecord{
			frontends:    map[dataplane.FrontendKey]dataplane.Frontend{},
			tables:       map[uint32]*tableRecord{},
			problems:     []string{problem},
			waitsForRoom: true,
		}
	}
	return refused
}

// fitRanges decides which of the ports in keys (those this Apply changes;
// a nil Service is a port that goes) get their source ranges written, so
// that the source ranges map never has to take more than it holds: a
// write that fails would fail again at every sync, and nothing after it
// would be applied. ids are the ports' service ids (portIDs). It returns
// the record of each port refused, as fitFrontends does: its previous
// one if that is in the maps whole (recordInMaps) and admits no client the new
// ranges deny (narrowedBy), else an empty one.
//
// It counts what write does: the ranges that go are deleted before any
// is written when no frontend left in the map checks them (their port
// goes, or loses its frontends); those a frontend still checks are
// deleted only after the new ones are written, since deleting first
// would drop the clients they admit until then. So a port that changes
// its ranges needs room for the old and the new together. The count
// errs on the full side (a frontend checks ranges until it is surely
// deleted; a port applied keeps its old ranges until the end), which may
// refuse a port that would have fitted; that port is tried again at the
// next change or full Apply. Ports with ranges in the map (after a
// restart: under their adopted id) come first, as in fitFrontends.
//
// The ports in skip are refused already (by fitFrontends): their new
// ranges are not counted (those they have in the map are).
func (r *Reconciler) fitRanges(keys []string, byKey map[string]*model.Service, ids map[string]uint32,
	full bool, skip map[string]*portRecord) map[string]*portRecord {
	capacity := int(r.dp.SourceRangeCapacity())
	held := map[uint32]map[netip.Prefix]bool{}
	for sr := range r.ranges {
		if held[sr.SvcID] == nil {
			held[sr.SvcID] = map[netip.Prefix]bool{}
		}
		held[sr.SvcID][sr.Prefix] = true
	}
	if len(held) == 0 && !slices.ContainsFunc(keys, func(k string) bool {
		return byKey[k] != nil && byKey[k].SourceRangesSet
	}) {
		return map[string]*portRecord{} // nothing to count: the common case
	}

	// checked are the service ids whose ranges a frontend may still check
	// while the new ranges are written: the frontends that go are those
	// no port applied wants, and, in an ApplyChanges, that a changed
	// port had.
	wantKeys := map[dataplane.FrontendKey]bool{}
	changedKeys := map[dataplane.FrontendKey]bool{}
	for _, k := range keys {
		if svc := byKey[k]; svc != nil {
			for _, f := range svc.Frontends {
				wantKeys[frontendKey(f)] = true
			}
		}
		if old := r.ports[k]; old != nil && !full {
			for fk := range old.frontends {
				changedKeys[fk] = true
			}
		}
	}
	checked := map[uint32]bool{}
	for fk, fe := range r.frontends {
		if fe.Flags&dataplane.FrontendSourceRanges == 0 {
			continue
		}
		if wantKeys[fk] || !full && !changedKeys[fk] {
			checked[fe.SvcID] = true
		}
	}
	// stays are the ranges in the map while the new ones are written:
	// those of ids a frontend checks; those of the ports applied, whose
	// frontends may yet be refused (fitFrontends) and keep checking them;
	// and, in an ApplyChanges, those of the ports it does not change
	// (only a full Apply deletes ranges no port has).
	var order []string
	applied := map[uint32]bool{}
	for _, k := range keys {
		if byKey[k] != nil && ids[k] != 0 {
			if skip[k] == nil {
				order = append(order, k)
			}
			applied[ids[k]] = true
		}
	}
	changedID := map[uint32]bool{}
	if !full {
		for _, k := range keys {
			if old := r.ports[k]; old != nil && old.id != 0 {
				changedID[old.id] = true
			}
		}
	}
	stays := func(id uint32) bool { return checked[id] || applied[id] || !full && !changedID[id] }
	used := 0
	for id, ps := range held {
		if stays(id) {
			used += len(ps)
		}
	}

	// A port without a record holds the pinned ranges of its adopted id
	// (on the first Apply after New).
	programmed := func(k string) bool {
		if old := r.ports[k]; old != nil {
			return len(held[old.id]) > 0
		}
		return r.adopted != nil && len(held[ids[k]]) > 0
	}
	slices.SortStableFunc(order, func(a, b string) int {
		switch pa, pb := programmed(a), programmed(b); {
		case pa && !pb:
			return -1
		case pb && !pa:
			return 1
		}
		return 0
	})

	refused := map[string]*portRecord{}
	want := map[netip.Prefix]bool{}
	for _, k := range order {
		svc, id := byKey[k], ids[k]
		clear(want)
		if svc.SourceRangesSet {
			for _, p := range svc.SourceRanges {
				want[p.Masked()] = true
			}
		}
		added := 0
		for p := range want {
			if !held[id][p] { // the port's own ranges stay (applied)
				added++
			}
		}
		if used+added <= capacity {
			used += added
			continue
		}
		old := r.ports[k]
		if old != nil && old.narrowedBy(svc) {
			// Keeping the previous version would admit clients the
			// new ranges exclude: fail closed instead.
			refused[k] = &portRecord{
				frontends: map[dataplane.FrontendKey]dataplane.Frontend{},
				tables:    map[uint32]*tableRecord{},
				problems: []string{fmt.Sprintf("service port %s not programmed: its %d source ranges do not fit in what "+
					"the source ranges map of %d leaves (raise --services-max, which sizes it); they admit fewer "+
					"clients than its previous version, so it is closed until they fit", k, len(want), capacity)},
				waitsForRoom: true,
			}
			continue
		}
		if old != nil && old.id == id && len(old.frontends) > 0 && r.recordInMaps(old) {
			// Its previous version stays, ranges, frontends, tables and all.
			kept := *old
			kept.problems = []string{fmt.Sprintf("service port %s not updated: its %d source ranges do not fit in what "+
				"the source ranges map of %d leaves, with the %d it has until they are swapped "+
				"(raise --services-max, which sizes it); its previous version stays", k, len(want), capacity, len(held[id]))}
			kept.waitsForRoom = true
			refused[k] = &kept
			continue
		}
		refused[k] = &portRecord{
			frontends: map[dataplane.FrontendKey]dataplane.Frontend{},
			tables:    map[uint32]*tableRecord{},
			problems: []string{fmt.Sprintf("service port %s not programmed: its %d source ranges do not fit in what "+
				"the source ranges map of %d leaves (raise --services-max, which sizes it)", k, len(want), capacity)},
			waitsForRoom: true,
		}
	}
	return refused
}

// narrowedBy reports whether rec, a port's previous version, admits a
// client on one of its frontends that svc, the port's new spec, would
// deny there: a LoadBalancer frontend of svc with source ranges that rec
// has without any (open to all), or ranges of rec that svc's do not
// cover (rangesCover). Such a previous version must not stand in for a
// refused svc.
func (rec *portRecord) narrowedBy(svc *model.Service) bool {
	if !svc.SourceRangesSet {
		return false // svc admits every client
	}
	restricted := false
	for _, f := range svc.Frontends {
		if f.Kind != model.LoadBalancer {
			continue
		}
		fe, ok := rec.frontends[frontendKey(f)]
		if !ok {
			continue
		}
		if fe.Flags&dataplane.FrontendSourceRanges == 0 {
			return true
		}
		restricted = true
	}
	if !restricted {
		return false
	}
	old := make([]netip.Prefix, 0, len(rec.ranges))
	for _, sr := range rec.ranges {
		old = append(old, sr.Prefix)
	}
	return !rangesCover(svc.SourceRanges, old)
}

// rangesCover reports whether every address in one of the prefixes old
// is in one of the prefixes cover: whether each of old is contained in
// (no longer than, and overlapping) some prefix of cover. A prefix split
// across several of cover (a /24 as its two /25s) counts as not covered,
// which errs on the closed side.
func rangesCover(cover, old []netip.Prefix) bool {
	for _, o := range old {
		o = o.Masked()
		if !slices.ContainsFunc(cover, func(c netip.Prefix) bool {
			return c.Bits() <= o.Bits() && c.Contains(o.Addr())
		}) {
			return false
		}
	}
	return true
}

// recordInMaps reports whether rec's frontends, source ranges and tables are all
// in the maps as rec has them.
func (r *Reconciler) recordInMaps(rec *portRecord) bool {
	if !r.tablesInPlace(rec) {
		return false
	}
	for k, v := range rec.frontends {
		if cur, ok := r.frontends[k]; !ok || cur != v {
			return false
		}
	}
	for _, sr := range rec.ranges {
		if !r.ranges[sr] {
			return false
		}
	}
	return true
}
