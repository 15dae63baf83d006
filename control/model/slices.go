package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// slice is the usable content of one EndpointSlice, parsed once for all the
// ports of its Service.
type slice struct {
	name      string
	ports     []slicePort
	endpoints []sliceEndpoint
	weight    uint32
	trigger   time.Time
	// fromController: the EndpointSlice controller wrote the slice, so
	// its port names follow the Service's, sooner or later.
	fromController bool
}

// servicePort is what picks a Service port's port in its slices.
type servicePort struct {
	name  string
	proto Protocol
	// target is the Service port's target port when it is a number (0
	// when it names a container port).
	target uint16
	// named holds every port name (with protocol) of the Service.
	named map[portName]bool
	// selector: the Service has a selector, so the EndpointSlice
	// controller keeps its slices in step with it (without one it leaves
	// the slices it wrote as they are).
	selector bool
}

// portName is a Service port's name and protocol: what a slice port
// matches.
type portName struct {
	name  string
	proto Protocol
}

// controllerName is the value of the managed-by label on slices the
// EndpointSlice controller writes.
const controllerName = "endpointslice-controller.k8s.io"

type slicePort struct {
	name  string
	proto Protocol
	port  uint16
}

type sliceEndpoint struct {
	addr                        netip.Addr
	nodeName, zone              string
	ready, serving, terminating bool
	host                        bool // addr is one of this node's addresses
	zoneHints, nodeHints        []string
}

// groupSlices parses the IPv4 EndpointSlices and groups them by the
// "namespace/name" of their Service, each group sorted by slice name.
func (c *computer) groupSlices(in []*discoveryv1.EndpointSlice) map[string][]*slice {
	var sorted []*discoveryv1.EndpointSlice
	for i, s := range in {
		if s == nil {
			c.report("EndpointSlice", fmt.Sprintf("#%d", i), "", "nil EndpointSlice skipped")
			continue
		}
		sorted = append(sorted, s)
	}
	slices.SortStableFunc(sorted, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	groups := map[string][]*slice{}
	for i, s := range sorted {
		obj := s.Namespace + "/" + s.Name
		if i > 0 && sorted[i-1].Namespace == s.Namespace && sorted[i-1].Name == s.Name {
			c.report("EndpointSlice", obj, "", "listed twice; the later copy is ignored")
			continue
		}
		svcName := s.Labels[discoveryv1.LabelServiceName]
		if svcName == "" {
			c.report("EndpointSlice", obj, "metadata.labels", "no %s label; slice ignored", discoveryv1.LabelServiceName)
			continue
		}
		switch s.AddressType {
		case discoveryv1.AddressTypeIPv4:
		case "":
			c.report("EndpointSlice", obj, "addressType", "not set; treated as IPv4")
		default:
			c.report("EndpointSlice", obj, "addressType", "%s slice skipped: the datapath handles IPv4 only", s.AddressType)
			continue
		}
		key := s.Namespace + "/" + svcName
		groups[key] = append(groups[key], c.parseSlice(s))
	}
	return groups
}

func (c *computer) parseSlice(s *discoveryv1.EndpointSlice) *slice {
	obj := s.Namespace + "/" + s.Name
	out := &slice{name: s.Name, weight: 1, fromController: s.Labels[discoveryv1.LabelManagedBy] == controllerName}
	if v, ok := s.Annotations[AnnotationWeight]; ok {
		if w, ok := parseWeight(v); ok {
			out.weight = w
		} else {
			c.report("EndpointSlice", obj, "metadata.annotations["+AnnotationWeight+"]",
				"invalid weight %q (want an integer from 1 to %d); using 1", v, MaxWeight)
		}
	}
	if v, ok := s.Annotations[corev1.EndpointsLastChangeTriggerTime]; ok {
		if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
			out.trigger = t
		} else {
			c.report("EndpointSlice", obj, "metadata.annotations["+corev1.EndpointsLastChangeTriggerTime+"]",
				"invalid time %q; ignored", v)
		}
	}

	for i, p := range s.Ports {
		field := func(sub string) string { return indexed("ports", i) + sub }
		sp := slicePort{proto: TCP}
		if p.Name != nil {
			sp.name = *p.Name
		}
		if p.Protocol != nil {
			switch *p.Protocol {
			case corev1.ProtocolTCP:
			case corev1.ProtocolUDP:
				sp.proto = UDP
			default:
				continue // no Service port of ours can match it
			}
		}
		switch {
		case p.Port == nil:
			c.report("EndpointSlice", obj, field(".port"), "not set; port ignored")
			continue
		case *p.Port < 1 || *p.Port > 65535:
			c.report("EndpointSlice", obj, field(".port"), "%d is out of range; port ignored", *p.Port)
			continue
		}
		sp.port = uint16(*p.Port)
		if slices.ContainsFunc(out.ports, func(q slicePort) bool { return q.name == sp.name && q.proto == sp.proto }) {
			c.report("EndpointSlice", obj, field(".name"), "duplicate port name %q for %s; ignored", sp.name, sp.proto)
			continue
		}
		out.ports = append(out.ports, sp)
	}

	out.endpoints = make([]sliceEndpoint, 0, len(s.Endpoints))
	for i, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			c.report("EndpointSlice", obj, indexed("endpoints", i)+".addresses", "empty; endpoint skipped")
			continue
		}
		a, msg := parseIPv4(e.Addresses[0])
		if msg != "" {
			c.report("EndpointSlice", obj, indexed("endpoints", i)+".addresses[0]", "%s", msg)
			continue
		}
		ep := sliceEndpoint{
			addr:        a,
			host:        slices.Contains(c.nodeAddrs, a),
			ready:       e.Conditions.Ready == nil || *e.Conditions.Ready,
			serving:     e.Conditions.Serving == nil || *e.Conditions.Serving,
			terminating: e.Conditions.Terminating != nil && *e.Conditions.Terminating,
		}
		if e.NodeName != nil {
			ep.nodeName = *e.NodeName
		}
		if e.Zone != nil {
			ep.zone = *e.Zone
		}
		if h := e.Hints; h != nil {
			for _, z := range h.ForZones {
				ep.zoneHints = append(ep.zoneHints, z.Name)
			}
			for _, n := range h.ForNodes {
				ep.nodeHints = append(ep.nodeHints, n.Name)
			}
		}
		out.endpoints = append(out.endpoints, ep)
	}
	return out
}

