package e2e

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// TestK8sServiceChanges: changing Services and EndpointSlices through the
// API changes what connections reach: type changes, ports added, renumbered
// and removed, a Service deleted and created again, an endpoint moving
// between the slices of its Service, and a UDP server pod replaced by
// another.
func TestK8sServiceChanges(t *testing.T) {
	c := newK8sCluster(t, 3, 1)
	remote1, remote2, remote3 := c.pods[0], c.pods[1], c.pods[2]
	client := c.local[0]
	edge := topology.EdgeAddr
	c.edge.start(t)

	// reaches reports whether a TCP connection from ns to dst is served
	// by want, seen as from; it fails the test on any other answer.
	reaches := func(t *testing.T, what string, ns *netns.NS, dst, from string, want *topology.Pod) bool {
		t.Helper()
		a, err := hello(ns, netip.AddrPort{}, dst)
		if err != nil {
			return false
		}
		wantAnswer(t, what, a, nil, from, want)
		return true
	}

	t.Run("TypeChanges", func(t *testing.T) {
		svc := newService("typed", "10.96.20.1", lineAndDNS(0, 0))
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, "typed-1", lineAndDNSPorts(), readyEps(remote1)))
		cip, np, lb := fe("10.96.20.1", 9000, protoTCP), fe(edge, 30100, protoTCP), fe("203.0.113.20", 9000, protoTCP)
		r1 := []string{be(remote1, topology.LinePort)}
		for _, step := range []struct {
			typ     corev1.ServiceType
			ingress bool // the status names the LoadBalancer IP
			np, lb  bool // whether the NodePort and the LoadBalancer IP serve
		}{
			{corev1.ServiceTypeClusterIP, false, false, false},
			{corev1.ServiceTypeNodePort, false, true, false},
			{corev1.ServiceTypeLoadBalancer, true, true, true},
			// The API server drops the load balancer status with the
			// type (and refuses one for other types).
			{corev1.ServiceTypeClusterIP, false, false, false},
		} {
			switch step.typ {
			case corev1.ServiceTypeClusterIP:
				c.updateService(t, "typed", withType(step.typ))
			default:
				c.updateService(t, "typed", withType(step.typ), withNodePorts(30100, 30101))
			}
			if step.ingress {
				c.setIngress(t, "typed", lbIngress("203.0.113.20", false))
			}
			want := programmed{cip: r1, np: notProgrammed, lb: notProgrammed}
			if step.np {
				want[np] = r1
			}
			if step.lb {
				want[lb] = r1
			}
			c.edge.waitProgrammed(t, want)
			for _, p := range []struct {
				what  string
				ns    *netns.NS
				dst   string
				from  string
				serve bool
			}{
				{"ClusterIP", client.NS, "10.96.20.1:9000", client.Addr.String(), true},
				{"NodePort", c.topo.Client, hostPort(edge, 30100), edge.String(), step.np},
				{"LoadBalancer IP", c.topo.Client, "203.0.113.20:9000", edge.String(), step.lb},
			} {
				if got := reaches(t, p.what, p.ns, p.dst, p.from, remote1); got != p.serve {
					t.Errorf("type %s: %s served: %v, want %v", step.typ, p.what, got, p.serve)
				}
			}
		}
	})

	t.Run("PortsAddedRenumberedRemoved", func(t *testing.T) {
		linesOnly := []corev1.ServicePort{svcPort("lines", protoTCP, 9000, topology.LinePort, 0)}
		svc := newService("ports", "10.96.20.2", linesOnly)
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, "ports-1", []discoveryv1.EndpointPort{epPort("lines", protoTCP, topology.LinePort)}, readyEps(remote1)))
		tcp9000, tcp9001, udp53 := fe("10.96.20.2", 9000, protoTCP), fe("10.96.20.2", 9001, protoTCP), fe("10.96.20.2", 53, protoUDP)
		lineBes, dnsBes := []string{be(remote1, topology.LinePort)}, []string{be(remote1, topology.UDPPort)}
		for _, step := range []struct {
			name  string
			ports []corev1.ServicePort
			want  programmed
		}{
			{"one port", linesOnly, programmed{tcp9000: lineBes, udp53: notProgrammed}},
			{"UDP port added", lineAndDNS(0, 0), programmed{tcp9000: lineBes, udp53: dnsBes}},
			{"TCP port renumbered", []corev1.ServicePort{
				svcPort("lines", protoTCP, 9001, topology.LinePort, 0), svcPort("dns", protoUDP, 53, topology.UDPPort, 0),
			}, programmed{tcp9000: notProgrammed, tcp9001: lineBes, udp53: dnsBes}},
			{"TCP port removed", []corev1.ServicePort{svcPort("dns", protoUDP, 53, topology.UDPPort, 0)},
				programmed{tcp9000: notProgrammed, tcp9001: notProgrammed, udp53: dnsBes}},
		} {
			c.updateService(t, "ports", withPorts(step.ports...))
			c.putSlice(t, newSlice(svc, "ports-1", lineAndDNSPorts(), readyEps(remote1)))
			c.edge.waitProgrammed(t, step.want)
			for _, port := range []int{9000, 9001} {
				dst := hostPort("10.96.20.2", port)
				served := step.want[fe("10.96.20.2", port, protoTCP)] != nil
				if got := reaches(t, step.name+": "+dst, client.NS, dst, client.Addr.String(), remote1); got != served {
					t.Errorf("%s: TCP %s served: %v, want %v", step.name, dst, got, served)
				}
			}
			if step.want[udp53] != nil {
				a, err := askUDP(client.NS, "10.96.20.2:53")
				wantAnswer(t, step.name+": UDP 53", a, err, client.Addr.String(), remote1)
			} else if a, err := dialUDP(t, client.NS, netip.AddrPort{}, "10.96.20.2:53").ask(500 * time.Millisecond); err == nil {
				t.Errorf("%s: UDP 53 answered by %s before the port exists", step.name, a)
			}
		}
	})

	t.Run("DeletedAndCreatedAgain", func(t *testing.T) {
		svc := newService("phoenix", "10.96.20.3", lineAndDNS(30102, 30103), withType(corev1.ServiceTypeNodePort))
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, "phoenix-1", lineAndDNSPorts(), readyEps(remote1)))
		cip, np := fe("10.96.20.3", 9000, protoTCP), fe(edge, 30102, protoTCP)
		c.edge.waitProgrammed(t, programmed{cip: {be(remote1, topology.LinePort)}, np: {be(remote1, topology.LinePort)}})
		a, err := hello(c.topo.Client, netip.AddrPort{}, hostPort(edge, 30102))
		wantAnswer(t, "NodePort before the deletion", a, err, edge.String(), remote1)

		c.deleteService(t, "phoenix")
		c.deleteSlice(t, "phoenix-1")
		c.edge.waitProgrammed(t, programmed{cip: notProgrammed, np: notProgrammed})
		if reaches(t, "ClusterIP of the deleted Service", client.NS, "10.96.20.3:9000", client.Addr.String(), remote1) {
			t.Errorf("the ClusterIP of a deleted Service is still served")
		}
		if reaches(t, "NodePort of the deleted Service", c.topo.Client, hostPort(edge, 30102), edge.String(), remote1) {
			t.Errorf("the NodePort of a deleted Service is still served")
		}

		svc = newService("phoenix", "10.96.20.3", lineAndDNS(30102, 30103), withType(corev1.ServiceTypeNodePort))
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, "phoenix-2", lineAndDNSPorts(), readyEps(remote2)))
		c.edge.waitProgrammed(t, programmed{cip: {be(remote2, topology.LinePort)}, np: {be(remote2, topology.LinePort)}})
		a, err = hello(client.NS, netip.AddrPort{}, "10.96.20.3:9000")
		wantAnswer(t, "ClusterIP of the new Service", a, err, client.Addr.String(), remote2)
		a, err = hello(c.topo.Client, netip.AddrPort{}, hostPort(edge, 30102))
		wantAnswer(t, "NodePort of the new Service", a, err, edge.String(), remote2)
	})

	t.Run("EndpointMovesBetweenSlices", func(t *testing.T) {
		svc := newService("moving", "10.96.20.4", lineAndDNS(30104, 30105), withType(corev1.ServiceTypeLoadBalancer))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.21", false)}
		c.createService(t, svc)
		ports := lineAndDNSPorts()
		c.putSlice(t, newSlice(svc, "moving-a", ports, readyEps(remote1, remote2)))
		c.putSlice(t, newSlice(svc, "moving-b", ports, readyEps(remote3)))
		vip := fe("203.0.113.21", 9000, protoTCP)
		all := []string{be(remote1, topology.LinePort), be(remote2, topology.LinePort), be(remote3, topology.LinePort)}
		c.edge.waitProgrammed(t, programmed{vip: all})

		// A long-lived connection to the endpoint that moves: pick a
		// client port Maglev sends to it.
		var conn *liveConn
		for port := uint16(42000); port < 42100 && conn == nil; port++ {
			src := netip.AddrPortFrom(topology.ClientAddr, port)
			if l := c.edge.lookup(t, protoTCP, src, "203.0.113.21:9000"); l.Backend == be(remote2, topology.LinePort) {
				conn = openLine(t, c.topo.Client, src, "203.0.113.21:9000")
			}
		}
		if conn == nil {
			t.Fatalf("no client port in 42000-42099 maps to %s", remote2.Name)
		}
		if conn.first.Pod != remote2.Name {
			t.Fatalf("the connection reached %s, xdplb lookup said %s", conn.first, remote2.Name)
		}

		// In both slices for a moment: one endpoint, not two.
		c.putSlice(t, newSlice(svc, "moving-b", ports, readyEps(remote3, remote2)))
		c.barrier(t, c.edge)
		c.edge.waitProgrammed(t, programmed{vip: all})
		f := c.edge.waitFrontend(t, vip, func(inspect.Frontend) bool { return true })
		for _, b := range f.Backends {
			if 10*b.Slots > 4*f.TableSize {
				t.Errorf("%s holds %d of %d Maglev slots while listed in two slices: counted twice", b.Address, b.Slots, f.TableSize)
			}
		}
		conn.still(t, "listed in both slices")

		// Gone from the first slice: it stays, with its connections.
		c.putSlice(t, newSlice(svc, "moving-a", ports, readyEps(remote1)))
		c.barrier(t, c.edge)
		c.edge.waitProgrammed(t, programmed{vip: all})
		conn.still(t, "moved to the other slice")
		for port := uint16(43000); port < 43012; port++ {
			src := netip.AddrPortFrom(topology.ClientAddr, port)
			l := c.edge.lookup(t, protoTCP, src, "203.0.113.21:9000")
			a, err := hello(c.topo.Client, src, "203.0.113.21:9000")
			if p := findPod(c.pods, a.Pod); err != nil || p == nil || be(p, topology.LinePort) != l.Backend {
				t.Fatalf("after the move, a connection from port %d reached %s (%v); xdplb lookup says %s", port, a, err, l.Backend)
			}
		}
	})

	t.Run("UDPServerPodReplaced", func(t *testing.T) {
		newPod := func(name string) (*topology.Pod, *topology.Server) {
			p, err := c.topo.AddPod(c.topo.Node2, name)
			if err != nil {
				t.Fatal(err)
			}
			srv, err := p.StartServer()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			return p, srv
		}
		podA, srvA := newPod("cyc-a")
		svc := newService("resolver", "10.96.20.5", lineAndDNS(30106, 30107), withType(corev1.ServiceTypeLoadBalancer))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.22", false)}
		c.createService(t, svc)
		slice := func(pods ...*topology.Pod) *discoveryv1.EndpointSlice {
			return newSlice(svc, "resolver-1", lineAndDNSPorts(), readyEps(pods...))
		}
		c.putSlice(t, slice(podA))
		vip, cip := fe("203.0.113.22", 53, protoUDP), fe("10.96.20.5", 53, protoUDP)
		c.edge.waitProgrammed(t, programmed{vip: {be(podA, topology.UDPPort)}, cip: {be(podA, topology.UDPPort)}})

		// One socket each, from outside and from a pod: one flow each,
		// for the whole test.
		sockets := []struct {
			what string
			u    *udpSocket
			from string
		}{
			{"from outside", dialUDP(t, c.topo.Client, netip.AddrPort{}, "203.0.113.22:53"), edge.String()},
			{"from a pod", dialUDP(t, client.NS, netip.AddrPort{}, "10.96.20.5:53"), client.Addr.String()},
		}
		check := func(when string, want *topology.Pod) {
			t.Helper()
			for _, s := range sockets {
				// The first datagram must be answered: no waiting for
				// a conntrack entry to expire.
				a, err := s.u.ask(time.Second)
				wantAnswer(t, when+", "+s.what, a, err, s.from, want)
			}
		}
		check("first", podA)

		// Scaled to zero: refused at once.
		c.putSlice(t, slice())
		c.edge.waitProgrammed(t, programmed{vip: noBackends, cip: noBackends})
		for _, s := range sockets {
			if a, err := s.u.ask(time.Second); outcome(err) != "refused" {
				t.Errorf("no endpoints, %s: %s %v, want port unreachable", s.what, outcome(err), a)
			}
		}

		// The pod is gone; its replacement has a new address.
		srvA.Close()
		podB, _ := newPod("cyc-b")
		c.putSlice(t, slice(podB))
		c.edge.waitProgrammed(t, programmed{vip: {be(podB, topology.UDPPort)}, cip: {be(podB, topology.UDPPort)}})
		check("scaled up again with a new pod", podB)

		// Replaced in one update while the old pod still answers.
		podC, _ := newPod("cyc-c")
		c.putSlice(t, slice(podC))
		c.edge.waitProgrammed(t, programmed{vip: {be(podC, topology.UDPPort)}, cip: {be(podC, topology.UDPPort)}})
		check("endpoint replaced", podC)
	})
}
