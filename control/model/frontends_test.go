package model

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestFrontends(t *testing.T) {
	lbPorts := withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080))
	tests := []struct {
		name     string
		svc      *corev1.Service
		want     []string
		problems []string // fields that must be reported
	}{
		{
			name: "ClusterIP",
			svc:  newService("web"),
			want: []string{"10.96.0.10:80/TCP (ClusterIP)"},
		},
		{
			name: "type not set is ClusterIP",
			svc:  newService("web", withType("")),
			want: []string{"10.96.0.10:80/TCP (ClusterIP)"},
		},
		{
			name: "clusterIP without clusterIPs",
			svc: newService("web", func(s *corev1.Service) {
				s.Spec.ClusterIPs = nil
			}),
			want: []string{"10.96.0.10:80/TCP (ClusterIP)"},
		},
		{
			name:     "nodePort ignored on a ClusterIP Service",
			svc:      newService("web", lbPorts),
			want:     []string{"10.96.0.10:80/TCP (ClusterIP)"},
			problems: []string{"spec.ports[0].nodePort"},
		},
		{
			name: "NodePort on every node address",
			svc:  newService("web", withType(corev1.ServiceTypeNodePort), lbPorts),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
			},
		},
		{
			name: "NodePort with the node port not allocated yet",
			svc:  newService("web", withType(corev1.ServiceTypeNodePort)),
			want: []string{"10.96.0.10:80/TCP (ClusterIP)"},
		},
		{
			name: "LoadBalancer",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer), lbPorts,
				withIngress("203.0.113.7", "203.0.113.8/VIP")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
				"203.0.113.7:80/TCP (LoadBalancer)",
				"203.0.113.8:80/TCP (LoadBalancer)",
			},
		},
		{
			name: "LoadBalancer ingress in Proxy mode and by hostname",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer), lbPorts,
				withIngress("203.0.113.7/Proxy", "host:lb.example.com", "203.0.113.9")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
				"203.0.113.9:80/TCP (LoadBalancer)",
			},
		},
		{
			name: "LoadBalancer without node ports",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer),
				withIngress("203.0.113.7")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"203.0.113.7:80/TCP (LoadBalancer)",
			},
		},
		{
			name: "LoadBalancer not yet provisioned",
			svc:  newService("web", withType(corev1.ServiceTypeLoadBalancer), lbPorts),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
			},
		},
		{
			name:     "ingress status on a ClusterIP Service is ignored",
			svc:      newService("web", withIngress("203.0.113.7")),
			want:     []string{"10.96.0.10:80/TCP (ClusterIP)"},
			problems: []string{"status.loadBalancer.ingress[0].ip"},
		},
		{
			name: "bad and IPv6 ingress IPs",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer),
				withIngress("2001:db8::7", "not-an-ip", "203.0.113.7")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"203.0.113.7:80/TCP (LoadBalancer)",
			},
			problems: []string{"status.loadBalancer.ingress[0].ip", "status.loadBalancer.ingress[1].ip"},
		},
		{
			name: "externalIPs on a ClusterIP Service",
			svc:  newService("web", withExternalIPs("198.51.100.2", "198.51.100.1")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"198.51.100.1:80/TCP (ExternalIP)",
				"198.51.100.2:80/TCP (ExternalIP)",
			},
		},
		{
			name: "externalIPs on a LoadBalancer",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer), lbPorts,
				withIngress("203.0.113.7"), withExternalIPs("198.51.100.1")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
				"203.0.113.7:80/TCP (LoadBalancer)",
				"198.51.100.1:80/TCP (ExternalIP)",
			},
		},
		{
			name:     "IPv6 and invalid externalIPs",
			svc:      newService("web", withExternalIPs("2001:db8::1", "198.51.100.300", "198.51.100.1")),
			want:     []string{"10.96.0.10:80/TCP (ClusterIP)", "198.51.100.1:80/TCP (ExternalIP)"},
			problems: []string{"spec.externalIPs[0]", "spec.externalIPs[1]"},
		},
		{
			name:     "dual-stack cluster IPs keep the IPv4 one",
			svc:      newService("web", withClusterIPs("fd00::10", "10.96.0.10")),
			want:     []string{"10.96.0.10:80/TCP (ClusterIP)"},
			problems: []string{"spec.clusterIPs[0]"},
		},
		{
			// Stored before the API server's validation became strict;
			// kube-proxy reads them with ParseIPSloppy.
			name: "IPv4 addresses with leading zeros are read as decimal",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer), lbPorts,
				withClusterIPs("010.096.000.010"), withIngress("203.000.113.007"), withExternalIPs("198.051.100.08")),
			want: []string{
				"10.96.0.10:80/TCP (ClusterIP)",
				"192.168.0.10:30080/TCP (NodePort)",
				"192.168.1.10:30080/TCP (NodePort)",
				"203.0.113.7:80/TCP (LoadBalancer)",
				"198.51.100.8:80/TCP (ExternalIP)",
			},
		},
		{
			name:     "leading zeros do not make an address valid, or IPv4-mapped IPv6 IPv4",
			svc:      newService("web", withExternalIPs("0256.1.2.3", "::ffff:198.51.100.1", "198.51.100.2")),
			want:     []string{"10.96.0.10:80/TCP (ClusterIP)", "198.51.100.2:80/TCP (ExternalIP)"},
			problems: []string{"spec.externalIPs[0]", "spec.externalIPs[1]"},
		},
		{
			name: "an external IP equal to the LoadBalancer IP is one frontend",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer),
				withIngress("203.0.113.7"), withExternalIPs("203.0.113.7")),
			want: []string{"10.96.0.10:80/TCP (ClusterIP)", "203.0.113.7:80/TCP (LoadBalancer)"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{tc.svc})
			if len(st.Services) != 1 {
				t.Fatalf("got %d service ports, want 1; problems %v", len(st.Services), probs)
			}
			equal(t, "frontends", frontendStrings(&st.Services[0]), tc.want)
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

