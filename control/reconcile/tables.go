// Maglev tables: their records, planning which to build, installing them,
// and which are wanted.

package reconcile

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/maglev"
	"github.com/xdplb/xdplb/control/model"
)

// tableSet selects one of a service port's endpoint sets.
type tableSet uint8

const (
	clusterSet tableSet = iota
	localSet
)

// tableRecord is one Maglev table of a service port.
type tableRecord struct {
	// key names the build's inputs and ids are the backend id of each
	// member: together they determine the slots, so a later Apply that
	// finds both unchanged keeps the table without building it again.
	key string
	ids []uint32
	// digest identifies the slots (see tableDigest) once the table is
	// written; the goroutine that builds and writes the table sets it.
	digest uint64
}

// tableDigest identifies a table's content: FNV-1a over the slots, never 0
// (0 marks a pinned table of unknown content).
func tableDigest(slots []uint32) uint64 {
	h := uint64(14695981039346656037)
	for _, s := range slots {
		for j := 0; j < 4; j++ {
			h ^= uint64(byte(s >> (8 * j)))
			h *= 1099511628211
		}
	}
	if h == 0 {
		h = 1
	}
	return h
}

// tableInput is what one Maglev table of a port is built from.
type tableInput struct {
	members []maglev.Backend
	ids     []uint32 // backend id of each member
	size    uint32
	key     string // names the build (buildKey)
	err     error
	// prev is the port's table as applied before, if any; id is the
	// table's id.
	prev  *tableRecord
	id    uint32
	table *tableRecord // the result; nil for no table
}

// tableID is the id of a service port's table for one endpoint set.
func tableID(svcID uint32, set tableSet) uint32 {
	return svcID*2 - 1 + uint32(set)
}

// serviceOfTable is the service port id whose table id is (the inverse
// of tableID).
func serviceOfTable(id uint32) uint32 {
	return (id + 1) / 2
}

// tableWrites are tables to install and the records they come from.
type tableWrites struct {
	puts []dataplane.TableContent
	recs []*tableRecord
}

// add adds table t under id, to be built by b.
func (w *tableWrites) add(id uint32, t *tableRecord, b *tableBuild) {
	w.puts = append(w.puts, dataplane.TableContent{ID: id, Size: int(b.size), Fill: func(dst []uint32) error {
		if err := b.fill(dst, t.ids); err != nil {
			return err
		}
		t.digest = tableDigest(dst)
		return nil
	}})
	w.recs = append(w.recs, t)
}

// planTables decides the tables of recs. A table whose inputs are those
// of the table written before is kept; the others are to be written,
// split into those under ids the outer map does not hold (fresh) and
// those replacing a table. Their builds, one per distinct member set, are
// made by the goroutines that write the tables (see tableBuild).
func (r *Reconciler) planTables(recs []*portRecord) (fresh, replacing tableWrites, builds []*tableBuild) {
	byKey := map[string]*tableBuild{}
	for _, rec := range recs {
		if rec.pending == nil {
			continue
		}
		for _, set := range rec.pending.order {
			in := rec.pending.sets[set]
			if in.err != nil || len(in.members) == 0 {
				continue
			}
			if p := in.prev; p != nil && p.digest != 0 && p.key == in.key && slices.Equal(p.ids, in.ids) &&
				r.tables[in.id] == p.digest {
				// Written already, and its inputs are the same. (A
				// record without a digest was never filled: its install
				// stopped before it.)
				in.table = &tableRecord{key: p.key, ids: p.ids, digest: p.digest}
				continue
			}
			b := byKey[in.key]
			if b == nil {
				b = &tableBuild{members: in.members, size: in.size, seed: r.cfg.MaglevSeed}
				byKey[in.key] = b
				builds = append(builds, b)
			}
			b.users++
			in.table = &tableRecord{key: in.key, ids: in.ids}
			w := &fresh
			if _, installed := r.tables[in.id]; installed {
				w = &replacing
			}
			w.add(in.id, in.table, b)
		}
	}
	return fresh, replacing, builds
}

// tableInstall is a PutTables running in the background.
type tableInstall struct {
	tables tableWrites
	done   chan struct{}
	n      int // tables surely installed, valid once done is closed
	err    error
	// awaited is set once the result is recorded in the Reconciler.
	awaited bool
}

