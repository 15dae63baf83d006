package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
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
	// ServicesMax and BackendsMax are the id ranges (the map capacities;
	// New lowers BackendsMax to the backends map's size).
	ServicesMax uint32
	BackendsMax uint32
}

// Result summarises one Apply.
type Result struct {
	BackendsAdded, BackendsRemoved     int
	TablesWritten, TablesRemoved       int
	FrontendsWritten, FrontendsRemoved int
	RangesRemoved                      int // source ranges deleted
	// MaglevBuilds counts the Maglev builds made, MaglevTime the time
	// they took, summed (they run in parallel).
	MaglevBuilds int
	MaglevTime   time.Duration
	// Problems are service ports that could not be programmed fully
	// (out of ids, a table that could not be built, frontends or source
	// ranges that do not fit in their map); the rest was. They are every
	// port's, not only those this Apply changed, sorted by port.
	Problems []string
	// ProblemPorts are the keys of the ports Problems are about: their
	// endpoints' latest change may not be in the datapath (a port refused
	// whole, or in part, or keeping its previous version).
	ProblemPorts map[string]bool
	// WaitingForRoom counts the ports among them refused, whole or in
	// part, for lack of room in a map or an id range: a later sync that
	// frees room (FreedRoom) may fit them. Only a full Apply tries ports
	// that did not change.
	WaitingForRoom int
	// ServicePorts counts the service ports programmed after the Apply,
	// every port's: those with their frontends in the maps. A port
	// refused whole (out of service ids, its frontends or source ranges
	// do not fit) is not among them.
	ServicePorts int
	// RemovedBackends are the backends freed by this Apply: flows still
	// tracked to them are stale (see PurgeFlows).
	RemovedBackends map[uint32]dataplane.Backend
	// Departed are the backends that left a service port in this Apply
	// while other ports keep them: that port's flows and affinity
	// clients to them are stale too.
	Departed []Departure
}

// Stale is what the Apply leaves for PurgeFlows.
func (r Result) Stale() Stale {
	return Stale{Removed: r.RemovedBackends, Departed: r.Departed}
}

// FreedRoom reports whether Apply deleted anything from a map whose room
// a port can be refused for (frontends, source ranges, tables, backends),
// so ports refused for lack of room may fit now.
func (r Result) FreedRoom() bool {
	return r.FrontendsRemoved+r.RangesRemoved+r.TablesRemoved+r.BackendsRemoved > 0
}

// Changed reports whether Apply wrote anything.
func (r Result) Changed() bool {
	return r.BackendsAdded+r.BackendsRemoved+r.TablesWritten+r.TablesRemoved+
		r.FrontendsWritten+r.FrontendsRemoved > 0
}

// Reconciler owns the datapath maps' contents. One sync loop calls
// Apply; StillDeparted may be called from elsewhere meanwhile.
type Reconciler struct {
	dp  *dataplane.Dataplane
	cfg Config
	log *slog.Logger

	// mu is held by Apply while it changes the records, and by
	// StillDeparted while it reads them.
	mu sync.Mutex

	// Per service port: what it wants (applied, or about to be).
	ports map[string]*portRecord
	// withProblems names the ports whose records have problems, so each
	// Apply reports every port's without walking them all.
	withProblems map[string]bool
	// portOfID names the port whose record in ports has each service id
	// (ids are unique among records; 0 is none). A frontend's value and a
	// table's id name a service id, so this finds their port at once
	// (owner, tableWanted). setPort keeps it in step with ports.
	portOfID map[uint32]string
	// Backends: the id and the use of each address:port, and the values
	// as written by id.
	addrs    map[netip.AddrPort]backendState
	backends map[uint32]dataplane.Backend
	// hostPortsStale is set when a backend at a node address (Host) was
	// written or removed since the host backend port bitmap was last
	// written, and before the first write.
	hostPortsStale bool
	// applies counts the Applies, to tell the backends one of them
	// touched (backendState.touched).
	applies uint64
	// The other maps as written.
	tables    map[uint32]uint64 // digest of the slots as written; 0: pinned by an earlier agent, content unknown
	frontends map[dataplane.FrontendKey]dataplane.Frontend
	// frontendsUnknown is set when a write of frontends failed: some of
	// the batch may be in the map without being in frontends, so the
	// next full Apply reads the map again.
	frontendsUnknown bool
	ranges           map[dataplane.SourceRange]bool
	// rangesUnknown is set when a write of source ranges failed, so that
	// the next full Apply reads the map again. (A range is written or
	// deleted alone, so ranges should be exact even then; reading them
	// again costs one walk of the map after an error.)
	rangesUnknown bool
	usedIDs       map[uint32]bool // service port ids in use
	// Backend ids in use (those in addrs); the allocators
	// resume their search where they last found a free id.
	usedBackendIDs map[uint32]bool
	nextBackendID  uint32
	nextServiceID  uint32
	// adoptedIDs are the service ids pinned frontends carry.
	adoptedIDs map[uint32]bool

	// adopted are frontends found pinned at start, used once to give
	// service ports their old ids back.
	adopted map[dataplane.FrontendKey]dataplane.Frontend

	// Names and counter resets of service ids allocated since the last
	// flushIDs, written in batches.
	newNames    map[uint32]string
	resetCounts []uint32
}

