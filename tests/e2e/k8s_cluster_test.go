package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/xdplb/xdplb/control/inspect"
	"github.com/xdplb/xdplb/tests/apiserver"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/tests/topology"
)

// The tests in k8s_*_test.go run the agent against a real kube-apiserver:
// every agent authenticates as deploy/'s ServiceAccount with the RBAC
// authorizer on, reaches the API server (on the test process's loopback)
// through a forwarder listening on the same address inside its node, and
// programs its node from the Services and EndpointSlices the test writes
// through the API. No controller runs: the tests write every EndpointSlice
// and LoadBalancer status themselves.

const k8sNS = "default"

// programWait bounds the wait for an agent to program a change.
const programWait = 10 * time.Second

// k8sCluster is a sandbox with an API server and agents on its nodes.
type k8sCluster struct {
	*sandbox
	api    *apiserver.Server
	kube   kubernetes.Interface
	access apiserver.Access
	edge   *k8sNode
	node2  *k8sNode
	// barriers counts the calls of [k8sCluster.barrier].
	barriers int
}

// k8sNode is a node of the cluster with its agent.
type k8sNode struct {
	c       *k8sCluster
	node    *topology.Node
	bpffs   string
	fwd     *topology.Forwarder
	agent   *topology.Agent
	args    []string
	logPath string
	// excused are ranges of the agent's log (byte offsets) where a
	// refusal by the authorizer does not count against deploy/'s RBAC:
	// a freshly started API server may refuse requests until its
	// authorizer has loaded the bindings.
	excused [][2]int
}

// logSize is the current length of the agent's log.
func (n *k8sNode) logSize() int { return len(n.agent.Log()) }

// excuse marks the agent's log from offset from to its current end.
func (n *k8sNode) excuse(from int) { n.excused = append(n.excused, [2]int{from, n.logSize()}) }

// forbidden returns the first line of log outside the excused ranges that
// reports a request the authorizer refused, or "".
func (n *k8sNode) forbidden(log string) string {
	off := 0
	for _, l := range strings.SplitAfter(log, "\n") {
		start := off
		off += len(l)
		if !strings.Contains(l, " is forbidden: ") {
			continue
		}
		if !slices.ContainsFunc(n.excused, func(r [2]int) bool { return start >= r[0] && start < r[1] }) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// newK8sCluster builds the sandbox (remote pods on node2, local pods on the
// edge, all serving), starts an API server and registers both Nodes. No
// agent runs yet: see [k8sNode.start].
func newK8sCluster(t *testing.T, remotePods, localPods int) *k8sCluster {
	t.Helper()
	testenv.RequirePrivileged(t)
	apiserver.RequireBinaries(t)
	s := newSandbox(t, remotePods, localPods)
	api := apiserver.Start(t)
	cfg := api.AdminConfig()
	cfg.WarningHandler = rest.NoWarnings{} // externalIPs are deprecated, and used here on purpose
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &k8sCluster{sandbox: s, api: api, kube: kube, access: api.AgentAccess(t)}
	c.edge = &k8sNode{c: c, node: s.topo.Edge, bpffs: s.topo.BPFFS, logPath: filepath.Join(s.dir, "agent-edge.log")}
	c.node2 = &k8sNode{c: c, node: s.topo.Node2, logPath: filepath.Join(s.dir, "agent-node2.log")}
	for _, n := range []*topology.Node{s.topo.Edge, s.topo.Node2} {
		// Connections to what is not served must fail at once, also
		// when a test makes many: no rate limit on ICMP errors.
		if err := n.Sysctl("net.ipv4.icmp_ratelimit", "0"); err != nil {
			t.Fatal(err)
		}
		c.createNode(t, n)
	}
	return c
}

func (c *k8sCluster) createNode(t *testing.T, n *topology.Node) {
	t.Helper()
	ctx := t.Context()
	obj, err := c.kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Node %s: %v", n.Name, err)
	}
	obj.Status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: n.Addr.String()},
		{Type: corev1.NodeHostName, Address: n.Name},
	}
	if _, err := c.kube.CoreV1().Nodes().UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("set the addresses of Node %s: %v", n.Name, err)
	}
}

