package model

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// FuzzCompute feeds arbitrary Service and EndpointSlice objects, as JSON, to
// Compute: it must not panic, and its output must hold together.
func FuzzCompute(f *testing.F) {
	f.Add(`{"metadata":{"name":"web","namespace":"default"},"spec":{"type":"LoadBalancer","clusterIP":"10.96.0.10",
		"clusterIPs":["10.96.0.10"],"externalIPs":["198.51.100.1"],"externalTrafficPolicy":"Local",
		"ports":[{"name":"http","port":80,"nodePort":30080,"protocol":"TCP"},{"port":53,"protocol":"UDP"}]},
		"status":{"loadBalancer":{"ingress":[{"ip":"203.0.113.7"},{"ip":"203.0.113.8","ipMode":"Proxy"}]}}}`,
		`{"metadata":{"name":"web-1","namespace":"default","labels":{"kubernetes.io/service-name":"web"},
		"annotations":{"xdplb.io/weight":"2"}},"addressType":"IPv4","ports":[{"name":"http","port":8080}],
		"endpoints":[{"addresses":["10.0.1.1"],"nodeName":"node-a"},{"addresses":["10.0.1.2"],"conditions":{"ready":false,"serving":true,"terminating":true}}]}`,
		"node-a")
	f.Add(`{"metadata":{"name":"x"},"spec":{"clusterIP":"None"}}`, `{}`, "")
	f.Add(`{"spec":{"clusterIPs":["fd00::1","10.0.0.1"],"sessionAffinity":"ClientIP","sessionAffinityConfig":{"clientIP":{}},
		"loadBalancerSourceRanges":[" 10.0.0.0/8","x"],"ports":[{"port":1,"protocol":"SCTP"},{"port":65535}]}}`,
		`{"metadata":{"labels":{"kubernetes.io/service-name":""}},"ports":[{}],"endpoints":[{}]}`, "n")
	f.Fuzz(func(t *testing.T, svcJSON, sliceJSON, nodeName string) {
		var svc corev1.Service
		var sl discoveryv1.EndpointSlice
		if json.Unmarshal([]byte(svcJSON), &svc) != nil || json.Unmarshal([]byte(sliceJSON), &sl) != nil {
			return
		}
		in := Input{
			Services: []*corev1.Service{&svc, nil},
			Slices:   []*discoveryv1.EndpointSlice{&sl, nil},
			Node: NodeInfo{Name: nodeName, Addresses: []netip.Addr{
				netip.MustParseAddr("192.168.0.10"), netip.MustParseAddr("fd00::10"),
			}},
		}
		st, probs := Compute(in)
		again, probs2 := Compute(in)
		if !reflect.DeepEqual(st, again) || !reflect.DeepEqual(probs, probs2) {
			t.Fatal("two runs differ")
		}
		seenKeys := map[string]bool{}
		seenFrontends := map[Frontend]bool{}
		for i := range st.Services {
			s := &st.Services[i]
			if seenKeys[s.Key()] {
				t.Fatalf("key %s twice", s.Key())
			}
			seenKeys[s.Key()] = true
			if s.Protocol != TCP && s.Protocol != UDP {
				t.Fatalf("%s: protocol %v", s.Key(), s.Protocol)
			}
			for _, fe := range s.Frontends {
				fe.Kind = 0 // one frontend per address, port and protocol
				if !fe.Addr.Is4() || seenFrontends[fe] || fe.Protocol != s.Protocol {
					t.Fatalf("%s: bad or repeated frontend %v", s.Key(), fe)
				}
				seenFrontends[fe] = true
			}
			for _, e := range s.Endpoints {
				if !e.Addr.Is4() || e.Port == 0 || e.Weight == 0 || e.Local != (nodeName != "" && e.NodeName == nodeName) {
					t.Fatalf("%s: bad endpoint %+v", s.Key(), e)
				}
			}
			for _, e := range s.ClusterSet {
				if !containsEndpoint(s.Endpoints, e) || !(e.Ready || e.Serving && e.Terminating) {
					t.Fatalf("%s: bad cluster endpoint %+v", s.Key(), e)
				}
			}
			for _, e := range s.LocalSet {
				if !containsEndpoint(s.Endpoints, e) || !e.Local {
					t.Fatalf("%s: bad local endpoint %+v", s.Key(), e)
				}
			}
			if s.SourceRangesSet != (len(svc.Spec.LoadBalancerSourceRanges) > 0) {
				t.Fatalf("%s: SourceRangesSet %v", s.Key(), s.SourceRangesSet)
			}
		}
	})
}

func containsEndpoint(eps []Endpoint, e Endpoint) bool {
	return slices.ContainsFunc(eps, func(x Endpoint) bool { return reflect.DeepEqual(x, e) })
}
