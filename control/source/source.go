// Package source supplies the objects the model is computed from: Services
// and EndpointSlices (and this node's Node object), either from the
// Kubernetes API through shared informers or from a services file holding
// the same objects in YAML.
package source

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Snapshot is a consistent view of the inputs at one moment. Services and
// Slices are sorted by namespace and name and hold only the objects the
// agent's proxy name selects (see model.Selected). The objects and slices
// are shared: callers must not modify them.
type Snapshot struct {
	Services []*corev1.Service
	Slices   []*discoveryv1.EndpointSlice
	// Node is this node's Node object, nil when unknown (services-file
	// mode, or not yet seen).
	Node *corev1.Node
}

// Status describes the health of a source.
type Status struct {
	// Synced is true once the first complete view has been loaded.
	Synced bool
	// LastChange is when the view last changed (or was first loaded).
	LastChange time.Time
	// Err is the most recent problem reading the source (a broken file, an
	// unreachable API server), nil when the last read succeeded. The last
	// good view stays in effect while Err is set.
	Err error
	// ErrSince is when the current run of problems began: it stays put
	// while Err changes from one problem to the next, and is zero when Err
	// is nil.
	ErrSince time.Time
}

// Source is where desired state comes from.
type Source interface {
	// Run watches the source until ctx is done. It calls changed (from
	// any goroutine, possibly concurrently and in bursts; the caller
	// coalesces, and changed should return quickly) whenever the view may
	// have changed, including once after the first complete load; never
	// before it. It returns nil when ctx ends, or an error if it cannot
	// run at all.
	Run(ctx context.Context, changed func()) error
	// Snapshot returns the current view. It may be called at any time,
	// from any goroutine; before the first complete load the view is
	// empty or partial.
	Snapshot() Snapshot
	// Status returns the source's health.
	Status() Status
}

// sortObjects sorts objects by namespace and name.
func sortObjects[T metav1.Object](objs []T) {
	slices.SortFunc(objs, func(a, b T) int {
		return cmp.Or(strings.Compare(a.GetNamespace(), b.GetNamespace()), strings.Compare(a.GetName(), b.GetName()))
	})
}
