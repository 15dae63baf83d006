package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func TestWhichServices(t *testing.T) {
	tests := []struct {
		name      string
		svc       *corev1.Service
		proxyName string
		ours      bool
		problem   string // field reported, if any
	}{
		{name: "plain", svc: newService("web"), ours: true},
		{name: "ExternalName", svc: newService("web", withType(corev1.ServiceTypeExternalName), withClusterIPs())},
		{name: "ExternalName with a cluster IP", svc: newService("web", withType(corev1.ServiceTypeExternalName))},
		{name: "headless", svc: newService("web", withClusterIPs(corev1.ClusterIPNone))},
		{name: "headless by clusterIP only", svc: newService("web", func(s *corev1.Service) {
			s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, nil
		})},
		{name: "headless label", svc: newService("web", withLabels(LabelHeadless, ""))},
		{name: "other proxy", svc: newService("web", withLabels(LabelServiceProxyName, "other"))},
		{name: "empty proxy name label", svc: newService("web", withLabels(LabelServiceProxyName, ""))},
		{name: "our proxy name", svc: newService("web", withLabels(LabelServiceProxyName, "xdplb")), proxyName: "xdplb", ours: true},
		{name: "unlabelled is not ours when we have a name", svc: newService("web"), proxyName: "xdplb"},
		{name: "other proxy when we have a name", svc: newService("web", withLabels(LabelServiceProxyName, "other")), proxyName: "xdplb"},
		{name: "our name but headless", svc: newService("web", withLabels(LabelServiceProxyName, "xdplb", LabelHeadless, "")), proxyName: "xdplb"},
		{name: "unrelated labels", svc: newService("web", withLabels("app", "web")), ours: true},
		{name: "no cluster IP", svc: newService("web", withClusterIPs()), problem: "spec.clusterIP"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode
			node.ProxyName = tc.proxyName
			st, probs := Compute(Input{
				Services: []*corev1.Service{tc.svc},
				Slices:   []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort, ep("10.0.1.1", "node-b", "RS"))},
				Node:     node,
			})
			if got := len(st.Services) == 1; got != tc.ours {
				t.Errorf("handled: %v, want %v (%v)", got, tc.ours, keys(st))
			}
			if tc.problem == "" && len(probs) > 0 || tc.problem != "" && !hasProblem(probs, tc.problem, "") {
				t.Errorf("problems %v, want one on %q", probs, tc.problem)
			}
			// The informer selector agrees with the model.
			sel := LabelSelector(tc.proxyName)
			wantSelected := Selected(tc.svc.Labels, tc.proxyName)
			if got := sel.Matches(labels.Set(tc.svc.Labels)); got != wantSelected {
				t.Errorf("selector %q matches: %v, Selected: %v", sel, got, wantSelected)
			}
		})
	}
}

func TestLabelSelector(t *testing.T) {
	tests := []struct {
		proxyName string
		want      string
	}{
		{"", "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"},
		{"xdplb", "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=xdplb"},
		{"not a valid label value!", ""},
	}
	for _, tc := range tests {
		sel := LabelSelector(tc.proxyName)
		if got := sel.String(); got != tc.want {
			t.Errorf("LabelSelector(%q) = %q, want %q", tc.proxyName, got, tc.want)
		}
	}
	if LabelSelector("not a valid label value!").Matches(labels.Set{}) {
		t.Error("a selector for an invalid proxy name matches objects")
	}
}

