package suite

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/xdplb/xdplb/tests/apiserver"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// cluster is the real API server kube-proxy talks to. etcd and
// kube-apiserver run on loopback in the caller's namespace (as in the
// integration tests); a forwarder listening on the same loopback address
// and port inside the edge node carries kube-proxy's connections there, so
// the admin kubeconfig works unchanged in the node and nothing is
// configured outside the sandbox.
type cluster struct {
	srv    *apiserver.Server
	client kubernetes.Interface
	fwd    *topology.Forwarder
	log    *slog.Logger
	dir    string

	// Services currently in the API, by name, with digests of what they
	// and their EndpointSlices were given.
	have map[string]objectDigests
}

// objectDigests identify the content of a Service and of its EndpointSlice.
type objectDigests struct{ svc, slice [sha256.Size]byte }

// digestsOf returns the digests of the objects as sync writes them.
func digestsOf(svc *corev1.Service, slice *discoveryv1.EndpointSlice) (objectDigests, error) {
	var d objectDigests
	b, err := json.Marshal(svc)
	if err != nil {
		return d, err
	}
	d.svc = sha256.Sum256(b)
	if b, err = json.Marshal(slice); err != nil {
		return d, err
	}
	d.slice = sha256.Sum256(b)
	return d, nil
}

func startCluster(ctx context.Context, dir string, edge *netns.NS, cpus []int, log *slog.Logger) (*cluster, error) {
	start := time.Now()
	srv, err := apiserver.Run(ctx, dir, apiserver.WithCPUs(cpus...))
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver: %w", err)
	}
	c := &cluster{srv: srv, log: log, dir: dir, have: map[string]objectDigests{}}
	cfg := srv.AdminConfig()
	cfg.QPS, cfg.Burst = 5000, 10000
	cfg.UserAgent = "xdplb-perf"
	// externalIPs draw a deprecation warning per object.
	cfg.WarningHandler = rest.NoWarnings{}
	if c.client, err = kubernetes.NewForConfig(cfg); err != nil {
		srv.Stop()
		return nil, fmt.Errorf("API client: %w", err)
	}
	u, err := url.Parse(srv.URL())
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("API server URL: %w", err)
	}
	if c.fwd, err = topology.Forward(edge, u.Host, u.Host); err != nil {
		srv.Stop()
		return nil, err
	}
	if err := c.ensureNode(ctx); err != nil {
		c.stop()
		return nil, err
	}
	log.Info("API server ready", "url", srv.URL(), "took", time.Since(start).Round(time.Millisecond))
	return c, nil
}

func (c *cluster) kubeconfig() string { return c.srv.AdminKubeconfig() }

func (c *cluster) stop() error {
	var errs []error
	if c.fwd != nil {
		c.fwd.Close()
	}
	errs = append(errs, c.srv.Stop())
	// etcd's database holds up to 100k Services (a few hundred MB per
	// run) and is of no use afterwards; the servers' logs stay.
	if err := os.RemoveAll(filepath.Join(c.dir, "etcd")); err != nil {
		errs = append(errs, fmt.Errorf("remove etcd data: %w", err))
	}
	return errors.Join(errs...)
}

// ensureNode creates the Node objects kube-proxy looks up: the edge node
// (its own, by --hostname-override) and node2.
func (c *cluster) ensureNode(ctx context.Context) error {
	for _, n := range []struct {
		name string
		addr string
		cidr string
	}{{edgeNode, EdgeAddr.String(), "10.244.1.0/24"}, {remoteNode, Node2Addr.String(), RemotePodCIDR.String()}} {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"kubernetes.io/hostname": n.name}},
			Spec:       corev1.NodeSpec{PodCIDR: n.cidr, PodCIDRs: []string{n.cidr}},
		}
		created, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("create Node %s: %w", n.name, err)
		}
		created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.addr}}
		created.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		if _, err := c.client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("set Node %s status: %w", n.name, err)
		}
	}
	return nil
}

// sync makes the API hold exactly the set's Services and EndpointSlices:
// it creates what is missing, deletes what the set lacks and updates what
// changed. The same Service can have other endpoints in another set (16
// as a target, one otherwise, depending on the set's stride), and
// kube-proxy must see what xdplb's services file of the same set says.
func (c *cluster) sync(ctx context.Context, set ServiceSet) error {
	svcs, slices := set.Objects()
	return c.syncObjects(ctx, svcs, slices)
}

