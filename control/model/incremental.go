package model

import (
	"cmp"
	"net/netip"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Incremental computes the same State as Compute, but keeps each
// Service's service ports between calls and recomputes only the Services
// whose inputs changed: the Service itself, its EndpointSlices, or the
// node. Changes are told apart by resourceVersion (the services file sets
// one from each object's content), so objects without one are recomputed
// every time. Frontends claimed by two Services are resolved as Compute
// does, but only for the frontends whose claims changed. The cost of a
// call is one pass over the inputs to spot changes plus the work for the
// changed Services. It is not safe for concurrent use.
type Incremental struct {
	nodeKey   string
	nodeAddrs []netip.Addr

	services map[svcID]*cachedService  // each Service's computed ports
	claims   map[frontendID][]claimant // who claims each frontend
	ports    map[string]*portState     // service port key -> its state
	order    []string                  // service port keys in State order
	pos      map[string]int            // index of each key in order and state
	moved    bool                      // order changed since state was built
	lossy    map[string]bool           // service port keys with losses
	troubled map[svcID]bool            // Services with problems
	calls    uint64
	// owners remembers which Service each EndpointSlice object belongs
	// to: objects from an informer are replaced, never modified, so the
	// pointer identifies the content and its labels need not be read again.
	owners, spareOwners map[*discoveryv1.EndpointSlice]svcID
	bySvc               map[svcID][]*discoveryv1.EndpointSlice // kept current for the Services whose slices change
	byPtr               map[*corev1.Service]*cachedService     // the cached Services by the object computed from
	state               []Service
}

type cachedService struct {
	inputs   inputVersions
	ports    []port // as computed, before conflicts between Services
	problems []Problem
	seen     uint64 // the call that last saw the Service
	// svc is the object computed from; dirty is set when the Service's
	// slices changed since; volatile when an input has no resourceVersion
	// and so must be recomputed every time.
	svc      *corev1.Service
	dirty    bool
	volatile bool
}

// inputVersions identifies a Service's inputs by resourceVersion, so an
// unchanged Service is recognised without recomputing it.
type inputVersions struct {
	uid, version string
	slices       []sliceVersion // sorted by name
}

type sliceVersion struct{ name, version string }

// svcID names a Service without building a string.
type svcID struct{ namespace, name string }

// frontendID is a frontend without its kind: what two Services can share.
type frontendID struct {
	addr  netip.Addr
	port  uint16
	proto Protocol
}

type claimant struct {
	key     string
	kind    FrontendKind
	created time.Time
}

// loss is a frontend a service port gives up to another claim.
type loss struct {
	frontend Frontend
	winner   claimant
}

type portState struct {
	pre    *port   // before conflicts
	losses []loss  // frontends lost to other claims
	final  Service // what State holds
}

// parallelMin is the number of Services to recompute per goroutine below
// which Update computes them on one.
const parallelMin = 256

// NewIncremental returns an empty cache.
func NewIncremental() *Incremental {
	inc := &Incremental{}
	inc.reset()
	return inc
}

func (inc *Incremental) reset() {
	inc.services = map[svcID]*cachedService{}
	inc.byPtr = map[*corev1.Service]*cachedService{}
	inc.troubled = map[svcID]bool{}
	inc.claims = map[frontendID][]claimant{}
	inc.ports = map[string]*portState{}
	inc.order = nil
	inc.pos = map[string]int{}
	inc.lossy = map[string]bool{}
}

// Update returns the state for in, its problems, and the keys (Service.Key)
// of the service ports that may differ from the previous call's: added,
// removed, recomputed, or whose frontends other Services now claim. The
// state's slice is reused by the next call.
func (inc *Incremental) Update(in Input) (State, []Problem, map[string]bool) {
	changed := map[string]bool{}
	c := &computer{node: in.Node}
	c.nodeAddrs = c.nodeAddresses(in.Node)
	if key := nodeKey(in.Node, c.nodeAddrs); key != inc.nodeKey {
		for k := range inc.ports {
			changed[k] = true
		}
		inc.reset()
		inc.nodeKey, inc.nodeAddrs = key, c.nodeAddrs
	}

	inc.calls++
	// The maps and the state slice are reused from call to call: at 10k
	// Services, allocating them afresh made the garbage collector the
	// largest cost of a sync.
	if inc.bySvc == nil {
		inc.bySvc = make(map[svcID][]*discoveryv1.EndpointSlice, len(in.Slices))
	}
	bySvc := inc.bySvc

	// EndpointSlices: objects are replaced, never modified, so a slice
	// seen before (by pointer) belongs to the same Service as before.
	// The Services whose slices came or went are dirty, and only their
	// lists in bySvc are rebuilt, in input order.
	owners := inc.spareOwners
	if owners == nil {
		owners = make(map[*discoveryv1.EndpointSlice]svcID, len(in.Slices))
	}
	clear(owners)
	dirty := map[svcID]bool{}
	unlabeled := map[svcID]bool{}
	for _, s := range in.Slices {
		if s == nil {
			continue
		}
		id, ok := inc.owners[s]
		if !ok {
			id = svcID{s.Namespace, s.Labels[discoveryv1.LabelServiceName]}
			dirty[id] = true
		}
		if id.name == "" {
			unlabeled[id] = true
		}
		owners[s] = id
	}
	for s, id := range inc.owners {
		if _, ok := owners[s]; !ok {
			dirty[id] = true
		}
	}
	inc.owners, inc.spareOwners = owners, inc.owners
	if len(dirty) > 0 {
		for id := range dirty {
			bySvc[id] = bySvc[id][:0]
			if cs := inc.services[id]; cs != nil {
				cs.dirty = true
			}
		}
		for _, s := range in.Slices {
			if s == nil {
				continue
			}
			if id := owners[s]; dirty[id] {
				bySvc[id] = append(bySvc[id], s)
			}
		}
		for id := range dirty {
			if len(bySvc[id]) == 0 {
				delete(bySvc, id)
			}
		}
	}

	// Find the Services to recompute, compute them (on all CPUs when
	// there are many: each depends only on its own objects), and merge
	// the results in input order.
	type job struct {
		id   svcID
		svc  *corev1.Service
		prev *cachedService
		one  *computer
	}
	var jobs []*job
	var queued map[svcID]bool
	seen := 0
	for i, svc := range in.Services {
		if svc == nil {
			c.report("Service", "#"+strconv.Itoa(i), "", "nil Service skipped")
			continue
		}
		// The same object as last time, with the same slices: unchanged
		// (unless a newer copy of it came earlier in this input).
		if cs := inc.byPtr[svc]; cs != nil && cs.seen != inc.calls && !cs.dirty && !cs.volatile &&
			!queued[svcID{svc.Namespace, svc.Name}] {
			cs.seen = inc.calls
			seen++
			continue
		}
		id := svcID{svc.Namespace, svc.Name}
		cs := inc.services[id]
		if (cs != nil && cs.seen == inc.calls) || queued[id] {
			c.report("Service", id.namespace+"/"+id.name, "", "listed twice; the later copy is ignored")
			continue
		}
		seen++
		if cs != nil && cs.inputs.same(svc, bySvc[id]) {
			cs.seen = inc.calls
			cs.dirty = false
			if cs.svc != svc {
				delete(inc.byPtr, cs.svc)
				cs.svc = svc
				inc.byPtr[svc] = cs
			}
			continue
		}
		if queued == nil {
			queued = map[svcID]bool{}
		}
		queued[id] = true
		jobs = append(jobs, &job{id: id, svc: svc, prev: cs})
	}
	compute := func(j *job) {
		key := j.id.namespace + "/" + j.id.name
		j.one = &computer{node: in.Node, nodeAddrs: c.nodeAddrs}
		groups := j.one.groupSlices(bySvc[j.id])
		j.one.addService(j.svc, groups[key])
	}
	if workers := min(len(jobs)/parallelMin, runtime.GOMAXPROCS(0)); workers > 1 {
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := int(next.Add(1) - 1); i < len(jobs); i = int(next.Add(1) - 1) {
					compute(jobs[i])
				}
			}()
		}
		wg.Wait()
	} else {
		for _, j := range jobs {
			compute(j)
		}
	}
	affected := map[frontendID]bool{}
	for _, j := range jobs {
		id, svc, one := j.id, j.svc, j.one
		inc.drop(id, changed, affected)
		if j.prev != nil {
			delete(inc.byPtr, j.prev.svc)
		}
		cs := &cachedService{inputs: versionsOf(svc, bySvc[id]), ports: one.ports, problems: one.problems,
			seen: inc.calls, svc: svc}
		cs.volatile = cs.inputs.volatile()
		inc.services[id] = cs
		inc.byPtr[svc] = cs
		if len(cs.problems) > 0 {
			inc.troubled[id] = true
		}
		for i := range cs.ports {
			p := &cs.ports[i]
			p.Frontends = tidyFrontends(p.Frontends)
			pk := p.Key()
			inc.ports[pk] = &portState{pre: p}
			changed[pk] = true
			for _, f := range p.Frontends {
				fid := frontendID{f.Addr, f.Port, f.Protocol}
				inc.claims[fid] = append(inc.claims[fid], claimant{pk, f.Kind, p.created})
				affected[fid] = true
			}
		}
	}
	if seen != len(inc.services) {
		for id, cs := range inc.services {
			if cs.seen != inc.calls {
				inc.drop(id, changed, affected)
				delete(inc.services, id)
				delete(inc.byPtr, cs.svc)
			}
		}
	}
	// Slices without the service-name label belong to no Service.
	for id := range unlabeled {
		if cs := inc.services[id]; cs != nil && cs.seen == inc.calls {
			continue
		}
		for _, s := range bySvc[id] {
			c.report("EndpointSlice", s.Namespace+"/"+s.Name, "metadata.labels",
				"no %s label; slice ignored", discoveryv1.LabelServiceName)
		}
	}

	inc.resolve(affected, changed)
	for k := range changed {
		if ps := inc.ports[k]; ps != nil {
			ps.final = ps.pre.Service
			if len(ps.losses) > 0 {
				ps.final.Frontends = slices.DeleteFunc(slices.Clone(ps.pre.Frontends), func(f Frontend) bool {
					return slices.ContainsFunc(ps.losses, func(l loss) bool { return l.frontend == f })
				})
			}
		}
	}
	inc.reorder(changed)

	// The state is rebuilt only when ports came or went; otherwise the
	// changed ports are updated in place, so a sync costs little more
	// than its changes.
	if inc.moved || len(inc.state) != len(inc.order) {
		inc.state = slices.Grow(inc.state[:0], len(inc.order))
		clear(inc.pos)
		for i, k := range inc.order {
			inc.state = append(inc.state, inc.ports[k].final)
			inc.pos[k] = i
		}
		inc.moved = false
	} else {
		for k := range changed {
			if ps := inc.ports[k]; ps != nil {
				inc.state[inc.pos[k]] = ps.final
			}
		}
	}
	st := State{Services: inc.state}
	problems := c.problems
	troubled := make([]svcID, 0, len(inc.troubled))
	for id := range inc.troubled {
		troubled = append(troubled, id)
	}
	slices.SortFunc(troubled, func(a, b svcID) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	})
	for _, id := range troubled {
		problems = append(problems, inc.services[id].problems...)
	}
	lossy := make([]string, 0, len(inc.lossy))
	for k := range inc.lossy {
		lossy = append(lossy, k)
	}
	slices.SortFunc(lossy, func(a, b string) int { return cmp.Compare(inc.pos[a], inc.pos[b]) })
	for _, k := range lossy {
		ps := inc.ports[k]
		for _, l := range ps.losses {
			if l.winner.key == k {
				continue // the same address twice in one service port
			}
			problems = append(problems, Problem{Kind: "Service", Object: ps.pre.Namespace + "/" + ps.pre.Name,
				Message: "frontend " + l.frontend.String() + " of port " + k + " is also claimed by " +
					l.winner.key + " (" + l.winner.kind.String() + "); dropped here"})
		}
	}
	return st, problems, changed
}