// Addresses are read as kube-proxy reads them (netutils.ParseIPSloppy):
// leading zeros are allowed and decimal, never octal.
func TestParseIPv4(t *testing.T) {
	tests := []struct {
		in      string
		want    string // "" when skipped
		problem string // what the message says then
	}{
		{"10.1.2.3", "10.1.2.3", ""},
		{"010.1.2.3", "10.1.2.3", ""},
		{"0010.001.02.3", "10.1.2.3", ""},
		{"08.09.010.011", "8.9.10.11", ""}, // decimal: 08 is no octal digit, 010 is ten
		{"000.000.000.000", "0.0.0.0", ""},
		{"0256.1.2.3", "", "invalid"},
		{"0x0a.1.2.3", "", "invalid"},
		{"10.1.2", "", "invalid"},
		{" 10.1.2.3", "", "invalid"},
		{"", "", "invalid"},
		{"fd00::1", "", "IPv6"},
		{"::ffff:10.1.2.3", "", "IPv6"},
		{"::ffff:010.1.2.3", "", "IPv6"},
	}
	for _, tc := range tests {
		a, msg := parseIPv4(tc.in)
		switch {
		case tc.want != "" && (msg != "" || a != netip.MustParseAddr(tc.want)):
			t.Errorf("parseIPv4(%q) = %v, %q; want %s", tc.in, a, msg, tc.want)
		case tc.want == "" && (a.IsValid() || !strings.Contains(msg, tc.problem)):
			t.Errorf("parseIPv4(%q) = %v, %q; want it skipped as %s", tc.in, a, msg, tc.problem)
		}
	}
}

