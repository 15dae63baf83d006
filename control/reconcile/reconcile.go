package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/maglev"
	"github.com/xdplb/xdplb/control/model"
)

// Config holds the reconciler's settings.
type Config struct {
	// MaglevMaxSize caps every table's size (--maglev-table-size); each
	// table is the smallest supported prime of at least 100x its backends
	// up to this cap, the same on every node.
	MaglevMaxSize uint32
	// MaglevSeed seeds the table permutations (--maglev-hash-seed).
	MaglevSeed uint64
	// ServicesMax and BackendsMax are the id ranges (the map capacities).
	ServicesMax uint32
	BackendsMax uint32
}

// Result summarises one Apply.
type Result struct {
	BackendsAdded, BackendsRemoved     int
	TablesWritten, TablesRemoved       int
	FrontendsWritten, FrontendsRemoved int
	MaglevBuilds                       int
	MaglevTime                         time.Duration
	// Problems are service ports that could not be programmed fully
	// (out of ids, a table that could not be built); the rest was.
	Problems []string
	// RemovedBackends are the backends freed by this Apply: flows still
	// tracked to them are stale (see PurgeFlows).
	RemovedBackends map[uint32]dataplane.Backend
}

// Changed reports whether Apply wrote anything.
func (r Result) Changed() bool {
	return r.BackendsAdded+r.BackendsRemoved+r.TablesWritten+r.TablesRemoved+
		r.FrontendsWritten+r.FrontendsRemoved > 0
}

// tableSet selects one of a service port's endpoint sets.
type tableSet uint8

const (
	clusterSet tableSet = iota
	localSet
)

// Reconciler owns the datapath maps' contents. It is not safe for
// concurrent use: one sync loop calls Apply.
type Reconciler struct {
	dp  *dataplane.Dataplane
	cfg Config
	log *slog.Logger

	svcIDs     map[string]uint32 // service port key -> id
	backendIDs map[netip.AddrPort]uint32
	backends   map[uint32]dataplane.Backend
	tables     map[uint32][]uint32 // table id -> slots as written
	frontends  map[dataplane.FrontendKey]dataplane.Frontend
	ranges     map[dataplane.SourceRange]bool

	// adopted are frontends found pinned at start, used once to give
	// service ports their old ids back.
	adopted map[dataplane.FrontendKey]dataplane.Frontend
	// tablesKnown is false until the pinned tables are known to match
	// what this reconciler wrote; until then every table is rewritten.
	tablesKnown bool

	cache *buildCache
}

// New adopts the state pinned in the datapath maps.
func New(dp *dataplane.Dataplane, cfg Config, log *slog.Logger) (*Reconciler, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ServicesMax == 0 || cfg.BackendsMax < 2 {
		return nil, errors.New("reconcile: ServicesMax and BackendsMax must be set")
	}
	r := &Reconciler{
		dp: dp, cfg: cfg, log: log,
		svcIDs:     map[string]uint32{},
		backendIDs: map[netip.AddrPort]uint32{},
		tables:     map[uint32][]uint32{},
		ranges:     map[dataplane.SourceRange]bool{},
		cache:      newBuildCache(),
	}
	var err error
	if r.backends, err = dp.Backends(); err != nil {
		return nil, fmt.Errorf("adopt backends: %w", err)
	}
	for id, b := range r.backends {
		r.backendIDs[netip.AddrPortFrom(b.Addr, b.Port)] = id
	}
	if r.frontends, err = dp.Frontends(); err != nil {
		return nil, fmt.Errorf("adopt frontends: %w", err)
	}
	r.adopted = maps.Clone(r.frontends)
	ranges, err := dp.SourceRanges()
	if err != nil {
		return nil, fmt.Errorf("adopt source ranges: %w", err)
	}
	for _, sr := range ranges {
		r.ranges[sr] = true
	}
	ids, err := dp.TableIDs()
	if err != nil {
		return nil, fmt.Errorf("adopt tables: %w", err)
	}
	for _, id := range ids {
		r.tables[id] = nil // content unknown: rewritten on first Apply
	}
	log.Info("adopted pinned datapath state", "backends", len(r.backends),
		"frontends", len(r.frontends), "tables", len(ids), "source_ranges", len(ranges))
	return r, nil
}