func TestSessionAffinity(t *testing.T) {
	affinity := func(a corev1.ServiceAffinity, cfg *corev1.SessionAffinityConfig) svcOpt {
		return func(s *corev1.Service) { s.Spec.SessionAffinity, s.Spec.SessionAffinityConfig = a, cfg }
	}
	timeout := func(sec int32) *corev1.SessionAffinityConfig {
		return &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &sec}}
	}
	tests := []struct {
		name    string
		opt     svcOpt
		want    time.Duration
		problem bool
	}{
		{"not set", affinity("", nil), 0, false},
		{"None", affinity(corev1.ServiceAffinityNone, timeout(60)), 0, false},
		{"ClientIP with the default", affinity(corev1.ServiceAffinityClientIP, nil), 10800 * time.Second, false},
		{"ClientIP with an empty config", affinity(corev1.ServiceAffinityClientIP, &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{}}), 10800 * time.Second, false},
		{"ClientIP with a timeout", affinity(corev1.ServiceAffinityClientIP, timeout(60)), time.Minute, false},
		{"ClientIP with the longest timeout", affinity(corev1.ServiceAffinityClientIP, timeout(86400)), 24 * time.Hour, false},
		{"ClientIP with a zero timeout", affinity(corev1.ServiceAffinityClientIP, timeout(0)), 10800 * time.Second, true},
		{"ClientIP with a too long timeout", affinity(corev1.ServiceAffinityClientIP, timeout(86401)), 10800 * time.Second, true},
		{"unknown affinity", affinity("Cookie", nil), 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{newService("web", tc.opt)})
			if got := st.Services[0].AffinityTimeout; got != tc.want {
				t.Errorf("AffinityTimeout = %v, want %v", got, tc.want)
			}
			if (len(probs) > 0) != tc.problem {
				t.Errorf("problems %v, want some: %v", probs, tc.problem)
			}
		})
	}
}

func TestSourceRanges(t *testing.T) {
	ranges := func(r ...string) svcOpt {
		return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = r }
	}
	lb := []svcOpt{withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7")}
	tests := []struct {
		name     string
		ranges   []string
		set      bool
		want     []string
		problems []string
		allowed  []string // clients allowed on the LoadBalancer frontend
		denied   []string
	}{
		{
			name:    "none",
			allowed: []string{"198.51.100.1", "10.1.2.3"},
		},
		{
			name:    "parsed, masked, sorted, deduplicated, spaces tolerated",
			ranges:  []string{" 10.0.0.0/8", "192.0.2.7/24 ", "10.0.0.0/8"},
			set:     true,
			want:    []string{"10.0.0.0/8", "192.0.2.0/24"},
			allowed: []string{"10.1.2.3", "192.0.2.200"},
			denied:  []string{"198.51.100.1"},
		},
		{
			name:     "invalid and IPv6 entries are skipped",
			ranges:   []string{"10.0.0.0/33", "fd00::/8", "nonsense", "192.0.2.0/24"},
			set:      true,
			want:     []string{"192.0.2.0/24"},
			problems: []string{"spec.loadBalancerSourceRanges[0]", "spec.loadBalancerSourceRanges[1]", "spec.loadBalancerSourceRanges[2]"},
			allowed:  []string{"192.0.2.1"},
			denied:   []string{"10.1.2.3"},
		},
		{
			// kube-proxy reads them with ParseCIDRSloppy; dropped, a list
			// of such ranges would admit no client at all.
			name:    "leading zeros are read as decimal",
			ranges:  []string{"010.0.0.0/8", "192.000.002.007/24"},
			set:     true,
			want:    []string{"10.0.0.0/8", "192.0.2.0/24"},
			allowed: []string{"10.1.2.3", "192.0.2.200"},
			denied:  []string{"198.51.100.1", "8.1.2.3"},
		},
		{
			name:     "an IPv4-mapped IPv6 range is IPv6",
			ranges:   []string{"::ffff:10.0.0.0/104", "192.0.2.0/24"},
			set:      true,
			want:     []string{"192.0.2.0/24"},
			problems: []string{"spec.loadBalancerSourceRanges[0]"},
			allowed:  []string{"192.0.2.1"},
			denied:   []string{"10.1.2.3"},
		},
		{
			name:     "nothing usable admits nobody",
			ranges:   []string{"fd00::/8"},
			set:      true,
			problems: []string{"spec.loadBalancerSourceRanges[0]", "spec.loadBalancerSourceRanges"},
			denied:   []string{"10.1.2.3", "198.51.100.1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{newService("web", append(lb, ranges(tc.ranges...))...)})
			s := &st.Services[0]
			var got []string
			for _, p := range s.SourceRanges {
				got = append(got, p.String())
			}
			equal(t, "SourceRanges", got, tc.want)
			if s.SourceRangesSet != tc.set {
				t.Errorf("SourceRangesSet = %v, want %v", s.SourceRangesSet, tc.set)
			}
			for _, f := range tc.problems {
				if !hasProblem(probs, f, "") {
					t.Errorf("no problem on %s: %v", f, probs)
				}
			}
			if len(probs) != len(tc.problems) {
				t.Errorf("problems %v, want %d", probs, len(tc.problems))
			}
			for _, a := range tc.allowed {
				if !s.AllowsSource(LoadBalancer, netip.MustParseAddr(a)) {
					t.Errorf("%s denied on the LoadBalancer frontend", a)
				}
			}
			for _, a := range tc.denied {
				if s.AllowsSource(LoadBalancer, netip.MustParseAddr(a)) {
					t.Errorf("%s allowed on the LoadBalancer frontend", a)
				}
				// Source ranges restrict LoadBalancer frontends only.
				for _, k := range []FrontendKind{ClusterIP, NodePort, ExternalIP} {
					if !s.AllowsSource(k, netip.MustParseAddr(a)) {
						t.Errorf("%s denied on a %v frontend", a, k)
					}
				}
			}
		})
	}
}