// drop forgets a Service's ports and their claims.
func (inc *Incremental) drop(id svcID, changed map[string]bool, affected map[frontendID]bool) {
	cs, ok := inc.services[id]
	if !ok {
		return
	}
	delete(inc.troubled, id)
	for i := range cs.ports {
		p := &cs.ports[i]
		pk := p.Key()
		changed[pk] = true
		for _, f := range p.Frontends {
			id := frontendID{f.Addr, f.Port, f.Protocol}
			inc.claims[id] = slices.DeleteFunc(inc.claims[id], func(c claimant) bool { return c.key == pk })
			if len(inc.claims[id]) == 0 {
				delete(inc.claims, id)
			}
			affected[id] = true
		}
		delete(inc.ports, pk)
		delete(inc.lossy, pk)
	}
}

// resolve decides the frontends whose claims changed: the best claim
// keeps it (kind, then the older Service, then the smaller key), the
// others lose it.
func (inc *Incremental) resolve(affected map[frontendID]bool, changed map[string]bool) {
	better := func(a, b claimant) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), compareCreated(a.created, b.created), cmp.Compare(a.key, b.key))
	}
	for id := range affected {
		cl := inc.claims[id]
		same := func(l loss) bool {
			return l.frontend.Addr == id.addr && l.frontend.Port == id.port && l.frontend.Protocol == id.proto
		}
		// Forget earlier decisions about this frontend.
		for _, c := range cl {
			if ps := inc.ports[c.key]; ps != nil && slices.ContainsFunc(ps.losses, same) {
				ps.losses = slices.DeleteFunc(ps.losses, same)
				if len(ps.losses) == 0 {
					delete(inc.lossy, c.key)
				}
				changed[c.key] = true
			}
		}
		if len(cl) < 2 {
			continue
		}
		w := slices.MinFunc(cl, better)
		for _, c := range cl {
			if c == w {
				continue
			}
			if ps := inc.ports[c.key]; ps != nil {
				f := Frontend{Addr: id.addr, Port: id.port, Protocol: id.proto, Kind: c.kind}
				ps.losses = append(ps.losses, loss{f, w})
				inc.lossy[c.key] = true
				slices.SortFunc(ps.losses, func(a, b loss) int { return compareFrontends(a.frontend, b.frontend) })
				changed[c.key] = true
			}
		}
	}
}

