package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"

	"github.com/xdplb/xdplb/control/model"
)

// KubernetesOptions configures a Kubernetes source.
type KubernetesOptions struct {
	// NodeName is the name of the node the agent runs on; its Node object
	// is watched. Empty means no Node is watched (Snapshot.Node stays
	// nil).
	NodeName string
	// ProxyName is the agent's service-proxy-name; see model.Selected.
	ProxyName string
	// ResyncPeriod is the informers' resync period; 0 disables resyncs,
	// which this source does not need.
	ResyncPeriod time.Duration
}

// The resources watched, as named in errors.
const (
	resServices       = "services"
	resEndpointSlices = "endpointslices"
	resNodes          = "nodes"
	// resAPIServer is the readiness probe: a watch that is accepted and
	// closed at once (a load balancer in front of a stopped API server)
	// looks like success to the informers, the probe does not.
	resAPIServer = "apiserver"

	// probeInterval is how often the API server's /readyz is asked.
	probeInterval = 2 * time.Second
)

// Kubernetes is a Source watching the Kubernetes API through shared
// informers: Services and EndpointSlices selected by the proxy name (see
// model.LabelSelector), and this node's Node.
//
// The informers keep their last view while the API server cannot be
// reached, so the snapshot stays in effect; Status().Err says why it may be
// stale. The error is set when a list or watch request for any of the
// resources fails or a watch breaks, and cleared when the next list or
// watch request for that resource succeeds.
type Kubernetes struct {
	opts   KubernetesOptions
	log    *slog.Logger
	client kubernetes.Interface

	factory     informers.SharedInformerFactory
	nodeFactory informers.SharedInformerFactory // nil without NodeName
	svcInformer cache.SharedIndexInformer
	svcLister   corelisters.ServiceLister
	epsInformer cache.SharedIndexInformer
	epsLister   discoverylisters.EndpointSliceLister
	nodInformer cache.SharedIndexInformer // nil without NodeName
	nodLister   corelisters.NodeLister    // nil without NodeName

	started atomic.Bool
	synced  atomic.Bool

	mu         sync.Mutex
	lastChange time.Time
	errs       map[string]error // failing resources
	errSince   time.Time
}

var _ Source = (*Kubernetes)(nil)

// NewKubernetes returns a source watching the API server behind client.
// A nil log discards messages.
func NewKubernetes(client kubernetes.Interface, opts KubernetesOptions, log *slog.Logger) *Kubernetes {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &Kubernetes{
		opts:   opts,
		log:    log,
		client: client,
		errs:   make(map[string]error),
	}
	tracked := &trackingClient{Interface: client, k: k}

	sel := model.LabelSelector(opts.ProxyName)
	selector := sel.String()
	if _, ok := sel.Requirements(); !ok {
		// No object can carry an invalid label value: select nothing
		// rather than (with an empty selector string) everything.
		log.Error("the proxy name is not a valid label value; no Service is selected", "proxyName", opts.ProxyName)
		selector = model.LabelServiceProxyName + ",!" + model.LabelServiceProxyName
	}
	k.factory = informers.NewSharedInformerFactoryWithOptions(tracked, opts.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector }),
		informers.WithTransform(dropManagedFields))
	svcs := k.factory.Core().V1().Services()
	k.svcInformer, k.svcLister = svcs.Informer(), svcs.Lister()
	eps := k.factory.Discovery().V1().EndpointSlices()
	k.epsInformer, k.epsLister = eps.Informer(), eps.Lister()
	k.setErrorHandler(k.svcInformer, resServices)
	k.setErrorHandler(k.epsInformer, resEndpointSlices)

	if opts.NodeName != "" {
		byName := fields.OneTermEqualSelector("metadata.name", opts.NodeName).String()
		k.nodeFactory = informers.NewSharedInformerFactoryWithOptions(tracked, opts.ResyncPeriod,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = byName }),
			informers.WithTransform(dropManagedFields))
		nodes := k.nodeFactory.Core().V1().Nodes()
		k.nodInformer, k.nodLister = nodes.Informer(), nodes.Lister()
		k.setErrorHandler(k.nodInformer, resNodes)
	}
	return k
}