func TestHealthCheckNodePort(t *testing.T) {
	hc := func(p int32) svcOpt { return func(s *corev1.Service) { s.Spec.HealthCheckNodePort = p } }
	local := withETP(corev1.ServiceExternalTrafficPolicyLocal)
	tests := []struct {
		name    string
		svc     *corev1.Service
		want    uint16
		problem bool
	}{
		{"LoadBalancer, eTP Local", newService("web", withType(corev1.ServiceTypeLoadBalancer), local, hc(32000)), 32000, false},
		{"LoadBalancer, eTP Cluster", newService("web", withType(corev1.ServiceTypeLoadBalancer), hc(32000)), 0, false},
		{"NodePort, eTP Local", newService("web", withType(corev1.ServiceTypeNodePort), local, hc(32000)), 0, false},
		{"LoadBalancer, eTP Local, not allocated", newService("web", withType(corev1.ServiceTypeLoadBalancer), local), 0, true},
		{"LoadBalancer, eTP Local, out of range", newService("web", withType(corev1.ServiceTypeLoadBalancer), local, hc(70000)), 0, true},
	}
	for _, tc := range tests {
		st, probs := compute(t, []*corev1.Service{tc.svc})
		if got := st.Services[0].HealthCheckNodePort; got != tc.want {
			t.Errorf("%s: HealthCheckNodePort = %d, want %d", tc.name, got, tc.want)
		}
		if (len(probs) > 0) != tc.problem {
			t.Errorf("%s: problems %v, want some: %v", tc.name, probs, tc.problem)
		}
	}
}

