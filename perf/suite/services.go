package suite

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/xdplb/xdplb/perf/traffic"
)

// The Services of a run. Every datapath gets the same ones: xdplb from a
// services file, kube-proxy through the API server.
//
//   - perf-svc-NNNNNN: Count Services with externalIP 172.16.0.1 + i, ports
//     80/TCP and 80/UDP to 8080, traffic policy Cluster (SNAT to remote
//     backends).
//     Targets of them, evenly spaced, carry the traffic and have Backends
//     endpoints on node2 (10.244.2.10 on); the rest have one.
//   - perf-local: externalIP 172.31.0.1, policy Local, one endpoint on the
//     edge node (10.244.1.10): DNAT only.
//   - perf-one: externalIP 172.31.0.2, one remote endpoint of its own
//     (10.244.2.250): the NAT port exhaustion scenario.
var (
	ExternalIPBase  = netip.MustParseAddr("172.16.0.1")
	LocalServiceIP  = netip.MustParseAddr("172.31.0.1")
	OneBackendIP    = netip.MustParseAddr("172.31.0.2")
	RemoteBackend0  = netip.MustParseAddr("10.244.2.10")
	OneBackendAddr  = netip.MustParseAddr("10.244.2.250")
	clusterIPBase   = netip.MustParseAddr("10.96.0.10")
	localClusterIP  = netip.MustParseAddr("10.96.0.2")
	oneClusterIP    = netip.MustParseAddr("10.96.0.3")
	defaultNS       = "default"
	remoteNode      = "node2"
	edgeNode        = "edge"
	servicePort     = int32(80)
	backendPort     = int32(8080)
	maxBackends     = 200
	maxServiceCount = 1 << 20
)

// ServiceSet is the Services of one scale step.
type ServiceSet struct {
	Count    int // perf-svc-* Services
	Targets  int // of those, how many get traffic
	Backends int // endpoints of each target
}

// Validate checks the set fits the address plan.
func (s ServiceSet) Validate() error {
	switch {
	case s.Count < 1 || s.Count > maxServiceCount:
		return fmt.Errorf("%d services: want 1 to %d", s.Count, maxServiceCount)
	case s.Targets < 1 || s.Targets > s.Count:
		return fmt.Errorf("%d target services of %d", s.Targets, s.Count)
	case s.Backends < 1 || s.Backends > maxBackends:
		return fmt.Errorf("%d backends: want 1 to %d", s.Backends, maxBackends)
	}
	return nil
}

// Stride is the index step between target Services.
func (s ServiceSet) Stride() int { return max(s.Count/s.Targets, 1) }

// IsTarget reports whether Service i carries traffic.
func (s ServiceSet) IsTarget(i int) bool {
	st := s.Stride()
	return i%st == 0 && i/st < s.Targets
}

// ServiceName is the name of Service i.
func ServiceName(i int) string { return fmt.Sprintf("perf-svc-%06d", i) }

// Destinations returns the generator settings that spread traffic over the
// target Services.
func (s ServiceSet) Destinations() (first netip.Addr, count, stride uint32) {
	return ExternalIPBase, uint32(s.Targets), uint32(s.Stride())
}

// Objects returns every Service and its EndpointSlice, in a stable order.
func (s ServiceSet) Objects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	n := s.Count + 2
	svcs := make([]*corev1.Service, 0, n)
	slices := make([]*discoveryv1.EndpointSlice, 0, n)
	add := func(name string, clusterIP, extIP netip.Addr, local bool, eps []netip.Addr, node string) {
		svc, slice := serviceObjects(name, clusterIP, extIP, local, eps, node)
		svcs = append(svcs, svc)
		slices = append(slices, slice)
	}
	remote := make([]netip.Addr, s.Backends)
	for i := range remote {
		remote[i] = traffic.AddrAdd(RemoteBackend0, uint32(i))
	}
	for i := 0; i < s.Count; i++ {
		eps := remote[:1]
		if s.IsTarget(i) {
			eps = remote
		}
		add(ServiceName(i), traffic.AddrAdd(clusterIPBase, uint32(i)), traffic.AddrAdd(ExternalIPBase, uint32(i)),
			false, eps, remoteNode)
	}
	add("perf-local", localClusterIP, LocalServiceIP, true, []netip.Addr{LocalPodAddr}, edgeNode)
	add("perf-one", oneClusterIP, OneBackendIP, false, []netip.Addr{OneBackendAddr}, remoteNode)
	return svcs, slices
}

func serviceObjects(name string, clusterIP, extIP netip.Addr, local bool, eps []netip.Addr, node string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: defaultNS},
		Spec: corev1.ServiceSpec{
			Type:        corev1.ServiceTypeClusterIP,
			ClusterIP:   clusterIP.String(),
			ClusterIPs:  []string{clusterIP.String()},
			ExternalIPs: []string{extIP.String()},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort, TargetPort: intstr.FromInt32(backendPort)},
				{Name: "udp", Protocol: corev1.ProtocolUDP, Port: servicePort, TargetPort: intstr.FromInt32(backendPort)},
			},
		},
	}
	if local {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	tcpName, tcp, udpName, udp, port := "http", corev1.ProtocolTCP, "udp", corev1.ProtocolUDP, backendPort
	yes := true
	slice := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: name + "-perf", Namespace: defaultNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: &tcpName, Protocol: &tcp, Port: &port},
			{Name: &udpName, Protocol: &udp, Port: &port},
		},
	}
	for _, ep := range eps {
		nodeName := node
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{ep.String()},
			NodeName:   &nodeName,
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes},
		})
	}
	return svc, slice
}

// WriteServicesFile writes the set as a multi-document YAML services file
// (temporary file and rename).
func (s ServiceSet) WriteServicesFile(path string) error {
	svcs, slices := s.Objects()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".services-*.yaml")
	if err != nil {
		return fmt.Errorf("services file: %w", err)
	}
	w := bufio.NewWriterSize(tmp, 1<<20)
	write := func() error {
		for i := range svcs {
			for _, obj := range []any{svcs[i], slices[i]} {
				b, err := yaml.Marshal(obj)
				if err != nil {
					return err
				}
				if _, err := w.WriteString("---\n"); err != nil {
					return err
				}
				if _, err := w.Write(b); err != nil {
					return err
				}
			}
		}
		return w.Flush()
	}
	if err := write(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write services file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write services file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}
