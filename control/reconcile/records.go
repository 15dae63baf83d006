// Port records: what one service port was written as, built from the
// model and completed once its tables are planned.

package reconcile

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
)

// pendingPort is the part of a port's record that waits for its tables.
type pendingPort struct {
	svc   *model.Service
	sets  [2]*tableInput
	order []tableSet // the sets the frontends use, in the order they do
}

// portRecord is what one service port puts into the maps.
type portRecord struct {
	id        uint32
	frontends map[dataplane.FrontendKey]dataplane.Frontend
	tables    map[uint32]*tableRecord
	ranges    []dataplane.SourceRange
	// backends is this port's view of its endpoints; a backend several
	// ports share is merged from all views.
	backends backendList
	// hintedOut are the ready endpoints topology hints leave out of both
	// sets (see hintedOut); nil when there are none.
	hintedOut map[netip.AddrPort]bool
	problems  []string
	// waitsForRoom: refused, whole or in part, for lack of room in a map
	// or an id range (Result.WaitingForRoom).
	waitsForRoom bool
	pending      *pendingPort
}

// releaseUnappliedIDs returns ids allocated for records that will not be applied.
// An id another port holds (inherited from a port the Apply would have
// removed) stays that port's.
func (r *Reconciler) releaseUnappliedIDs(next map[string]*portRecord) {
	for k, rec := range next {
		if rec == nil || r.ports[k] != nil && r.ports[k].id == rec.id {
			continue
		}
		if _, held := r.portOfID[rec.id]; !held {
			delete(r.usedIDs, rec.id)
		}
	}
}

// newPortRecord computes what one service port puts into the maps under its
// service id (0: none was free, see portIDs), allocating backend ids as
// needed. prev is the record applied before under that id, if any (the
// port's own, or that of the port it took the id over from): its tables
// are kept where their inputs are the same. The Maglev tables are planned
// afterwards, for all ports at once (planTables), and completePortRecord
// completes the record.
func (r *Reconciler) newPortRecord(svc *model.Service, id uint32, prev *portRecord) *portRecord {
	key := svc.Key()
	rec := &portRecord{
		frontends: map[dataplane.FrontendKey]dataplane.Frontend{},
		tables:    map[uint32]*tableRecord{},
		backends:  make(backendList, 0, len(svc.Endpoints)),
	}
	if id == 0 {
		rec.problems = append(rec.problems, fmt.Sprintf(
			"service port %s not programmed: all %d service ids in use (raise --services-max)", key, r.cfg.ServicesMax-1))
		rec.waitsForRoom = true
		return rec
	}
	rec.id = id

	// Every endpoint is a backend, also those in no set (terminating, not
	// ready, or left out by topology hints): their tracked flows keep
	// working until the endpoint leaves its EndpointSlice.
	rec.hintedOut = hintedOut(svc)
	for _, e := range svc.Endpoints {
		ap := netip.AddrPortFrom(e.Addr, e.Port)
		if _, ok := r.addrs[ap]; !ok {
			bid, ok := r.allocateBackendID()
			if !ok {
				rec.problems = append(rec.problems, fmt.Sprintf(
					"backend %s of %s not programmed: all %d backend ids in use (raise --backends-max)", ap, key, r.cfg.BackendsMax-1))
				rec.waitsForRoom = true
				continue
			}
			r.addrs[ap] = backendState{id: bid}
		}
		// Not ready counts as draining too: such an endpoint is in no set
		// (unless as the fallback), and an affinity must not lead to it.
		// So does one that topology hints leave out of the sets.
		rec.backends = append(rec.backends, backend{dataplane.Backend{Addr: e.Addr, Port: e.Port, Local: e.Local,
			Host: e.Host, Terminating: e.Terminating || !e.Serving || !e.Ready || rec.hintedOut[ap]}})
	}
	rec.backends = rec.backends.sorted()

	// The tables the frontends use, and only those.
	p := &pendingPort{svc: svc}
	need := func(set tableSet) {
		if p.sets[set] != nil {
			return
		}
		eps := svc.ClusterSet
		if set == localSet {
			eps = svc.LocalSet
		}
		in := r.tableInput(eps)
		in.id = tableID(id, set)
		if prev != nil && prev.id == id {
			in.prev = prev.tables[in.id]
		}
		p.sets[set] = in
		p.order = append(p.order, set)
	}
	for _, f := range svc.Frontends {
		set, internal := tableSets(svc, f)
		need(set)
		need(internal)
	}
	rec.pending = p
	return rec
}

// completePortRecord completes a record once its tables are built: the tables and the
// frontends that point at them.
func (r *Reconciler) completePortRecord(rec *portRecord) {
	p := rec.pending
	if p == nil {
		return
	}
	rec.pending = nil
	svc, id := p.svc, rec.id
	key := svc.Key()
	var tableOf [2]uint32 // per set: table id, 0 if empty
	for _, set := range p.order {
		in := p.sets[set]
		switch {
		case in.err != nil:
			rec.problems = append(rec.problems, fmt.Sprintf("service port %s: %v", key, in.err))
		case in.table != nil:
			tableOf[set] = tableID(id, set)
			rec.tables[tableOf[set]] = in.table
		}
	}
	for _, f := range svc.Frontends {
		set, internal := tableSets(svc, f)
		v := dataplane.Frontend{SvcID: id, TableID: tableOf[set], InternalTableID: tableOf[internal]}
		if set == localSet {
			v.Flags |= dataplane.FrontendLocalSet
		}
		if internal == localSet {
			v.Flags |= dataplane.FrontendInternalLocalSet
		}
		if v.InternalTableID == 0 && len(svc.ClusterSet) > 0 {
			v.Flags |= dataplane.FrontendInternalDropIfEmpty
		}
		if f.Kind.External() {
			v.Flags |= dataplane.FrontendExternal
			if !svc.ExternalTrafficPolicyLocal {
				v.Flags |= dataplane.FrontendSNATRemote
			}
		}
		if f.Kind == model.LoadBalancer && svc.SourceRangesSet {
			v.Flags |= dataplane.FrontendSourceRanges
		}
		if v.TableID == 0 && svc.Verdict(f.Kind) == model.Drop {
			v.Flags |= dataplane.FrontendDropIfEmpty
		}
		if svc.AffinityTimeout > 0 {
			v.AffinityTimeout = uint32(max(1, svc.AffinityTimeout/time.Second))
		}
		rec.frontends[frontendKey(f)] = v
	}
	if svc.SourceRangesSet {
		for _, p := range svc.SourceRanges {
			rec.ranges = append(rec.ranges, dataplane.SourceRange{SvcID: id, Prefix: p.Masked()})
		}
	}
}

func frontendKey(f model.Frontend) dataplane.FrontendKey {
	return dataplane.FrontendKey{Addr: f.Addr, Port: f.Port, Proto: uint8(f.Protocol)}
}
