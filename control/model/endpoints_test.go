package model

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestEndpoints(t *testing.T) {
	tests := []struct {
		name     string
		svc      *corev1.Service
		slices   []*discoveryv1.EndpointSlice
		want     map[string][]string // service port key -> endpoints
		problems []string            // fields that must be reported
	}{
		{
			name: "basic",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort,
				ep("10.0.1.2", "node-b", "RS"), ep("10.0.1.1", "node-a", "RS"))},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RSL", "10.0.1.2:8080 RS"}},
		},
		{
			name: "missing ready and serving count as true",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort,
				ep("10.0.1.1", "node-b", ""))},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS"}},
		},
		{
			name: "named ports of a multiport Service",
			svc: newService("web", withPorts(
				svcPort("http", corev1.ProtocolTCP, 80, 0),
				svcPort("metrics", corev1.ProtocolTCP, 9000, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1",
				[]discoveryv1.EndpointPort{epPort("metrics", corev1.ProtocolTCP, 9102), epPort("http", corev1.ProtocolTCP, 8080)},
				ep("10.0.1.1", "node-b", "RS"))},
			want: map[string][]string{
				"default/web:http/TCP":    {"10.0.1.1:8080 RS"},
				"default/web:metrics/TCP": {"10.0.1.1:9102 RS"},
			},
		},
		{
			name: "a named target port resolves per slice",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-old", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)},
					ep("10.0.1.1", "node-b", "RS")),
				newSlice("web", "web-new", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 9090)},
					ep("10.0.1.2", "node-b", "RS")),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS", "10.0.1.2:9090 RS"}},
		},
		{
			name: "unnamed port, and a slice port without name or protocol",
			svc:  newService("web", withPorts(svcPort("", corev1.ProtocolTCP, 80, 0))),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-1", []discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)},
					ep("10.0.1.1", "node-b", "RS")),
				newSlice("web", "web-2", []discoveryv1.EndpointPort{{Port: ptr(int32(8081))}},
					ep("10.0.1.2", "node-b", "RS")),
			},
			want: map[string][]string{"default/web/TCP": {"10.0.1.1:8080 RS", "10.0.1.2:8081 RS"}},
		},
		{
			name: "a slice port must match name and protocol",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1",
				[]discoveryv1.EndpointPort{epPort("http", corev1.ProtocolUDP, 8080), epPort("other", corev1.ProtocolTCP, 8081)},
				ep("10.0.1.1", "node-b", "RS"))},
			want: map[string][]string{"default/web:http/TCP": nil},
		},
		{
			name: "endpoint moving between slices is listed once, preferring the ready copy",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-a", httpPort, ep("10.0.1.1", "node-b", "-"), ep("10.0.1.2", "node-b", "RS")),
				newSlice("web", "web-b", httpPort, ep("10.0.1.1", "node-b", "RS")),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS", "10.0.1.2:8080 RS"}},
		},
		{
			name: "a terminating copy loses to a running one",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-a", httpPort, ep("10.0.1.1", "node-b", "ST")),
				newSlice("web", "web-b", httpPort, ep("10.0.1.1", "node-a", "")),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RSL"}},
		},
		{
			name: "equal copies: the slice sorting first wins",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-b", httpPort, ep("10.0.1.1", "node-b", "RS")),
				newSlice("web", "web-a", httpPort, ep("10.0.1.1", "node-a", "RS")),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RSL"}},
		},
		{
			name: "same address, different ports: two endpoints",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-a", httpPort, ep("10.0.1.1", "node-b", "RS")),
				newSlice("web", "web-b", []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 9090)},
					ep("10.0.1.1", "node-b", "RS")),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS", "10.0.1.1:9090 RS"}},
		},
		{
			name: "slices of other Services and namespaces are not ours",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-1", httpPort, ep("10.0.1.1", "node-b", "RS")),
				newSlice("api", "api-1", httpPort, ep("10.0.2.1", "node-b", "RS")),
				func() *discoveryv1.EndpointSlice {
					s := newSlice("web", "web-1", httpPort, ep("10.0.3.1", "node-b", "RS"))
					s.Namespace = "other"
					return s
				}(),
			},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS"}},
		},
		{
			name: "IPv6 and FQDN slices are skipped",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{
				newSlice("web", "web-v4", httpPort, ep("10.0.1.1", "node-b", "RS")),
				func() *discoveryv1.EndpointSlice {
					s := newSlice("web", "web-v6", httpPort, ep("fd00::1", "node-b", "RS"))
					s.AddressType = discoveryv1.AddressTypeIPv6
					return s
				}(),
				func() *discoveryv1.EndpointSlice {
					s := newSlice("web", "web-fqdn", httpPort, ep("web.example.com", "node-b", "RS"))
					s.AddressType = discoveryv1.AddressTypeFQDN
					return s
				}(),
			},
			want:     map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS"}},
			problems: []string{"addressType", "addressType"},
		},
		{
			name: "only the first address counts; bad addresses are skipped",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort,
				discoveryv1.Endpoint{Addresses: []string{"10.0.1.1", "10.0.1.9"}},
				discoveryv1.Endpoint{Addresses: []string{"fd00::2"}},
				discoveryv1.Endpoint{Addresses: []string{"bogus"}},
				discoveryv1.Endpoint{},
			)},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS"}},
			problems: []string{
				"endpoints[1].addresses[0]",
				"endpoints[2].addresses[0]",
				"endpoints[3].addresses",
			},
		},
		{
			name: "leading zeros in an endpoint address are read as decimal",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort,
				ep("010.000.001.01", "node-b", "RS"), ep("10.0.1.09", "node-b", "RS"))},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS", "10.0.1.9:8080 RS"}},
		},
		{
			// A hostNetwork pod here: local even when the slice names no node.
			name: "an endpoint at an address of this node is the host, and local",
			svc:  newService("web"),
			slices: []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort,
				ep("10.0.1.1", "node-b", "RS"), ep("192.168.1.10", "", "RS"))},
			want: map[string][]string{"default/web:http/TCP": {"10.0.1.1:8080 RS", "192.168.1.10:8080 RSLH"}},
		},
		{
			name: "same port number on TCP and UDP",
			svc: newService("dns", withPorts(
				svcPort("dns-tcp", corev1.ProtocolTCP, 53, 0),
				svcPort("dns", corev1.ProtocolUDP, 53, 0))),
			slices: []*discoveryv1.EndpointSlice{newSlice("dns", "dns-1",
				[]discoveryv1.EndpointPort{epPort("dns", corev1.ProtocolUDP, 5353), epPort("dns-tcp", corev1.ProtocolTCP, 5354)},
				ep("10.0.1.1", "node-b", "RS"))},
			want: map[string][]string{
				"default/dns:dns-tcp/TCP": {"10.0.1.1:5354 RS"},
				"default/dns:dns/UDP":     {"10.0.1.1:5353 RS"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{tc.svc}, tc.slices...)
			if len(st.Services) != len(tc.want) {
				t.Fatalf("got service ports %v, want %d", keys(st), len(tc.want))
			}
			for key, want := range tc.want {
				s := st.Lookup(key)
				if s == nil {
					t.Fatalf("no service port %s in %v", key, keys(st))
				}
				equal(t, key, epStrings(s.Endpoints), want)
			}
			for _, f := range tc.problems {
				if !hasProblem(probs, f, "") {
					t.Errorf("no problem reported for %s; got %v", f, probs)
				}
			}
			if len(probs) != len(tc.problems) {
				t.Errorf("got %d problems, want %d: %v", len(probs), len(tc.problems), probs)
			}
		})
	}
}

