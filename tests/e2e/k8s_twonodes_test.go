package e2e

import (
	"encoding/json"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/tests/topology"
)

// TestK8sTwoNodesAgree: agents on two nodes, watching the same API server,
// program identical Maglev tables, so a flow reaches the same endpoint
// whichever node the router sends it to.
func TestK8sTwoNodesAgree(t *testing.T) {
	c := newK8sCluster(t, 2, 2)
	nodes := []*k8sNode{c.edge, c.node2}
	for _, n := range nodes {
		n.start(t)
	}
	svc := newService("shared", "10.96.50.1", lineAndDNS(30150, 30151), withType(corev1.ServiceTypeLoadBalancer))
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.50", false)}
	c.createService(t, svc)
	endpoints := append(append([]*topology.Pod{}, c.pods...), c.local...)
	c.putSlice(t, newSlice(svc, "shared-1", lineAndDNSPorts(), readyEps(endpoints...)))
	var lineBes, dnsBes []string
	for _, p := range endpoints {
		lineBes = append(lineBes, be(p, topology.LinePort))
		dnsBes = append(dnsBes, be(p, topology.UDPPort))
	}
	vip, vipUDP := fe("203.0.113.50", 9000, protoTCP), fe("203.0.113.50", 53, protoUDP)
	for _, n := range nodes {
		n.waitProgrammed(t, programmed{vip: lineBes, vipUDP: dnsBes, fe(n.node.Addr, 30150, protoTCP): lineBes})
	}

	t.Run("SameTables", func(t *testing.T) {
		for _, name := range []string{vip, vipUDP} {
			edgeSlots, edgeIDs := maglevSlots(t, c.edge, name)
			node2Slots, node2IDs := maglevSlots(t, c.node2, name)
			if len(edgeSlots) == 0 || !slices.Equal(edgeSlots, node2Slots) {
				t.Errorf("%s: the Maglev tables differ between the nodes (%d and %d slots)", name, len(edgeSlots), len(node2Slots))
			} else if !slices.Equal(edgeIDs, node2IDs) {
				t.Errorf("%s: both tables send every slot to the same backend, but not byte for byte: the backend ids differ", name)
			}
		}
		// What the CLI shows agrees too.
		var shown [2]string
		for i, n := range nodes {
			out, err := n.cli("maglev", "-o", "json", "default/shared")
			if err != nil {
				t.Fatal(err)
			}
			var reports []inspect.TableReport
			if err := json.Unmarshal([]byte(out), &reports); err != nil {
				t.Fatalf("xdplb maglev: %v", err)
			}
			for i := range reports {
				// Numbered per node; NodePorts are on each node's address.
				reports[i].TableID, reports[i].Frontends = 0, nil
				for j := range reports[i].Backends {
					reports[i].Backends[j].ID, reports[i].Backends[j].Local = 0, false
				}
			}
			b, _ := json.Marshal(reports)
			shown[i] = string(b)
		}
		if shown[0] != shown[1] {
			t.Errorf("xdplb maglev differs between the nodes:\nedge:  %s\nnode2: %s", shown[0], shown[1])
		}
	})

	t.Run("FlowsReachTheSameEndpointThroughEitherNode", func(t *testing.T) {
		// via routes the LoadBalancer IP through a node, as a router
		// would pick one.
		via := func(n *k8sNode) {
			t.Helper()
			if _, err := c.topo.Client.IP("route", "replace", "203.0.113.50/32", "via", n.node.Addr.String()); err != nil {
				t.Fatal(err)
			}
		}
		// seen is the client address an endpoint sees through node n:
		// the client's own for an endpoint on n, else n's (SNAT).
		seen := func(n *k8sNode, p *topology.Pod) string {
			if p.Node == n.node {
				return topology.ClientAddr.String()
			}
			return n.node.Addr.String()
		}
		const flows = 12
		answers := map[uint16][]answer{}
		for _, n := range nodes {
			via(n)
			for port := uint16(44000); port < 44000+flows; port++ {
				src := netip.AddrPortFrom(topology.ClientAddr, port)
				predicted := findPodByBackend(endpoints, n.lookup(t, protoTCP, src, "203.0.113.50:9000").Backend)
				if predicted == nil {
					t.Fatalf("port %d via %s: xdplb lookup names no endpoint", port, n.node.Name)
				}
				a, err := hello(c.topo.Client, src, "203.0.113.50:9000")
				wantAnswer(t, "port "+src.String()+" via "+n.node.Name, a, err, seen(n, predicted), predicted)
				answers[port] = append(answers[port], a)
			}
		}
		reached := map[string]bool{}
		for port, as := range answers {
			if as[0].Pod != as[1].Pod {
				t.Errorf("the flow from port %d reached %s via the edge and %s via node2", port, as[0].Pod, as[1].Pod)
			}
			reached[as[0].Pod] = true
		}
		if len(reached) < 2 {
			t.Errorf("%d flows all reached %v: the comparison says little", flows, reached)
		}

		// One UDP flow moved from one node to the other mid-way keeps
		// its endpoint.
		via(c.edge)
		u := dialUDP(t, c.topo.Client, netip.AddrPortFrom(topology.ClientAddr, 45000), "203.0.113.50:53")
		before, err := u.ask(time.Second)
		if err != nil {
			t.Fatal(err)
		}
		via(c.node2)
		after, err := u.ask(time.Second)
		if err != nil || after.Pod != before.Pod {
			t.Errorf("a UDP flow moved from the edge to node2 went from %s to %s (%v)", before, after, err)
		}
	})
}

// maglevSlots reads the Maglev table of a frontend from the node's pins:
// the backend address of every slot, and the raw backend ids.
func maglevSlots(t *testing.T, n *k8sNode, frontend string) (addrs []string, ids []uint32) {
	t.Helper()
	dp, err := inspect.Open(n.bpffs)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Maps().Close()
	fes, err := inspect.Services(dp)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(fes, func(f inspect.Frontend) bool { return f.Frontend == frontend })
	if i < 0 || fes[i].TableID == 0 {
		t.Fatalf("%s: no Maglev table for %s", n.node.Name, frontend)
	}
	ids, err = dp.Table(fes[i].TableID)
	if err != nil {
		t.Fatal(err)
	}
	bes, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		b, ok := bes[id]
		if !ok {
			t.Fatalf("%s: slot names backend id %d, which does not exist", n.node.Name, id)
		}
		addrs = append(addrs, b.String())
	}
	return addrs, ids
}

// findPodByBackend returns the pod of a backend address ("10.244.2.10:9000").
func findPodByBackend(pods []*topology.Pod, backend string) *topology.Pod {
	host, _, _ := net.SplitHostPort(backend)
	for _, p := range pods {
		if p.Addr.String() == host {
			return p
		}
	}
	return nil
}