// tableID is the id of a service port's table for one endpoint set.
func tableID(svcID uint32, set tableSet) uint32 {
	return svcID*2 - 1 + uint32(set)
}

// desired is the datapath content for one model state.
type desired struct {
	backends  map[netip.AddrPort]dataplane.Backend
	tables    map[uint32][]uint32
	frontends map[dataplane.FrontendKey]dataplane.Frontend
	ranges    map[dataplane.SourceRange]bool
	svcIDs    map[string]uint32
}

// Apply makes the maps hold st. Problems with single service ports are
// reported in the result and do not stop the others; an error means the
// maps could not be written and the next Apply should try again.
func (r *Reconciler) Apply(ctx context.Context, st model.State) (Result, error) {
	var res Result
	want, err := r.desire(st, &res)
	if err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}

	// 1. Backends that are new or changed.
	for ap, b := range want.backends {
		id := r.backendIDs[ap]
		if old, ok := r.backends[id]; ok && old == b {
			continue
		}
		if err := r.dp.PutBackend(id, b); err != nil {
			return res, err
		}
		r.backends[id] = b
		res.BackendsAdded++
	}
	// 2. Tables, each swapped in whole.
	for id, slots := range want.tables {
		if old, ok := r.tables[id]; ok && old != nil && slices.Equal(old, slots) {
			continue
		}
		if err := r.dp.PutTable(id, slots); err != nil {
			return res, err
		}
		r.tables[id] = slots
		res.TablesWritten++
	}
	// 3. Source ranges, then frontends.
	for sr := range want.ranges {
		if r.ranges[sr] {
			continue
		}
		if err := r.dp.PutSourceRange(sr.SvcID, sr.Prefix); err != nil {
			return res, err
		}
		r.ranges[sr] = true
	}
	for k, v := range want.frontends {
		if old, ok := r.frontends[k]; ok && old == v {
			continue
		}
		if err := r.dp.PutFrontend(k, v); err != nil {
			return res, err
		}
		r.frontends[k] = v
		res.FrontendsWritten++
	}

	// Deletions, in reverse order.
	for k := range r.frontends {
		if _, ok := want.frontends[k]; ok {
			continue
		}
		if err := r.dp.DeleteFrontend(k); err != nil {
			return res, err
		}
		delete(r.frontends, k)
		res.FrontendsRemoved++
	}
	if res.FrontendsRemoved > 0 {
		if err := r.dp.SyncFrontendPorts(); err != nil {
			return res, err
		}
	}
	for sr := range r.ranges {
		if want.ranges[sr] {
			continue
		}
		if err := r.dp.DeleteSourceRange(sr.SvcID, sr.Prefix); err != nil {
			return res, err
		}
		delete(r.ranges, sr)
	}
	for id := range r.tables {
		if _, ok := want.tables[id]; ok {
			continue
		}
		if err := r.dp.DeleteTable(id); err != nil {
			return res, err
		}
		delete(r.tables, id)
		res.TablesRemoved++
	}
	for id, b := range r.backends {
		ap := netip.AddrPortFrom(b.Addr, b.Port)
		if _, ok := want.backends[ap]; ok {
			continue
		}
		if err := r.dp.DeleteBackend(id); err != nil {
			return res, err
		}
		if res.RemovedBackends == nil {
			res.RemovedBackends = map[uint32]dataplane.Backend{}
		}
		res.RemovedBackends[id] = b
		delete(r.backends, id)
		delete(r.backendIDs, ap)
		res.BackendsRemoved++
	}
	// Service ids of service ports that are gone become free.
	for key, id := range r.svcIDs {
		if _, ok := want.svcIDs[key]; !ok {
			delete(r.svcIDs, key)
			if err := r.dp.DeleteServiceName(id); err != nil {
				return res, err
			}
		}
	}
	r.adopted = nil
	r.tablesKnown = true
	r.cache.sweep()
	return res, nil
}