// TestEndpointSets covers the choice of endpoints for each kind of frontend
// under each traffic policy, the fallback to terminating endpoints, and
// what happens when the chosen set is empty.
func TestEndpointSets(t *testing.T) {
	type want struct {
		cluster, local []string
		// Verdicts for ClusterIP and for external frontends.
		internal, external Verdict
	}
	lbOpts := []svcOpt{withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7"),
		withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080))}
	lb := func(extra ...svcOpt) *corev1.Service { return newService("web", append(lbOpts, extra...)...) }
	tests := []struct {
		name string
		svc  *corev1.Service
		eps  []discoveryv1.Endpoint
		want want
	}{
		{
			name: "ready endpoints, terminating ones left out",
			svc:  lb(),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "RS"), ep("10.0.1.2", "node-b", "RS"), ep("10.0.1.3", "node-a", "ST")},
			want: want{
				cluster:  []string{"10.0.1.1:8080 RSL", "10.0.1.2:8080 RS"},
				local:    []string{"10.0.1.1:8080 RSL"},
				internal: Forward, external: Forward,
			},
		},
		{
			name: "no ready endpoint: fall back to serving terminating ones",
			svc:  lb(),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "ST"), ep("10.0.1.2", "node-b", "ST"), ep("10.0.1.3", "node-b", "T"), ep("10.0.1.4", "node-b", "-")},
			want: want{
				cluster:  []string{"10.0.1.1:8080 STL", "10.0.1.2:8080 ST"},
				local:    []string{"10.0.1.1:8080 STL"},
				internal: Forward, external: Forward,
			},
		},
		{
			name: "local set falls back on its own while the cluster has ready ones",
			svc:  lb(withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "ST"), ep("10.0.1.2", "node-b", "RS")},
			want: want{
				cluster:  []string{"10.0.1.2:8080 RS"},
				local:    []string{"10.0.1.1:8080 STL"},
				internal: Forward, external: Forward,
			},
		},
		{
			name: "serving but not terminating (not ready yet) is never used",
			svc:  lb(),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "S")},
			want: want{internal: Reject, external: Reject},
		},
		{
			name: "no endpoints: reject",
			svc:  lb(withETP(corev1.ServiceExternalTrafficPolicyLocal), withITP(corev1.ServiceInternalTrafficPolicyLocal)),
			want: want{internal: Reject, external: Reject},
		},
		{
			name: "externalTrafficPolicy Local without local endpoints: drop external, forward internal",
			svc:  lb(withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.2", "node-b", "RS")},
			want: want{
				cluster:  []string{"10.0.1.2:8080 RS"},
				internal: Forward, external: Drop,
			},
		},
		{
			name: "internalTrafficPolicy Local without local endpoints: drop internal, forward external",
			svc:  lb(withITP(corev1.ServiceInternalTrafficPolicyLocal)),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.2", "node-b", "RS")},
			want: want{
				cluster:  []string{"10.0.1.2:8080 RS"},
				internal: Drop, external: Forward,
			},
		},
		{
			name: "both policies Local with a local endpoint",
			svc:  lb(withETP(corev1.ServiceExternalTrafficPolicyLocal), withITP(corev1.ServiceInternalTrafficPolicyLocal)),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "RS"), ep("10.0.1.2", "node-b", "RS")},
			want: want{
				cluster:  []string{"10.0.1.1:8080 RSL", "10.0.1.2:8080 RS"},
				local:    []string{"10.0.1.1:8080 RSL"},
				internal: Forward, external: Forward,
			},
		},
		{
			name: "Local policy with only non-serving local endpoints: drop",
			svc:  lb(withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			eps:  []discoveryv1.Endpoint{ep("10.0.1.1", "node-a", "T"), ep("10.0.1.2", "node-b", "RS")},
			want: want{
				cluster:  []string{"10.0.1.2:8080 RS"},
				internal: Forward, external: Drop,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := one(t, tc.svc, newSlice("web", "web-1", httpPort, tc.eps...))
			equal(t, "ClusterSet", epStrings(s.ClusterSet), tc.want.cluster)
			equal(t, "LocalSet", epStrings(s.LocalSet), tc.want.local)
			if got := s.Verdict(ClusterIP); got != tc.want.internal {
				t.Errorf("Verdict(ClusterIP) = %v, want %v", got, tc.want.internal)
			}
			for _, k := range []FrontendKind{NodePort, LoadBalancer, ExternalIP} {
				if got := s.Verdict(k); got != tc.want.external {
					t.Errorf("Verdict(%v) = %v, want %v", k, got, tc.want.external)
				}
			}
			// SetFor follows the policy of each frontend kind.
			wantSet := func(local bool) []string {
				if local {
					return tc.want.local
				}
				return tc.want.cluster
			}
			equal(t, "SetFor(ClusterIP)", epStrings(s.SetFor(ClusterIP)), wantSet(s.InternalTrafficPolicyLocal))
			equal(t, "SetFor(LoadBalancer)", epStrings(s.SetFor(LoadBalancer)), wantSet(s.ExternalTrafficPolicyLocal))
		})
	}
}

