// Package model turns Kubernetes Services and EndpointSlices into the state
// the datapath needs, with kube-proxy's semantics: which Services are ours,
// the frontends of each service port, its endpoints, and which endpoints
// serve which traffic. It is pure data in, data out: no API client, no
// kernel.
//
// Compute never fails and never panics on odd objects: whatever it cannot
// use it skips and describes in a Problem. The datapath handles IPv4 only,
// so IPv6 addresses are among the things skipped and reported, as are SCTP
// ports.
//
// Where kube-proxy leaves room, the model decides as follows:
//   - An endpoint is identified by address and resolved port, as in
//     kube-proxy. When several slices of a Service list it (it is moving
//     between slices), a non-terminating copy wins over a terminating one,
//     then a ready one over a not-ready one, then a serving one, then the
//     copy in the slice whose name sorts first.
//   - status.loadBalancer.ingress is used only for Services of type
//     LoadBalancer, and nodePort only for types NodePort and LoadBalancer.
//   - loadBalancerSourceRanges that all turn out unusable (invalid, or IPv6)
//     admit no client at all rather than every client.
//   - IPv4 addresses and CIDRs may have leading zeros, read as decimal
//     ("010.1.2.3" is 10.1.2.3), as kube-proxy reads them (ParseIPSloppy,
//     ParseCIDRSloppy): objects stored before the API server's validation
//     became strict may hold them.
//   - A frontend (address, port, protocol) claimed by two services goes to
//     the first by kind (ClusterIP, NodePort, LoadBalancer, ExternalIP), then
//     the older Service, then the smaller key; the other claim is dropped
//     and reported. This keeps a user-set externalIP from hijacking another
//     Service's address.
//   - An EndpointSlice port without a name counts as the unnamed port, and
//     one without a protocol as TCP (the API server fills both in).
//   - A Service port renamed has, until the EndpointSlice controller
//     rewrites the Service's slices, the endpoints of the controller's
//     slice port that is named after no port of the Service and has its
//     protocol and numeric target port, while the Service has a selector
//     (see slice.port): kube-proxy has none in that gap, and xdplb would
//     end their flows.
package model

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	netutils "k8s.io/utils/net"
)

// DefaultAffinityTimeout is the ClientIP affinity timeout of a Service that
// does not set one.
const DefaultAffinityTimeout = time.Duration(corev1.DefaultClientIPServiceAffinitySeconds) * time.Second

// maxAffinitySeconds is the largest timeout the API server accepts.
const maxAffinitySeconds = 86400