// port returns the slice's port number for a Service port: that of the
// slice port of the same name and protocol. A Service port renamed (a
// second port added names the first, removing one may unname the other)
// has no such port in the controller's slices until the controller
// rewrites them: until then, a port of the slice that is named after no
// port of the Service, of the same protocol and the Service port's target
// port number, is the renamed port, as the controller is about to write
// it (only while the Service has a selector: without one the controller
// never rewrites its slices). Without that, the renamed port would have
// no endpoints for a sync or two and its backends' flows would end.
func (s *slice) port(p servicePort) (uint16, bool) {
	for _, q := range s.ports {
		if q.name == p.name && q.proto == p.proto {
			return q.port, true
		}
	}
	if !s.fromController || !p.selector || p.target == 0 {
		return 0, false
	}
	for _, q := range s.ports {
		if q.proto == p.proto && q.port == p.target && !p.named[portName{q.name, q.proto}] {
			return q.port, true
		}
	}
	return 0, false
}

// endpointsFor collects a Service port's endpoints from its slices (sorted
// by name), resolving the target port per slice and keeping one copy of
// each address and port. nodeName marks the local ones.
func endpointsFor(svcSlices []*slice, sp servicePort, nodeName string) []Endpoint {
	n := 0
	for _, s := range svcSlices {
		n += len(s.endpoints)
	}
	out := make([]Endpoint, 0, n)
	for _, s := range svcSlices {
		port, ok := s.port(sp)
		if !ok {
			continue
		}
		for _, e := range s.endpoints {
			out = append(out, Endpoint{
				Addr:        e.addr,
				Port:        port,
				NodeName:    e.nodeName,
				Zone:        e.zone,
				Local:       e.host || (nodeName != "" && e.nodeName == nodeName),
				Host:        e.host,
				ZoneHints:   e.zoneHints,
				NodeHints:   e.nodeHints,
				Ready:       e.ready,
				Serving:     e.serving,
				Terminating: e.terminating,
				Weight:      s.weight,
			})
		}
	}
	if len(out) == 0 {
		return nil
	}
	// A stable sort keeps copies of one endpoint in slice order, so among
	// equally good copies the first slice's wins.
	slices.SortStableFunc(out, func(a, b Endpoint) int {
		return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
	})
	w := 0
	for _, e := range out {
		if w > 0 && out[w-1].Addr == e.Addr && out[w-1].Port == e.Port {
			if preferred(e, out[w-1]) {
				out[w-1] = e
			}
			continue
		}
		out[w] = e
		w++
	}
	return slices.Clip(out[:w])
}

// preferred reports whether a is a better copy of an endpoint than b:
// not terminating, then ready, then serving.
func preferred(a, b Endpoint) bool {
	if a.Terminating != b.Terminating {
		return !a.Terminating
	}
	if a.Ready != b.Ready {
		return a.Ready
	}
	return a.Serving && !b.Serving
}

// lastChange returns the latest trigger time among the slices.
func lastChange(svcSlices []*slice) time.Time {
	var t time.Time
	for _, s := range svcSlices {
		if s.trigger.After(t) {
			t = s.trigger
		}
	}
	return t
}
