package source

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	"github.com/xdplb/xdplb/control/model"
)

const (
	labelProxy    = model.LabelServiceProxyName
	labelHeadless = model.LabelHeadless
)

func kubeService(ns, name string, port int32, labels map[string]string) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.ServiceSpec{
			ClusterIP: "10.96.0.1",
			Ports:     []corev1.ServicePort{{Port: port, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
}

func kubeSlice(ns, name, service string, addr string, labels map[string]string) *discoveryv1.EndpointSlice {
	l := map[string]string{discoveryv1.LabelServiceName: service}
	for k, v := range labels {
		l[k] = v
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: l},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{addr}}},
	}
}

func kubeNode(name, addr string) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}},
		},
	}
}

// kubeHarness runs a Kubernetes source on a fake clientset.
type kubeHarness struct {
	t       *testing.T
	client  *fake.Clientset
	k       *Kubernetes
	changed chan struct{}
	done    chan error
	cancel  context.CancelFunc
	stopped sync.Once
}

func newKubeHarness(t *testing.T, opts KubernetesOptions, objs ...k8sruntime.Object) *kubeHarness {
	t.Helper()
	client := fake.NewClientset(objs...)
	return &kubeHarness{
		t:       t,
		client:  client,
		k:       NewKubernetes(client, opts, testLogger(t)),
		changed: make(chan struct{}, 1000),
	}
}

func (h *kubeHarness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.done = make(chan error, 1)
	go func() { h.done <- h.k.Run(ctx, func() { h.changed <- struct{}{} }) }()
	h.t.Cleanup(h.stop)
}

func (h *kubeHarness) stop() {
	h.stopped.Do(h.stopOnce)
}

func (h *kubeHarness) stopOnce() {
	h.cancel()
	select {
	case err := <-h.done:
		if err != nil {
			h.t.Errorf("Run: %v", err)
		}
	case <-time.After(waitTimeout):
		buf := make([]byte, 1<<20)
		h.t.Errorf("Run did not return after cancel\n%s", buf[:runtime.Stack(buf, true)])
	}
}

// waitFor consumes calls of changed until cond holds for the snapshot.
func (h *kubeHarness) waitFor(what string, cond func(Snapshot) bool) {
	h.t.Helper()
	deadline := time.After(waitTimeout)
	for {
		select {
		case <-h.changed:
			if cond(h.k.Snapshot()) {
				return
			}
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; snapshot: services %q, slices %q",
				what, names(h.k.Snapshot().Services), names(h.k.Snapshot().Slices))
		}
	}
}

// waitStatus polls Status until cond holds; errors have no callback.
func (h *kubeHarness) waitStatus(what string, cond func(Status) bool) Status {
	h.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(waitTimeout)
	for {
		if st := h.k.Status(); cond(st) {
			return st
		}
		select {
		case <-tick.C:
		case <-deadline:
			h.t.Fatalf("timed out waiting for %s; status %+v", what, h.k.Status())
		}
	}
}

func svcNames(s Snapshot) string   { return strings.Join(names(s.Services), ",") }
func sliceNames(s Snapshot) string { return strings.Join(names(s.Slices), ",") }

