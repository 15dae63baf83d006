package agent

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/reconcile"
)

// purgeFunc forgets the tracked flows of removed and departed backends
// (reconcile.PurgeFlows; tests replace it).
type purgeFunc func(ctx context.Context, dp *dataplane.Dataplane, stale reconcile.Stale) (reconcile.Purged, error)

// flowPurger purges the flows of removed backends (and of backends that
// left a service port) in the background, one purge at a time: each walks
// the whole conntrack map, so backends removed while a purge runs wait
// and go together into the next one. A purge that fails is tried again.
// Stop cancels the purges and waits for them, so they end before the
// maps are closed.
type flowPurger struct {
	plane  *dataplane.Dataplane
	log    *slog.Logger
	purge  purgeFunc
	ctx    context.Context
	cancel context.CancelFunc
	// retryAfter is the wait before a batch whose purge failed is tried
	// again: its flows would keep their SNAT ports until evicted.
	retryAfter time.Duration

	mu sync.Mutex
	// queue holds what is not purged yet, in batches: a backend id is
	// reused, so one removed again under another address goes into a
	// batch of its own rather than replace the first.
	queue   []reconcile.Stale
	running bool
	done    sync.WaitGroup
}

// newFlowPurger returns a purger whose purges run until Stop.
func newFlowPurger(plane *dataplane.Dataplane, log *slog.Logger, purge purgeFunc) *flowPurger {
	ctx, cancel := context.WithCancel(context.Background())
	return &flowPurger{plane: plane, log: log, purge: purge, ctx: ctx, cancel: cancel, retryAfter: 5 * time.Second}
}

// Add queues the flows of removed and departed backends for purging, and
// starts a purge unless one is running (it takes them up when it is done).
func (p *flowPurger) Add(stale reconcile.Stale) {
	if stale.Empty() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return // stopped
	}
	p.enqueue(stale)
	if p.running {
		return
	}
	p.running = true
	p.done.Add(1)
	go p.run()
}

// enqueue merges stale into the last batch of the queue, or starts a new
// batch where an id there names another removed backend. (Departures name
// their backend's address: they merge whatever the ids.)
func (p *flowPurger) enqueue(stale reconcile.Stale) {
	if n := len(p.queue); n > 0 {
		last := &p.queue[n-1]
		clash := false
		for id, b := range stale.Removed {
			if have, ok := last.Removed[id]; ok && have != b {
				clash = true
				break
			}
		}
		if !clash {
			if last.Removed == nil && len(stale.Removed) > 0 {
				last.Removed = map[uint32]dataplane.Backend{}
			}
			maps.Copy(last.Removed, stale.Removed)
			last.Departed = append(last.Departed, stale.Departed...)
			last.Sweep = last.Sweep || stale.Sweep
			return
		}
	}
	p.queue = append(p.queue, reconcile.Stale{Removed: maps.Clone(stale.Removed), Departed: slices.Clone(stale.Departed),
		Sweep: stale.Sweep})
}

// run purges batches until the queue is empty or the purger stops.
func (p *flowPurger) run() {
	defer p.done.Done()
	for {
		p.mu.Lock()
		if len(p.queue) == 0 || p.ctx.Err() != nil {
			p.queue = nil
			p.running = false
			p.mu.Unlock()
			return
		}
		batch := p.queue[0]
		p.queue = p.queue[1:]
		p.mu.Unlock()

		purged, err := p.purge(p.ctx, p.plane, batch)
		switch {
		case err != nil && p.ctx.Err() == nil:
			p.log.Warn("purge stale flows; trying again", "removed_backends", len(batch.Removed),
				"departures", len(batch.Departed), "sweep", batch.Sweep, "after", p.retryAfter, "error", err)
			p.mu.Lock()
			p.queue = append([]reconcile.Stale{batch}, p.queue...)
			p.mu.Unlock()
			select {
			case <-p.ctx.Done():
			case <-time.After(p.retryAfter):
			}
		case purged.Flows > 0 || purged.Affinities > 0:
			p.log.Info("stale flows purged", "removed_backends", len(batch.Removed),
				"departures", len(batch.Departed), "sweep", batch.Sweep, "flows", purged.Flows,
				"affinities", purged.Affinities)
		}
	}
}

// Stop cancels the purge running, drops those queued and waits for the
// running one to return. Add does nothing afterwards.
func (p *flowPurger) Stop() {
	p.mu.Lock()
	p.cancel()
	p.mu.Unlock()
	p.done.Wait()
}