// desire computes the datapath content for st, allocating ids as needed.
func (r *Reconciler) desire(st model.State, res *Result) (*desired, error) {
	want := &desired{
		backends:  map[netip.AddrPort]dataplane.Backend{},
		tables:    map[uint32][]uint32{},
		frontends: map[dataplane.FrontendKey]dataplane.Frontend{},
		ranges:    map[dataplane.SourceRange]bool{},
		svcIDs:    map[string]uint32{},
	}

	// Every endpoint of every service port is a backend, also those not in
	// any set (terminating, not ready): their tracked flows keep working
	// until the endpoint leaves its EndpointSlice.
	for i := range st.Services {
		for _, e := range st.Services[i].Endpoints {
			ap := netip.AddrPortFrom(e.Addr, e.Port)
			b := dataplane.Backend{Addr: e.Addr, Port: e.Port, Local: e.Local,
				Terminating: e.Terminating || !e.Serving}
			if old, ok := want.backends[ap]; ok {
				// Listed by several services: local if any says so,
				// terminating only if all do.
				b.Local = b.Local || old.Local
				b.Terminating = b.Terminating && old.Terminating
			}
			want.backends[ap] = b
		}
	}
	if err := r.allocateBackendIDs(want.backends, res); err != nil {
		return nil, err
	}

	r.allocateServiceIDs(st, want, res)
	for i := range st.Services {
		svc := &st.Services[i]
		id, ok := want.svcIDs[svc.Key()]
		if !ok {
			continue
		}
		r.desireService(svc, id, want, res)
	}
	return want, nil
}

