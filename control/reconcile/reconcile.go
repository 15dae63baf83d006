package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
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

// tableID is the id of a service port's table for one endpoint set.
func tableID(svcID uint32, set tableSet) uint32 {
	return svcID*2 - 1 + uint32(set)
}

// serviceOfTable is the service port id whose table id is (the inverse
// of tableID).
func serviceOfTable(id uint32) uint32 {
	return (id + 1) / 2
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
	r.reserve(byKey)
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
			rec := r.record(svc, ids[k], prev)
			next[k] = rec
			recs = append(recs, rec)
		}
	}
	r.flushIDs()
	if err := ctx.Err(); err != nil {
		r.release(next)
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
		r.finish(rec)
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
				touched = r.use(b, -1, touched)
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
				touched = r.use(b, 1, touched)
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
				if !wantFrontends[k] && r.owner(k) == "" {
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

// reserve sizes the empty maps keyed by port or frontend for the ports in
// byKey, typically before the first Apply, rather than grow them an entry
// at a time. The maps keyed by backend grow instead: ports often share
// backends, so their endpoints would overestimate them.
func (r *Reconciler) reserve(byKey map[string]*model.Service) {
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

// backend is a port's view of one of its endpoints.
type backend struct{ dataplane.Backend }

func (b backend) addrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// backendList is a port's backends ordered by address and port, each
// once: smaller than a map for the few endpoints most ports have.
type backendList []backend

// has reports whether the list holds the backend at ap.
func (l backendList) has(ap netip.AddrPort) bool {
	_, found := slices.BinarySearchFunc(l, ap, func(b backend, ap netip.AddrPort) int { return b.addrPort().Compare(ap) })
	return found
}

// hintedOut returns the ready endpoints of a service port that are in
// neither of its sets: those topology hints leave out of the cluster-wide
// set (model.Service.ClusterSet) and that are not in the node-local one.
// nil when the cluster-wide set has every ready endpoint, as it has
// without hints.
func hintedOut(svc *model.Service) map[netip.AddrPort]bool {
	ready := 0
	for _, e := range svc.Endpoints {
		if e.Ready {
			ready++
		}
	}
	if len(svc.ClusterSet) == 0 || !svc.ClusterSet[0].Ready || len(svc.ClusterSet) == ready {
		return nil
	}
	inSets := make(map[netip.AddrPort]bool, len(svc.ClusterSet)+len(svc.LocalSet))
	for _, set := range [][]model.Endpoint{svc.ClusterSet, svc.LocalSet} {
		for _, e := range set {
			inSets[netip.AddrPortFrom(e.Addr, e.Port)] = true
		}
	}
	out := map[netip.AddrPort]bool{}
	for _, e := range svc.Endpoints {
		if ap := netip.AddrPortFrom(e.Addr, e.Port); e.Ready && !inSets[ap] {
			out[ap] = true
		}
	}
	return out
}

// departure is a backend leaving a service port, or only the sets its
// tables are built from (see Result.Departed).
type departure struct {
	svcID        uint32
	backend      netip.AddrPort
	affinityOnly bool
}

// StillDeparted reports whether a departure still holds as the last Apply
// left the records: the backend is not among the port's endpoints (or,
// for an affinity-only departure, not in its sets). A backend that came
// back since must keep the flows and affinity it has got meanwhile.
func (r *Reconciler) StillDeparted(d Departure) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, ok := r.portOfID[d.SvcID]
	if !ok {
		return true // the port is gone
	}
	rec := r.ports[key]
	ap := netip.AddrPortFrom(d.Backend.Addr, d.Backend.Port)
	if rec == nil || !rec.backends.has(ap) {
		return true
	}
	return d.AffinityOnly && rec.hintedOut[ap]
}

// sorted orders l and keeps the last of duplicates, as a map filled in
// l's order would.
func (l backendList) sorted() backendList {
	slices.SortStableFunc(l, func(a, b backend) int { return a.addrPort().Compare(b.addrPort()) })
	out := l[:0]
	for _, b := range l {
		if n := len(out); n > 0 && out[n-1].addrPort() == b.addrPort() {
			out[n-1] = b
			continue
		}
		out = append(out, b)
	}
	return slices.Clip(out)
}

// backendState is what the reconciler keeps of one backend address: its
// id, and how many service ports have it in their view, how many of those
// see it local and how many see it serving (not terminating). A backend
// several ports share is merged from all their views: local if any sees it
// local, terminating only if all see it terminating.
type backendState struct {
	id                          uint32
	users, local, serving, host int32
	// touched is the number of the last Apply that changed the counts.
	touched uint64
}

// syncHostPorts writes the host backend port bitmap from the backends as
// written, when a backend at a node address came, changed or went since
// it was last written.
func (r *Reconciler) syncHostPorts() error {
	if !r.hostPortsStale {
		return nil
	}
	var ports []uint16
	for _, b := range r.backends {
		if b.Host {
			ports = append(ports, b.Port)
		}
	}
	if err := r.dp.SetHostBackendPorts(ports); err != nil {
		return err
	}
	r.hostPortsStale = false
	return nil
}

// merged is the backend's value as its users see it together.
func (s backendState) merged(ap netip.AddrPort) dataplane.Backend {
	return dataplane.Backend{Addr: ap.Addr(), Port: ap.Port(), Local: s.local > 0, Host: s.host > 0,
		Terminating: s.serving == 0}
}

// use adds one port's view b of a backend to its counts (delta 1) or
// takes it away (delta -1), and appends the backend to touched the first
// time this Apply changes it. The backend must have an id.
func (r *Reconciler) use(b backend, delta int32, touched []netip.AddrPort) []netip.AddrPort {
	ap := b.addrPort()
	st := r.addrs[ap]
	st.users += delta
	if b.Local {
		st.local += delta
	}
	if b.Host {
		st.host += delta
	}
	if !b.Terminating {
		st.serving += delta
	}
	if st.touched != r.applies {
		st.touched = r.applies
		touched = append(touched, ap)
	}
	r.addrs[ap] = st
	return touched
}

// owner returns the port whose record holds frontend k under the
// service id written for it, "" if none.
func (r *Reconciler) owner(k dataplane.FrontendKey) string {
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
				if fe, ok := r.frontends[fk]; ok && fe.SvcID == id && r.owner(fk) == "" {
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
		port := r.owner(k)
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
// one if that is in the maps whole (whole) and admits no client the new
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
		if old != nil && old.id == id && len(old.frontends) > 0 && r.whole(old) {
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

// whole reports whether rec's frontends, source ranges and tables are all
// in the maps as rec has them.
func (r *Reconciler) whole(rec *portRecord) bool {
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

// release returns ids allocated for records that will not be applied.
// An id another port holds (inherited from a port the Apply would have
// removed) stays that port's.
func (r *Reconciler) release(next map[string]*portRecord) {
	for k, rec := range next {
		if rec == nil || r.ports[k] != nil && r.ports[k].id == rec.id {
			continue
		}
		if _, held := r.portOfID[rec.id]; !held {
			delete(r.usedIDs, rec.id)
		}
	}
}

// record computes what one service port puts into the maps under its
// service id (0: none was free, see portIDs), allocating backend ids as
// needed. prev is the record applied before under that id, if any (the
// port's own, or that of the port it took the id over from): its tables
// are kept where their inputs are the same. The Maglev tables are planned
// afterwards, for all ports at once (planTables), and finish completes
// the record.
func (r *Reconciler) record(svc *model.Service, id uint32, prev *portRecord) *portRecord {
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

// finish completes a record once its tables are built: the tables and the
// frontends that point at them.
func (r *Reconciler) finish(rec *portRecord) {
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

// portIDs chooses the service id of each port in keys that byKey does not
// remove, in the order of keys (0 when no id is free); heirs take the ids
// of the ports they take over.
func (r *Reconciler) portIDs(keys []string, byKey map[string]*model.Service, heirs heirs) map[string]uint32 {
	ids := make(map[string]uint32, len(keys))
	for _, k := range keys {
		if svc := byKey[k]; svc != nil {
			if from, ok := heirs.from[k]; ok {
				ids[k] = r.ports[from].id // in use already, named once the Apply goes ahead
				continue
			}
			ids[k], _ = r.serviceID(k, svc)
		}
	}
	return ids
}

// heirs pairs the ports an Apply removes with the ports it adds that take
// them over (see Reconciler.heirs), both ways.
type heirs struct {
	from map[string]string // new port -> the removed port whose id it takes
	to   map[string]string // removed port -> the new port that takes its id
}

// serviceOfKey is the namespace/name of the Service a port key (see
// model.Service.Key) belongs to.
func serviceOfKey(key string) string {
	s := key[:max(strings.LastIndexByte(key, '/'), 0)]
	if i := strings.IndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	return s
}

// heirs finds the ports new in this Apply (without a record, or one
// without an id) that take over a frontend (address, port, protocol) of a
// port of the same Service the Apply removes: such a port keeps the
// removed port's service id. (Another Service that takes the frontend
// over gets an id of its own: counters and names are the Service's.) A port key names the port (ns/web/TCP becomes ns/web:http/TCP once
// the Service has a second port), so a renamed port is removed and added;
// with the id, its frontends, tables, source ranges, counters, ClientIP
// affinity entries and tracked flows (all keyed by service id) carry on,
// and only backends that truly leave it are reported departed. Each
// removed port's id goes to one port, the first in the order of keys
// (sorted) that takes over one of its frontends; a new port whose
// frontends no removed port had gets an id of its own.
func (r *Reconciler) heirs(keys []string, byKey map[string]*model.Service) heirs {
	var h heirs
	var gone map[dataplane.FrontendKey]string
	for _, k := range keys {
		if old := r.ports[k]; byKey[k] == nil && old != nil && old.id != 0 {
			for fk := range old.frontends {
				if gone == nil {
					gone = map[dataplane.FrontendKey]string{}
				}
				gone[fk] = k
			}
		}
	}
	if gone == nil {
		return h // the common case: no port with an id goes
	}
	for _, k := range keys {
		svc := byKey[k]
		if svc == nil {
			continue
		}
		if old := r.ports[k]; old != nil && old.id != 0 {
			continue // keeps its own id
		}
		for _, f := range svc.Frontends {
			from, ok := gone[frontendKey(f)]
			if !ok || h.to[from] != "" || serviceOfKey(from) != svc.Namespace+"/"+svc.Name {
				continue
			}
			if h.from == nil {
				h.from, h.to = map[string]string{}, map[string]string{}
			}
			h.from[k], h.to[from] = from, k
			break
		}
	}
	return h
}

// releaseID frees a service id allocated in this Apply for a port that
// is refused: its counters were reset, its name is not written.
func (r *Reconciler) releaseID(id uint32) {
	delete(r.usedIDs, id)
	delete(r.newNames, id)
}

// serviceID returns the port's id: its current one, the one its pinned
// frontends carry (after a restart), or the lowest free one.
func (r *Reconciler) serviceID(key string, svc *model.Service) (uint32, bool) {
	if rec := r.ports[key]; rec != nil && rec.id != 0 {
		return rec.id, true
	}
	if r.adopted != nil {
		for _, f := range svc.Frontends {
			fe, ok := r.adopted[frontendKey(f)]
			if ok && fe.SvcID != 0 && fe.SvcID < r.cfg.ServicesMax && !r.usedIDs[fe.SvcID] {
				r.usedIDs[fe.SvcID] = true
				r.nameService(fe.SvcID, key)
				return fe.SvcID, true
			}
		}
	}
	if id, ok := nextFree(&r.nextServiceID, r.cfg.ServicesMax, func(id uint32) bool {
		return r.usedIDs[id] || r.adoptedIDs[id]
	}); ok {
		r.usedIDs[id] = true
		r.resetCounts = append(r.resetCounts, id)
		r.nameService(id, key)
		return id, true
	}
	return 0, false
}

// nextFree finds a free id in [1, limit), starting after *cursor and
// wrapping once; used reports the ids taken. Amortised constant time while
// ids are plentiful.
func nextFree(cursor *uint32, limit uint32, used func(uint32) bool) (uint32, bool) {
	if limit < 2 {
		return 0, false
	}
	for n := uint32(1); n < limit; n++ {
		id := (*cursor+n-1)%(limit-1) + 1
		if !used(id) {
			*cursor = id
			return id, true
		}
	}
	return 0, false
}

func (r *Reconciler) nameService(id uint32, key string) {
	r.newNames[id] = key
}

// flushIDs resets the counters and records the names of the service ids
// allocated since the last call.
func (r *Reconciler) flushIDs() {
	if len(r.resetCounts) > 0 {
		if err := r.dp.ResetServicesCounters(r.resetCounts); err != nil {
			r.log.Warn("reset service counters", "services", len(r.resetCounts), "error", err)
		}
		r.resetCounts = r.resetCounts[:0]
	}
	if len(r.newNames) > 0 {
		if err := r.dp.PutServiceNames(r.newNames); err != nil {
			r.log.Warn("name service ports", "services", len(r.newNames), "error", err)
		}
		clear(r.newNames)
	}
}

// allocateBackendID returns a free backend id.
func (r *Reconciler) allocateBackendID() (uint32, bool) {
	id, ok := nextFree(&r.nextBackendID, r.cfg.BackendsMax, func(id uint32) bool { return r.usedBackendIDs[id] })
	if ok {
		r.usedBackendIDs[id] = true
	}
	return id, ok
}

func frontendKey(f model.Frontend) dataplane.FrontendKey {
	return dataplane.FrontendKey{Addr: f.Addr, Port: f.Port, Proto: uint8(f.Protocol)}
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
