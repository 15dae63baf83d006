package model

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Incremental computes the same State as Compute, but keeps each
// Service's service ports between calls and recomputes only the Services
// whose inputs changed: the Service itself, its EndpointSlices, or the
// node. Changes are told apart by resourceVersion, so objects without one
// (a services file) are recomputed every time. Frontends claimed by two
// Services are resolved over the whole state on every call, as Compute
// does. It is not safe for concurrent use.
type Incremental struct {
	nodeKey  string
	services map[string]*cachedService
	losers   map[string]bool // service ports that lost a frontend last time
}

type cachedService struct {
	fingerprint string
	ports       []port
	problems    []Problem
}

// NewIncremental returns an empty cache.
func NewIncremental() *Incremental {
	return &Incremental{services: map[string]*cachedService{}, losers: map[string]bool{}}
}

// Update returns the state for in, its problems, and the keys (Service.Key)
// of the service ports that may differ from the previous call's: added,
// removed, or recomputed. On the first call every port is in changed.
func (inc *Incremental) Update(in Input) (State, []Problem, map[string]bool) {
	changed := map[string]bool{}
	c := &computer{node: in.Node}
	c.nodeAddrs = c.nodeAddresses(in.Node)
	if key := nodeKey(in.Node, c.nodeAddrs); key != inc.nodeKey {
		for _, cs := range inc.services {
			for _, p := range cs.ports {
				changed[p.Key()] = true
			}
		}
		inc.services = map[string]*cachedService{}
		inc.nodeKey = key
	}
	nodeProblems := c.problems

	bySvc := map[string][]*discoveryv1.EndpointSlice{}
	for _, s := range in.Slices {
		if s == nil {
			continue
		}
		name := s.Labels[discoveryv1.LabelServiceName]
		bySvc[s.Namespace+"/"+name] = append(bySvc[s.Namespace+"/"+name], s)
	}

	svcs := c.services(in.Services)
	seen := make(map[string]bool, len(svcs))
	for _, svc := range svcs {
		key := svc.Namespace + "/" + svc.Name
		seen[key] = true
		fp := fingerprint(svc, bySvc[key])
		if cs, ok := inc.services[key]; ok && fp != "" && cs.fingerprint == fp {
			continue
		}
		one := &computer{node: in.Node, nodeAddrs: c.nodeAddrs}
		groups := one.groupSlices(bySvc[key])
		one.addService(svc, groups[key])
		if old, ok := inc.services[key]; ok {
			for _, p := range old.ports {
				changed[p.Key()] = true
			}
		}
		for _, p := range one.ports {
			changed[p.Key()] = true
		}
		inc.services[key] = &cachedService{fingerprint: fp, ports: one.ports, problems: one.problems}
	}
	for key, cs := range inc.services {
		if !seen[key] {
			for _, p := range cs.ports {
				changed[p.Key()] = true
			}
			delete(inc.services, key)
		}
	}
	// Slices of no Service are reported like Compute does.
	for key, ss := range bySvc {
		if !seen[key] {
			for _, s := range ss {
				if s.Labels[discoveryv1.LabelServiceName] == "" {
					c.report("EndpointSlice", s.Namespace+"/"+s.Name, "metadata.labels",
						"no %s label; slice ignored", discoveryv1.LabelServiceName)
				}
			}
		}
	}

	problems := append([]Problem(nil), nodeProblems...)
	problems = append(problems, c.problems[len(nodeProblems):]...)
	all := &computer{node: in.Node, nodeAddrs: c.nodeAddrs}
	keys := make([]string, 0, len(inc.services))
	for key := range inc.services {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	for _, key := range keys {
		cs := inc.services[key]
		for _, p := range cs.ports {
			p.Frontends = slices.Clone(p.Frontends)
			all.ports = append(all.ports, p)
		}
		problems = append(problems, cs.problems...)
	}
	before := len(all.problems)
	all.resolveConflicts()
	problems = append(problems, all.problems[before:]...)

	// A port that lost a frontend now or last time differs from what the
	// cache alone says: count it as changed.
	for k := range all.lost {
		changed[k] = true
	}
	for k := range inc.losers {
		changed[k] = true
	}
	inc.losers = all.lost

	out := make([]Service, len(all.ports))
	for i, p := range all.ports {
		out[i] = p.Service
	}
	slices.SortFunc(out, func(a, b Service) int {
		return cmp.Or(
			cmp.Compare(a.Namespace, b.Namespace),
			cmp.Compare(a.Name, b.Name),
			cmp.Compare(a.PortName, b.PortName),
			cmp.Compare(a.Protocol, b.Protocol),
		)
	})
	return State{Services: out}, problems, changed
}

// fingerprint identifies a Service's inputs by resourceVersion; "" when
// some object has none, meaning "recompute".
func fingerprint(svc *corev1.Service, ss []*discoveryv1.EndpointSlice) string {
	if svc.ResourceVersion == "" {
		return ""
	}
	parts := make([]string, 0, len(ss)+1)
	for _, s := range ss {
		if s.ResourceVersion == "" {
			return ""
		}
		parts = append(parts, s.Name+"@"+s.ResourceVersion)
	}
	slices.Sort(parts)
	return string(svc.UID) + "@" + svc.ResourceVersion + "|" + strings.Join(parts, ",")
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