// New adopts the state pinned in the datapath maps.
func New(dp *dataplane.Dataplane, cfg Config, log *slog.Logger) (*Reconciler, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.ServicesMax == 0 || cfg.BackendsMax < 2 {
		return nil, errors.New("reconcile: ServicesMax and BackendsMax must be set")
	}
	if n := dp.BackendCapacity(); cfg.BackendsMax > n {
		// The backends map is an array of n ids: an id past it fails
		// the batch that writes it, at every sync, half-way. Ids past
		// the map are not handed out: their endpoints are reported.
		log.Warn("backend ids limited to the backends map's size", "backends_max", cfg.BackendsMax, "map_size", n)
		cfg.BackendsMax = n
	}
	r := &Reconciler{
		dp: dp, cfg: cfg, log: log,
		ports:        map[string]*portRecord{},
		withProblems: map[string]bool{},
		portOfID:     map[uint32]string{},
		addrs:        map[netip.AddrPort]backendState{},
		tables:       map[uint32]uint64{},
		ranges:       map[dataplane.SourceRange]bool{},
		usedIDs:      map[uint32]bool{},
		newNames:     map[uint32]string{},

		usedBackendIDs: map[uint32]bool{},
		adoptedIDs:     map[uint32]bool{},
		hostPortsStale: true, // an earlier agent's bits are not known
	}
	var err error
	if r.backends, err = dp.Backends(); err != nil {
		return nil, fmt.Errorf("adopt backends: %w", err)
	}
	for id, b := range r.backends {
		r.addrs[netip.AddrPortFrom(b.Addr, b.Port)] = backendState{id: id}
		r.usedBackendIDs[id] = true
	}
	if r.frontends, err = dp.Frontends(); err != nil {
		return nil, fmt.Errorf("adopt frontends: %w", err)
	}
	r.adopted = maps.Clone(r.frontends)
	for _, fe := range r.adopted {
		r.adoptedIDs[fe.SvcID] = true
	}
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
		r.tables[id] = 0 // content unknown: rewritten on the first Apply
	}
	log.Info("adopted pinned datapath state", "backends", len(r.backends),
		"frontends", len(r.frontends), "tables", len(ids), "source_ranges", len(ranges))
	return r, nil
}

// Backends returns what the backends map holds, by id: what the
// reconciler adopted and has written since. The map is the reconciler's
// own: read it between Applies, do not keep or change it.
func (r *Reconciler) Backends() map[uint32]dataplane.Backend { return r.backends }

// Apply makes the maps hold the full state st: the first Apply must be
// one, and it also removes whatever an earlier agent left that st does not
// want. Problems with single service ports are reported in the result and
// do not stop the others; an error means the maps could not be written,
// and the next Apply should be a full one.
func (r *Reconciler) Apply(ctx context.Context, st model.State) (Result, error) {
	byKey := make(map[string]*model.Service, len(st.Services))
	for i := range st.Services {
		byKey[st.Services[i].Key()] = &st.Services[i]
	}
	return r.apply(ctx, byKey, true)
}

// ApplyChanges applies only the service ports in changed (by key; a nil
// Service means the port is gone), leaving the others as they are.
func (r *Reconciler) ApplyChanges(ctx context.Context, changed map[string]*model.Service) (Result, error) {
	return r.apply(ctx, changed, false)
}