func TestPorts(t *testing.T) {
	tests := []struct {
		name     string
		ports    []corev1.ServicePort
		want     []string // keys with their frontends' ports
		problems []string
	}{
		{
			name:  "one port",
			ports: []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80, 0)},
			want:  []string{"default/web:http/TCP 10.96.0.10:80"},
		},
		{
			name:  "port added",
			ports: []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80, 0), svcPort("https", corev1.ProtocolTCP, 443, 0)},
			want:  []string{"default/web:http/TCP 10.96.0.10:80", "default/web:https/TCP 10.96.0.10:443"},
		},
		{
			name:  "first port removed",
			ports: []corev1.ServicePort{svcPort("https", corev1.ProtocolTCP, 443, 0)},
			want:  []string{"default/web:https/TCP 10.96.0.10:443"},
		},
		{
			name:  "no ports",
			ports: nil,
			want:  nil,
		},
		{
			name:  "same port number on TCP and UDP",
			ports: []corev1.ServicePort{svcPort("dns-tcp", corev1.ProtocolTCP, 53, 0), svcPort("dns", corev1.ProtocolUDP, 53, 0)},
			want:  []string{"default/web:dns/UDP 10.96.0.10:53", "default/web:dns-tcp/TCP 10.96.0.10:53"},
		},
		{
			name:  "protocol not set means TCP",
			ports: []corev1.ServicePort{svcPort("http", "", 80, 0)},
			want:  []string{"default/web:http/TCP 10.96.0.10:80"},
		},
		{
			name:     "SCTP is skipped",
			ports:    []corev1.ServicePort{svcPort("sig", corev1.ProtocolSCTP, 3868, 0), svcPort("http", corev1.ProtocolTCP, 80, 0)},
			want:     []string{"default/web:http/TCP 10.96.0.10:80"},
			problems: []string{"spec.ports[0].protocol"},
		},
		{
			name: "odd ports are skipped",
			ports: []corev1.ServicePort{
				svcPort("zero", corev1.ProtocolTCP, 0, 0),
				svcPort("big", corev1.ProtocolTCP, 70000, 0),
				svcPort("quic", "QUIC", 443, 0),
				svcPort("http", corev1.ProtocolTCP, 80, 0),
				svcPort("http", corev1.ProtocolTCP, 8080, 0),
			},
			want: []string{"default/web:http/TCP 10.96.0.10:80"},
			problems: []string{
				"spec.ports[0].port", "spec.ports[1].port", "spec.ports[2].protocol", "spec.ports[4].name",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{newService("web", withPorts(tc.ports...))})
			var got []string
			for i := range st.Services {
				s := &st.Services[i]
				for _, f := range s.Frontends {
					got = append(got, s.Key()+" "+netip.AddrPortFrom(f.Addr, f.Port).String())
				}
			}
			equal(t, "ports", got, tc.want)
			for _, f := range tc.problems {
				if !hasProblem(probs, f, "") {
					t.Errorf("no problem on %s: %v", f, probs)
				}
			}
			if len(probs) != len(tc.problems) {
				t.Errorf("problems %v, want %d", probs, len(tc.problems))
			}
		})
	}
}

func TestServiceFields(t *testing.T) {
	svc := newService("web", withType(corev1.ServiceTypeNodePort),
		withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080), svcPort("", corev1.ProtocolUDP, 53, 0)))
	svc.Namespace = "shop"
	st, _ := compute(t, []*corev1.Service{svc})
	want := []string{"shop/web/UDP", "shop/web:http/TCP"}
	equal(t, "keys", keys(st), want)
	s := st.Lookup("shop/web:http/TCP")
	if s.Namespace != "shop" || s.Name != "web" || s.PortName != "http" || s.Protocol != TCP || s.Port != 80 || s.NodePort != 30080 {
		t.Errorf("service port %+v", *s)
	}
	if st.Lookup("shop/web:nope/TCP") != nil {
		t.Error("Lookup found a port that does not exist")
	}
	if s := st.Lookup("shop/web/UDP"); s.Protocol.String() != "UDP" || s.NodePort != 0 {
		t.Errorf("unnamed UDP port: %+v", *s)
	}
}

// TestDeterministic computes the same objects in different orders, as
// informers deliver them.
func TestDeterministic(t *testing.T) {
	svcs := []*corev1.Service{
		newService("web", withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7"),
			withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080), svcPort("https", corev1.ProtocolTCP, 443, 30443))),
		newService("api", withClusterIPs("10.96.0.20"), withExternalIPs("198.51.100.1", "2001:db8::1")),
		newService("dns", withClusterIPs("10.96.0.53"), withPorts(svcPort("dns", corev1.ProtocolUDP, 53, 0))),
		newService("hijack", withClusterIPs("10.96.0.66"), withExternalIPs("203.0.113.7")),
	}
	webPorts := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("https", corev1.ProtocolTCP, 8443)}
	eps := []*discoveryv1.EndpointSlice{
		newSlice("web", "web-1", webPorts, ep("10.0.1.1", "node-a", "RS"), ep("10.0.1.2", "node-b", "ST")),
		newSlice("web", "web-2", webPorts, ep("10.0.1.2", "node-b", "RS"), ep("10.0.1.3", "node-c", "")),
		newSlice("api", "api-1", httpPort, ep("10.0.2.1", "node-b", "RS"), ep("fd00::1", "node-b", "RS")),
		newSlice("dns", "dns-1", []discoveryv1.EndpointPort{epPort("dns", corev1.ProtocolUDP, 53)}, ep("10.0.3.1", "node-a", "RS")),
		newSlice("gone", "gone-1", httpPort, ep("10.0.4.1", "node-a", "RS")),
	}
	want, wantProbs := compute(t, svcs, eps...)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10 {
		s2, e2 := slices.Clone(svcs), slices.Clone(eps)
		rng.Shuffle(len(s2), func(i, j int) { s2[i], s2[j] = s2[j], s2[i] })
		rng.Shuffle(len(e2), func(i, j int) { e2[i], e2[j] = e2[j], e2[i] })
		got, gotProbs := compute(t, s2, e2...)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("state depends on input order:\n got  %+v\n want %+v", got, want)
		}
		if !reflect.DeepEqual(gotProbs, wantProbs) {
			t.Fatalf("problems depend on input order:\n got  %v\n want %v", gotProbs, wantProbs)
		}
	}
	equal(t, "keys", keys(want), []string{
		"default/api:http/TCP", "default/dns:dns/UDP", "default/hijack:http/TCP",
		"default/web:http/TCP", "default/web:https/TCP",
	})
}