// start runs the node's agent (with args added to the common ones) and
// waits for its first sync. The first start also opens the node's path to
// the API server and arranges the teardown, for the cluster's test.
func (n *k8sNode) start(t *testing.T, args ...string) *topology.Agent {
	t.Helper()
	if n.fwd == nil {
		n.setup(t)
	}
	n.args = args
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	full := append([]string{"--kubeconfig", n.c.access.Kubeconfig, "--node-name", n.node.Name,
		"--iface", "eth0", "--xdp-mode", "native", "--cgroup-root", n.c.topo.Cgroup, "--log-level", "debug"}, args...)
	a, err := topology.StartNodeAgent(ctx, n.node, binary, n.bpffs, n.logPath, full...)
	if err != nil {
		t.Fatalf("start the agent on %s: %v", n.node.Name, err)
	}
	n.agent = a
	return a
}

func (n *k8sNode) setup(t *testing.T) {
	t.Helper()
	ct := n.c.t // teardown belongs to the cluster's test
	if n.bpffs == "" {
		n.bpffs = testenv.BPFFS(ct)
	}
	u, err := url.Parse(n.c.api.URL())
	if err != nil {
		t.Fatal(err)
	}
	// The agent's kubeconfig names the API server's loopback address:
	// the forwarder answers on the same address inside the node.
	fwd, err := topology.Forward(n.node.NS, u.Host, u.Host)
	if err != nil {
		t.Fatal(err)
	}
	n.fwd = fwd
	ct.Cleanup(func() {
		if n.agent != nil {
			if err := n.agent.Stop(); err != nil && !n.agent.Exited() {
				ct.Errorf("stop the agent on %s: %v", n.node.Name, err)
			}
			log := n.agent.Log()
			// Every request the agent makes must be allowed by
			// deploy/'s ClusterRole.
			if line := n.forbidden(log); line != "" {
				ct.Errorf("the agent on %s was refused a request with deploy/'s RBAC: %s", n.node.Name, line)
			}
			if ct.Failed() {
				ct.Logf("agent log of %s:\n%s", n.node.Name, log)
			}
		}
		if out, err := topology.NodeExec(n.node, binary, "detach", "--bpffs-root", n.bpffs); err != nil && n.agent != nil {
			ct.Errorf("detach on %s: %v\n%s", n.node.Name, err, out)
		}
		fwd.Close()
	})
}

// restart stops the agent and starts it again, with args if given, else
// with the same arguments as before.
func (n *k8sNode) restart(t *testing.T, args ...string) {
	t.Helper()
	if err := n.agent.Stop(); err != nil {
		t.Fatalf("stop the agent on %s: %v", n.node.Name, err)
	}
	if args == nil {
		args = n.args
	}
	n.start(t, args...)
}

// cli runs an xdplb command in the node against its agent's pins.
func (n *k8sNode) cli(args ...string) (string, error) {
	return topology.NodeExec(n.node, binary, append([]string{args[0], "--bpffs-root", n.bpffs}, args[1:]...)...)
}

// frontends returns what `xdplb services -o json` reports.
func (n *k8sNode) frontends() ([]inspect.Frontend, error) {
	out, err := n.cli("services", "-o", "json")
	if err != nil {
		return nil, err
	}
	var fes []inspect.Frontend
	if err := json.Unmarshal([]byte(out), &fes); err != nil {
		return nil, fmt.Errorf("xdplb services: %w: %q", err, out)
	}
	return fes, nil
}

// programmed is a state to wait for, as `xdplb services` shows it: for each
// frontend ("10.96.0.10:80/tcp"), its backends ("10.244.2.10:9000", with
// " terminating" appended for a terminating one) in any order. The value
// absent requires the frontend not to exist; none requires it to exist
// without backends.
type programmed map[string][]string

var (
	notProgrammed []string
	noBackends    = []string{}
)

