package apiserver_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/xdplb/xdplb/tests/apiserver"
)

const ns = "default"

func TestServer(t *testing.T) {
	s := apiserver.Start(t, apiserver.WithUser("limited"), apiserver.WithUser("agent-user", "xdplb-testers"))
	ctx := t.Context()
	admin := s.Client()

	t.Run("ServiceAndEndpointSlice", func(t *testing.T) {
		svc := createService(t, admin, "web")
		if ip, err := netip.ParseAddr(svc.Spec.ClusterIP); err != nil || !netip.MustParsePrefix("10.96.0.0/16").Contains(ip) {
			t.Errorf("ClusterIP %q not allocated from 10.96.0.0/16", svc.Spec.ClusterIP)
		}
		createSlice(t, admin, "web", "web-1", "10.244.1.5")

		svcs, err := admin.CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("listing Services: %v", err)
		}
		if !hasName(svcs.Items, "web", func(s corev1.Service) string { return s.Name }) {
			t.Errorf("Service web not listed: %v", svcs.Items)
		}
		slices, err := admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
			LabelSelector: discoveryv1.LabelServiceName + "=web",
		})
		if err != nil {
			t.Fatalf("listing EndpointSlices: %v", err)
		}
		if len(slices.Items) != 1 || slices.Items[0].Name != "web-1" ||
			len(slices.Items[0].Endpoints) != 1 || slices.Items[0].Endpoints[0].Addresses[0] != "10.244.1.5" {
			t.Errorf("EndpointSlices for web = %+v, want web-1 with 10.244.1.5", slices.Items)
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		// A role that can see Services and get single slices, but not list.
		createClusterRole(t, admin, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "no-list-endpointslices"},
			Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: []string{"get"}},
			},
		})
		s.BindClusterRole(t, "limited", "no-list-endpointslices", rbacv1.Subject{Kind: rbacv1.UserKind, Name: "limited"})
		limited := s.User(t, "limited")
		waitCan(t, limited, "list", "", "services")
		lc := clientFor(t, limited)
		if _, err := lc.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("limited user listing EndpointSlices: got %v, want Forbidden", err)
		}
		if w, err := lc.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			if w != nil {
				w.Stop()
			}
			t.Errorf("limited user watching EndpointSlices: got %v, want Forbidden", err)
		}

		// The agent's ClusterRole, exactly as deploy/ has it, bound to a
		// token user through its group.
		role := deployObject(t, "ClusterRole")
		if err := s.Apply(ctx, role); err != nil {
			t.Fatal(err)
		}
		s.BindClusterRole(t, "agent-user", role.GetName(), rbacv1.Subject{Kind: rbacv1.GroupKind, Name: "xdplb-testers"})
		agent := s.User(t, "agent-user")
		waitCan(t, agent, "list", "discovery.k8s.io", "endpointslices")
		ac := clientFor(t, agent)
		list, err := ac.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("agent user listing EndpointSlices: %v", err)
		}
		w, err := ac.DiscoveryV1().EndpointSlices("").Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			t.Fatalf("agent user watching EndpointSlices: %v", err)
		}
		defer w.Stop()
		createSlice(t, admin, "web", "web-2", "10.244.2.7")
		waitEvent(t, w, watch.Added, "web-2")

		if _, err := ac.CoreV1().Services(ns).Create(ctx, service("sneaky"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("agent user creating a Service: got %v, want Forbidden", err)
		}
		if _, err := ac.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("agent user listing Secrets: got %v, want Forbidden", err)
		}
	})

	t.Run("AgentServiceAccount", func(t *testing.T) {
		a := s.AgentAccess(t)
		cfg, err := clientcmd.BuildConfigFromFlags("", a.Kubeconfig)
		if err != nil {
			t.Fatalf("loading agent kubeconfig: %v", err)
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CoreV1().Services("").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("agent listing Services: %v", err)
		}
		if _, err := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
			t.Errorf("agent listing EndpointSlices: %v", err)
		}
		if _, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=edge-1"}); err != nil {
			t.Errorf("agent listing its Node: %v", err)
		}
		if _, err := c.CoreV1().ConfigMaps("kube-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("agent listing ConfigMaps: got %v, want Forbidden", err)
		}
	})

	for _, stop := range []struct {
		name string
		fn   func() error
	}{{"StopAPIServer", s.StopAPIServer}, {"KillAPIServer", s.KillAPIServer}} {
		t.Run(stop.name, func(t *testing.T) {
			if err := stop.fn(); err != nil {
				t.Fatal(err)
			}
			short, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := admin.CoreV1().Services(ns).Get(short, "web", metav1.GetOptions{}); err == nil {
				t.Fatal("API server answered while stopped")
			}
			if err := s.StartAPIServer(ctx); err != nil {
				t.Fatal(err)
			}
			// Same port and credentials, and etcd kept the data.
			if _, err := admin.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{}); err != nil {
				t.Errorf("Service web after restart: %v", err)
			}
			if _, err := clientFor(t, s.User(t, "agent-user")).DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{}); err != nil {
				t.Errorf("agent user after restart: %v", err)
			}
		})
	}
}

func service(name string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{
				Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromInt32(8080),
			}},
		},
	}
}

func createService(t *testing.T, c kubernetes.Interface, name string) *corev1.Service {
	t.Helper()
	svc, err := c.CoreV1().Services(ns).Create(t.Context(), service(name), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating Service %s: %v", name, err)
	}
	return svc
}

func createSlice(t *testing.T, c kubernetes.Interface, svc, name, addr string) {
	t.Helper()
	port, proto, ready := int32(8080), corev1.ProtocolTCP, true
	portName := "http"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &portName, Port: &port, Protocol: &proto}},
	}
	if _, err := c.DiscoveryV1().EndpointSlices(ns).Create(t.Context(), slice, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating EndpointSlice %s: %v", name, err)
	}
}

func createClusterRole(t *testing.T, c kubernetes.Interface, role *rbacv1.ClusterRole) {
	t.Helper()
	if _, err := c.RbacV1().ClusterRoles().Create(t.Context(), role, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating ClusterRole %s: %v", role.Name, err)
	}
}

func waitCan(t *testing.T, a apiserver.Access, verb, group, resource string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := a.WaitCan(ctx, verb, group, resource, ""); err != nil {
		t.Fatal(err)
	}
}

func clientFor(t *testing.T, a apiserver.Access) kubernetes.Interface {
	t.Helper()
	c, err := a.Client()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitEvent(t *testing.T, w watch.Interface, typ watch.EventType, name string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before %s %s", typ, name)
			}
			if s, isSlice := ev.Object.(*discoveryv1.EndpointSlice); isSlice && ev.Type == typ && s.Name == name {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for %s within 30s", typ, name)
		}
	}
}

// deployObject returns the one object of kind in deploy/.
func deployObject(t *testing.T, kind string) *unstructured.Unstructured {
	t.Helper()
	dir, err := apiserver.DeployDir()
	if err != nil {
		t.Fatal(err)
	}
	k, err := apiserver.ReadKustomization(dir)
	if err != nil {
		t.Fatal(err)
	}
	ms, err := k.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	var found *unstructured.Unstructured
	for _, m := range ms {
		if m.Object.GetKind() == kind {
			if found != nil {
				t.Fatalf("deploy/ has more than one %s", kind)
			}
			found = m.Object
		}
	}
	if found == nil {
		t.Fatalf("deploy/ has no %s", kind)
	}
	return found
}

func hasName[T any](items []T, name string, nameOf func(T) string) bool {
	for _, it := range items {
		if nameOf(it) == name {
			return true
		}
	}
	return false
}
