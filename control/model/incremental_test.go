package model

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func incService(name, rv, clusterIP string, nodePort int32) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: rv, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080), NodePort: nodePort}},
		},
	}
}

func incSlice(svc, rv string, addrs ...string) *discoveryv1.EndpointSlice {
	name, port, proto := "http", int32(8080), corev1.ProtocolTCP
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: svc + "-1", ResourceVersion: rv,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &name, Port: &port, Protocol: &proto}},
	}
	for _, a := range addrs {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{a}})
	}
	return s
}

// TestIncrementalMatchesCompute applies a sequence of changes and checks,
// after each, that Incremental gives exactly what Compute gives and that
// only the touched service ports are reported as changed.
func TestIncrementalMatchesCompute(t *testing.T) {
	node := NodeInfo{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	svcs := map[string]*corev1.Service{}
	slices := map[string]*discoveryv1.EndpointSlice{}
	for i := 0; i < 5; i++ {
		name := fmt.Sprintf("s%d", i)
		svcs[name] = incService(name, "1", fmt.Sprintf("10.96.0.%d", i+1), int32(30000+i))
		slices[name] = incSlice(name, "1", fmt.Sprintf("10.244.0.%d", i+1))
	}
	inc := NewIncremental()
	steps := []struct {
		name    string
		change  func()
		changed []string
	}{
		{"first", func() {}, []string{"ns/s0:http/TCP", "ns/s1:http/TCP", "ns/s2:http/TCP", "ns/s3:http/TCP", "ns/s4:http/TCP"}},
		{"nothing", func() {}, nil},
		{"endpoints of s1", func() { slices["s1"] = incSlice("s1", "2", "10.244.0.1", "10.244.0.9") }, []string{"ns/s1:http/TCP"}},
		{"s2 deleted", func() { delete(svcs, "s2"); delete(slices, "s2") }, []string{"ns/s2:http/TCP"}},
		{"s3 takes s4's node port", func() { svcs["s3"] = incService("s3", "2", "10.96.0.4", 30004) },
			[]string{"ns/s3:http/TCP", "ns/s4:http/TCP"}},
		{"s3 gives it back", func() { svcs["s3"] = incService("s3", "3", "10.96.0.4", 30003) },
			[]string{"ns/s3:http/TCP", "ns/s4:http/TCP"}},
		{"node address", func() { node.Addresses = append(node.Addresses, netip.MustParseAddr("192.0.2.2")) },
			[]string{"ns/s0:http/TCP", "ns/s1:http/TCP", "ns/s3:http/TCP", "ns/s4:http/TCP"}},
		{"second slice of s0", func() {
			extra := incSlice("s0", "1", "10.244.1.1")
			extra.Name = "s0-2"
			slices["s0-2"] = extra
		}, []string{"ns/s0:http/TCP"}},
		{"second slice of s0 gone", func() { delete(slices, "s0-2") }, []string{"ns/s0:http/TCP"}},
		{"s1's slice and Service replaced by equal objects", func() {
			slices["s1"] = incSlice("s1", "2", "10.244.0.1", "10.244.0.9")
			svcs["s1"] = incService("s1", "1", "10.96.0.2", 30001)
		}, nil},
		{"slice without a service label", func() {
			orphan := incSlice("s9", "1", "10.244.2.1")
			orphan.Labels = nil
			slices["orphan"] = orphan
		}, nil},
		{"unchanged again", func() {}, nil},
		{"s4 without versions", func() {
			svcs["s4"] = incService("s4", "", "10.96.0.5", 30004)
		}, []string{"ns/s4:http/TCP"}},
		{"s4 without versions, recomputed every time", func() {}, []string{"ns/s4:http/TCP"}},
	}
	for _, st := range steps {
		st.change()
		in := Input{Node: node}
		for _, s := range svcs {
			in.Services = append(in.Services, s)
		}
		for _, s := range slices {
			in.Slices = append(in.Slices, s)
		}
		want, wantProblems := Compute(in)
		got, problems, changed := inc.Update(in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: incremental state differs from Compute:\n got %+v\nwant %+v", st.name, got, want)
		}
		if p, w := problemStrings(problems), problemStrings(wantProblems); !reflect.DeepEqual(p, w) {
			t.Errorf("%s: problems %q, want %q", st.name, p, w)
		}
		wantChanged := map[string]bool{}
		for _, k := range st.changed {
			wantChanged[k] = true
		}
		if !reflect.DeepEqual(changed, wantChanged) && !(len(changed) == 0 && len(wantChanged) == 0) {
			t.Errorf("%s: changed %v, want %v", st.name, changed, wantChanged)
		}
	}
}

// problemStrings is the sorted set of problems as text.
func problemStrings(ps []Problem) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.String())
	}
	sort.Strings(out)
	return out
}