// backendsOf renders a frontend's backends the way programmed lists them.
func backendsOf(f inspect.Frontend) []string {
	out := []string{}
	for _, b := range f.Backends {
		s := b.Address
		if b.Terminating {
			s += " terminating"
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// mismatch describes how fes differs from want ("" if it does not).
func (want programmed) mismatch(fes []inspect.Frontend) string {
	have := map[string][]string{}
	for _, f := range fes {
		have[f.Frontend] = backendsOf(f)
	}
	var diffs []string
	for fe, bes := range want {
		got, ok := have[fe]
		switch {
		case bes == nil && ok:
			diffs = append(diffs, fmt.Sprintf("%s: present with %v, want absent", fe, got))
		case bes == nil:
		case !ok:
			diffs = append(diffs, fmt.Sprintf("%s: absent, want %v", fe, bes))
		default:
			w := slices.Clone(bes)
			slices.Sort(w)
			if !slices.Equal(got, w) {
				diffs = append(diffs, fmt.Sprintf("%s: backends %v, want %v", fe, got, w))
			}
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "; ")
}

// waitProgrammed polls the node's pins until they show want.
func (n *k8sNode) waitProgrammed(t *testing.T, want programmed) {
	t.Helper()
	deadline := time.Now().Add(programWait)
	var last string
	for {
		fes, err := n.frontends()
		if err != nil {
			last = err.Error()
		} else if last = want.mismatch(fes); last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the agent did not program the expected state in %s: %s", n.node.Name, programWait, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// lookup asks the node where a new flow would go.
func (n *k8sNode) lookup(t *testing.T, proto corev1.Protocol, src netip.AddrPort, dst string) inspect.Lookup {
	t.Helper()
	out, err := n.cli("lookup", "-o", "json", "--proto", strings.ToLower(string(proto)), "--src", src.String(), "--dst", dst)
	if err != nil {
		t.Fatalf("xdplb lookup: %v", err)
	}
	var l inspect.Lookup
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		t.Fatalf("xdplb lookup output %q: %v", out, err)
	}
	return l
}

// k8sHealth is the part of /healthz the tests read.
type k8sHealth struct {
	LastUpdated time.Time  `json:"lastUpdated"`
	Stale       bool       `json:"stale"`
	StaleSince  *time.Time `json:"staleSince"`
	StaleError  string     `json:"staleError"`
}

// healthz fetches the agent's /healthz.
func (n *k8sNode) healthz(t *testing.T) (int, k8sHealth) {
	t.Helper()
	code, body, err := n.agent.Get(n.agent.Healthz, "/healthz")
	if err != nil {
		t.Fatalf("%s /healthz: %v", n.node.Name, err)
	}
	var h k8sHealth
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("%s /healthz body %q: %v", n.node.Name, body, err)
	}
	return code, h
}

// Objects.

// svcOpt adjusts a Service.
type svcOpt func(*corev1.Service)

// newService is a ClusterIP Service at clusterIP with the given ports.
func newService(name, clusterIP string, ports []corev1.ServicePort, opts ...svcOpt) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: k8sNS},
		Spec: corev1.ServiceSpec{
			Type:      corev1.ServiceTypeClusterIP,
			ClusterIP: clusterIP,
			Ports:     ports,
		},
	}
	for _, o := range opts {
		o(s)
	}
	return s
}

const (
	protoTCP = corev1.ProtocolTCP
	protoUDP = corev1.ProtocolUDP
)

// svcPort is a Service port targeting a port number (an int) or a named
// port (a string).
func svcPort(name string, proto corev1.Protocol, port int32, target any, nodePort int32) corev1.ServicePort {
	p := corev1.ServicePort{Name: name, Protocol: proto, Port: port, NodePort: nodePort}
	switch v := target.(type) {
	case int:
		p.TargetPort = intstr.FromInt32(int32(v))
	case string:
		p.TargetPort = intstr.FromString(v)
	default:
		panic(fmt.Sprintf("target port %v", target))
	}
	return p
}

// lineAndDNS are the ports most tests use: TCP port 9000 on the pods' line
// server, UDP port 53 on their UDP server, with the given node ports (0:
// none).
func lineAndDNS(tcpNodePort, udpNodePort int32) []corev1.ServicePort {
	return []corev1.ServicePort{
		svcPort("lines", protoTCP, 9000, topology.LinePort, tcpNodePort),
		svcPort("dns", protoUDP, 53, topology.UDPPort, udpNodePort),
	}
}

// lineAndDNSPorts are the EndpointSlice ports matching lineAndDNS.
func lineAndDNSPorts() []discoveryv1.EndpointPort {
	return []discoveryv1.EndpointPort{epPort("lines", protoTCP, topology.LinePort), epPort("dns", protoUDP, topology.UDPPort)}
}

// withType changes the type, dropping what the new type does not allow.
func withType(typ corev1.ServiceType) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.Type = typ
		if typ == corev1.ServiceTypeClusterIP {
			for i := range s.Spec.Ports {
				s.Spec.Ports[i].NodePort = 0
			}
			s.Spec.ExternalTrafficPolicy = ""
			s.Spec.HealthCheckNodePort = 0
			s.Spec.AllocateLoadBalancerNodePorts = nil
			s.Spec.LoadBalancerSourceRanges = nil
		}
	}
}

// withNodePorts sets the node ports of the Service's ports, in order.
func withNodePorts(ports ...int32) svcOpt {
	return func(s *corev1.Service) {
		for i, p := range ports {
			s.Spec.Ports[i].NodePort = p
		}
	}
}

