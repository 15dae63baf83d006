// The ordered write of one Apply into the maps.

package reconcile

import (
	"context"
	"iter"
	"maps"
	"net/netip"

	"github.com/xdplb/xdplb/control/dataplane"
)

// leftovers tells which entries of one map go in a write: on a full Apply,
// those no port wants (wanted: the keys of every record); otherwise those
// the changed ports had and no longer have (had, gathered from the old
// records), unless still wanted (stillWanted: gathered from the new ones,
// or a lookup of what the other ports hold).
type leftovers[K comparable] struct {
	full        bool
	wanted      map[K]bool
	had         []K
	stillWanted func(K) bool
}

// in returns the leftovers among have (on a full Apply) or had.
func (l leftovers[K]) in(have iter.Seq[K]) []K {
	var out []K
	if l.full {
		for k := range have {
			if !l.wanted[k] {
				out = append(out, k)
			}
		}
		return out
	}
	for _, k := range l.had {
		if !l.stillWanted(k) {
			out = append(out, k)
		}
	}
	return out
}

// writeState is what the steps of one write share.
type writeState struct {
	next, old map[string]*portRecord
	full      bool
	all       wantedSet // on a full Apply: what some port wants
	// lateRanges are source ranges that go once no frontend checks them.
	lateRanges []dataplane.SourceRange
	// gone are backends no port uses any more.
	gone []netip.AddrPort
	res  *Result
}

// write applies the changes in the safe order: frontends that go and the
// source ranges no frontend checks any more (they make room for new
// ones), backends, tables, ranges, frontends; then the other deletions in
// reverse. The tables of fresh are being installed already; replacing are
// the tables to install once the backends are written.
func (r *Reconciler) write(ctx context.Context, touched []netip.AddrPort, next, old map[string]*portRecord,
	full bool, fresh *tableInstall, replacing tableWrites, res *Result) error {
	w := &writeState{next: next, old: old, full: full, res: res}
	if full {
		w.all = r.wanted()
	}
	if err := r.removeLeavingFrontends(w); err != nil {
		return err
	}
	if err := r.removeUncheckedRanges(w); err != nil {
		return err
	}
	if err := r.writeBackends(w, touched); err != nil {
		return err
	}
	// Tables, each swapped in whole.
	if err := r.awaitInstall(r.startInstall(ctx, replacing), res); err != nil {
		return err
	}
	if err := r.awaitInstall(fresh, res); err != nil {
		return err
	}
	if err := r.writeRangesAndFrontends(w); err != nil {
		return err
	}
	if err := r.removeLeftovers(w); err != nil {
		return err
	}
	return r.releaseIDsOfGonePorts(w)
}

// removeLeavingFrontends deletes the frontends that go, first: they make
// room in the frontends map for those written later (fitFrontends counted
// on it), and nothing points at a frontend.
func (r *Reconciler) removeLeavingFrontends(w *writeState) error {
	wantFrontends := map[dataplane.FrontendKey]bool{}
	for _, rec := range w.next {
		if rec != nil {
			for k := range rec.frontends {
				wantFrontends[k] = true
			}
		}
	}
	l := leftovers[dataplane.FrontendKey]{full: w.full, wanted: w.all.frontends,
		stillWanted: func(k dataplane.FrontendKey) bool { return wantFrontends[k] || r.frontendOwner(k) != "" }}
	if !w.full {
		for _, rec := range w.old {
			if rec != nil {
				for k := range rec.frontends {
					l.had = append(l.had, k)
				}
			}
		}
	}
	for _, k := range l.in(maps.Keys(r.frontends)) {
		if _, ok := r.frontends[k]; !ok {
			continue
		}
		if err := r.dp.DeleteFrontend(k); err != nil {
			return err
		}
		delete(r.frontends, k)
		w.res.FrontendsRemoved++
	}
	if w.res.FrontendsRemoved > 0 {
		return r.dp.SyncFrontendPorts()
	}
	return nil
}

// removeUncheckedRanges deletes the source ranges that go and that no
// frontend left checks: they make room for those written later (fitRanges
// counted on it). The others go last (removeLeftovers), once the
// frontends that check them are rewritten and the ranges that replace
// them are in: deleting them now would drop the clients they admit until
// then.
func (r *Reconciler) removeUncheckedRanges(w *writeState) error {
	wantRanges := map[dataplane.SourceRange]bool{}
	for _, rec := range w.next {
		if rec != nil {
			for _, sr := range rec.ranges {
				wantRanges[sr] = true
			}
		}
	}
	l := leftovers[dataplane.SourceRange]{full: w.full, wanted: w.all.ranges,
		stillWanted: func(sr dataplane.SourceRange) bool { return wantRanges[sr] }}
	if !w.full {
		for _, rec := range w.old {
			if rec != nil {
				l.had = append(l.had, rec.ranges...)
			}
		}
	}
	checked := map[uint32]bool{}
	for _, fe := range r.frontends {
		if fe.Flags&dataplane.FrontendSourceRanges != 0 {
			checked[fe.SvcID] = true
		}
	}
	for _, sr := range l.in(maps.Keys(r.ranges)) {
		if checked[sr.SvcID] {
			w.lateRanges = append(w.lateRanges, sr)
			continue
		}
		if err := r.deleteRange(sr, w.res); err != nil {
			return err
		}
	}
	return nil
}