// Compute returns the desired state for in, and the problems found in it.
// Its results depend only on in: the same input in any order gives the same
// state. The agent uses Incremental; Compute is its reference, which the
// tests compare it against.
func Compute(in Input) (State, []Problem) {
	c := &computer{node: in.Node}
	c.nodeAddrs = c.nodeAddresses(in.Node)
	slicesByService := c.groupSlices(in.Slices)
	svcs := c.services(in.Services)
	nPorts := 0
	for _, svc := range svcs {
		nPorts += len(svc.Spec.Ports)
	}
	c.ports = make([]port, 0, nPorts)
	for _, svc := range svcs {
		c.addService(svc, slicesByService[svc.Namespace+"/"+svc.Name])
	}
	c.resolveConflicts()
	out := make([]Service, len(c.ports))
	for i, p := range c.ports {
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
	return State{Services: out}, c.problems
}

type computer struct {
	node      NodeInfo
	nodeAddrs []netip.Addr
	ports     []port
	problems  []Problem
}

// port is a service port being built, with what conflict resolution needs.
type port struct {
	Service
	created time.Time
}

func (c *computer) report(kind, object, field, format string, args ...any) {
	c.problems = append(c.problems, Problem{Kind: kind, Object: object, Field: field, Message: fmt.Sprintf(format, args...)})
}

// nodeAddresses returns the node's usable addresses, sorted and unique.
func (c *computer) nodeAddresses(n NodeInfo) []netip.Addr {
	var addrs []netip.Addr
	for i, a := range n.Addresses {
		switch {
		case !a.IsValid():
			c.report("Node", n.Name, fmt.Sprintf("addresses[%d]", i), "invalid address; skipped")
		case !a.Is4():
			c.report("Node", n.Name, fmt.Sprintf("addresses[%d]", i), "IPv6 address %s skipped: the datapath handles IPv4 only", a)
		default:
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return slices.Compact(addrs)
}

// services returns the non-nil Services sorted by namespace and name, with
// duplicates reported and dropped.
func (c *computer) services(in []*corev1.Service) []*corev1.Service {
	var out []*corev1.Service
	for i, s := range in {
		if s == nil {
			c.report("Service", fmt.Sprintf("#%d", i), "", "nil Service skipped")
			continue
		}
		out = append(out, s)
	}
	slices.SortStableFunc(out, func(a, b *corev1.Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return slices.CompactFunc(out, func(a, b *corev1.Service) bool {
		if a.Namespace != b.Namespace || a.Name != b.Name {
			return false
		}
		c.report("Service", a.Namespace+"/"+a.Name, "", "listed twice; the later copy is ignored")
		return true
	})
}

// indexed names element i of a list field: "name[i]".
func indexed(name string, i int) string {
	return name + "[" + strconv.Itoa(i) + "]"
}

// parseIPv4 parses an address that must be IPv4. On failure it returns a
// message for a Problem.
//
// As kube-proxy does (netutils.ParseIPSloppy), an IPv4 address may have
// leading zeros, read as decimal: "010.1.2.3" is 10.1.2.3. The API server
// accepted such addresses before its validation became strict, and objects
// stored then still hold them. An address written as IPv6 stays IPv6, an
// IPv4-mapped one ("::ffff:10.1.2.3") included.
func parseIPv4(s string) (netip.Addr, string) {
	ip := netutils.ParseIPSloppy(s)
	if ip == nil {
		return netip.Addr{}, fmt.Sprintf("invalid IP address %q; skipped", s)
	}
	ip4 := ip.To4()
	if ip4 == nil || strings.Contains(s, ":") {
		return netip.Addr{}, fmt.Sprintf("IPv6 address %s skipped: the datapath handles IPv4 only", s)
	}
	return netip.AddrFrom4([4]byte(ip4)), ""
}

// parseIPv4List parses addresses, reporting those it skips under
// field[index].
func (c *computer) parseIPv4List(object, field string, in []string) []netip.Addr {
	var out []netip.Addr
	for i, s := range in {
		a, msg := parseIPv4(s)
		if msg != "" {
			c.report("Service", object, fmt.Sprintf("%s[%d]", field, i), "%s", msg)
			continue
		}
		out = append(out, a)
	}
	return out
}

// addService adds the service ports of one Service, if it is ours.
func (c *computer) addService(svc *corev1.Service, svcSlices []*slice) {
	obj := svc.Namespace + "/" + svc.Name
	spec := &svc.Spec
	if spec.Type == corev1.ServiceTypeExternalName || !Selected(svc.Labels, c.node.ProxyName) {
		return
	}
	ipField, ipStrings := "spec.clusterIPs", spec.ClusterIPs
	if len(ipStrings) == 0 && spec.ClusterIP != "" {
		ipField, ipStrings = "spec.clusterIP", []string{spec.ClusterIP}
	}
	if spec.ClusterIP == corev1.ClusterIPNone || (len(ipStrings) > 0 && ipStrings[0] == corev1.ClusterIPNone) {
		return // headless
	}
	if len(ipStrings) == 0 {
		c.report("Service", obj, "spec.clusterIP", "not set; Service skipped")
		return
	}

	svcType := spec.Type
	switch svcType {
	case corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer:
	case "":
		svcType = corev1.ServiceTypeClusterIP
	default:
		c.report("Service", obj, "spec.type", "unknown type %q; treated as ClusterIP", spec.Type)
		svcType = corev1.ServiceTypeClusterIP
	}
	hasNodePorts := svcType == corev1.ServiceTypeNodePort || svcType == corev1.ServiceTypeLoadBalancer

	clusterIPs := c.parseIPv4List(obj, ipField, ipStrings)
	if len(clusterIPs) == 0 {
		// A Service of the other family (IPv6 single-stack) is not
		// this proxier's, as with kube-proxy: no NodePorts, external
		// IPs or health check on the node's IPv4 addresses either.
		c.report("Service", obj, ipField, "no IPv4 cluster IP; Service skipped")
		return
	}
	externalIPs := c.parseIPv4List(obj, "spec.externalIPs", spec.ExternalIPs)
	lbIPs := c.loadBalancerIPs(svc, svcType)

	base := Service{
		Namespace:                  svc.Namespace,
		Name:                       svc.Name,
		ExternalTrafficPolicyLocal: c.externalPolicyLocal(svc, svcType),
		InternalTrafficPolicyLocal: c.internalPolicyLocal(svc),
		AffinityTimeout:            c.affinityTimeout(svc),
		LastChangeTriggerTime:      lastChange(svcSlices),
	}
	base.SourceRangesSet, base.SourceRanges = c.sourceRanges(svc)
	if svcType == corev1.ServiceTypeLoadBalancer && base.ExternalTrafficPolicyLocal {
		switch hc := spec.HealthCheckNodePort; {
		case hc == 0:
			c.report("Service", obj, "spec.healthCheckNodePort", "not set for a LoadBalancer with externalTrafficPolicy Local")
		case hc < 0 || hc > 65535:
			c.report("Service", obj, "spec.healthCheckNodePort", "%d is out of range; ignored", hc)
		default:
			base.HealthCheckNodePort = uint16(hc)
		}
	}

	named := map[portName]bool{}
	for _, sp := range spec.Ports {
		if proto, ok := toProtocol(sp.Protocol); ok {
			named[portName{sp.Name, proto}] = true
		}
	}
	seen := map[portName]bool{}
	for i := range spec.Ports {
		sp := &spec.Ports[i]
		// Field names are built only for a problem: most ports have none.
		field := func(sub string) string { return indexed("spec.ports", i) + sub }
		proto, ok := c.protocol(obj, field, sp.Protocol)
		if !ok {
			continue
		}
		if sp.Port < 1 || sp.Port > 65535 {
			c.report("Service", obj, field(".port"), "%d is out of range; port skipped", sp.Port)
			continue
		}
		id := portName{sp.Name, proto}
		if seen[id] {
			c.report("Service", obj, field(".name"), "duplicate port name %q for %s; port skipped", sp.Name, proto)
			continue
		}
		seen[id] = true

		p := base
		p.PortName, p.Protocol, p.Port = sp.Name, proto, uint16(sp.Port)
		switch {
		case sp.NodePort == 0:
		case !hasNodePorts:
			c.report("Service", obj, field(".nodePort"), "ignored: Service type is %s", svcType)
		case sp.NodePort < 0 || sp.NodePort > 65535:
			c.report("Service", obj, field(".nodePort"), "%d is out of range; ignored", sp.NodePort)
		default:
			p.NodePort = uint16(sp.NodePort)
		}
		// No two service ports share memory.
		p.SourceRanges = slices.Clone(base.SourceRanges)

		add := func(kind FrontendKind, addrs []netip.Addr, port uint16) {
			for _, a := range addrs {
				p.Frontends = append(p.Frontends, Frontend{Addr: a, Port: port, Protocol: proto, Kind: kind})
			}
		}
		add(ClusterIP, clusterIPs, p.Port)
		if p.NodePort != 0 {
			add(NodePort, c.nodeAddrs, p.NodePort)
		}
		add(LoadBalancer, lbIPs, p.Port)
		add(ExternalIP, externalIPs, p.Port)

		p.Endpoints = endpointsFor(svcSlices, servicePort{name: sp.Name, proto: proto,
			target: targetPortNumber(sp), named: named, selector: spec.Selector != nil}, c.node.Name)
		p.ClusterSet = topologySet(chooseSet(p.Endpoints, false), c.node)
		p.LocalSet = chooseSet(p.Endpoints, true)
		c.ports = append(c.ports, port{Service: p, created: svc.CreationTimestamp.Time})
	}
}

// protocol converts a Service port protocol, reporting unsupported ones
// under field(".protocol").
func (c *computer) protocol(obj string, field func(string) string, p corev1.Protocol) (Protocol, bool) {
	if proto, ok := toProtocol(p); ok {
		return proto, true
	}
	if p == corev1.ProtocolSCTP {
		c.report("Service", obj, field(".protocol"), "SCTP is not supported; port skipped")
	} else {
		c.report("Service", obj, field(".protocol"), "unknown protocol %q; port skipped", p)
	}
	return 0, false
}

// toProtocol converts a Service port protocol the datapath handles.
func toProtocol(p corev1.Protocol) (Protocol, bool) {
	switch p {
	case corev1.ProtocolTCP, "":
		return TCP, true
	case corev1.ProtocolUDP:
		return UDP, true
	}
	return 0, false
}

// targetPortNumber is a Service port's target port when it is a number (an
// unset one is the port itself, as the API server defaults it), and 0 when
// it names a container port.
func targetPortNumber(sp *corev1.ServicePort) uint16 {
	switch {
	case sp.TargetPort.Type != intstr.Int:
		return 0
	case sp.TargetPort.IntVal == 0:
		return uint16(sp.Port)
	case sp.TargetPort.IntVal < 1 || sp.TargetPort.IntVal > 65535:
		return 0
	}
	return uint16(sp.TargetPort.IntVal)
}

// loadBalancerIPs returns the VIP-mode ingress IPs of a LoadBalancer Service.
// Ingress points in Proxy mode are reached through the load balancer, which
// sends traffic to node or pod addresses, so they get no frontend.
func (c *computer) loadBalancerIPs(svc *corev1.Service, svcType corev1.ServiceType) []netip.Addr {
	obj := svc.Namespace + "/" + svc.Name
	var out []netip.Addr
	for i, ing := range svc.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress
		}
		field := fmt.Sprintf("status.loadBalancer.ingress[%d].ip", i)
		if svcType != corev1.ServiceTypeLoadBalancer {
			c.report("Service", obj, field, "ignored: Service type is %s", svcType)
			continue
		}
		if ing.IPMode != nil && *ing.IPMode == corev1.LoadBalancerIPModeProxy {
			continue
		}
		a, msg := parseIPv4(ing.IP)
		if msg != "" {
			c.report("Service", obj, field, "%s", msg)
			continue
		}
		out = append(out, a)
	}
	return out
}

// externalPolicyLocal reports whether externalTrafficPolicy Local applies:
// only to Services reachable from outside, as in kube-proxy.
func (c *computer) externalPolicyLocal(svc *corev1.Service, svcType corev1.ServiceType) bool {
	switch p := svc.Spec.ExternalTrafficPolicy; p {
	case corev1.ServiceExternalTrafficPolicyLocal:
		return svcType == corev1.ServiceTypeNodePort || svcType == corev1.ServiceTypeLoadBalancer ||
			len(svc.Spec.ExternalIPs) > 0
	case corev1.ServiceExternalTrafficPolicyCluster, "":
	default:
		c.report("Service", svc.Namespace+"/"+svc.Name, "spec.externalTrafficPolicy", "unknown policy %q; treated as Cluster", p)
	}
	return false
}

func (c *computer) internalPolicyLocal(svc *corev1.Service) bool {
	p := svc.Spec.InternalTrafficPolicy
	if p == nil {
		return false
	}
	switch *p {
	case corev1.ServiceInternalTrafficPolicyLocal:
		return true
	case corev1.ServiceInternalTrafficPolicyCluster, "":
	default:
		c.report("Service", svc.Namespace+"/"+svc.Name, "spec.internalTrafficPolicy", "unknown policy %q; treated as Cluster", *p)
	}
	return false
}

func (c *computer) affinityTimeout(svc *corev1.Service) time.Duration {
	obj := svc.Namespace + "/" + svc.Name
	switch a := svc.Spec.SessionAffinity; a {
	case corev1.ServiceAffinityClientIP:
	case corev1.ServiceAffinityNone, "":
		return 0
	default:
		c.report("Service", obj, "spec.sessionAffinity", "unknown affinity %q; treated as None", a)
		return 0
	}
	cfg := svc.Spec.SessionAffinityConfig
	if cfg == nil || cfg.ClientIP == nil || cfg.ClientIP.TimeoutSeconds == nil {
		return DefaultAffinityTimeout
	}
	t := *cfg.ClientIP.TimeoutSeconds
	if t <= 0 || t > maxAffinitySeconds {
		c.report("Service", obj, "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
			"%d is out of range (1 to %d); using %d", t, maxAffinitySeconds, int(DefaultAffinityTimeout.Seconds()))
		return DefaultAffinityTimeout
	}
	return time.Duration(t) * time.Second
}

// sourceRanges parses loadBalancerSourceRanges, tolerating the surrounding
// spaces that API validation lets through, and, as kube-proxy does
// (netutils.ParseCIDRSloppy), leading zeros in an IPv4 address, read as
// decimal ("010.0.0.0/8" is 10.0.0.0/8). It returns whether any were
// given, and the usable IPv4 ones, masked, sorted and unique.
func (c *computer) sourceRanges(svc *corev1.Service) (bool, []netip.Prefix) {
	in := svc.Spec.LoadBalancerSourceRanges
	if len(in) == 0 {
		return false, nil
	}
	obj := svc.Namespace + "/" + svc.Name
	var out []netip.Prefix
	for i, s := range in {
		field := fmt.Sprintf("spec.loadBalancerSourceRanges[%d]", i)
		_, ipnet, err := netutils.ParseCIDRSloppy(strings.TrimSpace(s))
		if err != nil {
			c.report("Service", obj, field, "invalid CIDR %q; skipped", s)
			continue
		}
		// An IPv4 CIDR has a 32-bit mask; one written as IPv6 (an
		// IPv4-mapped prefix included) has a 128-bit one.
		ones, bits := ipnet.Mask.Size()
		ip4 := ipnet.IP.To4()
		if bits != 32 || ip4 == nil {
			c.report("Service", obj, field, "IPv6 range %s skipped: the datapath handles IPv4 only", ipnet)
			continue
		}
		out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte(ip4)), ones).Masked())
	}
	if len(out) == 0 {
		c.report("Service", obj, "spec.loadBalancerSourceRanges", "no usable IPv4 range: LoadBalancer frontends admit no client")
		return true, []netip.Prefix{}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return true, slices.Compact(out)
}

// chooseSet applies kube-proxy's rule to the endpoints, or to the local ones
// only: the ready endpoints or, if there are none, the serving and
// terminating ones.
func chooseSet(eps []Endpoint, localOnly bool) []Endpoint {
	all := len(eps) > 0
	for _, e := range eps {
		if (localOnly && !e.Local) || !e.Ready {
			all = false
			break
		}
	}
	if all {
		return eps // the common case: every endpoint qualifies; share the slice
	}
	var ready, fallback []Endpoint
	for _, e := range eps {
		if localOnly && !e.Local {
			continue
		}
		if e.Ready {
			ready = append(ready, e)
		} else if e.Serving && e.Terminating {
			fallback = append(fallback, e)
		}
	}
	if len(ready) > 0 {
		return ready
	}
	return fallback
}

// topologySet narrows a cluster-wide set of ready endpoints to those its
// slices' hints give this node, as kube-proxy does (the EndpointSlice
// controller writes the hints for trafficDistribution and the
// topology-mode annotation): to the endpoints hinted for this node when
// every endpoint has node hints and one names this node, else to those
// hinted for this node's zone when every endpoint has zone hints and one
// names the zone. Otherwise, and for a set of terminating endpoints (the
// fallback), the set is left whole: hints being added or removed, or a
// zone without endpoints of its own.
func topologySet(set []Endpoint, node NodeInfo) []Endpoint {
	if len(set) == 0 || !set[0].Ready {
		return set
	}
	allNode, forNode, allZone, forZone := true, false, true, false
	for _, e := range set {
		if len(e.NodeHints) == 0 {
			allNode = false
		} else if node.Name != "" && slices.Contains(e.NodeHints, node.Name) {
			forNode = true
		}
		if len(e.ZoneHints) == 0 {
			allZone = false
		} else if node.Zone != "" && slices.Contains(e.ZoneHints, node.Zone) {
			forZone = true
		}
	}
	var keep func(Endpoint) bool
	switch {
	case allNode && forNode:
		keep = func(e Endpoint) bool { return slices.Contains(e.NodeHints, node.Name) }
	case allZone && forZone:
		keep = func(e Endpoint) bool { return slices.Contains(e.ZoneHints, node.Zone) }
	default:
		return set
	}
	var out []Endpoint
	for _, e := range set {
		if keep(e) {
			out = append(out, e)
		}
	}
	return out
}

// resolveConflicts gives every frontend (address, port, protocol) to one
// service port and reports the claims it drops.
func (c *computer) resolveConflicts() {
	type key struct {
		addr  netip.Addr
		port  uint16
		proto Protocol
	}
	type claim struct {
		port int // index into c.ports
		kind FrontendKind
	}
	claims := map[key][]claim{}
	for i, p := range c.ports {
		for _, f := range p.Frontends {
			k := key{f.Addr, f.Port, f.Protocol}
			claims[k] = append(claims[k], claim{i, f.Kind})
		}
	}
	better := func(a, b claim) int {
		pa, pb := &c.ports[a.port], &c.ports[b.port]
		return cmp.Or(
			cmp.Compare(a.kind, b.kind),
			compareCreated(pa.created, pb.created),
			cmp.Compare(pa.Key(), pb.Key()),
		)
	}
	type loss struct {
		frontend Frontend
		winner   claim
	}
	losses := map[int][]loss{}
	for k, cl := range claims {
		if len(cl) < 2 {
			continue
		}
		w := slices.MinFunc(cl, better)
		for _, l := range cl {
			if l != w {
				f := Frontend{Addr: k.addr, Port: k.port, Protocol: k.proto, Kind: l.kind}
				losses[l.port] = append(losses[l.port], loss{f, w})
			}
		}
	}
	for i := range c.ports {
		p := &c.ports[i]
		lost := losses[i]
		p.Frontends = slices.DeleteFunc(p.Frontends, func(f Frontend) bool {
			return slices.ContainsFunc(lost, func(l loss) bool { return l.frontend == f })
		})
		slices.SortFunc(lost, func(a, b loss) int { return compareFrontends(a.frontend, b.frontend) })
		for _, l := range lost {
			if l.winner.port == i {
				continue // the same address twice in one service port
			}
			w := &c.ports[l.winner.port]
			c.report("Service", p.Namespace+"/"+p.Name, "",
				"frontend %s of port %s is also claimed by %s (%s); dropped here", l.frontend, p.Key(), w.Key(), l.winner.kind)
		}
		p.Frontends = tidyFrontends(p.Frontends)
	}
}

// tidyFrontends sorts frontends and drops exact duplicates.
func tidyFrontends(fs []Frontend) []Frontend {
	slices.SortFunc(fs, compareFrontends)
	return slices.Compact(fs)
}

// compareCreated orders creation times, oldest first and unknown (zero)
// last.
func compareCreated(a, b time.Time) int {
	switch {
	case a.Equal(b):
		return 0
	case a.IsZero():
		return 1
	case b.IsZero():
		return -1
	}
	return a.Compare(b)
}

func compareFrontends(a, b Frontend) int {
	return cmp.Or(
		cmp.Compare(a.Kind, b.Kind),
		a.Addr.Compare(b.Addr),
		cmp.Compare(a.Port, b.Port),
		cmp.Compare(a.Protocol, b.Protocol),
	)
}

// weight parses AnnotationWeight.
func parseWeight(s string) (uint32, bool) {
	w, err := strconv.ParseUint(s, 10, 32)
	if err != nil || w < 1 || w > MaxWeight {
		return 0, false
	}
	return uint32(w), true
}