func TestNodeAddresses(t *testing.T) {
	svc := newService("web", withType(corev1.ServiceTypeNodePort), withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080)))
	mp := netip.MustParseAddr
	node := NodeInfo{Name: "node-a", Addresses: []netip.Addr{
		mp("192.168.1.10"), mp("fd00::1"), mp("192.168.0.10"), mp("192.168.1.10"), {},
	}}
	st, probs := Compute(Input{Services: []*corev1.Service{svc}, Node: node})
	equal(t, "frontends", frontendStrings(&st.Services[0]), []string{
		"10.96.0.10:80/TCP (ClusterIP)",
		"192.168.0.10:30080/TCP (NodePort)",
		"192.168.1.10:30080/TCP (NodePort)",
	})
	if !hasProblem(probs, "addresses[1]", "IPv6") || !hasProblem(probs, "addresses[4]", "invalid") || len(probs) != 2 {
		t.Errorf("problems %v; want the IPv6 and the invalid address", probs)
	}

	// No node addresses: no NodePort frontends, nothing odd.
	st, probs = Compute(Input{Services: []*corev1.Service{svc}, Node: NodeInfo{Name: "node-a"}})
	equal(t, "frontends without node addresses", frontendStrings(&st.Services[0]), []string{"10.96.0.10:80/TCP (ClusterIP)"})
	if len(probs) != 0 {
		t.Errorf("unexpected problems %v", probs)
	}
}

// TestTypeChanges computes one Service as it changes type and back.
func TestTypeChanges(t *testing.T) {
	ports := withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080))
	clusterIP := []string{"10.96.0.10:80/TCP (ClusterIP)"}
	nodePort := append(clusterIP, "192.168.0.10:30080/TCP (NodePort)", "192.168.1.10:30080/TCP (NodePort)")
	lb := append(nodePort[:3:3], "203.0.113.7:80/TCP (LoadBalancer)")
	steps := []struct {
		name string
		svc  *corev1.Service
		want []string
	}{
		{"ClusterIP", newService("web"), clusterIP},
		{"NodePort", newService("web", withType(corev1.ServiceTypeNodePort), ports), nodePort},
		{"LoadBalancer", newService("web", withType(corev1.ServiceTypeLoadBalancer), ports, withIngress("203.0.113.7")), lb},
		{"back to NodePort", newService("web", withType(corev1.ServiceTypeNodePort), ports), nodePort},
		{"back to ClusterIP", newService("web"), clusterIP},
		{"ExternalName", newService("web", withType(corev1.ServiceTypeExternalName)), nil},
		{"ClusterIP again", newService("web"), clusterIP},
	}
	eps := newSlice("web", "web-1", httpPort, ep("10.0.1.1", "node-b", "RS"))
	for _, s := range steps {
		st, probs := compute(t, []*corev1.Service{s.svc}, eps)
		if len(probs) != 0 {
			t.Errorf("%s: problems %v", s.name, probs)
		}
		if s.want == nil {
			if len(st.Services) != 0 {
				t.Errorf("%s: got %v, want no service ports", s.name, keys(st))
			}
			continue
		}
		if len(st.Services) != 1 {
			t.Fatalf("%s: got %v, want one service port", s.name, keys(st))
		}
		equal(t, s.name, frontendStrings(&st.Services[0]), s.want)
		equal(t, s.name+" endpoints", epStrings(st.Services[0].Endpoints), []string{"10.0.1.1:8080 RS"})
	}
}