// TestIncrementalManyServices covers the first computation of many
// Services at once (spread over goroutines), including node ports that
// several Services claim, against Compute.
func TestIncrementalManyServices(t *testing.T) {
	node := NodeInfo{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	var in Input
	in.Node = node
	for i := 0; i < 1500; i++ {
		name := fmt.Sprintf("s%d", i)
		// One Service in twenty claims the node port of the one before.
		nodePort := int32(30000 + i)
		if i%20 == 1 {
			nodePort--
		}
		in.Services = append(in.Services, incService(name, "1", fmt.Sprintf("10.96.%d.%d", i/256, i%256), nodePort))
		in.Slices = append(in.Slices, incSlice(name, "1", fmt.Sprintf("10.244.%d.%d", i/256, i%256)))
	}
	in.Services = append(in.Services, in.Services[7]) // listed twice
	inc := NewIncremental()
	for step := 0; step < 2; step++ {
		want, wantProblems := Compute(in)
		got, problems, _ := inc.Update(in)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("step %d: incremental state differs from Compute", step)
		}
		if p, w := problemStrings(problems), problemStrings(wantProblems); !reflect.DeepEqual(p, w) {
			t.Fatalf("step %d: problems differ from Compute:\n got %q\nwant %q", step, p, w)
		}
		for i := 0; i < len(in.Slices); i += 7 {
			in.Slices[i] = incSlice(fmt.Sprintf("s%d", i), "2", fmt.Sprintf("10.245.%d.%d", i/256, i%256))
		}
	}
}

