package e2e

import (
	"context"
	"net/http"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/tests/topology"
)

// resyncWait bounds the wait for an agent to catch up once the API server
// is reachable again: client-go's reflectors retry with a backoff.
const resyncWait = 45 * time.Second

// staleWait bounds the wait for /healthz to report that the API server
// cannot be reached. Cut off, the node's connections to it are refused.
// With the API server down, the path to it accepts connections and closes
// them, as a load balancer in front of API servers does; client-go retries
// such requests for about ten seconds.
const (
	staleWait       = 10 * time.Second
	serverStaleWait = 15 * time.Second
)

// freshWait bounds the wait for /healthz to stop reporting staleness once
// the agent caught up: watches still backing off reconnect meanwhile.
const freshWait = 20 * time.Second

// TestK8sControlPlaneOutages: the datapath keeps serving on the last state
// while the agent is down, while the node cannot reach the API server and
// while the API server is down; /healthz says the state may be stale; once
// things are back the agent applies what changed meanwhile, and an
// established connection survives all of it.
func TestK8sControlPlaneOutages(t *testing.T) {
	c := newK8sCluster(t, 3, 1)
	remote1, remote2, remote3 := c.pods[0], c.pods[1], c.pods[2]
	client := c.local[0]
	edge := topology.EdgeAddr
	// The UDP flow below may idle through the outages: it must stay
	// tracked meanwhile.
	c.edge.start(t, "--udp-timeout", "10m")

	svc := newService("steady", "10.96.40.1", lineAndDNS(30130, 30131), withType(corev1.ServiceTypeLoadBalancer))
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{lbIngress("203.0.113.40", false)}
	c.createService(t, svc)
	put := func(t *testing.T, pods ...*topology.Pod) {
		c.putSlice(t, newSlice(svc, "steady-1", lineAndDNSPorts(), readyEps(pods...)))
	}
	put(t, remote1, remote2)
	vip := fe("203.0.113.40", 9000, protoTCP)
	lineBackends := func(pods ...*topology.Pod) []string {
		var out []string
		for _, p := range pods {
			out = append(out, be(p, topology.LinePort))
		}
		return out
	}
	c.edge.waitProgrammed(t, programmed{vip: lineBackends(remote1, remote2)})

	// Established flows, from outside and from a pod, and a UDP flow, all
	// to remote1, which every state below keeps.
	external := openLineTo(t, c, "203.0.113.40:9000", remote1)
	var internal *liveConn
	for i := 0; i < 40 && internal == nil; i++ {
		l := openLine(t, client.NS, netip.AddrPort{}, "10.96.40.1:9000")
		if l.first.Pod == remote1.Name {
			internal = l
		} else {
			l.Close()
		}
	}
	if internal == nil {
		t.Fatalf("40 connections from a pod to the ClusterIP never reached %s", remote1.Name)
	}
	var udpFlow *udpSocket
	for port := uint16(42000); port < 42100 && udpFlow == nil; port++ {
		src := netip.AddrPortFrom(topology.ClientAddr, port)
		if l := c.edge.lookup(t, protoUDP, src, "203.0.113.40:53"); l.Backend == be(remote1, topology.UDPPort) {
			udpFlow = dialUDP(t, c.topo.Client, src, "203.0.113.40:53")
		}
	}
	if udpFlow == nil {
		t.Fatalf("no client port in 42000-42099 is sent to %s", remote1.Name)
	}
	firstUDP, err := udpFlow.ask(time.Second)
	wantAnswer(t, "UDP", firstUDP, err, edge.String(), remote1)
	survive := func(t *testing.T, when string) {
		t.Helper()
		external.still(t, when+", connection from outside")
		internal.still(t, when+", connection from a pod")
		if a, err := udpFlow.ask(time.Second); err != nil || a != firstUDP {
			t.Fatalf("%s: the UDP flow is answered by %s (%v), was %s", when, a, err, firstUDP)
		}
	}
	// serving checks that new connections keep reaching exactly pods.
	serving := func(t *testing.T, when string, pods ...*topology.Pod) {
		t.Helper()
		got := spread(t, c.topo.Client, netip.Addr{}, "203.0.113.40:9000", 24, edge.String())
		for _, p := range pods {
			if got[p.Name] == 0 {
				t.Errorf("%s: new connections %v, none reached %s", when, got, p.Name)
			}
		}
		if len(got) != len(pods) {
			t.Errorf("%s: new connections %v, want only %v", when, got, podNames(pods))
		}
	}
	// waitStale polls /healthz until it reports staleness as want; a
	// staleness must have begun at since or later. It fails the test but
	// lets it go on otherwise: what follows does not depend on it.
	waitStale := func(t *testing.T, want bool, within time.Duration, since time.Time) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			code, h := c.edge.healthz(t)
			// Traffic follows the last state: the node stays healthy.
			if code != http.StatusOK {
				t.Errorf("/healthz answered %d (%+v); the datapath still serves", code, h)
			}
			fresh := !h.Stale
			if want && h.Stale && (h.StaleSince == nil || h.StaleError == "") {
				t.Errorf("/healthz says stale without since when and why: %+v", h)
				return
			}
			if (want && h.Stale && !h.StaleSince.Before(since.Add(-time.Second))) || (!want && fresh) {
				return
			}
			if time.Now().After(deadline) {
				if want {
					t.Errorf("/healthz does not report a staleness that began at %s or later, %s on: %+v",
						since.Format(time.StampMilli), within, h)
				} else {
					t.Errorf("/healthz still reports stale %s after the agent caught up: %+v", within, h)
				}
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	t.Run("AgentRestart", func(t *testing.T) {
		if err := c.edge.agent.Stop(); err != nil {
			t.Fatalf("stop the agent: %v", err)
		}
		survive(t, "agent stopped")
		serving(t, "agent stopped", remote1, remote2)
		// A change while no agent runs is applied by the next one.
		put(t, remote1, remote2, remote3)
		c.edge.start(t, c.edge.args...)
		c.edge.waitProgrammed(t, programmed{vip: lineBackends(remote1, remote2, remote3)})
		survive(t, "agent restarted")
		serving(t, "agent restarted", remote1, remote2, remote3)
	})

	t.Run("NodeCutOffFromTheAPIServer", func(t *testing.T) {
		cut := time.Now()
		c.edge.fwd.Cut()
		waitStale(t, true, staleWait, cut)
		// Changes the node cannot see: it keeps the last state.
		put(t, remote1, remote3)
		survive(t, "cut off")
		serving(t, "cut off", remote1, remote2, remote3)
		if err := c.edge.fwd.Restore(); err != nil {
			t.Fatal(err)
		}
		eventually(t, resyncWait, "the agent catching up", func() (bool, string) {
			fes, err := c.edge.frontends()
			if err != nil {
				return false, err.Error()
			}
			m := programmed{vip: lineBackends(remote1, remote3)}.mismatch(fes)
			return m == "", m
		})
		waitStale(t, false, freshWait, time.Time{})
		survive(t, "reconnected")
		serving(t, "reconnected", remote1, remote3)
	})

	t.Run("APIServerDown", func(t *testing.T) {
		restart, down := c.edge.logSize(), time.Now()
		if err := c.api.StopAPIServer(); err != nil {
			t.Fatalf("stop the API server: %v", err)
		}
		waitStale(t, true, serverStaleWait, down)
		survive(t, "API server down")
		serving(t, "API server down", remote1, remote3)
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := c.api.StartAPIServer(ctx); err != nil {
			t.Fatalf("start the API server again: %v", err)
		}
		// Changes apply again.
		put(t, remote1, remote2, remote3)
		eventually(t, resyncWait, "the agent catching up", func() (bool, string) {
			fes, err := c.edge.frontends()
			if err != nil {
				return false, err.Error()
			}
			m := programmed{vip: lineBackends(remote1, remote2, remote3)}.mismatch(fes)
			return m == "", m
		})
		waitStale(t, false, freshWait, time.Time{})
		c.edge.excuse(restart)
		survive(t, "API server back")
		serving(t, "API server back", remote1, remote2, remote3)
	})
}
