package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// lines is a ClusterIP service on the pods' line and UDP servers.
func lines(name, clusterIP string, eps ...*topology.Pod) topology.Service {
	return topology.Service{
		Name: name, ClusterIP: clusterIP,
		Ports: []topology.ServicePort{
			{Name: "lines", Port: 9000, TargetPort: topology.LinePort},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: topology.UDPPort},
		},
		Endpoints: eps,
	}
}

// ask opens a line connection from a pod and returns who answered and
// whom they saw.
func ask(t *testing.T, from *topology.Pod, addr string) (name, seen string) {
	t.Helper()
	c, err := topology.OpenLineFrom(from.NS, addr)
	if err != nil {
		t.Fatalf("%s -> %s: %v", from.Name, addr, err)
	}
	defer c.Close()
	name, seen, err = c.AskFrom()
	if err != nil {
		t.Fatalf("%s -> %s: %v", from.Name, addr, err)
	}
	host, _, _ := net.SplitHostPort(seen)
	return name, host
}

func TestPodToClusterIP(t *testing.T) {
	s := newSandbox(t, 1, 2)
	client, local := s.local[0], s.local[1]
	s.write(
		lines("to-local", "10.96.1.1", local),
		lines("to-remote", "10.96.1.2", s.pods[0]),
	)
	s.startAgent()
	for _, c := range []struct {
		addr string
		want *topology.Pod
	}{
		{"10.96.1.1:9000", local},
		{"10.96.1.2:9000", s.pods[0]},
	} {
		name, seen := ask(t, client, c.addr)
		if name != c.want.Name {
			t.Errorf("%s reached %s, want %s", c.addr, name, c.want.Name)
		}
		if seen != client.Addr.String() {
			t.Errorf("%s: backend saw client %s, want the pod's own address %s", c.addr, seen, client.Addr)
		}
		a, err := topology.UDPAsk(client.NS, strings.Replace(c.addr, ":9000", ":53", 1), []byte("q"))
		if err != nil || a.Name != c.want.Name || !strings.HasPrefix(a.From, client.Addr.String()+":") {
			t.Errorf("UDP %s: %+v, %v", c.addr, a, err)
		}
	}
}

func TestPodReachesItselfThroughItsService(t *testing.T) {
	s := newSandbox(t, 0, 1)
	self := s.local[0]
	s.write(lines("self", "10.96.1.3", self))
	s.startAgent()
	name, seen := ask(t, self, "10.96.1.3:9000")
	if name != self.Name {
		t.Fatalf("hairpin reached %s", name)
	}
	if seen == self.Addr.String() {
		t.Errorf("hairpin flow kept the pod's own source address; it must be SNATed")
	}
}

func TestPodToNodePortOfItsNode(t *testing.T) {
	s := newSandbox(t, 2, 1)
	svc := shop(s.pods...)
	s.write(svc)
	s.startAgent()
	for _, target := range []string{addr(topology.EdgeAddr, 30082), addr(lbIP, 9000)} {
		name, seen := ask(t, s.local[0], target)
		if podByName(s.pods, name) == nil {
			t.Errorf("%s reached %q", target, name)
		}
		if seen != s.local[0].Addr.String() {
			t.Errorf("%s: backend saw %s, want the pod's address", target, seen)
		}
	}
}

func podByName(pods []*topology.Pod, name string) *topology.Pod {
	for _, p := range pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

func TestInternalTrafficPolicyLocal(t *testing.T) {
	s := newSandbox(t, 1, 2)
	client, local := s.local[0], s.local[1]
	both := lines("both", "10.96.1.4", local, s.pods[0])
	both.InternalLocal = true
	remoteOnly := lines("remote-only", "10.96.1.5", s.pods[0])
	remoteOnly.InternalLocal = true
	s.write(both, remoteOnly)
	s.startAgent()
	for i := 0; i < 6; i++ {
		if name, _ := ask(t, client, "10.96.1.4:9000"); name != local.Name {
			t.Fatalf("internalTrafficPolicy Local sent a flow to %s", name)
		}
	}
	// No local endpoint: dropped, not refused (kube-proxy's behaviour).
	_, err := topology.DialFrom(client.NS, "10.96.1.5:9000", time.Second)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("no local endpoint under internalTrafficPolicy Local: %v, want a timeout", err)
	}
}

