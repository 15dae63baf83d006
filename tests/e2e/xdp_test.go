package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/tests/topology"
)

var lbIP = topology.LBIP(0)

// shop: a LoadBalancer service with HTTP, long-lived line and UDP ports.
func shop(eps ...*topology.Pod) topology.Service {
	return topology.Service{
		Name: "shop", Type: corev1.ServiceTypeLoadBalancer, ClusterIP: "10.96.0.11", LBIPs: []string{lbIP.String()},
		Ports: []topology.ServicePort{
			{Name: "http", Port: 80, TargetPort: topology.HTTPPort, NodePort: 30081},
			{Name: "lines", Port: 9000, TargetPort: topology.LinePort, NodePort: 30082},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: topology.UDPPort, NodePort: 30053},
		},
		Endpoints: eps,
	}
}

func addr(ip fmt.Stringer, port int) string { return net.JoinHostPort(ip.String(), fmt.Sprint(port)) }

// lookupResult is the part of `xdplb lookup -o json` the tests read.
type lookupResult struct {
	Verdict string `json:"verdict"`
	Backend string `json:"backend"`
	SNAT    bool   `json:"snat"`
	Host    bool   `json:"host"`
}

func (s *sandbox) lookup(proto, src, dst string) lookupResult {
	s.t.Helper()
	var l lookupResult
	out := s.cli("lookup", "-o", "json", "--proto", proto, "--src", src, "--dst", dst)
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		s.t.Fatalf("lookup output %q: %v", out, err)
	}
	return l
}

func podByAddr(pods []*topology.Pod, hostport string) *topology.Pod {
	host, _, _ := net.SplitHostPort(hostport)
	for _, p := range pods {
		if p.Addr.String() == host {
			return p
		}
	}
	return nil
}

func TestNodePortAndLBReachTheMaglevBackend(t *testing.T) {
	s := newSandbox(t, 3, 0)
	s.write(shop(s.pods...))
	s.startAgent()
	ctx := context.Background()
	for _, target := range []string{addr(topology.EdgeAddr, 30081), addr(lbIP, 80)} {
		for port := 41000; port < 41006; port++ {
			want := s.lookup("tcp", addr(topology.ClientAddr, port), target)
			if want.Verdict != "forward" || !want.SNAT {
				t.Fatalf("lookup %s from port %d: %+v", target, port, want)
			}
			got, err := s.topo.HTTPGetFrom(ctx, target, port)
			if err != nil {
				t.Fatalf("GET %s from port %d: %v", target, port, err)
			}
			if p := podByAddr(s.pods, want.Backend); p == nil || p.Name != got {
				t.Errorf("GET %s from port %d reached %s; Maglev says %s", target, port, got, want.Backend)
			}
			// TIME_WAIT would keep the client port busy: linger 0 is
			// not needed as every port is used once.
		}
	}
}

func TestShortConnectionsSpreadOverAllBackends(t *testing.T) {
	s := newSandbox(t, 3, 0)
	s.write(shop(s.pods...))
	s.startAgent()
	ctx := context.Background()
	tcp, udp := map[string]int{}, map[string]int{}
	for i := 0; i < 45; i++ {
		name, err := s.topo.HTTPGet(ctx, addr(lbIP, 80))
		if err != nil {
			t.Fatal(err)
		}
		tcp[name]++
		name, from, err := s.topo.UDPQuery(ctx, addr(lbIP, 53))
		if err != nil {
			t.Fatal(err)
		}
		udp[name]++
		if !strings.HasPrefix(from, topology.EdgeAddr.String()+":") {
			t.Fatalf("remote backend saw the client as %s, want the edge address (SNAT)", from)
		}
	}
	for proto, counts := range map[string]map[string]int{"tcp": tcp, "udp": udp} {
		if len(counts) != 3 {
			t.Errorf("%s: 45 flows reached %d of 3 backends: %v", proto, len(counts), counts)
		}
	}
}

func TestLongLivedConnectionKeepsItsBackend(t *testing.T) {
	s := newSandbox(t, 4, 0)
	s.write(shop(s.pods[:3]...))
	a := s.startAgent()
	conn, err := s.topo.OpenLine(addr(lbIP, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first, err := conn.Ask()
	if err != nil {
		t.Fatal(err)
	}
	var others []*topology.Pod
	for _, p := range s.pods[:3] {
		if p.Name != first {
			others = append(others, p)
		}
	}
	current := append([]*topology.Pod{}, s.pods[:3]...)
	steps := []struct {
		name string
		eps  []*topology.Pod
	}{
		{"add a backend", append(current, s.pods[3])},
		{"remove another backend", without(append(current, s.pods[3]), others[0])},
		{"remove all others", without(without(append(current, s.pods[3]), others[0]), others[1], s.pods[3])},
	}
	for _, st := range steps {
		s.write(shop(st.eps...))
		waitSynced(t, s, a, len(st.eps))
		got, err := conn.Ask()
		if err != nil {
			t.Fatalf("%s: connection broke: %v", st.name, err)
		}
		if got != first {
			t.Fatalf("%s: connection moved from %s to %s", st.name, first, got)
		}
	}
}

func without(pods []*topology.Pod, drop ...*topology.Pod) []*topology.Pod {
	var out []*topology.Pod
	for _, p := range pods {
		keep := true
		for _, d := range drop {
			if p == d {
				keep = false
			}
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

// waitSynced waits until the agent programmed n backends for shop's HTTP port.
func waitSynced(t *testing.T, s *sandbox, a *topology.Agent, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		out := s.cli("maglev", "-o", "json", "default/shop:http/TCP")
		var reports []struct {
			Backends []json.RawMessage `json:"backends"`
		}
		if json.Unmarshal([]byte(out), &reports) == nil && len(reports) == 1 && len(reports[0].Backends) == n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("agent did not program %d backends in time\n%s", n, a.Log())
}

func TestServiceWithoutEndpointsRefuses(t *testing.T) {
	s := newSandbox(t, 1, 0)
	s.write(shop())
	s.startAgent()
	start := time.Now()
	_, err := s.topo.HTTPGet(context.Background(), addr(lbIP, 80))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("TCP to a service without endpoints: %v, want connection refused", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refusal took %s; it must be immediate", d)
	}
	// A connected UDP socket reports ICMP port unreachable as ECONNREFUSED.
	c, err := s.topo.Client.Dial("udp4", addr(lbIP, 53), net.Dialer{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("who"))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 100))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("UDP to a service without endpoints: %v, want ICMP port unreachable", err)
	}
}

func TestAgentRestartIsHitless(t *testing.T) {
	s := newSandbox(t, 3, 0)
	s.write(shop(s.pods...))
	a := s.startAgent()
	conn, err := s.topo.OpenLine(addr(lbIP, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	first, err := conn.Ask()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Stop(); err != nil {
		t.Fatalf("agent stop: %v", err)
	}
	// With the agent gone the datapath keeps serving.
	if got, err := conn.Ask(); err != nil || got != first {
		t.Fatalf("with the agent stopped: %q, %v", got, err)
	}
	if _, err := s.topo.HTTPGet(context.Background(), addr(lbIP, 80)); err != nil {
		t.Fatalf("new connection with the agent stopped: %v", err)
	}
	s.startAgent()
	if got, err := conn.Ask(); err != nil || got != first {
		t.Fatalf("after the restart: %q, %v (was %s)", got, err, first)
	}
	out := s.cli("conntrack", "--service", "default/shop")
	if !strings.Contains(out, "established") {
		t.Errorf("the long-lived flow is not tracked after the restart:\n%s", out)
	}
}