// startInstall begins installing tables; awaitInstall waits for it.
// PutTables reads only the tables and the maps, never the Reconciler.
func (r *Reconciler) startInstall(ctx context.Context, tables tableWrites) *tableInstall {
	in := &tableInstall{tables: tables, done: make(chan struct{})}
	if len(tables.puts) == 0 {
		close(in.done)
		return in
	}
	go func() {
		defer close(in.done)
		in.n, in.err = r.dp.PutTables(ctx, tables.puts)
	}()
	return in
}

// awaitInstall waits for in and records what it installed: the digests
// of the tables surely installed, and unknown content for the rest, of
// which some may have been swapped in, so that the next Apply rewrites
// them whatever it would build. Only the first call for in records; it
// returns the installation's error.
func (r *Reconciler) awaitInstall(in *tableInstall, res *Result) error {
	<-in.done
	if in.awaited {
		return in.err
	}
	in.awaited = true
	for i, tc := range in.tables.puts {
		if i < in.n {
			r.tables[tc.ID] = in.tables.recs[i].digest
		} else {
			r.tables[tc.ID] = 0
		}
	}
	res.TablesWritten += in.n
	return in.err
}

// tableWanted reports whether a port's record (the changed ports' new
// ones are in r.ports already) holds table id. Tables are per service
// port id, so only the port with that id can.
func (r *Reconciler) tableWanted(id uint32) bool {
	key, ok := r.portOfID[serviceOfTable(id)]
	if !ok {
		return false
	}
	_, has := r.ports[key].tables[id]
	return has
}

// tablesInPlace reports whether every table of rec is in the tables map
// as rec has it. A record whose write failed may name tables that were
// never installed (no digest, or the map holds another one): keeping such
// a record as a port's previous version would leave its frontends on a
// table that names backends this Apply may delete, so it is not kept.
func (r *Reconciler) tablesInPlace(rec *portRecord) bool {
	for id, t := range rec.tables {
		if d, ok := r.tables[id]; !ok || t.digest == 0 || d != t.digest {
			return false
		}
	}
	return true
}

// tableSets are the endpoint sets a frontend uses for traffic from
// outside the node and for traffic from this node.
func tableSets(svc *model.Service, f model.Frontend) (set, internal tableSet) {
	set = clusterSet
	if svc.UsesLocalSet(f.Kind) {
		set = localSet
	}
	// Traffic from this node's pods and host to an external frontend
	// uses the cluster-wide set (as kube-proxy does); to a ClusterIP
	// it follows internalTrafficPolicy, like everyone's.
	internal = clusterSet
	if f.Kind == model.ClusterIP {
		internal = set
	}
	return set, internal
}

// tableInput gathers what the Maglev table over eps is built from; it has
// no members when there is no table (no endpoints, or none with a backend
// id).
func (r *Reconciler) tableInput(eps []model.Endpoint) *tableInput {
	if len(eps) == 0 {
		return &tableInput{}
	}
	members := make([]maglev.Backend, 0, len(eps))
	ids := make([]uint32, 0, len(eps))
	byAddr := make(map[netip.Addr]int, len(eps))
	for _, e := range eps {
		byAddr[e.Addr]++
	}
	for _, e := range eps {
		st, ok := r.addrs[netip.AddrPortFrom(e.Addr, e.Port)]
		if !ok {
			continue // out of backend ids, reported already
		}
		id := st.id
		// An endpoint is identified by its address (the same pod for every
		// port of the service, so multi-port services share one build),
		// or by address and port where one address serves twice.
		ident := e.Addr.String()
		if byAddr[e.Addr] > 1 {
			ident = e.ID()
		}
		members = append(members, maglev.Backend{ID: ident, Weight: e.Weight})
		ids = append(ids, id)
	}
	if len(members) == 0 {
		return &tableInput{}
	}
	in := &tableInput{members: members, ids: ids, size: maglev.SizeFor(len(members), r.cfg.MaglevMaxSize)}
	if in.size == 0 {
		in.err = fmt.Errorf("%d endpoints exceed the largest Maglev table", len(members))
		return in
	}
	// The build is made where the table is written: any error it would
	// have is found here, for this port alone.
	slots, err := maglev.Check(members, in.size)
	if err != nil {
		in.err = err
		return in
	}
	if !slots {
		return &tableInput{} // every member has weight 0: no table, as with no members
	}
	in.key = buildKey(members, in.size)
	return in
}