// dropManagedFields saves memory: nothing here reads managedFields.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

func (k *Kubernetes) setErrorHandler(inf cache.SharedIndexInformer, resource string) {
	err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		switch {
		case ctx.Err() != nil, errors.Is(err, io.EOF):
			// Shutting down, or a watch that ended normally.
		case apierrors.IsResourceExpired(err), apierrors.IsGone(err):
			// The informer lists again; nothing is wrong.
		default:
			k.result(resource, err)
		}
	})
	if err != nil {
		// Only possible once the informer has started.
		k.log.Error("cannot set the watch error handler", "resource", resource, "err", err)
	}
}

// result records the outcome of a request for resource: a failure is kept
// until a request for the same resource succeeds.
func (k *Kubernetes) result(resource string, err error) {
	if err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		return // shutting down
	}
	k.mu.Lock()
	prev, failing := k.errs[resource], len(k.errs) > 0
	switch {
	case err != nil:
		if !failing {
			k.errSince = time.Now()
		}
		k.errs[resource] = err
	case prev != nil:
		delete(k.errs, resource)
		if len(k.errs) == 0 {
			k.errSince = time.Time{}
		}
	}
	k.mu.Unlock()

	switch {
	case err != nil && (prev == nil || prev.Error() != err.Error()):
		k.log.Warn("watching the API server failed; keeping the last view", "resource", resource, "err", err)
	case err == nil && prev != nil:
		k.log.Info("watching the API server works again", "resource", resource)
	}
}

// Run starts the informers, calls changed once all caches have synced and
// after every relevant change from then on, and stops the informers when
// ctx is done. Before the caches have synced, changed is not called, so the
// caller never acts on a partial view. Run may be called only once.
func (k *Kubernetes) Run(ctx context.Context, changed func()) error {
	if changed == nil {
		changed = func() {}
	}
	if !k.started.CompareAndSwap(false, true) {
		return errors.New("kubernetes source: Run may be called only once")
	}
	notify := func() {
		k.mu.Lock()
		k.lastChange = time.Now()
		k.mu.Unlock()
		if k.synced.Load() {
			changed()
		}
	}
	proxy := k.opts.ProxyName
	type registration struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}
	regs := []registration{
		{k.svcInformer, eventHandler(notify,
			func(s *corev1.Service) bool { return model.Selected(s.Labels, proxy) },
			sameService)},
		{k.epsInformer, eventHandler(notify,
			func(s *discoveryv1.EndpointSlice) bool { return model.Selected(s.Labels, proxy) },
			sameSlice)},
	}
	if k.nodInformer != nil {
		regs = append(regs, registration{k.nodInformer, eventHandler(notify,
			func(n *corev1.Node) bool { return n.Name == k.opts.NodeName },
			sameNode)})
	}
	for _, r := range regs {
		if _, err := r.inf.AddEventHandler(r.h); err != nil {
			return fmt.Errorf("kubernetes source: %w", err)
		}
	}

	ctx, cancel := context.WithCancel(ctx)
	factories := []informers.SharedInformerFactory{k.factory}
	if k.nodeFactory != nil {
		factories = append(factories, k.nodeFactory)
	}
	defer func() {
		cancel()
		for _, f := range factories {
			f.Shutdown() // waits for the informers to stop
		}
	}()
	for _, f := range factories {
		f.StartWithContext(ctx)
	}
	k.log.Info("waiting for the informer caches to sync", "node", k.opts.NodeName, "proxyName", proxy)
	start := time.Now()
	for _, f := range factories {
		if f.WaitForCacheSyncWithContext(ctx).Err != nil {
			return nil // ctx is done
		}
	}
	k.mu.Lock()
	k.lastChange = time.Now()
	k.mu.Unlock()
	k.synced.Store(true)
	k.log.Info("informer caches synced", "took", time.Since(start).Round(time.Millisecond))
	changed()

	tick := time.NewTicker(probeInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			k.probe(ctx)
		}
	}
}

