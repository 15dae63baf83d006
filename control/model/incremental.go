package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Incremental computes the same State as Compute, but keeps each
// Service's service ports between calls and recomputes only the Services
// whose inputs changed: the Service itself, its EndpointSlices, or the
// node. Changes are told apart by resourceVersion, so objects without one
// (a services file) are recomputed every time. Frontends claimed by two
// Services are resolved as Compute does, but only for the frontends whose
// claims changed. The cost of a call is one pass over the inputs to spot
// changes plus the work for the changed Services. It is not safe for
// concurrent use.
type Incremental struct {
	nodeKey   string
	nodeAddrs []netip.Addr

	services map[string]*cachedService // namespace/name -> its computed ports
	claims   map[frontendID][]claimant // who claims each frontend
	ports    map[string]*portState     // service port key -> its state
	order    []string                  // service port keys in State order
}

type cachedService struct {
	fingerprint string
	ports       []port // as computed, before conflicts between Services
	problems    []Problem
}

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

// NewIncremental returns an empty cache.
func NewIncremental() *Incremental {
	inc := &Incremental{}
	inc.reset()
	return inc
}

func (inc *Incremental) reset() {
	inc.services = map[string]*cachedService{}
	inc.claims = map[frontendID][]claimant{}
	inc.ports = map[string]*portState{}
	inc.order = nil
}

// Update returns the state for in, its problems, and the keys (Service.Key)
// of the service ports that may differ from the previous call's: added,
// removed, recomputed, or whose frontends other Services now claim.
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

	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range in.Slices {
		if s == nil {
			continue
		}
		key := s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]
		bySvc[key] = append(bySvc[key], s)
	}

	affected := map[frontendID]bool{}
	seen := make(map[string]bool, len(in.Services))
	for i, svc := range in.Services {
		if svc == nil {
			c.report("Service", "#"+itoa(i), "", "nil Service skipped")
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		if seen[key] {
			c.report("Service", key, "", "listed twice; the later copy is ignored")
			continue
		}
		seen[key] = true
		fp := fingerprint(svc, bySvc[key])
		if cs, ok := inc.services[key]; ok && fp != "" && cs.fingerprint == fp {
			continue
		}
		one := &computer{node: in.Node, nodeAddrs: c.nodeAddrs}
		groups := one.groupSlices(bySvc[key])
		one.addService(svc, groups[key])
		inc.drop(key, changed, affected)
		cs := &cachedService{fingerprint: fp, ports: one.ports, problems: one.problems}
		inc.services[key] = cs
		for i := range cs.ports {
			p := &cs.ports[i]
			p.Frontends = tidyFrontends(p.Frontends)
			pk := p.Key()
			inc.ports[pk] = &portState{pre: p}
			changed[pk] = true
			for _, f := range p.Frontends {
				id := frontendID{f.Addr, f.Port, f.Protocol}
				inc.claims[id] = append(inc.claims[id], claimant{pk, f.Kind, p.created})
				affected[id] = true
			}
		}
	}
	for key := range inc.services {
		if !seen[key] {
			inc.drop(key, changed, affected)
			delete(inc.services, key)
		}
	}
	for key, ss := range bySvc {
		if seen[key] {
			continue
		}
		for _, s := range ss {
			if s.Labels[discoveryv1.LabelServiceName] == "" {
				c.report("EndpointSlice", s.Namespace+"/"+s.Name, "metadata.labels",
					"no %s label; slice ignored", discoveryv1.LabelServiceName)
			}
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

	st := State{Services: make([]Service, 0, len(inc.order))}
	problems := c.problems
	for _, k := range inc.order {
		st.Services = append(st.Services, inc.ports[k].final)
	}
	svcKeys := make([]string, 0, len(inc.services))
	for k := range inc.services {
		svcKeys = append(svcKeys, k)
	}
	slices.Sort(svcKeys)
	for _, k := range svcKeys {
		problems = append(problems, inc.services[k].problems...)
	}
	for _, k := range inc.order {
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
func (inc *Incremental) drop(svcKey string, changed map[string]bool, affected map[frontendID]bool) {
	cs, ok := inc.services[svcKey]
	if !ok {
		return
	}
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
	inc.order = slices.DeleteFunc(inc.order, func(k string) bool { return changed[k] && inc.ports[k] == nil })
	present := make(map[string]bool, len(changed))
	for _, k := range inc.order {
		if changed[k] {
			present[k] = true
		}
	}
	for k := range changed {
		ps := inc.ports[k]
		if ps == nil || present[k] {
			continue
		}
		i, _ := slices.BinarySearchFunc(inc.order, &ps.pre.Service, func(e string, t *Service) int {
			return less(&inc.ports[e].pre.Service, t)
		})
		inc.order = slices.Insert(inc.order, i, k)
	}
}

// fingerprint identifies a Service's inputs by resourceVersion; "" when
// some object has none, meaning "recompute".
func fingerprint(svc *corev1.Service, ss []*discoveryv1.EndpointSlice) string {
	if svc.ResourceVersion == "" {
		return ""
	}
	var b strings.Builder
	b.WriteString(string(svc.UID))
	b.WriteByte('@')
	b.WriteString(svc.ResourceVersion)
	if len(ss) > 1 {
		ss = slices.Clone(ss)
		slices.SortFunc(ss, func(a, b *discoveryv1.EndpointSlice) int { return cmp.Compare(a.Name, b.Name) })
	}
	for _, s := range ss {
		if s.ResourceVersion == "" {
			return ""
		}
		b.WriteByte('|')
		b.WriteString(s.Name)
		b.WriteByte('@')
		b.WriteString(s.ResourceVersion)
	}
	return b.String()
}

// nodeKey identifies what Compute uses of the node.
func nodeKey(n NodeInfo, addrs []netip.Addr) string {
	var b strings.Builder
	b.WriteString(n.Name)
	b.WriteByte('|')
	b.WriteString(n.ProxyName)
	for _, a := range addrs {
		b.WriteByte('|')
		b.WriteString(a.String())
	}
	return b.String()
}

func itoa(i int) string { return strconv.Itoa(i) }
