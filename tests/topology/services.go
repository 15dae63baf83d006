package topology

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// ServicePort is one port of a test Service.
type ServicePort struct {
	Name       string
	Protocol   corev1.Protocol
	Port       int32
	TargetPort int32
	NodePort   int32
}

// Service describes a Service and its endpoints for a services file.
type Service struct {
	Name      string
	Namespace string // default "default"
	Type      corev1.ServiceType
	ClusterIP string
	Ports     []ServicePort
	LBIPs     []string
	Local     bool // externalTrafficPolicy: Local
	// InternalLocal sets internalTrafficPolicy: Local.
	InternalLocal bool
	Affinity      bool // sessionAffinity: ClientIP
	Endpoints     []*Pod
	// Terminating endpoints stay in the slice, serving and terminating.
	Terminating []*Pod
}

// Objects renders the Service and its EndpointSlice.
func (s Service) Objects() (*corev1.Service, *discoveryv1.EndpointSlice) {
	ns := s.Namespace
	if ns == "" {
		ns = "default"
	}
	svc := &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:       s.Type,
			ClusterIP:  s.ClusterIP,
			ClusterIPs: []string{s.ClusterIP},
		},
	}
	if s.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if s.Local {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	}
	if s.InternalLocal {
		local := corev1.ServiceInternalTrafficPolicyLocal
		svc.Spec.InternalTrafficPolicy = &local
	}
	if s.Affinity {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
	}
	slice := &discoveryv1.EndpointSlice{
		TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta: metav1.ObjectMeta{Name: s.Name + "-1", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: s.Name}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{},
	}
	for _, p := range s.Ports {
		proto := p.Protocol
		if proto == "" {
			proto = corev1.ProtocolTCP
		}
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{
			Name: p.Name, Protocol: proto, Port: p.Port, TargetPort: intstr.FromInt32(p.TargetPort), NodePort: p.NodePort,
		})
		name, port := p.Name, p.TargetPort
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: &name, Protocol: &proto, Port: &port})
	}
	for _, ip := range s.LBIPs {
		svc.Status.LoadBalancer.Ingress = append(svc.Status.LoadBalancer.Ingress, corev1.LoadBalancerIngress{IP: ip})
	}
	yes, no := true, false
	for _, p := range s.Endpoints {
		node := p.Node.Name
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.Addr.String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &yes, Serving: &yes, Terminating: &no},
		})
	}
	for _, p := range s.Terminating {
		node := p.Node.Name
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{p.Addr.String()}, NodeName: &node,
			Conditions: discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes},
		})
	}
	return svc, slice
}

// WriteServicesFile writes the services as a multi-document YAML file,
// atomically (temporary file and rename), as a config manager would.
func WriteServicesFile(path string, svcs []Service) error {
	var buf bytes.Buffer
	for _, s := range svcs {
		svc, slice := s.Objects()
		for _, obj := range []any{svc, slice} {
			b, err := yaml.Marshal(obj)
			if err != nil {
				return err
			}
			buf.WriteString("---\n")
			buf.Write(b)
		}
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".services-*.yaml")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(buf.Bytes()); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("replace %s: %w", path, err)
	}
	return nil
}

// LBIP returns the n-th LoadBalancer address of the sandbox.
func LBIP(n int) netip.Addr {
	a := LBPrefix.Addr().As4()
	a[3] = byte(10 + n)
	return netip.AddrFrom4(a)
}