// probe asks the API server whether it is ready, once, without retries.
func (k *Kubernetes) probe(ctx context.Context) {
	rc := k.client.Discovery().RESTClient()
	if rc == nil {
		return // a fake client: nothing to probe
	}
	ctx, cancel := context.WithTimeout(ctx, probeInterval)
	defer cancel()
	err := rc.Get().AbsPath("/readyz").MaxRetries(0).Do(ctx).Error()
	if ctx.Err() != nil && err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return // shutting down
	}
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		err = errors.New("API server /readyz did not answer in time")
	}
	k.result(resAPIServer, err)
}

// eventHandler calls notify for the events that may change the view:
// additions of selected objects, updates that touch a selected object
// (including label changes into or out of the selection) other than in its
// resourceVersion or managedFields, and every deletion.
func eventHandler[T any](notify func(), selected func(T) bool, same func(a, b T) bool) cache.ResourceEventHandler {
	sel := func(obj any) bool {
		o, ok := obj.(T)
		return ok && selected(o)
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if sel(obj) {
				notify()
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			was, is := sel(oldObj), sel(newObj)
			if !was && !is {
				return
			}
			if was && is {
				o, _ := oldObj.(T)
				n, _ := newObj.(T)
				if same(o, n) {
					return
				}
			}
			notify()
		},
		DeleteFunc: func(obj any) {
			// The deleted object (or a tombstone of it) may carry
			// labels from before or after a change that made it
			// leave the selection; either way the view may change.
			notify()
		},
	}
}

// sameService reports whether two versions of a Service differ at most in
// their resourceVersion and managedFields.
func sameService(a, b *corev1.Service) bool {
	if a == b {
		return true
	}
	x, y := *a, *b
	stripVersion(&x.ObjectMeta, &y.ObjectMeta)
	return equality.Semantic.DeepEqual(&x, &y)
}

// sameSlice is sameService for EndpointSlices.
func sameSlice(a, b *discoveryv1.EndpointSlice) bool {
	if a == b {
		return true
	}
	x, y := *a, *b
	stripVersion(&x.ObjectMeta, &y.ObjectMeta)
	return equality.Semantic.DeepEqual(&x, &y)
}

// sameNode reports whether two versions of a Node agree in what the model
// may use: metadata (labels, annotations), spec and addresses. Heartbeats
// and other status changes are ignored.
func sameNode(a, b *corev1.Node) bool {
	if a == b {
		return true
	}
	x, y := a.ObjectMeta, b.ObjectMeta
	stripVersion(&x, &y)
	return equality.Semantic.DeepEqual(&x, &y) &&
		equality.Semantic.DeepEqual(&a.Spec, &b.Spec) &&
		equality.Semantic.DeepEqual(a.Status.Addresses, b.Status.Addresses)
}

// stripVersion clears the metadata that changes with every write.
func stripVersion(x, y *metav1.ObjectMeta) {
	x.ResourceVersion, y.ResourceVersion = "", ""
	x.ManagedFields, y.ManagedFields = nil, nil
}

// Snapshot returns the informers' current view: selected Services and
// EndpointSlices sorted by namespace and name, and the Node when known.
// Before the caches have synced (Status().Synced) it may be partial.
func (k *Kubernetes) Snapshot() Snapshot {
	var snap Snapshot
	proxy := k.opts.ProxyName
	if svcs, err := k.svcLister.List(labels.Everything()); err == nil {
		snap.Services = slices.DeleteFunc(svcs, func(s *corev1.Service) bool { return !model.Selected(s.Labels, proxy) })
	}
	if eps, err := k.epsLister.List(labels.Everything()); err == nil {
		snap.Slices = slices.DeleteFunc(eps, func(s *discoveryv1.EndpointSlice) bool { return !model.Selected(s.Labels, proxy) })
	}
	sortObjects(snap.Services)
	sortObjects(snap.Slices)
	if k.nodLister != nil {
		if n, err := k.nodLister.Get(k.opts.NodeName); err == nil {
			snap.Node = n
		}
	}
	return snap
}