func TestTrafficPolicies(t *testing.T) {
	ports := withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080))
	tests := []struct {
		name             string
		svc              *corev1.Service
		external, intern bool
		usesLocal        map[FrontendKind]bool
	}{
		{
			name:      "defaults",
			svc:       newService("web", withType(corev1.ServiceTypeNodePort), ports),
			usesLocal: map[FrontendKind]bool{ClusterIP: false, NodePort: false, LoadBalancer: false, ExternalIP: false},
		},
		{
			name:      "eTP Local on a NodePort",
			svc:       newService("web", withType(corev1.ServiceTypeNodePort), ports, withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			external:  true,
			usesLocal: map[FrontendKind]bool{ClusterIP: false, NodePort: true, LoadBalancer: true, ExternalIP: true},
		},
		{
			name:      "eTP Local on a ClusterIP with externalIPs",
			svc:       newService("web", withExternalIPs("198.51.100.1"), withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			external:  true,
			usesLocal: map[FrontendKind]bool{ClusterIP: false, ExternalIP: true},
		},
		{
			name:      "eTP Local means nothing on a plain ClusterIP",
			svc:       newService("web", withETP(corev1.ServiceExternalTrafficPolicyLocal)),
			usesLocal: map[FrontendKind]bool{ClusterIP: false},
		},
		{
			name:      "iTP Local",
			svc:       newService("web", withType(corev1.ServiceTypeNodePort), ports, withITP(corev1.ServiceInternalTrafficPolicyLocal)),
			intern:    true,
			usesLocal: map[FrontendKind]bool{ClusterIP: true, NodePort: false},
		},
		{
			name:      "explicit Cluster policies",
			svc:       newService("web", withType(corev1.ServiceTypeNodePort), ports, withETP(corev1.ServiceExternalTrafficPolicyCluster), withITP(corev1.ServiceInternalTrafficPolicyCluster)),
			usesLocal: map[FrontendKind]bool{ClusterIP: false, NodePort: false},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := one(t, tc.svc)
			if s.ExternalTrafficPolicyLocal != tc.external || s.InternalTrafficPolicyLocal != tc.intern {
				t.Errorf("external/internal Local = %v/%v, want %v/%v",
					s.ExternalTrafficPolicyLocal, s.InternalTrafficPolicyLocal, tc.external, tc.intern)
			}
			for k, want := range tc.usesLocal {
				if got := s.UsesLocalSet(k); got != want {
					t.Errorf("UsesLocalSet(%v) = %v, want %v", k, got, want)
				}
			}
		})
	}
}