func TestKubernetesSync(t *testing.T) {
	h := newKubeHarness(t, KubernetesOptions{NodeName: "edge-1"},
		kubeService("b", "web", 80, nil),
		kubeService("a", "web", 80, nil),
		kubeService("a", "headless", 80, map[string]string{labelHeadless: ""}),
		kubeService("a", "theirs", 80, map[string]string{labelProxy: "other"}),
		kubeSlice("a", "web-1", "web", "10.0.0.1", nil),
		kubeSlice("a", "headless-1", "headless", "10.0.0.2", map[string]string{labelHeadless: ""}),
		kubeNode("edge-1", "192.0.2.1"),
		kubeNode("edge-2", "192.0.2.2"),
	)
	if st := h.k.Status(); st.Synced || st.Err != nil || !st.LastChange.IsZero() {
		t.Errorf("status before Run = %+v", st)
	}
	if snap := h.k.Snapshot(); len(snap.Services) != 0 || snap.Node != nil {
		t.Errorf("snapshot before Run = %+v", snap)
	}
	before := time.Now()
	h.start()
	select {
	case <-h.changed:
	case <-time.After(waitTimeout):
		t.Fatal("changed not called after sync")
	}
	st := h.k.Status()
	if !st.Synced || st.Err != nil || st.LastChange.Before(before) {
		t.Errorf("status after sync = %+v", st)
	}
	snap := h.k.Snapshot()
	if got, want := svcNames(snap), "a/web,b/web"; got != want {
		t.Errorf("services %s, want %s", got, want)
	}
	if got, want := sliceNames(snap), "a/web-1"; got != want {
		t.Errorf("slices %s, want %s", got, want)
	}
	if snap.Node == nil || snap.Node.Name != "edge-1" {
		t.Errorf("node = %v", snap.Node)
	}

	// The informers ask the API server for our objects only.
	var svcSel, nodeSel string
	for _, a := range h.client.Actions() {
		l, ok := a.(k8stesting.ListActionImpl)
		if !ok {
			continue
		}
		switch l.GetResource().Resource {
		case "services":
			svcSel = l.ListOptions.LabelSelector
		case "nodes":
			nodeSel = l.ListOptions.FieldSelector
		}
	}
	if want := model.LabelSelector("").String(); svcSel != want {
		t.Errorf("services listed with label selector %q, want %q", svcSel, want)
	}
	if want := "metadata.name=edge-1"; nodeSel != want {
		t.Errorf("nodes listed with field selector %q, want %q", nodeSel, want)
	}

	if err := h.k.Run(context.Background(), nil); err == nil {
		t.Error("second Run succeeded")
	}
}

func TestKubernetesNoNode(t *testing.T) {
	h := newKubeHarness(t, KubernetesOptions{ProxyName: "xdplb"},
		kubeService("a", "ours", 80, map[string]string{labelProxy: "xdplb"}),
		kubeService("a", "default", 80, nil),
		kubeNode("edge-1", "192.0.2.1"),
	)
	h.start()
	h.waitFor("sync", func(s Snapshot) bool { return true })
	snap := h.k.Snapshot()
	if got := svcNames(snap); got != "a/ours" {
		t.Errorf("services %s, want a/ours", got)
	}
	if snap.Node != nil {
		t.Errorf("node = %v, want nil without a node name", snap.Node)
	}
	for _, a := range h.client.Actions() {
		if a.GetResource().Resource == "nodes" {
			t.Errorf("nodes requested: %v", a)
		}
	}
}

