package suite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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

	// Services currently in the API, by name.
	have map[string]bool
}

func startCluster(ctx context.Context, dir string, edge *netns.NS, log *slog.Logger) (*cluster, error) {
	start := time.Now()
	srv, err := apiserver.Run(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver: %w", err)
	}
	c := &cluster{srv: srv, log: log, dir: dir, have: map[string]bool{}}
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

// sync makes the API hold exactly the set's Services and EndpointSlices.
// Objects are immutable per name across sets (same name, same spec), so
// only creations and deletions are needed.
func (c *cluster) sync(ctx context.Context, set ServiceSet) error {
	start := time.Now()
	svcs, slices := set.Objects()
	want := map[string]bool{}
	var create []int
	for i, s := range svcs {
		want[s.Name] = true
		if !c.have[s.Name] {
			create = append(create, i)
		}
	}
	var remove []string
	for name := range c.have {
		if !want[name] {
			remove = append(remove, name)
		}
	}
	err := parallel(ctx, 32, len(create), func(ctx context.Context, k int) error {
		i := create[k]
		if _, err := c.client.CoreV1().Services(defaultNS).Create(ctx, svcs[i], metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create Service %s: %w", svcs[i].Name, err)
		}
		if _, err := c.client.DiscoveryV1().EndpointSlices(defaultNS).Create(ctx, slices[i], metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create EndpointSlice %s: %w", slices[i].Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, i := range create {
		c.have[svcs[i].Name] = true
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
		return err
	}
	for _, name := range remove {
		delete(c.have, name)
	}
	c.log.Info("Services in the API server", "services", len(c.have), "created", len(create), "deleted", len(remove),
		"took", time.Since(start).Round(time.Millisecond))
	return nil
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