// allocateBackendIDs gives every new backend the lowest free id.
func (r *Reconciler) allocateBackendIDs(want map[netip.AddrPort]dataplane.Backend, res *Result) error {
	var fresh []netip.AddrPort
	for ap := range want {
		if _, ok := r.backendIDs[ap]; !ok {
			fresh = append(fresh, ap)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	slices.SortFunc(fresh, func(a, b netip.AddrPort) int { return a.Compare(b) })
	used := make(map[uint32]bool, len(r.backends))
	for id := range r.backends {
		used[id] = true
	}
	next := uint32(1)
	for _, ap := range fresh {
		for next < r.cfg.BackendsMax && used[next] {
			next++
		}
		if next >= r.cfg.BackendsMax {
			res.Problems = append(res.Problems, fmt.Sprintf(
				"backend %s not programmed: all %d backend ids in use (raise --backends-max)", ap, r.cfg.BackendsMax-1))
			delete(want, ap)
			continue
		}
		r.backendIDs[ap] = next
		used[next] = true
	}
	return nil
}

// allocateServiceIDs keeps every known service port's id, gives adopted
// ones the id their pinned frontends carry, and new ones the lowest free.
func (r *Reconciler) allocateServiceIDs(st model.State, want *desired, res *Result) {
	used := map[uint32]bool{}
	for i := range st.Services {
		key := st.Services[i].Key()
		if id, ok := r.svcIDs[key]; ok {
			want.svcIDs[key] = id
			used[id] = true
		}
	}
	if r.adopted != nil {
		for i := range st.Services {
			svc := &st.Services[i]
			if _, ok := want.svcIDs[svc.Key()]; ok {
				continue
			}
			for _, f := range svc.Frontends {
				fe, ok := r.adopted[frontendKey(f)]
				if ok && fe.SvcID != 0 && fe.SvcID < r.cfg.ServicesMax && !used[fe.SvcID] {
					want.svcIDs[svc.Key()] = fe.SvcID
					used[fe.SvcID] = true
					break
				}
			}
		}
	}
	next := uint32(1)
	for i := range st.Services {
		svc := &st.Services[i]
		if _, ok := want.svcIDs[svc.Key()]; ok {
			continue
		}
		for next < r.cfg.ServicesMax && used[next] {
			next++
		}
		if next >= r.cfg.ServicesMax {
			res.Problems = append(res.Problems, fmt.Sprintf(
				"service port %s not programmed: all %d service ids in use (raise --services-max)", svc.Key(), r.cfg.ServicesMax-1))
			continue
		}
		want.svcIDs[svc.Key()] = next
		used[next] = true
		if err := r.dp.ResetServiceCounters(next); err != nil {
			res.Problems = append(res.Problems, err.Error())
		}
	}
	for key, id := range want.svcIDs {
		if r.svcIDs[key] != id {
			if err := r.dp.PutServiceName(id, key); err != nil {
				res.Problems = append(res.Problems, err.Error())
			}
		}
		r.svcIDs[key] = id
	}
}

func frontendKey(f model.Frontend) dataplane.FrontendKey {
	return dataplane.FrontendKey{Addr: f.Addr, Port: f.Port, Proto: uint8(f.Protocol)}
}

// desireService adds one service port's tables, frontends and ranges.
func (r *Reconciler) desireService(svc *model.Service, id uint32, want *desired, res *Result) {
	var tableOf [2]uint32 // per set: table id, 0 if empty
	var built [2]bool
	table := func(set tableSet) uint32 {
		if !built[set] {
			built[set] = true
			eps := svc.ClusterSet
			if set == localSet {
				eps = svc.LocalSet
			}
			slots, err := r.table(eps, res)
			if err != nil {
				res.Problems = append(res.Problems, fmt.Sprintf("service port %s: %v", svc.Key(), err))
			} else if len(slots) > 0 {
				tableOf[set] = tableID(id, set)
				want.tables[tableOf[set]] = slots
			}
		}
		return tableOf[set]
	}
	for _, f := range svc.Frontends {
		set := clusterSet
		if svc.UsesLocalSet(f.Kind) {
			set = localSet
		}
		// Traffic from this node's pods and host to an external frontend
		// uses the cluster-wide set (as kube-proxy does); to a ClusterIP
		// it follows internalTrafficPolicy, like everyone's.
		internal := clusterSet
		if f.Kind == model.ClusterIP {
			internal = set
		}
		v := dataplane.Frontend{SvcID: id, TableID: table(set), InternalTableID: table(internal)}
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
		want.frontends[frontendKey(f)] = v
	}
	if svc.SourceRangesSet {
		for _, p := range svc.SourceRanges {
			want.ranges[dataplane.SourceRange{SvcID: id, Prefix: p.Masked()}] = true
		}
	}
}

// table computes the slots (backend ids) of a Maglev table over eps.
func (r *Reconciler) table(eps []model.Endpoint, res *Result) ([]uint32, error) {
	if len(eps) == 0 {
		return nil, nil
	}
	members := make([]maglev.Backend, 0, len(eps))
	ids := make([]uint32, 0, len(eps))
	byAddr := map[netip.Addr]int{}
	for _, e := range eps {
		byAddr[e.Addr]++
	}
	for _, e := range eps {
		id, ok := r.backendIDs[netip.AddrPortFrom(e.Addr, e.Port)]
		if !ok {
			continue // out of backend ids, reported already
		}
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
		return nil, nil
	}
	size := maglev.SizeFor(len(members), r.cfg.MaglevMaxSize)
	if size == 0 {
		return nil, fmt.Errorf("%d endpoints exceed the largest Maglev table", len(members))
	}
	start := time.Now()
	perm, cached, err := r.cache.build(members, size, r.cfg.MaglevSeed)
	if err != nil {
		return nil, err
	}
	if !cached {
		res.MaglevBuilds++
		res.MaglevTime += time.Since(start)
	}
	slots := make([]uint32, len(perm))
	for i, idx := range perm {
		slots[i] = ids[idx]
	}
	return slots, nil
}
