package model

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The node the tests run on.
var testNode = NodeInfo{
	Name:      "node-a",
	Addresses: []netip.Addr{netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("192.168.1.10")},
}

type svcOpt func(*corev1.Service)

// newService returns a ClusterIP Service default/<name> with cluster IP
// 10.96.0.10 and one port "http" 80/TCP -> 8080, modified by opts.
func newService(name string, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.ServiceSpec{
			Type:       corev1.ServiceTypeClusterIP,
			ClusterIP:  "10.96.0.10",
			ClusterIPs: []string{"10.96.0.10"},
			Ports:      []corev1.ServicePort{svcPort("http", corev1.ProtocolTCP, 80, 0)},
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

func svcPort(name string, proto corev1.Protocol, port, nodePort int32) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort, TargetPort: intstr.FromString(name)}
}

func withType(t corev1.ServiceType) svcOpt { return func(s *corev1.Service) { s.Spec.Type = t } }

func withPorts(ps ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ps }
}

func withClusterIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ClusterIPs = ips
		s.Spec.ClusterIP = ""
		if len(ips) > 0 {
			s.Spec.ClusterIP = ips[0]
		}
	}
}

func withExternalIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

// withIngress sets status.loadBalancer.ingress; "ip/Proxy" and "ip/VIP" set
// the ipMode, "host:name" a hostname-only entry.
func withIngress(entries ...string) svcOpt {
	return func(s *corev1.Service) {
		var ing []corev1.LoadBalancerIngress
		for _, e := range entries {
			if h, ok := strings.CutPrefix(e, "host:"); ok {
				ing = append(ing, corev1.LoadBalancerIngress{Hostname: h})
				continue
			}
			ip, mode, ok := strings.Cut(e, "/")
			in := corev1.LoadBalancerIngress{IP: ip}
			if ok {
				m := corev1.LoadBalancerIPMode(mode)
				in.IPMode = &m
			}
			ing = append(ing, in)
		}
		s.Status.LoadBalancer.Ingress = ing
	}
}

func withETP(p corev1.ServiceExternalTrafficPolicy) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalTrafficPolicy = p }
}

func withITP(p corev1.ServiceInternalTrafficPolicy) svcOpt {
	return func(s *corev1.Service) { s.Spec.InternalTrafficPolicy = &p }
}

func created(t time.Time) svcOpt {
	return func(s *corev1.Service) { s.CreationTimestamp = metav1.NewTime(t) }
}

func withLabels(kv ...string) svcOpt {
	return func(s *corev1.Service) {
		s.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			s.Labels[kv[i]] = kv[i+1]
		}
	}
}

// newSlice returns an IPv4 EndpointSlice default/<name> of Service svcName.
func newSlice(svcName, name string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "default",
			Name:      name,
			Labels:    map[string]string{discoveryv1.LabelServiceName: svcName},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

func annotate(s *discoveryv1.EndpointSlice, kv ...string) *discoveryv1.EndpointSlice {
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	for i := 0; i+1 < len(kv); i += 2 {
		s.Annotations[kv[i]] = kv[i+1]
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func epPort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Protocol: ptr(proto), Port: ptr(port)}
}

// httpPort is the slice port matching newService's default port.
var httpPort = []discoveryv1.EndpointPort{epPort("http", corev1.ProtocolTCP, 8080)}

// ep returns an endpoint on a node; conds is a combination of "R" (ready),
// "S" (serving) and "T" (terminating); "-" means all conditions explicitly
// false, and "" leaves them all unset.
func ep(addr, node, conds string) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}}
	if node != "" {
		e.NodeName = ptr(node)
	}
	if conds != "" {
		e.Conditions = discoveryv1.EndpointConditions{
			Ready:       ptr(strings.Contains(conds, "R")),
			Serving:     ptr(strings.Contains(conds, "S")),
			Terminating: ptr(strings.Contains(conds, "T")),
		}
	}
	return e
}

// compute runs Compute on the test node.
func compute(t *testing.T, svcs []*corev1.Service, eps ...*discoveryv1.EndpointSlice) (State, []Problem) {
	t.Helper()
	return Compute(Input{Services: svcs, Slices: eps, Node: testNode})
}

// one computes a single Service and returns its only service port.
func one(t *testing.T, svc *corev1.Service, eps ...*discoveryv1.EndpointSlice) *Service {
	t.Helper()
	st, probs := compute(t, []*corev1.Service{svc}, eps...)
	if len(st.Services) != 1 {
		t.Fatalf("got %d service ports, want 1 (problems: %v)", len(st.Services), probs)
	}
	return &st.Services[0]
}

func frontendStrings(s *Service) []string {
	var out []string
	for _, f := range s.Frontends {
		out = append(out, f.String())
	}
	return out
}

// epStrings renders endpoints as "addr:port flags" where flags are R, S, T
// for the conditions and L for local.
func epStrings(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		flags := ""
		for _, f := range []struct {
			on bool
			c  string
		}{{e.Ready, "R"}, {e.Serving, "S"}, {e.Terminating, "T"}, {e.Local, "L"}, {e.Host, "H"}} {
			if f.on {
				flags += f.c
			}
		}
		out = append(out, e.ID()+" "+flags)
	}
	return out
}

func keys(st State) []string {
	var out []string
	for i := range st.Services {
		out = append(out, st.Services[i].Key())
	}
	return out
}

// hasProblem reports whether a problem on field exists whose message
// contains substr.
func hasProblem(probs []Problem, field, substr string) bool {
	return slices.ContainsFunc(probs, func(p Problem) bool {
		return p.Field == field && strings.Contains(p.Message, substr)
	})
}

func equal(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s:\n got  %s\n want %s", what, fmt.Sprint(quote(got)), fmt.Sprint(quote(want)))
	}
}

func quote(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = fmt.Sprintf("%q", v)
	}
	return out
}
