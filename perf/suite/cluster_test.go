package suite

import (
	"context"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/xdplb/xdplb/tests/apiserver"
)

// TestClusterSync moves a real API server through Service sets whose
// common Services get other endpoints (target in one set, not in the
// next) and checks that after every sync it holds exactly what the set's
// services file for xdplb says: the same Services with the same
// EndpointSlices.
func TestClusterSync(t *testing.T) {
	s := apiserver.Start(t)
	ctx := t.Context()
	cfg := s.AdminConfig()
	cfg.WarningHandler = rest.NoWarnings{} // externalIPs draw one per object
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{client: client, log: slog.Default(), have: map[string]objectDigests{}}

	// Like the plan's steps, smaller: 20 Services with a target every one
	// (0-15), 40 with a target every other one (0, 2, .. 30), 1 with one
	// target, and back.
	steps := []ServiceSet{
		{Count: 20, Targets: 16, Backends: 3},
		{Count: 40, Targets: 16, Backends: 3},
		{Count: 1, Targets: 1, Backends: 3},
		{Count: 40, Targets: 16, Backends: 3},
		{Count: 20, Targets: 16, Backends: 3},
	}
	for _, set := range steps {
		if err := c.sync(ctx, set); err != nil {
			t.Fatalf("sync %+v: %v", set, err)
		}
		svcs, slices := set.Objects()
		checkAPI(ctx, t, c, svcs, slices)
	}

	// A Service whose spec changed is replaced as well, and a changed
	// EndpointSlice that someone else deleted comes back.
	svcs, slices := steps[len(steps)-1].Objects()
	svcs[3].Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
	if err := c.client.DiscoveryV1().EndpointSlices(defaultNS).Delete(ctx, slices[5].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	slices[5].Endpoints = slices[5].Endpoints[:0]
	if err := c.syncObjects(ctx, svcs, slices); err != nil {
		t.Fatal(err)
	}
	checkAPI(ctx, t, c, svcs, slices)

	// A sync that fails part-way (the API refuses one Service) leaves
	// the next one able to delete what either sync wrote.
	bad, badSlices := ServiceSet{Count: 40, Targets: 16, Backends: 3}.Objects()
	bad[39].Spec.Ports[0].Port = 0
	if err := c.syncObjects(ctx, bad, badSlices); err == nil {
		t.Fatal("a sync with an invalid Service succeeded")
	}
	one := ServiceSet{Count: 1, Targets: 1, Backends: 3}
	if err := c.sync(ctx, one); err != nil {
		t.Fatal(err)
	}
	svcs, slices = one.Objects()
	checkAPI(ctx, t, c, svcs, slices)
}

// checkAPI compares the API's Services and EndpointSlices with the set's.
func checkAPI(ctx context.Context, t *testing.T, c *cluster, svcs []*corev1.Service, eps []*discoveryv1.EndpointSlice) {
	t.Helper()
	gotSvcs, err := c.client.CoreV1().Services(defaultNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gotSlices, err := c.client.DiscoveryV1().EndpointSlices(defaultNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svcByName := map[string]corev1.Service{}
	for _, s := range gotSvcs.Items {
		if s.Name != "kubernetes" {
			svcByName[s.Name] = s
		}
	}
	sliceByName := map[string]discoveryv1.EndpointSlice{}
	for _, s := range gotSlices.Items {
		sliceByName[s.Name] = s
	}
	if len(svcByName) != len(svcs) || len(sliceByName) != len(eps) {
		t.Fatalf("the API holds %d Services and %d EndpointSlices, want %d each", len(svcByName), len(sliceByName), len(svcs))
	}
	for i, want := range svcs {
		got, ok := svcByName[want.Name]
		if !ok {
			t.Fatalf("Service %s is missing", want.Name)
		}
		if got.Spec.ClusterIP != want.Spec.ClusterIP || !slices.Equal(got.Spec.ExternalIPs, want.Spec.ExternalIPs) ||
			got.Spec.ExternalTrafficPolicy != want.Spec.ExternalTrafficPolicy && want.Spec.ExternalTrafficPolicy != "" {
			t.Errorf("Service %s: %+v, want %+v", want.Name, got.Spec, want.Spec)
		}
		slice, ok := sliceByName[eps[i].Name]
		if !ok {
			t.Fatalf("EndpointSlice %s is missing", eps[i].Name)
		}
		if slice.Labels[discoveryv1.LabelServiceName] != want.Name || !slices.Equal(addresses(slice.Endpoints), addresses(eps[i].Endpoints)) {
			t.Errorf("EndpointSlice %s: endpoints %v, want %v", slice.Name, addresses(slice.Endpoints), addresses(eps[i].Endpoints))
		}
	}
}

func addresses(eps []discoveryv1.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		out = append(out, ep.Addresses...)
	}
	return out
}
