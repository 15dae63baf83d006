package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// TestK8sEndpointSelection: which endpoints serve which traffic, as the
// Service and its EndpointSlices say through the API: terminating
// endpoints, externalTrafficPolicy and internalTrafficPolicy Local (with
// their fallback to terminating endpoints), session affinity and its
// timeout, loadBalancerSourceRanges.
func TestK8sEndpointSelection(t *testing.T) {
	c := newK8sCluster(t, 2, 3)
	remote1, remote2 := c.pods[0], c.pods[1]
	client, local1, local2 := c.local[0], c.local[1], c.local[2]
	edge, outside := topology.EdgeAddr, topology.ClientAddr.String()
	c.edge.start(t)

	// onlyFrom makes n connections from ns to dst and fails unless every
	// one is answered by want, having seen from.
	onlyFrom := func(t *testing.T, what string, ns *netns.NS, dst string, n int, from string, want *topology.Pod) {
		t.Helper()
		got := spread(t, ns, netip.Addr{}, dst, n, from)
		if got[want.Name] != n {
			t.Errorf("%s: answers %v, want all %d from %s", what, got, n, want.Name)
		}
	}
	// both makes 20 connections and fails unless both pods answered.
	both := func(t *testing.T, what string, ns *netns.NS, dst, from string, a, b *topology.Pod) {
		t.Helper()
		got := spread(t, ns, netip.Addr{}, dst, 20, from)
		if got[a.Name] == 0 || got[b.Name] == 0 || len(got) != 2 {
			t.Errorf("%s: answers %v, want both %s and %s", what, got, a.Name, b.Name)
		}
	}

	t.Run("TerminatingEndpoints", func(t *testing.T) {
		svc := newService("drain", "10.96.30.1", lineAndDNS(30110, 30111), withType(corev1.ServiceTypeLoadBalancer))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.30", false)}
		c.createService(t, svc)
		put := func(eps ...discoveryv1.Endpoint) { c.putSlice(t, newSlice(svc, "drain-1", lineAndDNSPorts(), eps)) }
		put(ep(remote1, epReady), ep(remote2, epReady))
		vip, r1, r2 := fe("203.0.113.30", 9000, protoTCP), be(remote1, topology.LinePort), be(remote2, topology.LinePort)
		c.edge.waitProgrammed(t, programmed{vip: {r1, r2}})
		conn := openLineTo(t, c, "203.0.113.30:9000", remote1)

		put(ep(remote1, epTerminating), ep(remote2, epReady))
		c.edge.waitProgrammed(t, programmed{vip: {r2}})
		conn.still(t, "its endpoint terminating")
		onlyFrom(t, "new connections while a ready endpoint exists", c.topo.Client, "203.0.113.30:9000", 12, edge.String(), remote2)

		put(ep(remote1, epTerminating), ep(remote2, epTerminating))
		c.edge.waitProgrammed(t, programmed{vip: {r1 + " terminating", r2 + " terminating"}})
		both(t, "new connections when every endpoint is terminating", c.topo.Client, "203.0.113.30:9000", edge.String(), remote1, remote2)
		conn.still(t, "every endpoint terminating")

		// A terminating endpoint that no longer passes its readiness
		// probe gets no new connections; it still drains its
		// established ones (kube-proxy keeps established flows).
		put(ep(remote1, epGone), ep(remote2, epTerminating))
		c.edge.waitProgrammed(t, programmed{vip: {r2 + " terminating"}})
		onlyFrom(t, "new connections when only one endpoint still serves", c.topo.Client, "203.0.113.30:9000", 8, edge.String(), remote2)
		conn.still(t, "its endpoint terminating and no longer serving")
	})

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		svc := newService("etp", "10.96.30.2", lineAndDNS(30112, 30113), withType(corev1.ServiceTypeLoadBalancer), withExternalLocal(32001))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.31", false)}
		c.createService(t, svc)
		put := func(eps ...discoveryv1.Endpoint) { c.putSlice(t, newSlice(svc, "etp-1", lineAndDNSPorts(), eps)) }
		put(ep(local1, epReady), ep(remote1, epReady))
		remoteOnly := newService("etp-remote", "10.96.30.3", lineAndDNS(30114, 30115),
			withType(corev1.ServiceTypeLoadBalancer), withExternalLocal(32002))
		remoteOnly.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.32", false)}
		c.createService(t, remoteOnly)
		c.putSlice(t, newSlice(remoteOnly, "etp-remote-1", lineAndDNSPorts(), readyEps(remote1)))
		l1, r1 := be(local1, topology.LinePort), be(remote1, topology.LinePort)
		c.edge.waitProgrammed(t, programmed{
			fe("203.0.113.31", 9000, protoTCP): {l1},
			fe(edge, 30112, protoTCP):          {l1},
			fe("10.96.30.2", 9000, protoTCP):   {l1, r1},
			fe("203.0.113.32", 9000, protoTCP): noBackends,
			fe("10.96.30.3", 9000, protoTCP):   {r1},
		})

		// Only the local endpoint, and it sees the client itself.
		onlyFrom(t, "LoadBalancer IP", c.topo.Client, "203.0.113.31:9000", 12, outside, local1)
		onlyFrom(t, "NodePort", c.topo.Client, hostPort(edge, 30112), 12, outside, local1)
		a, err := askUDP(c.topo.Client, "203.0.113.31:53")
		wantAnswer(t, "LoadBalancer IP, UDP", a, err, outside, local1)
		// Traffic from inside the cluster is not external.
		both(t, "ClusterIP from a pod", client.NS, "10.96.30.2:9000", client.Addr.String(), local1, remote1)
		wantHealthCheck(t, c.topo.Client, hostPort(edge, 32001), http.StatusOK, 1)

		// No local endpoint: external traffic is dropped, not sent to
		// another node and not refused.
		wantDropped(t, "LoadBalancer IP without a local endpoint", c.topo.Client, netip.AddrPort{}, "203.0.113.32:9000")
		wantDropped(t, "NodePort without a local endpoint", c.topo.Client, netip.AddrPort{}, hostPort(edge, 30114))
		wantHealthCheck(t, c.topo.Client, hostPort(edge, 32002), http.StatusServiceUnavailable, 0)
		a, err = askUDP(client.NS, "10.96.30.3:53")
		wantAnswer(t, "ClusterIP of a Service without a local endpoint", a, err, client.Addr.String(), remote1)

		// The local set falls back to the local terminating endpoint
		// while a ready one exists on another node...
		put(ep(local1, epTerminating), ep(remote1, epReady))
		c.edge.waitProgrammed(t, programmed{fe("203.0.113.31", 9000, protoTCP): {l1 + " terminating"}, fe("10.96.30.2", 9000, protoTCP): {r1}})
		onlyFrom(t, "LoadBalancer IP, local endpoint terminating", c.topo.Client, "203.0.113.31:9000", 8, outside, local1)
		// ...and a ready local endpoint takes precedence again.
		put(ep(local1, epTerminating), ep(local2, epReady), ep(remote1, epReady))
		c.edge.waitProgrammed(t, programmed{fe("203.0.113.31", 9000, protoTCP): {be(local2, topology.LinePort)}})
		onlyFrom(t, "LoadBalancer IP, a ready local endpoint again", c.topo.Client, "203.0.113.31:9000", 8, outside, local2)
	})

	t.Run("InternalTrafficPolicyLocal", func(t *testing.T) {
		svc := newService("itp", "10.96.30.4", lineAndDNS(0, 0), withInternalLocal)
		c.createService(t, svc)
		put := func(eps ...discoveryv1.Endpoint) { c.putSlice(t, newSlice(svc, "itp-1", lineAndDNSPorts(), eps)) }
		put(ep(local1, epReady), ep(remote1, epReady))
		remoteOnly := newService("itp-remote", "10.96.30.5", lineAndDNS(0, 0), withInternalLocal)
		c.createService(t, remoteOnly)
		c.putSlice(t, newSlice(remoteOnly, "itp-remote-1", lineAndDNSPorts(), readyEps(remote1)))
		l1 := be(local1, topology.LinePort)
		c.edge.waitProgrammed(t, programmed{fe("10.96.30.4", 9000, protoTCP): {l1}, fe("10.96.30.5", 9000, protoTCP): noBackends})

		onlyFrom(t, "ClusterIP from a pod", client.NS, "10.96.30.4:9000", 12, client.Addr.String(), local1)
		wantDropped(t, "ClusterIP without a local endpoint", client.NS, netip.AddrPort{}, "10.96.30.5:9000")

		put(ep(local1, epTerminating), ep(remote1, epReady))
		c.edge.waitProgrammed(t, programmed{fe("10.96.30.4", 9000, protoTCP): {l1 + " terminating"}})
		onlyFrom(t, "ClusterIP from a pod, local endpoint terminating", client.NS, "10.96.30.4:9000", 8, client.Addr.String(), local1)
	})

	t.Run("SessionAffinity", func(t *testing.T) {
		ports := lineAndDNS(0, 0)
		sticky := newService("sticky", "10.96.30.6", ports, withType(corev1.ServiceTypeLoadBalancer),
			withNodePorts(30116, 30117), withAffinity(10800))
		sticky.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.33", false)}
		loose := newService("loose", "10.96.30.7", lineAndDNS(30118, 30119), withType(corev1.ServiceTypeLoadBalancer))
		loose.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.34", false)}
		for _, svc := range []*corev1.Service{sticky, loose} {
			c.createService(t, svc)
			c.putSlice(t, newSlice(svc, svc.Name+"-1", lineAndDNSPorts(), readyEps(remote1, remote2)))
		}
		r := []string{be(remote1, topology.LinePort), be(remote2, topology.LinePort)}
		c.edge.waitProgrammed(t, programmed{fe("203.0.113.33", 9000, protoTCP): r, fe("203.0.113.34", 9000, protoTCP): r})

		for _, tc := range []struct {
			what string
			ns   *netns.NS
			dst  string
			from string
		}{
			{"LoadBalancer IP", c.topo.Client, "203.0.113.33:9000", edge.String()},
			{"ClusterIP from a pod", client.NS, "10.96.30.6:9000", client.Addr.String()},
		} {
			got := spread(t, tc.ns, netip.Addr{}, tc.dst, 16, tc.from)
			if len(got) != 1 {
				t.Errorf("%s with ClientIP affinity: one client reached %v", tc.what, got)
			}
		}
		both(t, "the Service without affinity", c.topo.Client, "203.0.113.34:9000", edge.String(), remote1, remote2)

		c.updateService(t, "sticky", withoutAffinity)
		c.edge.waitFrontend(t, fe("203.0.113.33", 9000, protoTCP), func(f inspect.Frontend) bool { return f.AffinitySeconds == 0 })
		both(t, "affinity turned off", c.topo.Client, "203.0.113.33:9000", edge.String(), remote1, remote2)
	})

	t.Run("SessionAffinityTimeout", func(t *testing.T) {
		const timeout = 3 * time.Second
		svc := newService("brief", "10.96.30.8", lineAndDNS(30120, 30121), withType(corev1.ServiceTypeLoadBalancer),
			withAffinity(int32(timeout/time.Second)))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.35", false)}
		c.createService(t, svc)
		put := func(pods ...*topology.Pod) {
			c.putSlice(t, newSlice(svc, "brief-1", lineAndDNSPorts(), readyEps(pods...)))
		}
		put(remote1)
		vip := fe("203.0.113.35", 9000, protoTCP)
		c.edge.waitProgrammed(t, programmed{vip: {be(remote1, topology.LinePort)}})

		// Eight client addresses, each with its affinity to remote1.
		var clients []netip.Addr
		for i := 1; i <= 8; i++ {
			clients = append(clients, c.clientAlias(t, i))
		}
		lastUse := map[netip.Addr]time.Time{}
		connect := func(src netip.Addr) answer {
			t.Helper()
			a, err := hello(c.topo.Client, netip.AddrPortFrom(src, 0), "203.0.113.35:9000")
			if err != nil {
				t.Fatalf("from %s: %v", src, err)
			}
			lastUse[src] = time.Now()
			return a
		}
		for _, src := range clients {
			if a := connect(src); a.Pod != remote1.Name {
				t.Fatalf("from %s: reached %s, the only endpoint is %s", src, a, remote1.Name)
			}
		}

		// Two more endpoints: the clients keep remote1 while their
		// affinity lasts.
		put(remote1, remote2, local1)
		c.edge.waitProgrammed(t, programmed{vip: {be(remote1, topology.LinePort), be(remote2, topology.LinePort), be(local1, topology.LinePort)}})
		for _, src := range clients {
			if a := connect(src); a.Pod != remote1.Name {
				t.Errorf("from %s, %s after its last connection: reached %s, want %s (ClientIP affinity)",
					src, time.Since(lastUse[src]).Round(time.Millisecond), a, remote1.Name)
			}
		}

		// Idle longer than the timeout, a client gets the backend
		// Maglev gives its address.
		expired := map[netip.Addr]string{}
		eventually(t, timeout+5*time.Second, "affinity entries expiring", func() (bool, string) {
			for _, src := range clients {
				if _, ok := expired[src]; ok {
					continue
				}
				l := c.edge.lookup(t, protoTCP, netip.AddrPortFrom(src, 40000), "203.0.113.35:9000")
				if l.TableSize == 0 {
					continue // the affinity entry still decides
				}
				if idle := time.Since(lastUse[src]); idle < timeout-time.Second {
					t.Errorf("from %s: affinity expired after %s idle, timeout %s", src, idle.Round(time.Millisecond), timeout)
				}
				expired[src] = l.Backend
			}
			return len(expired) == len(clients), fmt.Sprintf("%d of %d expired", len(expired), len(clients))
		})
		moved := 0
		for _, src := range clients {
			a := connect(src)
			p := findPod(append(c.pods, c.local...), a.Pod)
			if p == nil || be(p, topology.LinePort) != expired[src] {
				t.Errorf("from %s after the timeout: reached %s, xdplb lookup says %s", src, a, expired[src])
			}
			if a.Pod != remote1.Name {
				moved++
			}
		}
		if moved == 0 {
			t.Fatalf("every client address hashes to %s: the expiry went unobserved; use other addresses", remote1.Name)
		}
	})

	t.Run("LoadBalancerSourceRanges", func(t *testing.T) {
		other := netip.MustParseAddr("198.51.100.11") // added by SessionAffinityTimeout, or here
		if _, err := c.topo.Client.IP("addr", "replace", other.String()+"/24", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
		svc := newService("ranged", "10.96.30.9", lineAndDNS(30122, 30123), withType(corev1.ServiceTypeLoadBalancer),
			withSourceRanges(outside+"/32"))
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.36", false)}
		c.createService(t, svc)
		c.putSlice(t, newSlice(svc, "ranged-1", lineAndDNSPorts(), readyEps(remote1)))
		c.edge.waitProgrammed(t, programmed{fe("203.0.113.36", 9000, protoTCP): {be(remote1, topology.LinePort)}})

		allowed := netip.AddrPortFrom(topology.ClientAddr, 0)
		denied := netip.AddrPortFrom(other, 0)
		a, err := hello(c.topo.Client, allowed, "203.0.113.36:9000")
		wantAnswer(t, "LoadBalancer IP from an allowed client", a, err, edge.String(), remote1)
		wantDropped(t, "LoadBalancer IP from a client outside the ranges", c.topo.Client, denied, "203.0.113.36:9000")
		// The ranges guard the load balancer's addresses only.
		a, err = hello(c.topo.Client, denied, hostPort(edge, 30122))
		wantAnswer(t, "NodePort from a client outside the ranges", a, err, edge.String(), remote1)

		c.updateService(t, "ranged", withSourceRanges(other.String()+"/32"))
		eventually(t, programWait, "the new ranges applied", func() (bool, string) {
			l := c.edge.lookup(t, protoTCP, netip.AddrPortFrom(topology.ClientAddr, 40000), "203.0.113.36:9000")
			return l.Verdict == "drop", l.Verdict + ": " + l.Reason
		})
		wantDropped(t, "LoadBalancer IP from a client no longer allowed", c.topo.Client, allowed, "203.0.113.36:9000")
		a, err = hello(c.topo.Client, denied, "203.0.113.36:9000")
		wantAnswer(t, "LoadBalancer IP from the client now allowed", a, err, edge.String(), remote1)
	})

	// Hints the EndpointSlice controller writes (trafficDistribution,
	// topology-mode) keep traffic in the node's zone, read from the
	// Node's topology.kubernetes.io/zone label.
	t.Run("TopologyHints", func(t *testing.T) {
		svc := newService("zoned", "10.96.30.10", lineAndDNS(0, 0))
		c.createService(t, svc)
		hint := func(e discoveryv1.Endpoint, zone string) discoveryv1.Endpoint {
			e.Hints = &discoveryv1.EndpointHints{ForZones: []discoveryv1.ForZone{{Name: zone}}}
			return e
		}
		c.putSlice(t, newSlice(svc, "zoned-1", lineAndDNSPorts(),
			[]discoveryv1.Endpoint{hint(ep(remote1, epReady), "zone-a"), hint(ep(remote2, epReady), "zone-b")}))
		vip, r1, r2 := fe("10.96.30.10", 9000, protoTCP), be(remote1, topology.LinePort), be(remote2, topology.LinePort)
		c.edge.waitProgrammed(t, programmed{vip: {r1, r2}}) // the node has no zone yet

		c.labelNode(t, "edge", corev1.LabelTopologyZone, "zone-b")
		t.Cleanup(func() { c.labelNode(t, "edge", corev1.LabelTopologyZone, "") })
		c.edge.waitProgrammed(t, programmed{vip: {r2}})
		onlyFrom(t, "ClusterIP from a pod in zone-b", client.NS, "10.96.30.10:9000", 8, client.Addr.String(), remote2)

		// A zone no endpoint is hinted for: all of them again.
		c.labelNode(t, "edge", corev1.LabelTopologyZone, "zone-c")
		c.edge.waitProgrammed(t, programmed{vip: {r1, r2}})
	})
}

// wantHealthCheck checks a healthCheckNodePort's answer.
func wantHealthCheck(t *testing.T, ns *netns.NS, addr string, code, localEndpoints int) {
	t.Helper()
	c, err := ns.Dial("tcp4", addr, net.Dialer{Timeout: 2 * time.Second})
	if err != nil {
		t.Errorf("health check node port %s: %v", addr, err)
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", addr)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Errorf("health check node port %s: %v", addr, err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var got struct {
		LocalEndpoints int `json:"localEndpoints"`
	}
	if resp.StatusCode != code || json.Unmarshal(body, &got) != nil || got.LocalEndpoints != localEndpoints {
		t.Errorf("health check node port %s answered %s %q, want %d with %d local endpoints", addr, resp.Status, body, code, localEndpoints)
	}
}