// TestNoSharedMemory checks that changing one service port's slices does
// not change another's.
func TestNoSharedMemory(t *testing.T) {
	svc := newService("web", withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7"),
		withPorts(svcPort("a", corev1.ProtocolTCP, 80, 0), svcPort("b", corev1.ProtocolTCP, 81, 0)),
		func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = []string{"10.0.0.0/8"} })
	st, _ := compute(t, []*corev1.Service{svc})
	st.Services[0].SourceRanges[0] = netip.MustParsePrefix("0.0.0.0/0")
	if st.Services[1].SourceRanges[0].String() != "10.0.0.0/8" {
		t.Error("service ports share their SourceRanges")
	}
}

func TestOddObjects(t *testing.T) {
	weird := newSlice("web", "web-weird", []discoveryv1.EndpointPort{
		{},                  // nothing set
		{Name: ptr("http")}, // no port number
		{Name: ptr("x"), Port: ptr(int32(-1))},
		epPort("http", corev1.ProtocolTCP, 8080),
		epPort("http", corev1.ProtocolTCP, 9090), // duplicate
		epPort("sig", corev1.ProtocolSCTP, 3868),
	}, discoveryv1.Endpoint{Addresses: []string{"10.0.1.1"}, Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}})
	noLabel := newSlice("web", "web-nolabel", httpPort, ep("10.0.1.2", "node-a", "RS"))
	noLabel.Labels = nil
	noType := newSlice("web", "web-notype", httpPort, ep("10.0.1.3", "node-a", "RS"))
	noType.AddressType = ""
	dupSlice := newSlice("web", "web-notype", httpPort, ep("10.0.1.4", "node-a", "RS"))
	bare := &corev1.Service{}
	bare.Name, bare.Namespace = "bare", "default"
	policies := newService("pol", withClusterIPs("10.96.0.30"), withType("Special"),
		withETP("Sometimes"), withITP("Nearby"), withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080)))
	dupSvc := newService("web", withClusterIPs("10.96.0.99"))

	st, probs := Compute(Input{
		Services: []*corev1.Service{nil, newService("web"), bare, policies, dupSvc},
		Slices:   []*discoveryv1.EndpointSlice{nil, weird, noLabel, noType, dupSlice, {}},
		Node:     testNode,
	})
	equal(t, "keys", keys(st), []string{"default/pol:http/TCP", "default/web:http/TCP"})
	web := st.Lookup("default/web:http/TCP")
	equal(t, "web frontends", frontendStrings(web), []string{"10.96.0.10:80/TCP (ClusterIP)"})
	equal(t, "web endpoints", epStrings(web.Endpoints), []string{"10.0.1.1:8080 S", "10.0.1.3:8080 RSL"})
	pol := st.Lookup("default/pol:http/TCP")
	if pol.ExternalTrafficPolicyLocal || pol.InternalTrafficPolicyLocal || pol.NodePort != 0 {
		t.Errorf("unknown values not treated as defaults: %+v", *pol)
	}
	for _, want := range []struct{ kind, object, field string }{
		{"Service", "#0", ""},
		{"Service", "default/web", ""}, // listed twice
		{"Service", "default/bare", "spec.clusterIP"},
		{"Service", "default/pol", "spec.type"},
		{"Service", "default/pol", "spec.externalTrafficPolicy"},
		{"Service", "default/pol", "spec.internalTrafficPolicy"},
		{"Service", "default/pol", "spec.ports[0].nodePort"},
		{"EndpointSlice", "#0", ""},
		{"EndpointSlice", "default/web-weird", "ports[1].port"},
		{"EndpointSlice", "default/web-weird", "ports[2].port"},
		{"EndpointSlice", "default/web-weird", "ports[4].name"},
		{"EndpointSlice", "default/web-nolabel", "metadata.labels"},
		{"EndpointSlice", "default/web-notype", "addressType"},
		{"EndpointSlice", "default/web-notype", ""}, // listed twice
		{"EndpointSlice", "/", "metadata.labels"},
	} {
		if !slices.ContainsFunc(probs, func(p Problem) bool {
			return p.Kind == want.kind && p.Object == want.object && p.Field == want.field
		}) {
			t.Errorf("no problem for %s %s %s", want.kind, want.object, want.field)
		}
	}
	// The port without anything set counts as unnamed TCP without a
	// number, so it is reported as well; nothing else is.
	if len(probs) != 16 {
		t.Errorf("got %d problems, want 16:\n%s", len(probs), problemLines(probs))
	}
}