// A newer copy of a Service listed before its cached copy must not hide a
// deletion in the same input: the cached copy is a duplicate, not a sign
// that nothing changed.
func TestIncrementalDuplicateDoesNotHideDeletion(t *testing.T) {
	node := NodeInfo{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	a := incService("a", "1", "10.96.0.1", 30001)
	b := incService("b", "1", "10.96.0.2", 30002)
	sa, sb := incSlice("a", "1", "10.244.0.1"), incSlice("b", "1", "10.244.0.2")
	inc := NewIncremental()
	inc.Update(Input{Services: []*corev1.Service{a, b}, Slices: []*discoveryv1.EndpointSlice{sa, sb}, Node: node})

	newA := incService("a", "2", "10.96.0.1", 30001)
	in := Input{Services: []*corev1.Service{newA, a}, Slices: []*discoveryv1.EndpointSlice{sa}, Node: node}
	got, problems, _ := inc.Update(in)
	for _, s := range got.Services {
		if s.Name == "b" {
			t.Fatalf("deleted Service b is still in the state: %+v", s)
		}
	}
	found := false
	for _, p := range problems {
		found = found || p.Object == "ns/a"
	}
	if !found {
		t.Errorf("the duplicate of ns/a is not reported: %v", problems)
	}
}

// Adding a second port to a one-port Service forces a name on the first
// (the API requires names once there are two): the key of that service
// port names it, so it is reported as a port gone and a port new, with the
// same frontends. The reconciler hands the gone port's service id to the
// new one (see control/reconcile).
func TestIncrementalNamingTheOnlyPort(t *testing.T) {
	node := NodeInfo{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
	before := incService("web", "1", "10.96.0.10", 30080)
	before.Spec.Ports[0].Name = ""
	after := incService("web", "2", "10.96.0.10", 30080)
	after.Spec.Ports = append(after.Spec.Ports, corev1.ServicePort{Name: "metrics", Protocol: corev1.ProtocolTCP,
		Port: 9090, TargetPort: intstr.FromInt32(9090), NodePort: 30090})
	inc := NewIncremental()
	inc.Update(Input{Services: []*corev1.Service{before}, Node: node})
	old := inc.Port("ns/web/TCP")
	if old == nil {
		t.Fatal("no port ns/web/TCP")
	}
	_, _, changed := inc.Update(Input{Services: []*corev1.Service{after}, Node: node})
	want := map[string]bool{"ns/web/TCP": true, "ns/web:http/TCP": true, "ns/web:metrics/TCP": true}
	if !reflect.DeepEqual(changed, want) {
		t.Errorf("changed %v, want %v", changed, want)
	}
	if p := inc.Port("ns/web/TCP"); p != nil {
		t.Errorf("the unnamed port is still there: %+v", p)
	}
	named := inc.Port("ns/web:http/TCP")
	if named == nil || !reflect.DeepEqual(named.Frontends, old.Frontends) {
		t.Errorf("the named port %+v, want the unnamed one's frontends %v", named, old.Frontends)
	}
}

// TestIncrementalMatchesComputeOnRandomChanges drives Incremental through
// random sequences of changes (Services of every type coming, going and
// changing, their port named or not, slices moving between Services,
// the node's name and zone) and checks, after each, that it gives what
// Compute gives and that every service port that differs from the step
// before, or is gone, is among those reported changed.
func TestIncrementalMatchesComputeOnRandomChanges(t *testing.T) {
	for seed := uint64(0); seed < 1000; seed++ {
		r := rand.New(rand.NewPCG(seed, 0))
		inc := NewIncremental()
		svcs := map[string]*corev1.Service{}
		sls := map[string]*discoveryv1.EndpointSlice{}
		rv := 0
		nextRV := func() string {
			rv++
			if r.IntN(10) == 0 {
				return ""
			}
			return fmt.Sprint(rv)
		}
		node := NodeInfo{Name: "n1", Addresses: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}
		names := []string{"a", "b", "c"}
		mkSvc := func(name string) *corev1.Service {
			typ := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer}[r.IntN(3)]
			ip := fmt.Sprintf("10.96.0.%d", 1+r.IntN(3))
			s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: nextRV(),
				UID: types.UID(fmt.Sprint("u", r.IntN(2))), CreationTimestamp: metav1.NewTime(time.Unix(int64(r.IntN(3)), 0))},
				Spec: corev1.ServiceSpec{Type: typ, ClusterIP: ip, ClusterIPs: []string{ip}}}
			np := int32(0)
			if typ != corev1.ServiceTypeClusterIP {
				np = int32(30000 + r.IntN(2))
			}
			pn := []string{"", "http"}[r.IntN(2)]
			s.Spec.Ports = []corev1.ServicePort{{Name: pn, Port: int32(80 + r.IntN(2)), Protocol: corev1.ProtocolTCP, NodePort: np}}
			if r.IntN(3) == 0 {
				s.Spec.ExternalIPs = []string{fmt.Sprintf("10.96.0.%d", 1+r.IntN(3))}
			}
			if r.IntN(3) == 0 {
				s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			}
			if typ == corev1.ServiceTypeLoadBalancer {
				s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: fmt.Sprintf("10.96.0.%d", 1+r.IntN(3))}}
			}
			return s
		}
		mkSlice := func(name string) *discoveryv1.EndpointSlice {
			pn := []string{"", "http"}[r.IntN(2)]
			port := int32(8080)
			s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, ResourceVersion: nextRV(),
				Labels: map[string]string{discoveryv1.LabelServiceName: names[r.IntN(3)]}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Name: &pn, Port: &port}}}
			if r.IntN(5) == 0 {
				s.Labels = nil
			}
			for i := 0; i < r.IntN(3); i++ {
				ready := r.IntN(2) == 0
				nn := []string{"n1", "n2"}[r.IntN(2)]
				s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.244.0.%d", 1+r.IntN(3))},
					NodeName: &nn, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
			}
			return s
		}
		prevState := map[string]Service{}
		for step := 0; step < 30; step++ {
			switch r.IntN(6) {
			case 0:
				n := names[r.IntN(3)]
				svcs[n] = mkSvc(n)
			case 1:
				delete(svcs, names[r.IntN(3)])
			case 2, 3:
				n := fmt.Sprint("s", r.IntN(4))
				sls[n] = mkSlice(n)
			case 4:
				delete(sls, fmt.Sprint("s", r.IntN(4)))
			case 5:
				if r.IntN(2) == 0 {
					node.Name = []string{"n1", "n2"}[r.IntN(2)]
				} else {
					node.Zone = []string{"", "z"}[r.IntN(2)]
				}
			}
			var in Input
			in.Node = node
			for _, n := range names {
				if s := svcs[n]; s != nil {
					in.Services = append(in.Services, s)
				}
			}
			r.Shuffle(len(in.Services), func(i, j int) { in.Services[i], in.Services[j] = in.Services[j], in.Services[i] })
			for i := 0; i < 4; i++ {
				if s := sls[fmt.Sprint("s", i)]; s != nil {
					in.Slices = append(in.Slices, s)
				}
			}
			r.Shuffle(len(in.Slices), func(i, j int) { in.Slices[i], in.Slices[j] = in.Slices[j], in.Slices[i] })
			want, _ := Compute(in)
			got, _, changed := inc.Update(in)
			cur := map[string]Service{}
			for _, sv := range got.Services {
				cur[sv.Key()] = sv
			}
			for k, sv := range cur {
				if p, ok := prevState[k]; (!ok || !reflect.DeepEqual(p, deepCopyService(sv))) && !changed[k] {
					t.Fatalf("seed %d step %d: %s differs but not in changed\n prev %+v\n cur  %+v", seed, step, k, prevState[k], sv)
				}
			}
			for k := range prevState {
				if _, ok := cur[k]; !ok && !changed[k] {
					t.Fatalf("seed %d step %d: %s gone but not in changed", seed, step, k)
				}
			}
			prevState = map[string]Service{}
			for k, sv := range cur {
				prevState[k] = deepCopyService(sv)
			}
			if len(got.Services) == 0 && len(want.Services) == 0 {
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d step %d: differ\n got %+v\nwant %+v", seed, step, got, want)
			}
		}
	}
}

// deepCopyService copies s with the slices it shares with the state it
// came from.
func deepCopyService(s Service) Service {
	s.Frontends = append([]Frontend(nil), s.Frontends...)
	s.Endpoints = append([]Endpoint(nil), s.Endpoints...)
	s.ClusterSet = append([]Endpoint(nil), s.ClusterSet...)
	s.LocalSet = append([]Endpoint(nil), s.LocalSet...)
	s.SourceRanges = append([]netip.Prefix(nil), s.SourceRanges...)
	return s
}