func TestFrontendConflicts(t *testing.T) {
	older := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	newer := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		svcs      []*corev1.Service
		want      map[string][]string // key -> frontends
		loserKeys []string            // Services that must be told
	}{
		{
			name: "externalIP cannot take another Service's LoadBalancer IP",
			svcs: []*corev1.Service{
				newService("a-hijack", withClusterIPs("10.96.0.1"), withExternalIPs("203.0.113.7"), created(older)),
				newService("web", withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7"), created(newer)),
			},
			want: map[string][]string{
				"default/a-hijack:http/TCP": {"10.96.0.1:80/TCP (ClusterIP)"},
				"default/web:http/TCP":      {"10.96.0.10:80/TCP (ClusterIP)", "203.0.113.7:80/TCP (LoadBalancer)"},
			},
			loserKeys: []string{"default/a-hijack"},
		},
		{
			name: "same kind: the older Service keeps it",
			svcs: []*corev1.Service{
				newService("a", withClusterIPs("10.96.0.1"), withExternalIPs("198.51.100.1"), created(newer)),
				newService("b", withClusterIPs("10.96.0.2"), withExternalIPs("198.51.100.1"), created(older)),
			},
			want: map[string][]string{
				"default/a:http/TCP": {"10.96.0.1:80/TCP (ClusterIP)"},
				"default/b:http/TCP": {"10.96.0.2:80/TCP (ClusterIP)", "198.51.100.1:80/TCP (ExternalIP)"},
			},
			loserKeys: []string{"default/a"},
		},
		{
			name: "same kind and age: the smaller key keeps it",
			svcs: []*corev1.Service{
				newService("b", withClusterIPs("10.96.0.2"), withExternalIPs("198.51.100.1")),
				newService("a", withClusterIPs("10.96.0.1"), withExternalIPs("198.51.100.1")),
			},
			want: map[string][]string{
				"default/a:http/TCP": {"10.96.0.1:80/TCP (ClusterIP)", "198.51.100.1:80/TCP (ExternalIP)"},
				"default/b:http/TCP": {"10.96.0.2:80/TCP (ClusterIP)"},
			},
			loserKeys: []string{"default/b"},
		},
		{
			name: "different protocols do not conflict",
			svcs: []*corev1.Service{
				newService("a", withClusterIPs("10.96.0.1"), withExternalIPs("198.51.100.1")),
				newService("b", withClusterIPs("10.96.0.2"), withExternalIPs("198.51.100.1"),
					withPorts(svcPort("dns", corev1.ProtocolUDP, 80, 0))),
			},
			want: map[string][]string{
				"default/a:http/TCP": {"10.96.0.1:80/TCP (ClusterIP)", "198.51.100.1:80/TCP (ExternalIP)"},
				"default/b:dns/UDP":  {"10.96.0.2:80/UDP (ClusterIP)", "198.51.100.1:80/UDP (ExternalIP)"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, tc.svcs)
			for key, want := range tc.want {
				s := st.Lookup(key)
				if s == nil {
					t.Fatalf("no service port %s in %v", key, keys(st))
				}
				equal(t, key, frontendStrings(s), want)
			}
			if len(probs) != len(tc.loserKeys) {
				t.Errorf("problems %v, want one each for %v", probs, tc.loserKeys)
			}
			for i, k := range tc.loserKeys {
				if i < len(probs) && (probs[i].Object != k || !strings.Contains(probs[i].Message, "also claimed")) {
					t.Errorf("problem %v, want one for %s", probs[i], k)
				}
			}
		})
	}
}

// A Service without an IPv4 cluster IP (IPv6 single-stack) belongs to the
// other family's proxier, as with kube-proxy: none of its ports is
// programmed, so the node's IPv4 addresses get no NodePort for it and no
// health check server answers for it.
func TestServicesWithoutAnIPv4ClusterIPAreSkipped(t *testing.T) {
	hc := func(s *corev1.Service) { s.Spec.HealthCheckNodePort = 32000 }
	tests := []struct {
		name     string
		svc      *corev1.Service
		problems []string
	}{
		{
			name:     "IPv6 single-stack ClusterIP",
			svc:      newService("web", withClusterIPs("fd00::10")),
			problems: []string{"spec.clusterIPs[0]", "spec.clusterIPs"},
		},
		{
			name: "IPv6 single-stack LoadBalancer with policy Local",
			svc: newService("web", withType(corev1.ServiceTypeLoadBalancer),
				withPorts(svcPort("http", corev1.ProtocolTCP, 80, 30080)), withClusterIPs("fd00::10"), withIngress("203.0.113.7"),
				withExternalIPs("198.51.100.1"), withETP(corev1.ServiceExternalTrafficPolicyLocal), hc),
			problems: []string{"spec.clusterIPs[0]", "spec.clusterIPs"},
		},
		{
			name:     "invalid cluster IP",
			svc:      newService("web", withClusterIPs("10.96.0.300")),
			problems: []string{"spec.clusterIPs[0]", "spec.clusterIPs"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, probs := compute(t, []*corev1.Service{tc.svc})
			if len(st.Services) != 0 {
				t.Errorf("got %d service ports, want none: %+v", len(st.Services), st.Services)
			}
			for _, f := range tc.problems {
				if !hasProblem(probs, f, "") {
					t.Errorf("no problem reported for %s; got %v", f, probs)
				}
			}
			if len(probs) != len(tc.problems) {
				t.Errorf("problems %v, want %d", probs, len(tc.problems))
			}
		})
	}
}