// Status returns the source's health: Synced once all caches have synced,
// LastChange at the last relevant event, and Err while requests to the API
// server fail.
func (k *Kubernetes) Status() Status {
	st := Status{Synced: k.synced.Load()}
	k.mu.Lock()
	defer k.mu.Unlock()
	st.LastChange = k.lastChange
	if len(k.errs) > 0 {
		var errs []error
		for _, res := range []string{resServices, resEndpointSlices, resNodes, resAPIServer} {
			if err := k.errs[res]; err != nil {
				errs = append(errs, fmt.Errorf("watch %s: %w", res, err))
			}
		}
		st.Err = errors.Join(errs...)
		st.ErrSince = k.errSince
	}
	return st
}

// trackingClient passes the informers' list and watch requests through to
// the client and records their outcome, so that an error is cleared by the
// next request that succeeds.
type trackingClient struct {
	kubernetes.Interface
	k *Kubernetes
}

// IsWatchListSemanticsUnSupported passes the wrapped client's answer on to
// the informers.
func (c *trackingClient) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.Interface)
}

func (c *trackingClient) CoreV1() corev1client.CoreV1Interface {
	return trackingCoreV1{c.Interface.CoreV1(), c.k}
}

func (c *trackingClient) DiscoveryV1() discoveryv1client.DiscoveryV1Interface {
	return trackingDiscoveryV1{c.Interface.DiscoveryV1(), c.k}
}

type trackingCoreV1 struct {
	corev1client.CoreV1Interface
	k *Kubernetes
}

func (c trackingCoreV1) Services(namespace string) corev1client.ServiceInterface {
	return trackedServices{c.CoreV1Interface.Services(namespace), c.k}
}

func (c trackingCoreV1) Nodes() corev1client.NodeInterface {
	return trackedNodes{c.CoreV1Interface.Nodes(), c.k}
}

type trackingDiscoveryV1 struct {
	discoveryv1client.DiscoveryV1Interface
	k *Kubernetes
}

func (c trackingDiscoveryV1) EndpointSlices(namespace string) discoveryv1client.EndpointSliceInterface {
	return trackedSlices{c.DiscoveryV1Interface.EndpointSlices(namespace), c.k}
}

// track records the outcome of a request and passes it on.
func track[T any](k *Kubernetes, resource string, v T, err error) (T, error) {
	k.result(resource, err)
	return v, err
}

type trackedServices struct {
	corev1client.ServiceInterface
	k *Kubernetes
}

func (c trackedServices) List(ctx context.Context, opts metav1.ListOptions) (*corev1.ServiceList, error) {
	l, err := c.ServiceInterface.List(ctx, opts)
	return track(c.k, resServices, l, err)
}

func (c trackedServices) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := c.ServiceInterface.Watch(ctx, opts)
	return track(c.k, resServices, w, err)
}

type trackedSlices struct {
	discoveryv1client.EndpointSliceInterface
	k *Kubernetes
}

func (c trackedSlices) List(ctx context.Context, opts metav1.ListOptions) (*discoveryv1.EndpointSliceList, error) {
	l, err := c.EndpointSliceInterface.List(ctx, opts)
	return track(c.k, resEndpointSlices, l, err)
}

func (c trackedSlices) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := c.EndpointSliceInterface.Watch(ctx, opts)
	return track(c.k, resEndpointSlices, w, err)
}

type trackedNodes struct {
	corev1client.NodeInterface
	k *Kubernetes
}

func (c trackedNodes) List(ctx context.Context, opts metav1.ListOptions) (*corev1.NodeList, error) {
	l, err := c.NodeInterface.List(ctx, opts)
	return track(c.k, resNodes, l, err)
}

func (c trackedNodes) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := c.NodeInterface.Watch(ctx, opts)
	return track(c.k, resNodes, w, err)
}