func (r *Reconciler) apply(ctx context.Context, byKey map[string]*model.Service, full bool) (Result, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var res Result
	var keys []string
	if full {
		keys = make([]string, 0, len(byKey)+len(r.ports))
		for k := range byKey {
			keys = append(keys, k)
		}
		for k := range r.ports {
			if byKey[k] == nil {
				keys = append(keys, k)
			}
		}
	} else {
		for k := range byKey {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys) // deterministic id allocation
	r.presizeMaps(byKey)
	if full && r.frontendsUnknown {
		fes, err := r.dp.Frontends()
		if err != nil {
			return res, fmt.Errorf("read frontends after a failed write: %w", err)
		}
		r.frontends, r.frontendsUnknown = fes, false
	}

	if full && r.rangesUnknown {
		srs, err := r.dp.SourceRanges()
		if err != nil {
			return res, fmt.Errorf("read source ranges after a failed write: %w", err)
		}
		clear(r.ranges)
		for _, sr := range srs {
			r.ranges[sr] = true
		}
		r.rangesUnknown = false
	}

	// Compute the new records of the changed ports; ports whose source
	// ranges or frontends do not fit get none of theirs written. Ranges
	// are keyed by service id, so the ids are chosen first. A port that
	// takes over a frontend of a port this Apply removes (a renamed port)
	// keeps that port's id.
	heirs := r.heirs(keys, byKey)
	ids := r.portIDs(keys, byKey, heirs)
	refused := r.fitRanges(keys, byKey, ids, full, nil)
	byFrontends := r.fitFrontends(keys, byKey, ids, full, refused)
	recount := false
	for k := range byFrontends {
		recount = recount || len(refused) > 0 && len(byKey[k].SourceRanges) > 0
	}
	if recount {
		// fitRanges counted the ranges of ports fitFrontends refused,
		// which may have refused others: count again without them (they
		// stay refused), then fit the frontends of the rest again.
		refused = r.fitRanges(keys, byKey, ids, full, byFrontends)
		maps.Copy(refused, byFrontends)
		byFrontends = r.fitFrontends(keys, byKey, ids, full, refused)
	}
	maps.Copy(refused, byFrontends)
	next := make(map[string]*portRecord, len(keys))
	recs := make([]*portRecord, 0, len(keys))
	var dropIDs []uint32 // ids of ports refused as empty, freed once the Apply goes ahead
	// Ids taken over from a removed port, named once the Apply goes ahead.
	renamed := map[uint32]string{}
	for _, k := range keys {
		switch svc := byKey[k]; {
		case svc == nil:
			next[k] = nil
		case refused[k] != nil:
			if id := ids[k]; id != 0 && id != refused[k].id {
				if old := r.ports[k]; old != nil && old.id == id {
					// The port's current id: its record stays if
					// this Apply stops below.
					dropIDs = append(dropIDs, id)
				} else if _, inherited := heirs.from[k]; !inherited {
					r.releaseID(id) // allocated for the port's new version
				}
				// (An id inherited from a port this Apply removes is
				// that port's until write frees it.)
			}
			next[k] = refused[k]
		default:
			prev := r.ports[k]
			if from, ok := heirs.from[k]; ok { // ids[k] is that port's id
				prev = r.ports[from]
				renamed[ids[k]] = k
			}
			rec := r.newPortRecord(svc, ids[k], prev)
			next[k] = rec
			recs = append(recs, rec)
		}
	}
	r.flushIDs()
	if err := ctx.Err(); err != nil {
		r.releaseUnappliedIDs(next)
		return res, err
	}
	for _, id := range dropIDs {
		r.releaseID(id)
	}
	if len(renamed) > 0 {
		// The ids' names become the ports that take them over.
		for id, k := range renamed {
			r.nameService(id, k)
		}
		r.flushIDs()
	}

	// Tables under ids the outer map does not hold yet go in while the
	// rest is worked out and the backends are written: no frontend points
	// at such an id (frontends are written after their tables and deleted
	// before them), so no packet can meet their backend ids before those
	// are written. On a cold start that is every table.
	fresh, replacing, builds := r.planTables(recs)
	install := r.startInstall(ctx, fresh)
	for _, rec := range recs {
		r.completePortRecord(rec)
	}

	// What moves: backends used by old or new records, frontends, tables
	// and ranges of the changed ports.
	nBackends := 0
	for _, rec := range next {
		if rec != nil {
			nBackends += len(rec.backends)
		}
	}
	r.applies++
	touched := make([]netip.AddrPort, 0, nBackends)
	var leaving []departure
	for k, rec := range next {
		if old := r.ports[k]; old != nil {
			// The port's id goes on in its new record, or in the record
			// of the port that took it over (a renamed port): what that
			// record keeps has not left.
			succ := rec
			if heir, ok := heirs.to[k]; ok && (rec == nil || rec.id != old.id) {
				succ = next[heir]
			}
			for _, b := range old.backends {
				touched = r.countBackendUse(b, -1, touched)
				ap := b.addrPort()
				switch {
				case old.id == 0:
				case succ == nil || succ.id != old.id || !succ.backends.has(ap):
					leaving = append(leaving, departure{old.id, ap, false})
				case !old.hintedOut[ap] && succ.hintedOut[ap]:
					leaving = append(leaving, departure{old.id, ap, true})
				}
			}
		}
		if rec != nil {
			for _, b := range rec.backends {
				touched = r.countBackendUse(b, 1, touched)
			}
		}
	}
	oldPorts := make(map[string]*portRecord, len(next))
	for k, rec := range next {
		oldPorts[k] = r.ports[k]
		r.setPort(k, rec)
	}

	err := r.write(ctx, touched, next, oldPorts, full, install, replacing, &res)
	if werr := r.awaitInstall(install, &res); err == nil {
		err = werr // no error of write's own: it waited for them
	}
	// Backends that left a port and are still in use: not freed, so the
	// datapath cannot tell their flows of that port from live ones.
	for _, l := range leaving {
		if st, ok := r.addrs[l.backend]; ok && st.users > 0 {
			res.Departed = append(res.Departed, Departure{SvcID: l.svcID, BackendID: st.id,
				Backend: r.backends[st.id], AffinityOnly: l.affinityOnly})
		}
	}
	for _, b := range builds {
		if b.built {
			res.MaglevBuilds++
			res.MaglevTime += b.took
		}
	}
	for k, rec := range next {
		if rec != nil && len(rec.problems) > 0 {
			r.withProblems[k] = true
		} else {
			delete(r.withProblems, k)
		}
	}
	// A port without problems is programmed whole; one with problems
	// may be in part, or keep its previous version.
	res.ServicePorts = len(r.ports)
	for _, k := range slices.Sorted(maps.Keys(r.withProblems)) {
		rec := r.ports[k]
		if rec == nil {
			continue
		}
		res.Problems = append(res.Problems, rec.problems...)
		if res.ProblemPorts == nil {
			res.ProblemPorts = map[string]bool{}
		}
		res.ProblemPorts[k] = true
		if rec.waitsForRoom {
			res.WaitingForRoom++
		}
		if rec.id == 0 || len(rec.frontends) == 0 {
			res.ServicePorts--
		}
	}
	r.adopted = nil
	r.adoptedIDs = map[uint32]bool{}
	return res, err
}

// presizeMaps sizes the empty maps keyed by port or frontend for the ports in
// byKey, typically before the first Apply, rather than grow them an entry
// at a time. The maps keyed by backend grow instead: ports often share
// backends, so their endpoints would overestimate them.
func (r *Reconciler) presizeMaps(byKey map[string]*model.Service) {
	if len(byKey) < 1024 {
		return
	}
	fes := 0
	for _, svc := range byKey {
		if svc != nil {
			fes += len(svc.Frontends)
		}
	}
	r.frontends = presized(r.frontends, fes)
	r.tables = presized(r.tables, len(byKey))
	r.usedIDs = presized(r.usedIDs, len(byKey))
	r.ports = presized(r.ports, len(byKey))
	r.portOfID = presized(r.portOfID, len(byKey))
}

// setPort makes rec the record of port key (nil: the port is gone),
// keeping portOfID in step.
func (r *Reconciler) setPort(key string, rec *portRecord) {
	if old := r.ports[key]; old != nil && old.id != 0 && r.portOfID[old.id] == key {
		delete(r.portOfID, old.id)
	}
	if rec == nil {
		delete(r.ports, key)
		return
	}
	r.ports[key] = rec
	if rec.id != 0 {
		r.portOfID[rec.id] = key
	}
}

// presized returns m, or, if m is empty, an empty map with room for n.
func presized[K comparable, V any](m map[K]V, n int) map[K]V {
	if len(m) > 0 {
		return m
	}
	return make(map[K]V, n)
}