func problemLines(probs []Problem) string {
	var b strings.Builder
	for _, p := range probs {
		b.WriteString("  " + p.String() + "\n")
	}
	return b.String()
}

func TestProblemString(t *testing.T) {
	p := Problem{Kind: "Service", Object: "default/web", Field: "spec.ports[1].protocol", Message: "SCTP is not supported; port skipped"}
	if got, want := p.String(), "Service default/web: spec.ports[1].protocol: SCTP is not supported; port skipped"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	p.Field = ""
	if got, want := p.String(), "Service default/web: SCTP is not supported; port skipped"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{TCP.String(), "TCP"}, {UDP.String(), "UDP"}, {Protocol(132).String(), "Protocol(132)"},
		{ClusterIP.String(), "ClusterIP"}, {NodePort.String(), "NodePort"},
		{LoadBalancer.String(), "LoadBalancer"}, {ExternalIP.String(), "ExternalIP"},
		{FrontendKind(9).String(), "FrontendKind(9)"},
		{Forward.String(), "Forward"}, {Reject.String(), "Reject"}, {Drop.String(), "Drop"},
		{Verdict(7).String(), "Verdict(7)"},
		{Endpoint{Addr: netip.MustParseAddr("10.0.0.1"), Port: 8080}.ID(), "10.0.0.1:8080"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// BenchmarkCompute computes 2000 Services of two ports with 10 endpoints
// each, in two slices.
func BenchmarkCompute(b *testing.B) {
	var in Input
	in.Node = testNode
	ports := []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080), epPort("https", corev1.ProtocolTCP, 8443)}
	for i := range 2000 {
		name := fmt.Sprintf("svc-%d", i)
		ip := fmt.Sprintf("10.96.%d.%d", i/250, i%250+1)
		in.Services = append(in.Services, newService(name, withClusterIPs(ip), withType(corev1.ServiceTypeNodePort),
			withPorts(svcPort("http", corev1.ProtocolTCP, 80, int32(30000+i)), svcPort("https", corev1.ProtocolTCP, 443, 0))))
		for s := range 2 {
			var eps []discoveryv1.Endpoint
			for e := range 5 {
				eps = append(eps, ep(fmt.Sprintf("10.%d.%d.%d", 1+s, i/250, (i%250)*5%250+e), "node-b", "RS"))
			}
			in.Slices = append(in.Slices, newSlice(name, fmt.Sprintf("%s-%d", name, s), ports, eps...))
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		Compute(in)
	}
}