func TestNeedsSNAT(t *testing.T) {
	local := Endpoint{Local: true}
	remote := Endpoint{}
	lb := func(opts ...svcOpt) *Service {
		return one(t, newService("web", append([]svcOpt{withType(corev1.ServiceTypeLoadBalancer),
			withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080))}, opts...)...))
	}
	cluster := lb()
	localPolicy := lb(withETP(corev1.ServiceExternalTrafficPolicyLocal))
	tests := []struct {
		svc  *Service
		kind FrontendKind
		ep   Endpoint
		want bool
	}{
		{cluster, NodePort, remote, true},
		{cluster, LoadBalancer, remote, true},
		{cluster, ExternalIP, remote, true},
		{cluster, NodePort, local, false},
		{cluster, ClusterIP, remote, false},
		{localPolicy, NodePort, remote, false},
		{localPolicy, LoadBalancer, local, false},
	}
	for _, tc := range tests {
		if got := tc.svc.NeedsSNAT(tc.kind, tc.ep); got != tc.want {
			t.Errorf("eTP Local %v, %v, local endpoint %v: NeedsSNAT = %v, want %v",
				tc.svc.ExternalTrafficPolicyLocal, tc.kind, tc.ep.Local, got, tc.want)
		}
	}
}

func TestLocalNeedsNodeName(t *testing.T) {
	svc := newService("web")
	eps := newSlice("web", "web-1", httpPort, ep("10.0.1.1", "", "RS"), ep("10.0.1.2", "node-a", "RS"))
	st, _ := Compute(Input{Services: []*corev1.Service{svc}, Slices: []*discoveryv1.EndpointSlice{eps}})
	equal(t, "no node name", epStrings(st.Services[0].Endpoints), []string{"10.0.1.1:8080 RS", "10.0.1.2:8080 RS"})
	st, _ = compute(t, []*corev1.Service{svc}, eps)
	equal(t, "node-a", epStrings(st.Services[0].Endpoints), []string{"10.0.1.1:8080 RS", "10.0.1.2:8080 RSL"})
	if e := st.Services[0].Endpoints[1]; e.NodeName != "node-a" || e.Weight != 1 {
		t.Errorf("endpoint %+v, want node-a and weight 1", e)
	}
}