// reorder keeps order sorted as Compute sorts State.
func (inc *Incremental) reorder(changed map[string]bool) {
	less := func(a, b *Service) int {
		return cmp.Or(
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.PortName, b.PortName),
			cmp.Compare(a.Protocol, b.Protocol),
		)
	}
	// Drop keys that are gone, then insert the new ones.
	gone := false
	for k := range changed {
		if inc.ports[k] == nil {
			gone = true
			break
		}
	}
	if gone {
		inc.moved = true
		inc.order = slices.DeleteFunc(inc.order, func(k string) bool { return changed[k] && inc.ports[k] == nil })
	}
	for k := range changed {
		ps := inc.ports[k]
		if ps == nil {
			continue
		}
		i, found := slices.BinarySearchFunc(inc.order, &ps.pre.Service, func(e string, t *Service) int {
			return less(&inc.ports[e].pre.Service, t)
		})
		if !found {
			inc.moved = true
			inc.order = slices.Insert(inc.order, i, k)
		}
	}
}

// versionsOf records a Service's inputs; an empty version anywhere (a
// services file) means "always recompute".
func versionsOf(svc *corev1.Service, ss []*discoveryv1.EndpointSlice) inputVersions {
	v := inputVersions{uid: string(svc.UID), version: svc.ResourceVersion}
	for _, s := range ss {
		v.slices = append(v.slices, sliceVersion{s.Name, s.ResourceVersion})
	}
	slices.SortFunc(v.slices, func(a, b sliceVersion) int { return cmp.Compare(a.name, b.name) })
	return v
}

