package model

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// hinted returns ep(addr, node, conds) with zone and node hints.
func hinted(addr, node, conds string, zones, nodes []string) discoveryv1.Endpoint {
	e := ep(addr, node, conds)
	if zones != nil || nodes != nil {
		e.Hints = &discoveryv1.EndpointHints{}
	}
	for _, z := range zones {
		e.Hints.ForZones = append(e.Hints.ForZones, discoveryv1.ForZone{Name: z})
	}
	for _, n := range nodes {
		e.Hints.ForNodes = append(e.Hints.ForNodes, discoveryv1.ForNode{Name: n})
	}
	return e
}

// TestTopologyHints: the cluster-wide set follows the slices' hints for
// this node's zone (or this node) when every endpoint has them and one
// names it, as kube-proxy does; otherwise it stays whole. The node-local
// set is not touched.
func TestTopologyHints(t *testing.T) {
	zone := func(zs ...string) []string { return zs }
	tests := []struct {
		name     string
		nodeZone string
		eps      []discoveryv1.Endpoint
		want     []string // ClusterSet
	}{
		{
			name:     "hints for this zone narrow the set",
			nodeZone: "zone-a",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), nil),
				hinted("10.0.2.1", "node-c", "RS", zone("zone-b"), nil),
				hinted("10.0.2.2", "node-c", "RS", zone("zone-b", "zone-a"), nil),
			},
			want: []string{"10.0.1.1:8080 RS", "10.0.2.2:8080 RS"},
		},
		{
			name:     "an endpoint without hints: all of them (hints are changing)",
			nodeZone: "zone-a",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), nil),
				hinted("10.0.2.1", "node-c", "RS", nil, nil),
			},
			want: []string{"10.0.1.1:8080 RS", "10.0.2.1:8080 RS"},
		},
		{
			name:     "no endpoint for this zone: all of them",
			nodeZone: "zone-c",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), nil),
				hinted("10.0.2.1", "node-c", "RS", zone("zone-b"), nil),
			},
			want: []string{"10.0.1.1:8080 RS", "10.0.2.1:8080 RS"},
		},
		{
			name: "node without a zone: all of them",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), nil),
				hinted("10.0.2.1", "node-c", "RS", zone("zone-b"), nil),
			},
			want: []string{"10.0.1.1:8080 RS", "10.0.2.1:8080 RS"},
		},
		{
			name:     "not-ready endpoints without hints do not count",
			nodeZone: "zone-a",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), nil),
				hinted("10.0.2.1", "node-c", "RS", zone("zone-b"), nil),
				hinted("10.0.2.9", "node-c", "S", nil, nil),
			},
			want: []string{"10.0.1.1:8080 RS"},
		},
		{
			name:     "node hints come first",
			nodeZone: "zone-a",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "RS", zone("zone-a"), []string{"node-b"}),
				hinted("10.0.1.2", "node-a", "RS", zone("zone-a"), []string{"node-a"}),
			},
			want: []string{"10.0.1.2:8080 RSL"},
		},
		{
			name:     "terminating fallback is not narrowed",
			nodeZone: "zone-a",
			eps: []discoveryv1.Endpoint{
				hinted("10.0.1.1", "node-b", "ST", zone("zone-b"), nil),
				hinted("10.0.2.1", "node-c", "ST", zone("zone-a"), nil),
			},
			want: []string{"10.0.1.1:8080 ST", "10.0.2.1:8080 ST"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode
			node.Zone = tc.nodeZone
			svc := newService("web", withType(corev1.ServiceTypeLoadBalancer), withIngress("203.0.113.7"))
			st, _ := Compute(Input{
				Services: []*corev1.Service{svc},
				Slices:   []*discoveryv1.EndpointSlice{newSlice("web", "web-1", httpPort, tc.eps...)},
				Node:     node,
			})
			if len(st.Services) != 1 {
				t.Fatalf("got %d service ports", len(st.Services))
			}
			s := &st.Services[0]
			equal(t, "cluster set", epStrings(s.ClusterSet), tc.want)
			// External frontends under policy Cluster use the same set.
			equal(t, "external set", epStrings(s.SetFor(LoadBalancer)), tc.want)
		})
	}
}

// A change of the node's zone recomputes every service port.
func TestZoneChangeRecomputes(t *testing.T) {
	svc := newService("web")
	slice := newSlice("web", "web-1", httpPort,
		hinted("10.0.1.1", "node-b", "RS", []string{"zone-a"}, nil),
		hinted("10.0.2.1", "node-c", "RS", []string{"zone-b"}, nil))
	var inc Incremental
	node := testNode
	node.Zone = "zone-a"
	in := Input{Services: []*corev1.Service{svc}, Slices: []*discoveryv1.EndpointSlice{slice}, Node: node}
	st, _, _ := inc.Update(in)
	equal(t, "zone-a", epStrings(st.Services[0].ClusterSet), []string{"10.0.1.1:8080 RS"})
	in.Node.Zone = "zone-b"
	st, _, changed := inc.Update(in)
	equal(t, "zone-b", epStrings(st.Services[0].ClusterSet), []string{"10.0.2.1:8080 RS"})
	if !changed[st.Services[0].Key()] {
		t.Errorf("the zone change did not mark %s changed: %v", st.Services[0].Key(), changed)
	}
}
