package agent

import (
	"context"
	"log/slog"
	"maps"
	"sync"

	"github.com/xdplb/xdplb/control/dataplane"
)

// purgeFunc forgets the tracked flows of removed backends
// (reconcile.PurgeFlows; tests replace it).
type purgeFunc func(ctx context.Context, dp *dataplane.Dataplane, removed map[uint32]dataplane.Backend) (int, error)

// flowPurger purges the flows of removed backends in the background, one
// purge at a time: each walks the whole conntrack map, so backends
// removed while a purge runs wait and go together into the next one.
// Stop cancels the purges and waits for them, so they end before the
// maps are closed.
type flowPurger struct {
	plane  *dataplane.Dataplane
	log    *slog.Logger
	purge  purgeFunc
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// queue holds the removed backends not purged yet, in batches: a
	// backend id is reused, so one removed again under another address
	// goes into a batch of its own rather than replace the first.
	queue   []map[uint32]dataplane.Backend
	running bool
	done    sync.WaitGroup
}

// newFlowPurger returns a purger whose purges run until Stop.
func newFlowPurger(plane *dataplane.Dataplane, log *slog.Logger, purge purgeFunc) *flowPurger {
	ctx, cancel := context.WithCancel(context.Background())
	return &flowPurger{plane: plane, log: log, purge: purge, ctx: ctx, cancel: cancel}
}

// Add queues the flows of removed backends for purging, and starts a
// purge unless one is running (it takes them up when it is done).
func (p *flowPurger) Add(removed map[uint32]dataplane.Backend) {
	if len(removed) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return // stopped
	}
	p.enqueue(removed)
	if p.running {
		return
	}
	p.running = true
	p.done.Add(1)
	go p.run()
}

// enqueue merges removed into the last batch of the queue, or starts a
// new batch where an id there names another backend.
func (p *flowPurger) enqueue(removed map[uint32]dataplane.Backend) {
	if n := len(p.queue); n > 0 {
		last := p.queue[n-1]
		clash := false
		for id, b := range removed {
			if have, ok := last[id]; ok && have != b {
				clash = true
				break
			}
		}
		if !clash {
			maps.Copy(last, removed)
			return
		}
	}
	p.queue = append(p.queue, maps.Clone(removed))
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

		n, err := p.purge(p.ctx, p.plane, batch)
		switch {
		case err != nil && p.ctx.Err() == nil:
			p.log.Warn("purge flows of removed backends", "backends", len(batch), "error", err)
		case n > 0:
			p.log.Info("flows of removed backends purged", "backends", len(batch), "flows", n)
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