// volatile reports whether an input has no version, so that it cannot be
// recognised as unchanged.
func (v *inputVersions) volatile() bool {
	if v.version == "" {
		return true
	}
	for _, s := range v.slices {
		if s.version == "" {
			return true
		}
	}
	return false
}

// same reports whether the inputs are unchanged.
func (v *inputVersions) same(svc *corev1.Service, ss []*discoveryv1.EndpointSlice) bool {
	if v.version == "" || svc.ResourceVersion != v.version || string(svc.UID) != v.uid || len(ss) != len(v.slices) {
		return false
	}
	for _, s := range ss {
		i, ok := slices.BinarySearchFunc(v.slices, s.Name, func(e sliceVersion, name string) int {
			return cmp.Compare(e.name, name)
		})
		if !ok || s.ResourceVersion == "" || v.slices[i].version != s.ResourceVersion {
			return false
		}
	}
	return true
}

// nodeKey identifies what Compute uses of the node.
func nodeKey(n NodeInfo, addrs []netip.Addr) string {
	var b strings.Builder
	b.WriteString(n.Name)
	b.WriteByte('|')
	b.WriteString(n.ProxyName)
	b.WriteByte('|')
	b.WriteString(n.Zone)
	for _, a := range addrs {
		b.WriteByte('|')
		b.WriteString(a.String())
	}
	return b.String()
}

// Port returns the service port with the given key as the last Update
// computed it, nil if there is none.
func (inc *Incremental) Port(key string) *Service {
	if ps := inc.ports[key]; ps != nil {
		return &ps.final
	}
	return nil
}
