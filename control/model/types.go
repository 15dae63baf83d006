package model

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// Input is everything Compute looks at.
type Input struct {
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	Node     NodeInfo
}

// NodeInfo holds the facts about the node the agent runs on.
type NodeInfo struct {
	// Name is the node's name, matched against endpoints' nodeName to tell
	// local endpoints. Empty means no endpoint is local.
	Name string
	// Addresses are the node addresses that get NodePort frontends, after
	// any nodePortAddresses-style filtering. Only IPv4 addresses are used.
	Addresses []netip.Addr
	// Zone is the node's topology.kubernetes.io/zone label, "" when
	// unknown: endpoints' zone hints are then not followed.
	Zone string
	// ProxyName is this agent's service-proxy-name; "" is the default
	// proxy, which handles only Services without the label.
	ProxyName string
}

// State is the desired datapath state: one entry per service port, sorted by
// namespace, name, port name and protocol.
type State struct {
	Services []Service
}

// Lookup returns the service port with the given key, or nil.
func (st *State) Lookup(key string) *Service {
	for i := range st.Services {
		if st.Services[i].Key() == key {
			return &st.Services[i]
		}
	}
	return nil
}

// Protocol is a transport protocol, valued as its IP protocol number.
type Protocol uint8

// The protocols the datapath handles.
const (
	TCP Protocol = 6
	UDP Protocol = 17
)

func (p Protocol) String() string {
	switch p {
	case TCP:
		return "TCP"
	case UDP:
		return "UDP"
	}
	return fmt.Sprintf("Protocol(%d)", uint8(p))
}

// FrontendKind says how a frontend address came about; it decides the
// traffic policy that applies.
type FrontendKind uint8

// Frontend kinds, in the order frontends are sorted. A frontend address
// claimed by two services goes to the kind listed first.
const (
	ClusterIP FrontendKind = iota
	NodePort
	LoadBalancer
	ExternalIP
)

func (k FrontendKind) String() string {
	switch k {
	case ClusterIP:
		return "ClusterIP"
	case NodePort:
		return "NodePort"
	case LoadBalancer:
		return "LoadBalancer"
	case ExternalIP:
		return "ExternalIP"
	}
	return fmt.Sprintf("FrontendKind(%d)", uint8(k))
}

// External reports whether traffic to this kind of frontend follows the
// external traffic policy (NodePort, LoadBalancer, ExternalIP).
func (k FrontendKind) External() bool {
	return k == NodePort || k == LoadBalancer || k == ExternalIP
}

// Frontend is an address, port and protocol that a service port answers on.
type Frontend struct {
	Addr     netip.Addr
	Port     uint16
	Protocol Protocol
	Kind     FrontendKind
}

func (f Frontend) String() string {
	return fmt.Sprintf("%s/%s (%s)", netip.AddrPortFrom(f.Addr, f.Port), f.Protocol, f.Kind)
}

// Endpoint is one backend of a service port.
type Endpoint struct {
	Addr netip.Addr
	// Port is the target port, resolved through the endpoint's slice.
	Port     uint16
	NodeName string
	Zone     string
	// Local is true when NodeName is this node, or Host.
	Local bool
	// Host is true when Addr is one of this node's addresses (a
	// hostNetwork pod here): the datapath delivers its packets to the
	// node's stack and translates the node's replies on their way out.
	Host bool
	// Conditions; a missing ready or serving condition counts as true, a
	// missing terminating condition as false.
	Ready, Serving, Terminating bool
	// ZoneHints and NodeHints are the zones and nodes the endpoint's
	// slice hints it for (hints.forZones, hints.forNodes), nil without.
	ZoneHints, NodeHints []string
	// Weight is the endpoint's relative share of new flows, 1 unless the
	// slice's AnnotationWeight says otherwise; never 0.
	Weight uint32
}

// ID is the endpoint's identity, "addr:port", the same on every node; it is
// what consistent hashing keys on.
func (e Endpoint) ID() string {
	return netip.AddrPortFrom(e.Addr, e.Port).String()
}

