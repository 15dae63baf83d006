package e2e

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// TestK8sFrontends: every kind of frontend a Service has, created through
// the API after the agent started, reaches its endpoints with the client
// address each path must preserve or translate; objects the agent must
// ignore are ignored; a Service without endpoints refuses; an agent with
// --service-proxy-name serves exactly the Services labelled with it.
func TestK8sFrontends(t *testing.T) {
	c := newK8sCluster(t, 2, 2)
	remote1, remote2 := c.pods[0], c.pods[1]
	client, local := c.local[0], c.local[1]
	c.edge.start(t)

	// Ignored objects first: by the time the Services written after them
	// are programmed, the agent has seen these.
	for _, svc := range []*corev1.Service{
		newService("headless-label", "10.96.10.4", lineAndDNS(0, 0), withLabel(model.LabelHeadless, "")),
		newService("other-proxy", "10.96.10.5", lineAndDNS(0, 0), withLabel(model.LabelServiceProxyName, "other")),
		newService("headless", "None", lineAndDNS(0, 0)),
	} {
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, svc.Name+"-1", lineAndDNSPorts(), readyEps(remote1)))
	}

	// web: a LoadBalancer with TCP 9000, TCP 53 and UDP 53 (the same
	// port number on both protocols), HTTP on 80; one ingress IP, one
	// ingress in ipMode Proxy, an externalIP.
	web := newService("web", "10.96.10.1", []corev1.ServicePort{
		svcPort("lines", protoTCP, 9000, topology.LinePort, 30090),
		svcPort("dns-tcp", protoTCP, 53, topology.LinePort, 30054),
		svcPort("dns", protoUDP, 53, topology.UDPPort, 30053),
		svcPort("http", protoTCP, 80, topology.HTTPPort, 30080),
	}, withType(corev1.ServiceTypeLoadBalancer), withExternalIPs("203.0.113.50"))
	web.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.10", false), lbIngress("203.0.113.11", true)}
	c.createService(t, web)
	c.putSlice(t, newSlice(web, "web-1", []discoveryv1.EndpointPort{
		epPort("lines", protoTCP, topology.LinePort), epPort("dns-tcp", protoTCP, topology.LinePort),
		epPort("dns", protoUDP, topology.UDPPort), epPort("http", protoTCP, topology.HTTPPort),
	}, readyEps(remote1, remote2)))

	// named: Service port "web" targets the pods' named port "app",
	// which is 9000 in one pod and 9100 in the other: their slices carry
	// the numbers under the Service port's name.
	serveLines(t, local, 9100)
	named := newService("named", "10.96.10.2", []corev1.ServicePort{svcPort("web", protoTCP, 80, "app", 0)})
	c.createService(t, named)
	c.putSlice(t, newSlice(named, "named-a", []discoveryv1.EndpointPort{epPort("web", protoTCP, topology.LinePort)}, readyEps(remote1)))
	c.putSlice(t, newSlice(named, "named-b", []discoveryv1.EndpointPort{epPort("web", protoTCP, 9100)}, readyEps(local)))

	// empty: no endpoints at all.
	empty := newService("empty", "10.96.10.3", lineAndDNS(30083, 30084), withType(corev1.ServiceTypeNodePort))
	c.createService(t, empty)
	c.putSlice(t, newSlice(empty, "empty-1", lineAndDNSPorts(), nil))

	// local-web: HTTP on a local endpoint behind a LoadBalancer IP.
	localWeb := newService("local-web", "10.96.10.6", []corev1.ServicePort{svcPort("http", protoTCP, 80, topology.HTTPPort, 30085)},
		withType(corev1.ServiceTypeLoadBalancer))
	localWeb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.12", false)}
	c.createService(t, localWeb)
	c.putSlice(t, newSlice(localWeb, "local-web-1", []discoveryv1.EndpointPort{epPort("http", protoTCP, topology.HTTPPort)}, readyEps(local)))

	lineBes := []string{be(remote1, topology.LinePort), be(remote2, topology.LinePort)}
	dnsBes := []string{be(remote1, topology.UDPPort), be(remote2, topology.UDPPort)}
	edge := topology.EdgeAddr
	c.edge.waitProgrammed(t, programmed{
		fe("10.96.10.1", 9000, protoTCP):   lineBes,
		fe("10.96.10.1", 53, protoTCP):     lineBes,
		fe("10.96.10.1", 53, protoUDP):     dnsBes,
		fe(edge, 30090, protoTCP):          lineBes,
		fe(edge, 30054, protoTCP):          lineBes,
		fe(edge, 30053, protoUDP):          dnsBes,
		fe("203.0.113.10", 9000, protoTCP): lineBes,
		fe("203.0.113.10", 53, protoTCP):   lineBes,
		fe("203.0.113.10", 53, protoUDP):   dnsBes,
		fe("203.0.113.50", 9000, protoTCP): lineBes,
		fe("203.0.113.50", 53, protoUDP):   dnsBes,
		fe("203.0.113.11", 9000, protoTCP): notProgrammed,
		fe("10.96.10.2", 80, protoTCP):     {be(remote1, topology.LinePort), be(local, 9100)},
		fe("10.96.10.3", 9000, protoTCP):   noBackends,
		fe(edge, 30083, protoTCP):          noBackends,
		fe("203.0.113.12", 80, protoTCP):   {be(local, topology.HTTPPort)},
		fe("10.96.10.4", 9000, protoTCP):   notProgrammed,
		fe("10.96.10.5", 9000, protoTCP):   notProgrammed,
	})

	t.Run("EveryFrontendReachesTheEndpoints", func(t *testing.T) {
		viaEdge, fromPod := edge.String(), client.Addr.String()
		for _, tc := range []struct {
			what  string
			from  *netns.NS
			dst   string
			isUDP bool
			seen  string // the client address the pod must see
		}{
			{"ClusterIP from a pod", client.NS, "10.96.10.1:9000", false, fromPod},
			{"ClusterIP, TCP 53, from a pod", client.NS, "10.96.10.1:53", false, fromPod},
			{"ClusterIP, UDP 53, from a pod", client.NS, "10.96.10.1:53", true, fromPod},
			{"NodePort from outside", c.topo.Client, hostPort(edge, 30090), false, viaEdge},
			{"NodePort, TCP 53's, from outside", c.topo.Client, hostPort(edge, 30054), false, viaEdge},
			{"NodePort, UDP 53's, from outside", c.topo.Client, hostPort(edge, 30053), true, viaEdge},
			{"NodePort from a pod of the node", client.NS, hostPort(edge, 30090), false, fromPod},
			{"LoadBalancer IP", c.topo.Client, "203.0.113.10:9000", false, viaEdge},
			{"LoadBalancer IP, TCP 53", c.topo.Client, "203.0.113.10:53", false, viaEdge},
			{"LoadBalancer IP, UDP 53", c.topo.Client, "203.0.113.10:53", true, viaEdge},
			{"externalIP", c.topo.Client, "203.0.113.50:9000", false, viaEdge},
			{"externalIP, UDP", c.topo.Client, "203.0.113.50:53", true, viaEdge},
		} {
			got := map[string]bool{}
			for i := 0; i < 20; i++ {
				var a answer
				var err error
				if tc.isUDP {
					a, err = askUDP(tc.from, tc.dst)
				} else {
					a, err = hello(tc.from, netip.AddrPort{}, tc.dst)
				}
				wantAnswer(t, tc.what, a, err, tc.seen, remote1, remote2)
				got[a.Pod] = true
			}
			if len(got) != 2 {
				t.Errorf("%s: 20 flows reached only %v of both endpoints", tc.what, got)
			}
		}
	})

	t.Run("APodReusesItsPortForAnotherFrontend", func(t *testing.T) {
		// A pod's kernel may give the port of a closed connection to a
		// connection to another address; when both frontends choose the
		// same backend, the backend sees its old connection's tuple
		// reused, and the new connection must go through.
		viaLB, viaNodePort := "203.0.113.10:9000", hostPort(edge, 30090)
		for port := uint16(41000); port < 41020; port++ {
			src := netip.AddrPortFrom(client.Addr, port)
			first, second := c.edge.lookup(t, protoTCP, src, viaLB), c.edge.lookup(t, protoTCP, src, viaNodePort)
			if first.Backend == "" || first.Backend != second.Backend {
				continue
			}
			a, err := hello(client.NS, src, viaLB)
			wantAnswer(t, "LoadBalancer IP from "+src.String(), a, err, client.Addr.String(), remote1, remote2)
			a, err = hello(client.NS, src, viaNodePort)
			wantAnswer(t, "then NodePort from the same port", a, err, client.Addr.String(), remote1, remote2)
			if want := podByAddr(c.pods, first.Backend); err == nil && (want == nil || a.Pod != want.Name) {
				t.Errorf("NodePort from %s reached %s, want %s", src, a.Pod, first.Backend)
			}
			return
		}
		t.Fatal("no source port in 41000-41019 that both frontends send to one backend")
	})

	t.Run("IngressInProxyModeIsNotCaptured", func(t *testing.T) {
		// The external load balancer handles such an address: the node
		// must leave it alone.
		if l := c.edge.lookup(t, protoTCP, netip.AddrPortFrom(topology.ClientAddr, 40000), "203.0.113.11:9000"); l.Service != "" {
			t.Errorf("the ipMode Proxy ingress is a frontend: %+v", l)
		}
		if a, err := hello(c.topo.Client, netip.AddrPort{}, "203.0.113.11:9000"); err == nil {
			t.Errorf("the ipMode Proxy ingress reached %s through the node", a)
		}
	})

	t.Run("NamedPortsResolvePerSlice", func(t *testing.T) {
		got := spread(t, client.NS, netip.Addr{}, "10.96.10.2:80", 16, client.Addr.String())
		if got[remote1.Name] == 0 || got[local.Name] == 0 || len(got) != 2 {
			t.Errorf("answers %v, want both %s (port 9000) and %s (port 9100)", got, remote1.Name, local.Name)
		}
	})

	t.Run("NoEndpointsRefuses", func(t *testing.T) {
		wantRefused(t, "ClusterIP", client.NS, "10.96.10.3:9000")
		wantRefused(t, "NodePort", c.topo.Client, hostPort(edge, 30083))
		// A connected UDP socket sees the ICMP port unreachable.
		u := dialUDP(t, c.topo.Client, netip.AddrPort{}, hostPort(edge, 30084))
		if a, err := u.ask(2 * time.Second); outcome(err) != "refused" {
			t.Errorf("UDP NodePort: %s %v, want port unreachable", outcome(err), a)
		}
	})

	t.Run("IgnoredServices", func(t *testing.T) {
		for _, dst := range []string{"10.96.10.4:9000", "10.96.10.5:9000"} {
			if a, err := hello(client.NS, netip.AddrPort{}, dst); err == nil {
				t.Errorf("%s (a Service the agent must ignore) reached %s", dst, a)
			}
		}
	})

	// Packets that do not fit in the headers the TC programs pull: an
	// HTTP request from a pod, a large datagram from a pod, an HTTP
	// response of a local endpoint to an outside client.
	t.Run("FullSizePacketsThroughTC", func(t *testing.T) {
		a, err := httpGet(client.NS, "10.96.10.1:80")
		wantAnswer(t, "HTTP from a pod to a ClusterIP", a, err, client.Addr.String(), remote1, remote2)
		u, err := topology.UDPAsk(client.NS, "10.96.10.1:53", []byte(strings.Repeat("q", 1000)))
		if err != nil || u.Size != 1000 {
			t.Errorf("1000-byte datagram from a pod to a ClusterIP: %+v, %v", u, err)
		}
		a, err = httpGet(c.topo.Client, "203.0.113.12:80")
		wantAnswer(t, "HTTP from outside to a local endpoint", a, err, topology.ClientAddr.String(), local)
	})

	t.Run("ServiceProxyName", func(t *testing.T) {
		// With --service-proxy-name other, the agent serves other-proxy
		// and nothing unlabelled; the headless label still excludes.
		c.edge.restart(t, "--service-proxy-name", "other")
		c.edge.waitProgrammed(t, programmed{
			fe("10.96.10.5", 9000, protoTCP):   {be(remote1, topology.LinePort)},
			fe("10.96.10.1", 9000, protoTCP):   notProgrammed,
			fe("203.0.113.10", 9000, protoTCP): notProgrammed,
			fe(edge, 30090, protoTCP):          notProgrammed,
			fe("10.96.10.4", 9000, protoTCP):   notProgrammed,
		})
		a, err := hello(client.NS, netip.AddrPort{}, "10.96.10.5:9000")
		wantAnswer(t, "the Service labelled with our proxy name", a, err, client.Addr.String(), remote1)
		if a, err := hello(client.NS, netip.AddrPort{}, "10.96.10.1:9000"); err == nil {
			t.Errorf("an unlabelled Service is still served by an agent with a proxy name: reached %s", a)
		}
	})
}