// TestKubernetesEvents drives changes through the fake API server. The
// fake does not filter watches by label, so objects leaving the selection
// arrive as updates; the handlers and Snapshot must still get it right.
func TestKubernetesEvents(t *testing.T) {
	ctx := context.Background()
	h := newKubeHarness(t, KubernetesOptions{NodeName: "edge-1", ProxyName: "xdplb"},
		kubeNode("edge-1", "192.0.2.1"),
		kubeNode("edge-2", "192.0.2.2"),
	)
	h.start()
	h.waitFor("sync", func(s Snapshot) bool { return h.k.Status().Synced })

	ours := map[string]string{labelProxy: "xdplb"}
	svcs := h.client.CoreV1().Services("shop")
	eps := h.client.DiscoveryV1().EndpointSlices("shop")
	nodes := h.client.CoreV1().Nodes()
	steps := []struct {
		name string
		do   func() error
		want func(Snapshot) bool
	}{
		{
			"add service",
			func() error {
				_, err := svcs.Create(ctx, kubeService("shop", "web", 80, ours), metav1.CreateOptions{})
				return err
			},
			func(s Snapshot) bool { return svcNames(s) == "shop/web" },
		},
		{
			"add service of another proxy",
			func() error {
				_, err := svcs.Create(ctx, kubeService("shop", "api", 80, map[string]string{labelProxy: "other"}), metav1.CreateOptions{})
				if err != nil {
					return err
				}
				_, err = svcs.Create(ctx, kubeService("shop", "zz", 80, ours), metav1.CreateOptions{})
				return err
			},
			func(s Snapshot) bool { return svcNames(s) == "shop/web,shop/zz" },
		},
		{
			"update service",
			func() error {
				_, err := svcs.Update(ctx, kubeService("shop", "web", 81, ours), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool { return len(s.Services) == 2 && s.Services[0].Spec.Ports[0].Port == 81 },
		},
		{
			"label change into the selection",
			func() error {
				_, err := svcs.Update(ctx, kubeService("shop", "api", 80, ours), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool { return svcNames(s) == "shop/api,shop/web,shop/zz" },
		},
		{
			"label change out of the selection",
			func() error {
				_, err := svcs.Update(ctx, kubeService("shop", "web", 81, map[string]string{labelProxy: "xdplb", labelHeadless: ""}), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool { return svcNames(s) == "shop/api,shop/zz" },
		},
		{
			"delete service",
			func() error { return svcs.Delete(ctx, "zz", metav1.DeleteOptions{}) },
			func(s Snapshot) bool { return svcNames(s) == "shop/api" },
		},
		{
			"add slices",
			func() error {
				if _, err := eps.Create(ctx, kubeSlice("shop", "api-1", "api", "10.0.0.1", ours), metav1.CreateOptions{}); err != nil {
					return err
				}
				_, err := eps.Create(ctx, kubeSlice("shop", "api-2", "api", "10.0.0.2", ours), metav1.CreateOptions{})
				return err
			},
			func(s Snapshot) bool { return sliceNames(s) == "shop/api-1,shop/api-2" },
		},
		{
			"update slice",
			func() error {
				_, err := eps.Update(ctx, kubeSlice("shop", "api-1", "api", "10.0.0.9", ours), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool {
				return len(s.Slices) == 2 && s.Slices[0].Endpoints[0].Addresses[0] == "10.0.0.9"
			},
		},
		{
			"slice label change out of the selection",
			func() error {
				_, err := eps.Update(ctx, kubeSlice("shop", "api-2", "api", "10.0.0.2", nil), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool { return sliceNames(s) == "shop/api-1" },
		},
		{
			"delete slice",
			func() error { return eps.Delete(ctx, "api-1", metav1.DeleteOptions{}) },
			func(s Snapshot) bool { return sliceNames(s) == "" },
		},
		{
			"node addresses change",
			func() error {
				_, err := nodes.Update(ctx, kubeNode("edge-1", "192.0.2.11"), metav1.UpdateOptions{})
				return err
			},
			func(s Snapshot) bool { return s.Node != nil && s.Node.Status.Addresses[0].Address == "192.0.2.11" },
		},
		{
			"another node changes, then ours is deleted",
			func() error {
				if _, err := nodes.Update(ctx, kubeNode("edge-2", "192.0.2.12"), metav1.UpdateOptions{}); err != nil {
					return err
				}
				return nodes.Delete(ctx, "edge-1", metav1.DeleteOptions{})
			},
			func(s Snapshot) bool { return s.Node == nil },
		},
		{
			"node created",
			func() error {
				_, err := nodes.Create(ctx, kubeNode("edge-1", "192.0.2.21"), metav1.CreateOptions{})
				return err
			},
			func(s Snapshot) bool { return s.Node != nil && s.Node.Status.Addresses[0].Address == "192.0.2.21" },
		},
	}
	for _, step := range steps {
		if err := step.do(); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		h.waitFor(step.name, step.want)
	}
	if st := h.k.Status(); !st.Synced || st.Err != nil {
		t.Errorf("status = %+v", st)
	}
}

// TestKubernetesListFailure checks that failing requests show in Status
// and that the next successful one clears them.
func TestKubernetesListFailure(t *testing.T) {
	h := newKubeHarness(t, KubernetesOptions{}, kubeService("a", "web", 80, nil))
	var failing atomic.Bool
	failing.Store(true)
	h.client.PrependReactor("list", "services", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		if failing.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	before := time.Now()
	h.start()
	st := h.waitStatus("an error", func(st Status) bool { return st.Err != nil })
	if st.Synced || st.ErrSince.Before(before) {
		t.Errorf("status = %+v", st)
	}
	if msg := st.Err.Error(); !strings.HasPrefix(msg, "watch services: ") || !strings.HasSuffix(msg, ": connection refused") {
		t.Errorf("error %q, want the resource and the cause", msg)
	}
	failing.Store(false)
	h.waitFor("sync", func(s Snapshot) bool { return svcNames(s) == "a/web" })
	if st := h.k.Status(); !st.Synced || st.Err != nil || !st.ErrSince.IsZero() {
		t.Errorf("status after recovery = %+v", st)
	}
}

// TestKubernetesStopBeforeSync stops a source that never synced.
func TestKubernetesStopBeforeSync(t *testing.T) {
	before := runtime.NumGoroutine()
	h := newKubeHarness(t, KubernetesOptions{NodeName: "edge-1"})
	h.client.PrependReactor("list", "*", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		return true, nil, errors.New("unreachable")
	})
	h.start()
	h.waitStatus("an error", func(st Status) bool { return st.Err != nil })
	h.stop()
	select {
	case <-h.changed:
		t.Error("changed called without a sync")
	default:
	}
	deadline := time.Now().Add(waitTimeout)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before", runtime.NumGoroutine(), before)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKubernetesErrorBookkeeping(t *testing.T) {
	k := NewKubernetes(fake.NewClientset(), KubernetesOptions{NodeName: "n"}, nil)
	k.result(resServices, nil)
	if st := k.Status(); st.Err != nil {
		t.Fatalf("error without failure: %v", st.Err)
	}
	k.result(resNodes, errors.New("forbidden"))
	first := k.Status()
	k.result(resServices, errors.New("refused"))
	st := k.Status()
	if got, want := st.Err.Error(), "watch services: refused\nwatch nodes: forbidden"; got != want {
		t.Errorf("error %q, want %q", got, want)
	}
	if !st.ErrSince.Equal(first.ErrSince) {
		t.Error("ErrSince moved while failing")
	}
	k.result(resNodes, nil)
	if st := k.Status(); st.Err == nil || st.Err.Error() != "watch services: refused" || !st.ErrSince.Equal(first.ErrSince) {
		t.Errorf("status = %+v", st)
	}
	k.result(resServices, context.Canceled) // shutting down: not a failure
	k.result(resServices, nil)
	if st := k.Status(); st.Err != nil || !st.ErrSince.IsZero() {
		t.Errorf("status = %+v", st)
	}
}

// TestEventHandler checks which events call for a new snapshot.
func TestEventHandler(t *testing.T) {
	proxy := "xdplb"
	svc := func(port int32, rv string, labels map[string]string) *corev1.Service {
		s := kubeService("a", "web", port, labels)
		s.ResourceVersion = rv
		return s
	}
	ours := map[string]string{labelProxy: proxy}
	theirs := map[string]string{labelProxy: "other"}
	withManaged := svc(80, "3", ours)
	withManaged.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}
	node := func(rv, addr string, mutate func(*corev1.Node)) *corev1.Node {
		n := kubeNode("edge-1", addr)
		n.ResourceVersion = rv
		if mutate != nil {
			mutate(n)
		}
		return n
	}
	heartbeat := func(n *corev1.Node) {
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, LastHeartbeatTime: metav1.Now()}}
	}

	svcHandler := func(notify func()) cache.ResourceEventHandler {
		return eventHandler(notify, func(s *corev1.Service) bool { return model.Selected(s.Labels, proxy) }, sameService)
	}
	nodeHandler := func(notify func()) cache.ResourceEventHandler {
		return eventHandler(notify, func(n *corev1.Node) bool { return n.Name == "edge-1" }, sameNode)
	}
	tests := []struct {
		name    string
		handler func(func()) cache.ResourceEventHandler
		event   func(cache.ResourceEventHandler)
		want    bool
	}{
		{"add selected", svcHandler, func(h cache.ResourceEventHandler) { h.OnAdd(svc(80, "1", ours), false) }, true},
		{"add other proxy", svcHandler, func(h cache.ResourceEventHandler) { h.OnAdd(svc(80, "1", theirs), false) }, false},
		{"add not a service", svcHandler, func(h cache.ResourceEventHandler) { h.OnAdd("junk", false) }, false},
		{"update spec", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", ours), svc(81, "2", ours)) }, true},
		{"update resourceVersion only", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", ours), svc(80, "2", ours)) }, false},
		{"update managedFields only", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", ours), withManaged) }, false},
		{"resync", svcHandler, func(h cache.ResourceEventHandler) { s := svc(80, "1", ours); h.OnUpdate(s, s) }, false},
		{"labels leave the selection", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", ours), svc(80, "2", theirs)) }, true},
		{"labels enter the selection", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", theirs), svc(80, "2", ours)) }, true},
		{"update outside the selection", svcHandler, func(h cache.ResourceEventHandler) { h.OnUpdate(svc(80, "1", theirs), svc(81, "2", theirs)) }, false},
		{"delete", svcHandler, func(h cache.ResourceEventHandler) { h.OnDelete(svc(80, "1", ours)) }, true},
		{"delete tombstone", svcHandler, func(h cache.ResourceEventHandler) {
			h.OnDelete(cache.DeletedFinalStateUnknown{Key: "a/web", Obj: svc(80, "1", ours)})
		}, true},
		{"node addresses", nodeHandler, func(h cache.ResourceEventHandler) {
			h.OnUpdate(node("1", "192.0.2.1", nil), node("2", "192.0.2.2", nil))
		}, true},
		{"node labels", nodeHandler, func(h cache.ResourceEventHandler) {
			h.OnUpdate(node("1", "192.0.2.1", nil), node("2", "192.0.2.1", func(n *corev1.Node) { n.Labels = map[string]string{"zone": "b"} }))
		}, true},
		{"node heartbeat", nodeHandler, func(h cache.ResourceEventHandler) {
			h.OnUpdate(node("1", "192.0.2.1", nil), node("2", "192.0.2.1", heartbeat))
		}, false},
		{"other node", nodeHandler, func(h cache.ResourceEventHandler) {
			other := kubeNode("edge-2", "192.0.2.9")
			h.OnAdd(other, false)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			tt.event(tt.handler(func() { called = true }))
			if called != tt.want {
				t.Errorf("notified = %v, want %v", called, tt.want)
			}
		})
	}
}

func TestKubernetesInvalidProxyName(t *testing.T) {
	h := newKubeHarness(t, KubernetesOptions{ProxyName: "not a label value!"},
		kubeService("a", "web", 80, nil),
	)
	h.start()
	h.waitFor("sync", func(Snapshot) bool { return true })
	if snap := h.k.Snapshot(); len(snap.Services) != 0 {
		t.Errorf("services %q selected", names(snap.Services))
	}
	for _, a := range h.client.Actions() {
		if l, ok := a.(k8stesting.ListActionImpl); ok && l.ListOptions.LabelSelector == "" {
			t.Errorf("%s listed without a label selector", l.GetResource().Resource)
		}
	}
}