func TestPodToServiceWithoutEndpointsIsRefused(t *testing.T) {
	s := newSandbox(t, 0, 1)
	s.write(lines("empty", "10.96.1.6"))
	s.startAgent()
	start := time.Now()
	_, err := topology.DialFrom(s.local[0].NS, "10.96.1.6:9000", 3*time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("TCP: %v, want connection refused", err)
	}
	if time.Since(start) > time.Second {
		t.Errorf("refusal took %s", time.Since(start))
	}
	c, err := s.local[0].Dial("udp4", "10.96.1.6:53", net.Dialer{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("q"))
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Read(make([]byte, 10)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("UDP: %v, want ICMP port unreachable", err)
	}
}

func TestPodCreatedAfterTheAgentIsServed(t *testing.T) {
	s := newSandbox(t, 1, 0)
	s.write(lines("svc", "10.96.1.7", s.pods[0]))
	s.startAgent()
	late, err := s.topo.AddPod(s.topo.Edge, "late")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := topology.OpenLineFrom(late.NS, "10.96.1.7:9000")
		if err == nil {
			name, askErr := c.Ask()
			c.Close()
			if askErr == nil && name == s.pods[0].Name {
				return
			}
			err = askErr
		}
		if time.Now().After(deadline) {
			t.Fatalf("a pod created after the agent cannot reach its service: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestExternalTrafficToLocalBackend(t *testing.T) {
	s := newSandbox(t, 1, 1)
	svc := shop(s.local[0])
	svc.Local = true
	s.write(svc)
	s.startAgent()
	conn, err := s.topo.OpenLine(addr(lbIP, 9000))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	name, seen, err := conn.AskFrom()
	if err != nil {
		t.Fatal(err)
	}
	if name != s.local[0].Name {
		t.Fatalf("reached %s", name)
	}
	if host, _, _ := net.SplitHostPort(seen); host != topology.ClientAddr.String() {
		t.Errorf("local backend saw %s, want the client's own address (no SNAT)", seen)
	}
	a, err := topology.UDPAsk(s.topo.Client, addr(lbIP, 53), []byte("q"))
	if err != nil || a.Name != s.local[0].Name {
		t.Fatalf("UDP to a local backend: %+v, %v", a, err)
	}
}

// TestHostNetworkBackend: a backend at the node's own address (a
// hostNetwork pod on the edge node) is reached through NodePort, LB IP and
// ClusterIP, from outside (TCP and UDP) and from a pod on the node (TCP),
// with its replies coming from the address the client used and the
// client's address kept.
func TestHostNetworkBackend(t *testing.T) {
	s := newSandbox(t, 0, 1)
	host := &topology.Pod{NS: s.topo.Edge.NS, Name: "edge-host", Addr: topology.EdgeAddr, Node: s.topo.Edge}
	srv, err := host.StartServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	svc := shop(host)
	s.write(svc)
	s.startAgent()
	if l := s.lookup("tcp", addr(topology.ClientAddr, 40999), addr(lbIP, 9000)); l.Verdict != "forward" ||
		!l.Host || l.SNAT || l.Backend != addr(topology.EdgeAddr, topology.LinePort) {
		t.Errorf("lookup: %+v, want forward to the node's own address, no SNAT", l)
	}

	for _, c := range []struct {
		from   *netns.NS
		client netip.Addr
		target string
	}{
		{s.topo.Client, topology.ClientAddr, addr(topology.EdgeAddr, 30082)},
		{s.topo.Client, topology.ClientAddr, addr(lbIP, 9000)},
		{s.local[0].NS, s.local[0].Addr, svc.ClusterIP + ":9000"},
		{s.local[0].NS, s.local[0].Addr, addr(lbIP, 9000)},
	} {
		conn, err := topology.OpenLineFrom(c.from, c.target)
		if err != nil {
			t.Errorf("%s -> %s: %v", c.client, c.target, err)
			continue
		}
		name, seen, err := conn.AskFrom()
		conn.Close()
		if err != nil || name != host.Name {
			t.Errorf("%s -> %s: reached %q, %v", c.client, c.target, name, err)
			continue
		}
		if h, _, _ := net.SplitHostPort(seen); h != c.client.String() {
			t.Errorf("%s -> %s: the host saw %s, want the client's own address", c.client, c.target, seen)
		}
		if c.from != s.topo.Client {
			// The test's UDP server answers from the address its route
			// to the client prefers (the pod bridge's here), not the
			// one it was asked at: no translation can match that, with
			// kube-proxy either. Real servers answer from the address
			// asked (IP_PKTINFO, or a socket bound to it).
			continue
		}
		udp := strings.Replace(strings.Replace(c.target, ":9000", ":53", 1), ":30082", ":30053", 1)
		a, err := topology.UDPAsk(c.from, udp, []byte("q"))
		if err != nil || a.Name != host.Name || !strings.HasPrefix(a.From, c.client.String()+":") {
			t.Errorf("UDP %s -> %s: %+v, %v", c.client, udp, a, err)
		}
	}
}

// A host-network backend with nothing listening on its UDP port: the
// node's port unreachable quotes the datagram as translated, and the host
// reply program translates it back, so a connected socket to the service
// sees "connection refused" rather than waiting for an answer: a client
// outside through the NIC, a pod on the node through its interface.
func TestHostNetworkBackendRefusesUnservedUDP(t *testing.T) {
	s := newSandbox(t, 0, 1)
	host := &topology.Pod{NS: s.topo.Edge.NS, Name: "edge-host", Addr: topology.EdgeAddr, Node: s.topo.Edge}
	svc := shop(host)
	s.write(svc) // no server started: nothing listens on the node
	s.startAgent()
	for _, c := range []struct {
		from   *netns.NS
		target string
	}{
		{s.topo.Client, addr(lbIP, 53)},
		{s.topo.Client, addr(topology.EdgeAddr, 30053)},
		{s.local[0].NS, svc.ClusterIP + ":53"},
		{s.local[0].NS, addr(lbIP, 53)},
	} {
		conn, err := c.from.Dial("udp4", c.target, net.Dialer{})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte("q"))
		conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = conn.Read(make([]byte, 10))
		conn.Close()
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP %s -> %s: %v, want connection refused (the node's port unreachable, translated)",
				c.from.Name, c.target, err)
		}
	}
}

func TestFragmentedDatagramArrivesWhole(t *testing.T) {
	s := newSandbox(t, 2, 1)
	s.write(shop(append(s.pods, s.local...)...))
	s.startAgent()
	payload := make([]byte, 4000)
	for i := 0; i < 10; i++ {
		a, err := topology.UDPAsk(s.topo.Client, addr(topology.EdgeAddr, 30053), payload)
		if err != nil {
			t.Fatalf("4000-byte datagram through the NodePort: %v", err)
		}
		if a.Size != len(payload) {
			t.Fatalf("backend %s received %d bytes of a %d-byte datagram", a.Name, a.Size, len(payload))
		}
	}
}

func TestPacketsWithIPOptionsAreServed(t *testing.T) {
	s := newSandbox(t, 2, 0)
	s.write(shop(s.pods...))
	s.startAgent()
	var c net.PacketConn
	if err := s.topo.Client.Do(func() error {
		var err error
		c, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, err := c.(*net.UDPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	// Four bytes of options: three no-ops and the end of the list.
	raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_IP, syscall.IP_OPTIONS, "\x01\x01\x01\x00")
	})
	if serr != nil {
		t.Fatalf("set IP options: %v", serr)
	}
	dst, _ := net.ResolveUDPAddr("udp4", addr(topology.EdgeAddr, 30053))
	buf := make([]byte, 1500)
	for i := 0; i < 3; i++ {
		if _, err := c.WriteTo([]byte("with options"), dst); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			t.Fatalf("datagram with IP options through the NodePort: %v", err)
		}
		if name := strings.Fields(string(buf[:n]))[0]; podByName(s.pods, name) == nil {
			t.Fatalf("answered by %q", name)
		}
	}
	out := s.cli("status", "-o", "json")
	if !strings.Contains(out, `"pass_ip_options"`) || !strings.Contains(out, `"tc_redirect"`) {
		t.Errorf("status shows no IP-options packets handed to and served by TC:\n%s", out)
	}
}

