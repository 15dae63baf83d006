package model

import (
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"testing"

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
