package agent

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/reconcile"
)

// One purge runs at a time; backends removed meanwhile are purged by the
// next, together, except a reused id removed under another address,
// which gets a purge of its own.
func TestFlowPurgerMergesRemovalsDuringAPurge(t *testing.T) {
	be := func(addr string) dataplane.Backend {
		return dataplane.Backend{Addr: netip.MustParseAddr(addr), Port: 8080}
	}
	type batch = map[uint32]dataplane.Backend
	cases := []struct {
		name   string
		during []batch // removed while the first purge runs
		want   []batch // the purges after the first
	}{
		{"nothing meanwhile", nil, nil},
		{"removals meanwhile go into one purge",
			[]batch{{2: be("10.0.0.2")}, {3: be("10.0.0.3"), 4: be("10.0.0.4")}},
			[]batch{{2: be("10.0.0.2"), 3: be("10.0.0.3"), 4: be("10.0.0.4")}}},
		{"a backend removed twice is purged once",
			[]batch{{2: be("10.0.0.2")}, {2: be("10.0.0.2")}},
			[]batch{{2: be("10.0.0.2")}}},
		{"a reused id removed under another address is not lost",
			[]batch{{7: be("10.0.0.7")}, {7: be("10.0.0.70"), 8: be("10.0.0.8")}, {9: be("10.0.0.9")}},
			[]batch{{7: be("10.0.0.7")}, {7: be("10.0.0.70"), 8: be("10.0.0.8"), 9: be("10.0.0.9")}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			started, release := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var calls []batch
			var active, most atomic.Int32
			purge := func(ctx context.Context, _ *dataplane.Dataplane, stale reconcile.Stale) (reconcile.Purged, error) {
				removed := stale.Removed
				if n := active.Add(1); n > most.Load() {
					most.Store(n)
				}
				defer active.Add(-1)
				mu.Lock()
				calls = append(calls, maps.Clone(removed))
				first := len(calls) == 1
				mu.Unlock()
				if first {
					close(started)
					<-release
				}
				return reconcile.Purged{Flows: len(removed)}, nil
			}
			p := newFlowPurger(nil, discard(), purge)
			defer p.Stop()
			first := batch{1: be("10.0.0.1")}
			p.Add(reconcile.Stale{Removed: first})
			<-started
			for _, b := range c.during {
				p.Add(reconcile.Stale{Removed: b})
			}
			close(release)
			p.done.Wait() // the queue is empty once the purges end
			want := append([]batch{first}, c.want...)
			if len(calls) != len(want) {
				t.Fatalf("purges %v, want %v", calls, want)
			}
			for i := range want {
				if !maps.Equal(calls[i], want[i]) {
					t.Fatalf("purges %v, want %v", calls, want)
				}
			}
			if most.Load() != 1 {
				t.Errorf("%d purges ran at once, want 1", most.Load())
			}
		})
	}
}

// A purge running when the agent stops is cancelled and waited for: Run
// returns only once it has (the maps are closed after Run).
func TestAgentStopWaitsForThePurge(t *testing.T) {
	opts, dp := loadSmallDatapath(t)
	src := newMemorySource()
	src.put(hintsService("10.244.1.10", "10.244.1.11"))
	a, err := assemble(smallAgentConfig(opts), discard(), src, dp)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	var finished atomic.Bool
	a.purger.purge = func(ctx context.Context, _ *dataplane.Dataplane, _ reconcile.Stale) (reconcile.Purged, error) {
		close(started)
		<-ctx.Done()
		time.Sleep(100 * time.Millisecond) // a purge slow to notice
		finished.Store(true)
		return reconcile.Purged{}, ctx.Err()
	}
	synced := make(chan struct{}, 16)
	a.synced = func(map[string]bool) {
		select {
		case synced <- struct{}{}:
		default:
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-synced:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no sync in 30 s")
	}
	src.put(hintsService("10.244.1.10")) // a backend goes: its flows are purged
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("agent stopped: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no purge 30 s after a backend went")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return 30 s after the agent was stopped")
	}
	if !finished.Load() {
		t.Fatal("Run returned while a purge was still running")
	}
}

// Departures queued while a purge runs go into the next purge with the
// removals, whatever their backend ids.
func TestFlowPurgerQueuesDepartures(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	var calls []reconcile.Stale
	purge := func(ctx context.Context, _ *dataplane.Dataplane, stale reconcile.Stale) (reconcile.Purged, error) {
		calls = append(calls, stale)
		if len(calls) == 1 {
			close(started)
			<-release
		}
		return reconcile.Purged{}, nil
	}
	p := newFlowPurger(nil, discard(), purge)
	defer p.Stop()
	b := dataplane.Backend{Addr: netip.MustParseAddr("10.0.0.5"), Port: 8080}
	p.Add(reconcile.Stale{Removed: map[uint32]dataplane.Backend{1: b}})
	<-started
	left := reconcile.Departure{SvcID: 3, BackendID: 5, Backend: b}
	p.Add(reconcile.Stale{Departed: []reconcile.Departure{left}})
	p.Add(reconcile.Stale{Removed: map[uint32]dataplane.Backend{2: b}})
	close(release)
	p.done.Wait()
	if len(calls) != 2 || len(calls[1].Departed) != 1 || calls[1].Departed[0] != left || len(calls[1].Removed) != 1 {
		t.Fatalf("purges %+v, want the departure and the second removal in the second", calls)
	}
}

// A purge that deleted anything says so, affinity entries alone included
// (a backend that left a service port whose clients have affinity, its
// flows kept); one that deleted nothing says nothing.
func TestFlowPurgerLogsWhatItDeleted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		purged reconcile.Purged
		want   string // in the log; "" for no log line
	}{
		{"flows", reconcile.Purged{Flows: 3}, "flows=3 affinities=0"},
		{"affinity entries only", reconcile.Purged{Affinities: 2}, "flows=0 affinities=2"},
		{"nothing", reconcile.Purged{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			log := slog.New(slog.NewTextHandler(&out, nil))
			p := newFlowPurger(nil, log, func(context.Context, *dataplane.Dataplane, reconcile.Stale) (reconcile.Purged, error) {
				return tc.purged, nil
			})
			b := dataplane.Backend{Addr: netip.MustParseAddr("10.0.0.5"), Port: 8080}
			p.Add(reconcile.Stale{Departed: []reconcile.Departure{{SvcID: 3, BackendID: 5, Backend: b, AffinityOnly: true}}})
			p.done.Wait()
			p.Stop()
			got := out.String()
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("log %q, want %q", got, tc.want)
			}
		})
	}
}