func withExternalLocal(healthCheckNodePort int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		s.Spec.HealthCheckNodePort = healthCheckNodePort
	}
}

func withInternalLocal(s *corev1.Service) {
	local := corev1.ServiceInternalTrafficPolicyLocal
	s.Spec.InternalTrafficPolicy = &local
}

func withAffinity(timeoutSeconds int32) svcOpt {
	return func(s *corev1.Service) {
		s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
		s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{
			ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: &timeoutSeconds}}
	}
}

func withoutAffinity(s *corev1.Service) {
	s.Spec.SessionAffinity = corev1.ServiceAffinityNone
	s.Spec.SessionAffinityConfig = nil
}

func withLabel(key, value string) svcOpt {
	return func(s *corev1.Service) {
		if s.Labels == nil {
			s.Labels = map[string]string{}
		}
		s.Labels[key] = value
	}
}

func withExternalIPs(ips ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.ExternalIPs = ips }
}

func withSourceRanges(cidrs ...string) svcOpt {
	return func(s *corev1.Service) { s.Spec.LoadBalancerSourceRanges = cidrs }
}

// withPorts replaces the ports.
func withPorts(ports ...corev1.ServicePort) svcOpt {
	return func(s *corev1.Service) { s.Spec.Ports = ports }
}

// epState is an endpoint's conditions.
type epState int

const (
	epReady       epState = iota
	epTerminating         // serving and terminating
	epGone                // terminating, no longer serving
)

// ep is an endpoint for pod p in the given state.
func ep(p *topology.Pod, st epState) discoveryv1.Endpoint {
	yes, no := true, false
	node := p.Node.Name
	e := discoveryv1.Endpoint{Addresses: []string{p.Addr.String()}, NodeName: &node}
	switch st {
	case epReady:
		e.Conditions = discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no}
	case epTerminating:
		e.Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}
	case epGone:
		e.Conditions = discoveryv1.EndpointConditions{Ready: &no, Serving: &no, Terminating: &yes}
	}
	return e
}

// readyEps are ready endpoints for pods.
func readyEps(pods ...*topology.Pod) []discoveryv1.Endpoint {
	out := []discoveryv1.Endpoint{}
	for _, p := range pods {
		out = append(out, ep(p, epReady))
	}
	return out
}

// epPort is an EndpointSlice port.
func epPort(name string, proto corev1.Protocol, port int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port}
}

// newSlice is an EndpointSlice of svc, carrying its labels.
func newSlice(svc *corev1.Service, name string, ports []discoveryv1.EndpointPort, eps []discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	labels := map[string]string{discoveryv1.LabelServiceName: svc.Name}
	for k, v := range svc.Labels {
		labels[k] = v
	}
	if eps == nil {
		eps = []discoveryv1.Endpoint{}
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: k8sNS, Labels: labels},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

// API writes. Each fails the test on error.

// createService creates svc and, if it has LoadBalancer ingress in its
// status, writes the status too (as a load balancer controller would).
func (c *k8sCluster) createService(t *testing.T, svc *corev1.Service) {
	t.Helper()
	ctx := t.Context()
	ingress := svc.Status.LoadBalancer.Ingress
	created, err := c.kube.CoreV1().Services(k8sNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Service %s: %v", svc.Name, err)
	}
	if len(ingress) > 0 {
		created.Status.LoadBalancer.Ingress = ingress
		if _, err := c.kube.CoreV1().Services(k8sNS).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("set the load balancer status of %s: %v", svc.Name, err)
		}
	}
}

// updateService applies opts to the current Service.
func (c *k8sCluster) updateService(t *testing.T, name string, opts ...svcOpt) {
	t.Helper()
	ctx := t.Context()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := c.kube.CoreV1().Services(k8sNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, o := range opts {
			o(s)
		}
		_, err = c.kube.CoreV1().Services(k8sNS).Update(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("update Service %s: %v", name, err)
	}
}

// lbIngress is a LoadBalancer ingress entry; proxy sets ipMode Proxy.
func lbIngress(ip string, proxy bool) corev1.LoadBalancerIngress {
	in := corev1.LoadBalancerIngress{IP: ip}
	if proxy {
		mode := corev1.LoadBalancerIPModeProxy
		in.IPMode = &mode
	}
	return in
}

// setIngress replaces the LoadBalancer status of a Service.
func (c *k8sCluster) setIngress(t *testing.T, name string, ingress ...corev1.LoadBalancerIngress) {
	t.Helper()
	ctx := t.Context()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := c.kube.CoreV1().Services(k8sNS).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		s.Status.LoadBalancer.Ingress = ingress
		_, err = c.kube.CoreV1().Services(k8sNS).UpdateStatus(ctx, s, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("set the load balancer status of %s: %v", name, err)
	}
}

func (c *k8sCluster) deleteService(t *testing.T, name string) {
	t.Helper()
	if err := c.kube.CoreV1().Services(k8sNS).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete Service %s: %v", name, err)
	}
}