// writeBackends writes the backends that are new or changed, and the
// ports of backends at a node address before any table leads to them (the
// host's replies are translated from the first); it notes in w the
// backends no port uses any more.
func (r *Reconciler) writeBackends(w *writeState, touched []netip.AddrPort) error {
	puts := make(map[uint32]dataplane.Backend, len(touched))
	for _, ap := range touched {
		st := r.addrs[ap]
		if st.users == 0 {
			w.gone = append(w.gone, ap)
			continue
		}
		b := st.merged(ap)
		cur, ok := r.backends[st.id]
		if ok && cur == b {
			continue
		}
		puts[st.id] = b
		if b.Host || cur.Host {
			r.hostPortsStale = true
		}
	}
	// A batch that fails may have written part of puts; r.backends
	// keeps the old values of all, so the next full Apply, which
	// touches every backend, writes them again.
	if err := r.dp.PutBackends(puts); err != nil {
		return err
	}
	r.backends = presized(r.backends, len(puts))
	for id, b := range puts {
		r.backends[id] = b
	}
	w.res.BackendsAdded += len(puts)
	return r.syncHostPorts()
}

// writeRangesAndFrontends writes the source ranges, then the frontends
// (which check them) of the ports written.
func (r *Reconciler) writeRangesAndFrontends(w *writeState) error {
	fePuts := map[dataplane.FrontendKey]dataplane.Frontend{}
	for _, rec := range w.next {
		if rec == nil {
			continue
		}
		for _, sr := range rec.ranges {
			if r.ranges[sr] {
				continue
			}
			if err := r.dp.PutSourceRange(sr.SvcID, sr.Prefix); err != nil {
				r.rangesUnknown = true
				return err
			}
			r.ranges[sr] = true
		}
		for k, v := range rec.frontends {
			if cur, ok := r.frontends[k]; ok && cur == v {
				continue
			}
			fePuts[k] = v
		}
	}
	if err := r.dp.PutFrontends(fePuts); err != nil {
		r.frontendsUnknown = true
		return err
	}
	for k, v := range fePuts {
		r.frontends[k] = v
	}
	w.res.FrontendsWritten += len(fePuts)
	return nil
}

// removeLeftovers makes the other deletions, once no frontend points at
// what goes: source ranges, tables and backends the changed ports had and
// no longer have (or, on a full Apply, whatever no port wants).
func (r *Reconciler) removeLeftovers(w *writeState) error {
	l := leftovers[uint32]{full: w.full, wanted: w.all.tables, stillWanted: r.tableWanted}
	if w.full {
		for ap, st := range r.addrs {
			if st.users == 0 && st.touched != r.applies { // touched: decided by writeBackends
				w.gone = append(w.gone, ap)
			}
		}
	} else {
		for _, rec := range w.old {
			if rec != nil {
				for id := range rec.tables {
					l.had = append(l.had, id)
				}
			}
		}
	}
	dropTables := l.in(maps.Keys(r.tables))
	for _, sr := range w.lateRanges {
		if err := r.deleteRange(sr, w.res); err != nil {
			return err
		}
	}
	for _, id := range dropTables {
		if _, ok := r.tables[id]; !ok {
			continue
		}
		if err := r.dp.DeleteTable(id); err != nil {
			return err
		}
		delete(r.tables, id)
		w.res.TablesRemoved++
	}
	for _, ap := range w.gone {
		if err := r.removeBackend(ap, w.res); err != nil {
			return err
		}
	}
	return r.syncHostPorts()
}

// removeBackend deletes the backend at ap, which no port uses.
func (r *Reconciler) removeBackend(ap netip.AddrPort, res *Result) error {
	st, ok := r.addrs[ap]
	if !ok {
		return nil
	}
	id := st.id
	if err := r.dp.DeleteBackend(id); err != nil {
		return err
	}
	if res.RemovedBackends == nil {
		res.RemovedBackends = map[uint32]dataplane.Backend{}
	}
	if b, ok := r.backends[id]; ok {
		res.RemovedBackends[id] = b
		if b.Host {
			r.hostPortsStale = true
		}
	}
	delete(r.backends, id)
	delete(r.addrs, ap)
	delete(r.usedBackendIDs, id)
	res.BackendsRemoved++
	return nil
}

// releaseIDsOfGonePorts frees the ids and names of ports that are gone,
// unless another port took the id over (a renamed port: its name is
// written already); on a full Apply, also the ids no port has now.
func (r *Reconciler) releaseIDsOfGonePorts(w *writeState) error {
	for k, rec := range w.old {
		if rec != nil && (w.next[k] == nil || w.next[k].id != rec.id) {
			if _, held := r.portOfID[rec.id]; held {
				continue
			}
			delete(r.usedIDs, rec.id)
			if err := r.dp.DeleteServiceName(rec.id); err != nil {
				return err
			}
		}
	}
	if !w.full {
		return nil
	}
	// Ids no port has now: left by an earlier agent, or by a failed write
	// that removed ports before it could release their ids.
	held := make(map[uint32]bool, len(r.ports))
	for _, rec := range r.ports {
		held[rec.id] = true
	}
	for id := range r.usedIDs {
		if !held[id] {
			delete(r.usedIDs, id)
		}
	}
	names, err := r.dp.ServiceNames()
	if err != nil {
		return err
	}
	for id := range names {
		if !r.usedIDs[id] {
			if err := r.dp.DeleteServiceName(id); err != nil {
				return err
			}
		}
	}
	return nil
}

// deleteRange deletes source range sr if it is in the map.
func (r *Reconciler) deleteRange(sr dataplane.SourceRange, res *Result) error {
	if !r.ranges[sr] {
		return nil
	}
	if err := r.dp.DeleteSourceRange(sr.SvcID, sr.Prefix); err != nil {
		r.rangesUnknown = true
		return err
	}
	delete(r.ranges, sr)
	res.RangesRemoved++
	return nil
}