// Replies of local backends are larger than the headers the TC program
// pulls into the linear part of the skb; they must be translated too.
func TestLocalBackendUnderClusterPolicyAnswersHTTP(t *testing.T) {
	s := newSandbox(t, 2, 1)
	s.write(shop(append(s.pods, s.local...)...))
	s.startAgent()
	tried := 0
	for port := 42000; port < 42100 && tried < 3; port++ {
		want := s.lookup("tcp", addr(topology.ClientAddr, port), addr(lbIP, 80))
		if podByAddr(s.local, want.Backend) == nil {
			continue
		}
		tried++
		got, err := s.topo.HTTPGetFrom(context.Background(), addr(lbIP, 80), port)
		if err != nil {
			t.Fatalf("HTTP from port %d to the local backend: %v", port, err)
		}
		if got != s.local[0].Name {
			t.Fatalf("HTTP from port %d reached %s, lookup said %s", port, got, want.Backend)
		}
	}
	if tried == 0 {
		t.Fatal("no client port hashed to the local backend")
	}
}

func TestHostReachesServices(t *testing.T) {
	s := newSandbox(t, 1, 1)
	svc := shop(s.pods...)
	sticky := lines("host-sticky", "10.96.1.12", append(slices.Clone(s.pods), s.local...)...)
	sticky.Affinity = true
	s.write(svc, lines("host-local", "10.96.1.10", s.local[0]), lines("host-empty", "10.96.1.11"), sticky)
	s.startAgent()
	if _, err := topology.DialFrom(s.topo.Edge.NS, "10.96.1.11:9000", 2*time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("host -> a service without endpoints: %v, want connection refused", err)
	}
	for _, target := range []struct {
		addr string
		want []*topology.Pod
	}{
		{"10.96.1.10:9000", s.local},             // ClusterIP, local backend
		{"10.96.0.11:9000", s.pods},              // ClusterIP, remote backend
		{addr(topology.EdgeAddr, 30082), s.pods}, // the node's own NodePort
		{addr(lbIP, 9000), s.pods},               // a LoadBalancer IP
	} {
		c, err := topology.OpenLineFrom(s.topo.Edge.NS, target.addr)
		if err != nil {
			t.Fatalf("host -> %s: %v", target.addr, err)
		}
		name, err := c.Ask()
		peer := c.RemoteAddr()
		c.Close()
		if err != nil {
			t.Fatalf("host -> %s: %v", target.addr, err)
		}
		if podByName(target.want, name) == nil {
			t.Errorf("host -> %s reached %q", target.addr, name)
		}
		if peer != target.addr {
			t.Errorf("host -> %s: the socket's peer is %s; it must stay the service address", target.addr, peer)
		}
	}
	// ClientIP affinity: the host is one client, so every new socket
	// reaches the same backend (two backends, twelve sockets).
	seen := map[string]bool{}
	for i := 0; i < 12; i++ {
		c, err := topology.OpenLineFrom(s.topo.Edge.NS, "10.96.1.12:9000")
		if err != nil {
			t.Fatalf("host -> sticky service: %v", err)
		}
		name, err := c.Ask()
		c.Close()
		if err != nil {
			t.Fatalf("host -> sticky service: %v", err)
		}
		seen[name] = true
	}
	if len(seen) != 1 {
		t.Errorf("host connections to a ClientIP-affinity service reached %v, want one backend", seen)
	}
	a, err := topology.UDPAsk(s.topo.Edge.NS, addr(lbIP, 53), []byte("q"))
	if err != nil || podByName(s.pods, a.Name) == nil {
		t.Fatalf("host UDP -> %s: %+v %v", addr(lbIP, 53), a, err)
	}
}