// putSlice creates the EndpointSlice or replaces the existing one.
// labelNode sets a label of a Node, or removes it when value is "".
func (c *k8sCluster) labelNode(t *testing.T, name, key, value string) {
	t.Helper()
	// Not t.Context(): a cleanup puts the label back after it ends.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api := c.kube.CoreV1().Nodes()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if value == "" {
			delete(n.Labels, key)
		} else {
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels[key] = value
		}
		_, err = api.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("label node %s: %v", name, err)
	}
}

func (c *k8sCluster) putSlice(t *testing.T, slice *discoveryv1.EndpointSlice) {
	t.Helper()
	ctx := t.Context()
	api := c.kube.DiscoveryV1().EndpointSlices(k8sNS)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := api.Get(ctx, slice.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = api.Create(ctx, slice.DeepCopy(), metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		next := slice.DeepCopy()
		next.ResourceVersion = cur.ResourceVersion
		_, err = api.Update(ctx, next, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("write EndpointSlice %s: %v", slice.Name, err)
	}
}

func (c *k8sCluster) deleteSlice(t *testing.T, name string) {
	t.Helper()
	if err := c.kube.DiscoveryV1().EndpointSlices(k8sNS).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete EndpointSlice %s: %v", name, err)
	}
}

// clientAlias adds another address to the client (198.51.100.10+n) and
// returns it.
func (c *k8sCluster) clientAlias(t *testing.T, n int) netip.Addr {
	t.Helper()
	a := topology.ClientAddr.As4()
	a[3] += byte(n)
	addr := netip.AddrFrom4(a)
	if _, err := c.topo.Client.IP("addr", "add", addr.String()+"/24", "dev", "eth0"); err != nil {
		t.Fatal(err)
	}
	return addr
}

// hostPort joins an address and a port.
func hostPort(ip any, port int) string { return net.JoinHostPort(fmt.Sprint(ip), fmt.Sprint(port)) }

// be names a pod's backend on port, as `xdplb services` does.
func be(p *topology.Pod, port int) string { return hostPort(p.Addr, port) }

// fe names a frontend as `xdplb services` does.
func fe(ip any, port int, proto corev1.Protocol) string {
	return hostPort(ip, port) + "/" + strings.ToLower(string(proto))
}

// eventually polls cond every 50 ms until it holds, and fails the test
// with cond's last word if that takes longer than within.
func eventually(t *testing.T, within time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %s", what, within, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFrontend polls the node's pins until the frontend named fe exists and
// satisfies ok.
func (n *k8sNode) waitFrontend(t *testing.T, name string, ok func(inspect.Frontend) bool) inspect.Frontend {
	t.Helper()
	var found inspect.Frontend
	eventually(t, programWait, n.node.Name+": frontend "+name, func() (bool, string) {
		fes, err := n.frontends()
		if err != nil {
			return false, err.Error()
		}
		for _, f := range fes {
			if f.Frontend == name {
				found = f
				return ok(f), fmt.Sprintf("%+v", f)
			}
		}
		return false, "absent"
	})
	return found
}

// barrier returns once node n's agent has seen every EndpointSlice written
// before, also where what it programs stays the same: it writes a slice of
// its own (the agent receives slices in the order they are written, over
// one watch) and waits until the agent has programmed that one.
func (c *k8sCluster) barrier(t *testing.T, n *k8sNode) {
	t.Helper()
	svc := newService("barrier", "10.96.255.254", []corev1.ServicePort{svcPort("lines", protoTCP, 9000, topology.LinePort, 0)})
	if c.barriers == 0 {
		c.createService(t, svc)
	}
	c.barriers++
	pod := append(append([]*topology.Pod{}, c.pods...), c.local...)[0]
	port := 20000 + c.barriers
	c.putSlice(t, newSlice(svc, "barrier-1", []discoveryv1.EndpointPort{epPort("lines", protoTCP, int32(port))}, readyEps(pod)))
	n.waitProgrammed(t, programmed{fe("10.96.255.254", 9000, protoTCP): {hostPort(pod.Addr, port)}})
}