func TestWeights(t *testing.T) {
	tests := []struct {
		annotation string
		want       uint32
		problem    bool
	}{
		{"", 1, false}, // no annotation
		{"3", 3, false},
		{"1", 1, false},
		{"65535", 65535, false},
		{"0", 1, true},
		{"65536", 1, true},
		{"-2", 1, true},
		{"2.5", 1, true},
		{"heavy", 1, true},
	}
	for _, tc := range tests {
		s := newSlice("web", "web-1", httpPort, ep("10.0.1.1", "node-b", "RS"))
		if tc.annotation != "" {
			annotate(s, AnnotationWeight, tc.annotation)
		}
		other := newSlice("web", "web-2", httpPort, ep("10.0.1.2", "node-b", "RS"))
		st, probs := compute(t, []*corev1.Service{newService("web")}, s, other)
		eps := st.Services[0].Endpoints
		if eps[0].Weight != tc.want || eps[1].Weight != 1 {
			t.Errorf("weight %q: endpoint weights %d, %d; want %d, 1", tc.annotation, eps[0].Weight, eps[1].Weight, tc.want)
		}
		if got := hasProblem(probs, "metadata.annotations["+AnnotationWeight+"]", "invalid weight"); got != tc.problem || len(probs) > 1 {
			t.Errorf("weight %q: problems %v, want a weight problem: %v", tc.annotation, probs, tc.problem)
		}
	}
}

func TestLastChangeTriggerTime(t *testing.T) {
	trig := corev1.EndpointsLastChangeTriggerTime
	a := annotate(newSlice("web", "web-a", httpPort), trig, "2026-03-01T10:00:00Z")
	b := annotate(newSlice("web", "web-b", httpPort), trig, "2026-03-01T10:00:05.25Z")
	c := newSlice("web", "web-c", httpPort)
	bad := annotate(newSlice("web", "web-d", httpPort), trig, "yesterday")
	s := one(t, newService("web"), a, b, c)
	if want := time.Date(2026, 3, 1, 10, 0, 5, 250_000_000, time.UTC); !s.LastChangeTriggerTime.Equal(want) {
		t.Errorf("LastChangeTriggerTime = %v, want %v", s.LastChangeTriggerTime, want)
	}
	if s := one(t, newService("web"), c); !s.LastChangeTriggerTime.IsZero() {
		t.Errorf("without annotations: LastChangeTriggerTime = %v, want zero", s.LastChangeTriggerTime)
	}
	st, probs := compute(t, []*corev1.Service{newService("web")}, a, bad)
	if want := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC); !st.Services[0].LastChangeTriggerTime.Equal(want) {
		t.Errorf("with a bad annotation: LastChangeTriggerTime = %v, want %v", st.Services[0].LastChangeTriggerTime, want)
	}
	if !hasProblem(probs, "metadata.annotations["+trig+"]", "invalid time") {
		t.Errorf("bad trigger time not reported: %v", probs)
	}
}

