// The ordered write of one Apply into the maps.

package reconcile

import (
	"context"
	"net/netip"

	"github.com/xdplb/xdplb/control/dataplane"
)

// write applies the changes in the safe order: frontends that go and the
// source ranges no frontend checks any more (they make room for new
// ones), backends, tables, ranges, frontends; then the other deletions in
// reverse. The tables of fresh are being
// installed already; replacing are the tables to install once the
// backends are written.
func (r *Reconciler) write(ctx context.Context, touched []netip.AddrPort, next, old map[string]*portRecord,
	full bool, fresh *tableInstall, replacing tableWrites, res *Result) error {
	// 1. Frontends that go, first: they make room in the frontends map
	// for those written below (fitFrontends counted on it), and nothing
	// points at a frontend.
	wantFrontends := map[dataplane.FrontendKey]bool{}
	for _, rec := range next {
		if rec != nil {
			for k := range rec.frontends {
				wantFrontends[k] = true
			}
		}
	}
	var dropFrontends []dataplane.FrontendKey
	var all wantedSet
	if full {
		all = r.wanted()
		for k := range r.frontends {
			if !all.frontends[k] {
				dropFrontends = append(dropFrontends, k)
			}
		}
	} else {
		for _, rec := range old {
			if rec == nil {
				continue
			}
			for k := range rec.frontends {
				if !wantFrontends[k] && r.frontendOwner(k) == "" {
					dropFrontends = append(dropFrontends, k)
				}
			}
		}
	}
	for _, k := range dropFrontends {
		if _, ok := r.frontends[k]; !ok {
			continue
		}
		if err := r.dp.DeleteFrontend(k); err != nil {
			return err
		}
		delete(r.frontends, k)
		res.FrontendsRemoved++
	}
	if res.FrontendsRemoved > 0 {
		if err := r.dp.SyncFrontendPorts(); err != nil {
			return err
		}
	}
	// Then the source ranges that go and that no frontend left checks:
	// they make room for those written below (fitRanges counted on it).
	// The others go last (5.), once the frontends that check them are
	// rewritten and the ranges that replace them are in: deleting them
	// now would drop the clients they admit until then.
	wantRanges := map[dataplane.SourceRange]bool{}
	for _, rec := range next {
		if rec != nil {
			for _, sr := range rec.ranges {
				wantRanges[sr] = true
			}
		}
	}
	var dropRanges []dataplane.SourceRange
	if full {
		for sr := range r.ranges {
			if !all.ranges[sr] {
				dropRanges = append(dropRanges, sr)
			}
		}
	} else {
		for _, rec := range old {
			if rec == nil {
				continue
			}
			for _, sr := range rec.ranges {
				if !wantRanges[sr] {
					dropRanges = append(dropRanges, sr)
				}
			}
		}
	}
	checked := map[uint32]bool{}
	for _, fe := range r.frontends {
		if fe.Flags&dataplane.FrontendSourceRanges != 0 {
			checked[fe.SvcID] = true
		}
	}
	late := dropRanges[:0]
	for _, sr := range dropRanges {
		if checked[sr.SvcID] {
			late = append(late, sr)
			continue
		}
		if err := r.deleteRange(sr, res); err != nil {
			return err
		}
	}
	dropRanges = late

	// 2. Backends that are new or changed.
	var gone []netip.AddrPort
	puts := make(map[uint32]dataplane.Backend, len(touched))
	for _, ap := range touched {
		st := r.addrs[ap]
		if st.users == 0 {
			gone = append(gone, ap)
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
	res.BackendsAdded += len(puts)
	// The ports of backends at a node address, before any table leads
	// to them: the host's replies are translated from the first.
	if err := r.syncHostPorts(); err != nil {
		return err
	}
	// 3. Tables, each swapped in whole.
	if err := r.awaitInstall(r.startInstall(ctx, replacing), res); err != nil {
		return err
	}
	if err := r.awaitInstall(fresh, res); err != nil {
		return err
	}
	// 4. Source ranges, then frontends.
	fePuts := map[dataplane.FrontendKey]dataplane.Frontend{}
	for _, rec := range next {
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
	res.FrontendsWritten += len(fePuts)

	// 5. The other deletions, once no frontend points at what goes:
	// what the changed ports had and no longer have (or, on a full Apply,
	// whatever no port wants).
	var dropTables []uint32
	if full {
		for id := range r.tables {
			if !all.tables[id] {
				dropTables = append(dropTables, id)
			}
		}
		for ap, st := range r.addrs {
			if st.users == 0 && st.touched != r.applies { // touched: decided above
				gone = append(gone, ap)
			}
		}
	} else {
		for _, rec := range old {
			if rec == nil {
				continue
			}
			for id := range rec.tables {
				if !r.tableWanted(id) {
					dropTables = append(dropTables, id)
				}
			}
		}
	}
	for _, sr := range dropRanges {
		if err := r.deleteRange(sr, res); err != nil {
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
		res.TablesRemoved++
	}
	for _, ap := range gone {
		st, ok := r.addrs[ap]
		if !ok {
			continue
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
	}
	if err := r.syncHostPorts(); err != nil {
		return err
	}
	// Ids and names of ports that are gone, unless another port took
	// the id over (a renamed port: its name is written already).
	for k, rec := range old {
		if rec != nil && (next[k] == nil || next[k].id != rec.id) {
			if _, held := r.portOfID[rec.id]; held {
				continue
			}
			delete(r.usedIDs, rec.id)
			if err := r.dp.DeleteServiceName(rec.id); err != nil {
				return err
			}
		}
	}
	if full {
		// Ids no port has now: left by an earlier agent, or by a failed
		// write that removed ports before it could release their ids.
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