// Service is one port of one Kubernetes Service: the unit the datapath
// load-balances.
type Service struct {
	Namespace, Name string
	// PortName is the Service port's name, "" for an unnamed port.
	PortName string
	Protocol Protocol
	// Port is the Service port; NodePort is its node port, 0 if none.
	Port, NodePort uint16

	// Frontends, sorted by kind, address and port.
	Frontends []Frontend

	// ExternalTrafficPolicyLocal is set when externalTrafficPolicy is Local
	// and the Service has external frontends (type NodePort or
	// LoadBalancer, or externalIPs).
	ExternalTrafficPolicyLocal bool
	// InternalTrafficPolicyLocal is set when internalTrafficPolicy is Local.
	InternalTrafficPolicyLocal bool

	// AffinityTimeout is how long a client address keeps its endpoint
	// after its last packet; 0 means no session affinity.
	AffinityTimeout time.Duration

	// SourceRangesSet is true when the Service lists
	// loadBalancerSourceRanges. Then only sources in SourceRanges may reach
	// its LoadBalancer frontends (none at all if SourceRanges is empty
	// because no listed range was usable). The ranges do not apply to the
	// other frontend kinds, as in kube-proxy.
	SourceRangesSet bool
	SourceRanges    []netip.Prefix

	// HealthCheckNodePort is the port of the node health check for a
	// LoadBalancer Service with externalTrafficPolicy Local, else 0.
	HealthCheckNodePort uint16

	// LastChangeTriggerTime is the latest
	// endpoints.kubernetes.io/last-change-trigger-time among the Service's
	// slices; zero if none carries it.
	LastChangeTriggerTime time.Time

	// Endpoints are all usable endpoints of this port, sorted by address
	// and port.
	Endpoints []Endpoint
	// ClusterSet is the ready endpoints, narrowed by topology hints for
	// this node (see topologySet), or, if there are none, the serving and
	// terminating ones. LocalSet is the same rule applied to the local
	// endpoints only, without hints. Both keep the order of Endpoints.
	ClusterSet, LocalSet []Endpoint
}

// Key identifies the service port: "namespace/name:portname/PROTOCOL", or
// "namespace/name/PROTOCOL" for an unnamed port.
func (s *Service) Key() string {
	if s.PortName == "" {
		return s.Namespace + "/" + s.Name + "/" + s.Protocol.String()
	}
	return s.Namespace + "/" + s.Name + ":" + s.PortName + "/" + s.Protocol.String()
}

// UsesLocalSet reports whether traffic arriving at a frontend of kind k is
// limited to local endpoints: external frontends follow
// externalTrafficPolicy, ClusterIP frontends internalTrafficPolicy.
//
// This is about traffic from outside the node. As in kube-proxy, traffic
// that this node's own pods or host send to an external frontend always uses
// ClusterSet, whatever the policies.
func (s *Service) UsesLocalSet(k FrontendKind) bool {
	if k.External() {
		return s.ExternalTrafficPolicyLocal
	}
	return s.InternalTrafficPolicyLocal
}

// SetFor returns the endpoints that traffic to a frontend of kind k may use:
// LocalSet or ClusterSet, as UsesLocalSet says.
func (s *Service) SetFor(k FrontendKind) []Endpoint {
	if s.UsesLocalSet(k) {
		return s.LocalSet
	}
	return s.ClusterSet
}

// Verdict says what happens to a new connection to a frontend.
type Verdict uint8

const (
	// Forward: SetFor has endpoints; pick one.
	Forward Verdict = iota
	// Reject: the service port has no usable endpoint anywhere; the client
	// must see "connection refused" (TCP RST, ICMP port unreachable).
	Reject
	// Drop: the traffic policy is Local and only other nodes have usable
	// endpoints; kube-proxy drops such packets silently.
	Drop
)

func (v Verdict) String() string {
	switch v {
	case Forward:
		return "Forward"
	case Reject:
		return "Reject"
	case Drop:
		return "Drop"
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// Verdict says how new connections to a frontend of kind k are handled.
func (s *Service) Verdict(k FrontendKind) Verdict {
	switch {
	case len(s.SetFor(k)) > 0:
		return Forward
	case len(s.ClusterSet) == 0:
		return Reject
	default:
		return Drop
	}
}

// NeedsSNAT reports whether traffic from outside the node to a frontend of
// kind k, sent to endpoint e, must be source-NATed to the node address so
// the replies come back through this node: external frontends under
// externalTrafficPolicy Cluster, to an endpoint on another node. (kube-proxy
// masquerades all such traffic, also to local endpoints, whose replies pass
// through this node anyway.) Hairpin traffic, a pod reaching itself through
// its service, also needs SNAT; that depends on the packet, not the service.
func (s *Service) NeedsSNAT(k FrontendKind, e Endpoint) bool {
	return k.External() && !s.ExternalTrafficPolicyLocal && !e.Local
}

// AllowsSource reports whether a client address may reach a frontend of
// kind k under the Service's loadBalancerSourceRanges.
func (s *Service) AllowsSource(k FrontendKind, client netip.Addr) bool {
	if k != LoadBalancer || !s.SourceRangesSet {
		return true
	}
	for _, p := range s.SourceRanges {
		if p.Contains(client) {
			return true
		}
	}
	return false
}

// Problem describes something odd in an input object that Compute skipped
// or worked around.
type Problem struct {
	Kind    string // "Service", "EndpointSlice" or "Node"
	Object  string // namespace/name, or the node name
	Field   string // path of the offending field, if any
	Message string
}

func (p Problem) String() string {
	if p.Field == "" {
		return fmt.Sprintf("%s %s: %s", p.Kind, p.Object, p.Message)
	}
	return fmt.Sprintf("%s %s: %s: %s", p.Kind, p.Object, p.Field, p.Message)
}