// TestRenamedPortKeepsItsEndpoints covers the time between a Service
// renaming a port (a second port names the first, or removing one
// unnames the other) and the EndpointSlice controller rewriting the
// Service's slices with the new names.
func TestRenamedPortKeepsItsEndpoints(t *testing.T) {
	port := func(name string, number int32, target intstr.IntOrString) corev1.ServicePort {
		return corev1.ServicePort{Name: name, Protocol: corev1.ProtocolTCP, Port: number, TargetPort: target}
	}
	controller := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		s.Labels[discoveryv1.LabelManagedBy] = controllerName
		return s
	}
	unnamed := []discoveryv1.EndpointPort{epPort("", corev1.ProtocolTCP, 8080)}
	twoNamed := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("metrics", corev1.ProtocolTCP, 9090)}
	secondPort := withPorts(port("http", 80, intstr.FromInt32(8080)), port("metrics", 9090, intstr.FromInt32(9090)))
	endpoint := ep("10.0.1.1", "node-b", "RS")
	// The controller keeps the slices of Services with a selector.
	selected := func(s *corev1.Service) { s.Spec.Selector = map[string]string{"app": "web"} }
	tests := []struct {
		name  string
		svc   *corev1.Service
		slice *discoveryv1.EndpointSlice
		want  map[string][]string
		// noSelector leaves the Service without a selector.
		noSelector bool
	}{
		{
			name:  "a second port named the first",
			svc:   newService("web", secondPort),
			slice: controller(newSlice("web", "web-1", unnamed, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    {"10.0.1.1:8080 RS"},
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name:  "the port left unnamed",
			svc:   newService("web", withPorts(port("", 80, intstr.FromInt32(8080)))),
			slice: controller(newSlice("web", "web-1", twoNamed, endpoint)),
			want:  map[string][]string{"default/web/TCP": {"10.0.1.1:8080 RS"}},
		},
		{
			name:  "an unset target port is the port",
			svc:   newService("web", withPorts(port("http", 8080, intstr.IntOrString{}), port("metrics", 9090, intstr.FromInt32(9090)))),
			slice: controller(newSlice("web", "web-1", unnamed, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    {"10.0.1.1:8080 RS"},
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name:       "not for a Service without a selector: the controller leaves its slices",
			svc:        newService("web", secondPort),
			noSelector: true,
			slice:      controller(newSlice("web", "web-1", unnamed, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    nil,
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name:  "only in slices of the controller",
			svc:   newService("web", secondPort),
			slice: newSlice("web", "web-1", unnamed, endpoint),
			want: map[string][]string{
				"default/web:http/TCP":    nil,
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name: "not to a named target port",
			svc: newService("web", withPorts(port("http", 80, intstr.FromString("web")),
				port("metrics", 9090, intstr.FromInt32(9090)))),
			slice: controller(newSlice("web", "web-1", unnamed, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    nil,
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name:  "not to another target port",
			svc:   newService("web", withPorts(port("http", 80, intstr.FromInt32(8081)), port("metrics", 9090, intstr.FromInt32(9090)))),
			slice: controller(newSlice("web", "web-1", unnamed, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    nil,
				"default/web:metrics/TCP": nil,
			},
		},
		{
			name: "not from a port the Service still has",
			svc:  newService("web", withPorts(port("http", 80, intstr.FromInt32(8080)), port("admin", 8080, intstr.FromInt32(8080)))),
			slice: controller(newSlice("web", "web-1",
				[]discoveryv1.EndpointPort{epPort("admin", corev1.ProtocolTCP, 8080)}, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":  nil,
				"default/web:admin/TCP": {"10.0.1.1:8080 RS"},
			},
		},
		{
			name: "not from another protocol",
			svc:  newService("web", secondPort),
			slice: controller(newSlice("web", "web-1",
				[]discoveryv1.EndpointPort{epPort("", corev1.ProtocolUDP, 8080)}, endpoint)),
			want: map[string][]string{
				"default/web:http/TCP":    nil,
				"default/web:metrics/TCP": nil,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.noSelector {
				selected(tc.svc)
			}
			st, probs := compute(t, []*corev1.Service{tc.svc}, tc.slice)
			if len(probs) > 0 {
				t.Errorf("problems: %v", probs)
			}
			if len(st.Services) != len(tc.want) {
				t.Fatalf("got service ports %v, want %d", keys(st), len(tc.want))
			}
			for key, want := range tc.want {
				s := st.Lookup(key)
				if s == nil {
					t.Fatalf("no service port %s in %v", key, keys(st))
				}
				equal(t, key, epStrings(s.Endpoints), want)
			}
		})
	}
}