// web is a ClusterIP service on the pods' HTTP servers.
func web(name, clusterIP string, eps ...*topology.Pod) topology.Service {
	return topology.Service{
		Name: name, ClusterIP: clusterIP,
		Ports:     []topology.ServicePort{{Name: "http", Port: 80, TargetPort: topology.HTTPPort}},
		Endpoints: eps,
	}
}

// Bulk replies leave a pod as GSO packets far larger than the MTU (veth
// offloads segmentation); they must be translated and sent on like any
// other, whichever hook sees them, to a client outside and to a pod. The
// client pauses, so the transfer goes on after a flow's cached next hop
// expired (once a second) and its packets are routed afresh.
func TestBulkRepliesArriveWhole(t *testing.T) {
	s := newSandbox(t, 1, 2)
	client, local, remote := s.local[1], s.local[0], s.pods[0]
	s.write(
		shop(local),
		web("to-local", "10.96.2.1", local),
		web("to-remote", "10.96.2.2", remote),
	)
	s.startAgent()
	const size = 4 << 20
	for _, c := range []struct {
		what string
		from *topology.Pod // nil: the client outside
		addr string
		want *topology.Pod
	}{
		{"outside client to a local backend", nil, addr(lbIP, 80), local},
		{"outside client to a local backend's NodePort", nil, addr(topology.EdgeAddr, 30081), local},
		{"pod to a local backend", client, "10.96.2.1:80", local},
		{"pod to a remote backend", client, "10.96.2.2:80", remote},
	} {
		ns := s.topo.Client
		if c.from != nil {
			ns = c.from.NS
		}
		name, err := topology.HTTPDownload(ns, c.addr, size, 1500*time.Millisecond)
		if err != nil {
			t.Errorf("%s: %d bytes from %s: %v", c.what, size, c.addr, err)
			continue
		}
		if name != c.want.Name {
			t.Errorf("%s: answered by %s, want %s", c.what, name, c.want.Name)
		}
	}
	// Only counters that moved are listed.
	if out := s.cli("status"); strings.Contains(out, "pass_frag_needed") {
		t.Errorf("packets of the transfers were taken for too big and handed to the stack translated:\n%s", out)
	}
}