// syncObjects makes the API hold exactly these Services and their
// EndpointSlices (slices[i] belongs to svcs[i]).
func (c *cluster) syncObjects(ctx context.Context, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) error {
	start := time.Now()
	want := make(map[string]objectDigests, len(svcs))
	var write []int
	for i, s := range svcs {
		d, err := digestsOf(s, slices[i])
		if err != nil {
			return fmt.Errorf("digest of Service %s: %w", s.Name, err)
		}
		want[s.Name] = d
		if have, ok := c.have[s.Name]; !ok || have != d {
			write = append(write, i)
		}
	}
	var remove []string
	for name := range c.have {
		if _, ok := want[name]; !ok {
			remove = append(remove, name)
		}
	}
	var created, updated atomic.Int64
	err := parallel(ctx, 32, len(write), func(ctx context.Context, k int) error {
		i := write[k]
		have, known := c.have[svcs[i].Name]
		if !known || have.svc != want[svcs[i].Name].svc {
			n, err := c.writeService(ctx, svcs[i], known)
			if err != nil {
				return err
			}
			created.Add(n.created)
			updated.Add(n.updated)
		}
		if !known || have.slice != want[svcs[i].Name].slice {
			n, err := c.writeSlice(ctx, slices[i], known)
			if err != nil {
				return err
			}
			created.Add(n.created)
			updated.Add(n.updated)
		}
		return nil
	})
	if err != nil {
		c.forget(want)
		return err
	}
	for _, i := range write {
		c.have[svcs[i].Name] = want[svcs[i].Name]
	}
	err = parallel(ctx, 32, len(remove), func(ctx context.Context, k int) error {
		name := remove[k]
		if err := c.client.DiscoveryV1().EndpointSlices(defaultNS).Delete(ctx, name+"-perf", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete EndpointSlice %s-perf: %w", name, err)
		}
		if err := c.client.CoreV1().Services(defaultNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete Service %s: %w", name, err)
		}
		return nil
	})
	if err != nil {
		c.forget(want)
		return err
	}
	for _, name := range remove {
		delete(c.have, name)
	}
	c.log.Info("Services in the API server", "services", len(c.have), "objects_created", created.Load(),
		"objects_updated", updated.Load(), "services_deleted", len(remove), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// forget follows a sync that failed part-way: what it wrote is not known
// exactly. Every name the API may hold now (known before, or wanted by the
// sync) stays known, so a later sync can delete it, with digests that
// match no object, so a later sync writes it again.
func (c *cluster) forget(want map[string]objectDigests) {
	for name := range c.have {
		c.have[name] = objectDigests{}
	}
	for name := range want {
		c.have[name] = objectDigests{}
	}
}

// writes counts the objects a write created and updated.
type writes struct{ created, updated int64 }

// writeService creates svc, or replaces the Service of its name (first,
// when it is known to exist).
func (c *cluster) writeService(ctx context.Context, svc *corev1.Service, exists bool) (writes, error) {
	return writeObject(ctx, c.client.CoreV1().Services(defaultNS), svc, "Service", svc.Name, exists)
}

// writeSlice is writeService for an EndpointSlice.
func (c *cluster) writeSlice(ctx context.Context, slice *discoveryv1.EndpointSlice, exists bool) (writes, error) {
	return writeObject(ctx, c.client.DiscoveryV1().EndpointSlices(defaultNS), slice, "EndpointSlice", slice.Name, exists)
}

// objectAPI is the part of a typed client writeObject uses.
type objectAPI[T any] interface {
	Create(context.Context, T, metav1.CreateOptions) (T, error)
	Update(context.Context, T, metav1.UpdateOptions) (T, error)
}

// writeObject creates obj (a kind named name), or replaces the object of
// its name: first, when it is known to exist; when it is not there after
// all, it is created.
func writeObject[T any](ctx context.Context, api objectAPI[T], obj T, kind, name string, exists bool) (writes, error) {
	if !exists {
		_, err := api.Create(ctx, obj, metav1.CreateOptions{})
		if err == nil {
			return writes{created: 1}, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return writes{}, fmt.Errorf("create %s %s: %w", kind, name, err)
		}
	}
	// Unconditional (no resourceVersion): nothing else writes these.
	_, err := api.Update(ctx, obj, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		if _, err = api.Create(ctx, obj, metav1.CreateOptions{}); err == nil {
			return writes{created: 1}, nil
		}
	}
	if err != nil {
		return writes{}, fmt.Errorf("update %s %s: %w", kind, name, err)
	}
	return writes{updated: 1}, nil
}

// parallel runs fn for 0..n-1 on up to workers goroutines and returns the
// first error (the others are cancelled).
func parallel(ctx context.Context, workers, n int, fn func(context.Context, int) error) error {
	if n == 0 {
		return nil
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(workers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		}()
	}
feed:
	for i := 0; i < n; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}
