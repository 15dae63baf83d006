package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/xdp"
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

// Naming the port of a one-port Service, as adding a second port requires,
// makes it another service port to the model (its key names the port),
// with the same frontends. The agent's purge must not end its flows: a
// SNAT flow to a backend the port keeps carries on, while the flow of a
// backend that went in the same change is purged.
func TestAgentKeepsFlowsOfARenamedPort(t *testing.T) {
	opts, dp := loadSmallDatapath(t)
	frontend := netip.MustParseAddrPort("192.0.2.1:30080")
	kept, gone := netip.MustParseAddrPort("10.244.1.10:8080"), netip.MustParseAddrPort("10.244.1.11:8080")
	type port struct {
		name             string
		port, target, np int32
	}
	service := func(ports []port, endpoints ...netip.AddrPort) (*corev1.Service, *discoveryv1.EndpointSlice) {
		svc := &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "rename", Name: "web", ResourceVersion: fmt.Sprint(len(ports))},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10",
				ClusterIPs: []string{"10.96.0.10"}, Selector: map[string]string{"app": "web"}},
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Namespace: "rename", Name: "web-1", ResourceVersion: fmt.Sprint(len(ports)),
				Labels: map[string]string{discoveryv1.LabelServiceName: "web",
					discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
			AddressType: discoveryv1.AddressTypeIPv4,
		}
		proto, node := corev1.ProtocolTCP, "node-1" // endpoints on another node: SNAT
		for _, p := range ports {
			svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.name, Protocol: proto, Port: p.port,
				TargetPort: intstr.FromInt32(p.target), NodePort: p.np})
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: &p.name, Port: &p.target, Protocol: &proto})
		}
		for _, e := range endpoints {
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.Addr().String()},
				NodeName: &node})
		}
		return svc, slice
	}

	src := newMemorySource()
	src.put(service([]port{{"", 80, 8080, 30080}}, kept, gone))
	a, err := assemble(smallAgentConfig(opts), discard(), src, dp)
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan struct{}, 16)
	a.synced = func(map[string]bool) {
		select {
		case synced <- struct{}{}:
		default:
		}
	}
	done := runAgent(t, a)
	// purged waits for the purges queued by the syncs so far.
	purged := func() {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			a.purger.mu.Lock()
			idle := !a.purger.running && len(a.purger.queue) == 0
			a.purger.mu.Unlock()
			if idle {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("a purge still running after 30 s")
			}
		}
	}
	// syncedUntil waits for syncs until cond holds.
	syncedUntil := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.After(30 * time.Second); !cond(); {
			select {
			case <-synced:
			case err := <-done:
				t.Fatalf("agent stopped: %v", err)
			case <-deadline:
				t.Fatalf("no sync %s in 30 s", what)
			}
		}
	}
	clusterIPPort := func(port uint16) (dataplane.Frontend, bool) {
		fes, err := a.plane.Frontends()
		if err != nil {
			t.Fatal(err)
		}
		fe, ok := fes[dataplane.FrontendKey{Addr: netip.MustParseAddr("10.96.0.10"), Port: port, Proto: dataplane.TCP}]
		return fe, ok
	}
	syncedUntil("programming the Service", func() bool { _, ok := clusterIPPort(80); return ok })
	purged() // the first sync's sweep
	fe, _ := clusterIPPort(80)
	bes, err := a.plane.Backends()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[netip.AddrPort]uint32{}
	for id, b := range bes {
		ids[netip.AddrPortFrom(b.Addr, b.Port)] = id
	}

	// An established SNAT flow to each backend, its reply tuple in the
	// slot of its SNAT port.
	var cfg xdp.DatapathConfig
	if err := dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	clients := map[netip.AddrPort]netip.AddrPort{}
	for i, backend := range []netip.AddrPort{kept, gone} {
		client := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), 40000+uint16(i))
		snat := netip.AddrPortFrom(frontend.Addr(), cfg.SnatPortMin+uint16(i))
		key := xdp.CtKey{Saddr: xdp.AddrToNet(client.Addr()), Sport: xdp.PortToNet(client.Port()),
			Daddr: xdp.AddrToNet(frontend.Addr()), Dport: xdp.PortToNet(frontend.Port()), Proto: dataplane.TCP}
		flags := uint8(xdp.CtFlagsCT_F_SNAT | xdp.CtFlagsCT_F_EXTERNAL)
		now := uint64(dataplane.Now())
		if err := dp.Maps.Conntrack.Put(key, xdp.CtEntry{CreatedNs: now, LastSeenNs: now, SvcId: fe.SvcID,
			BackendId: ids[backend], BackendAddr: xdp.AddrToNet(backend.Addr()), BackendPort: xdp.PortToNet(backend.Port()),
			NatAddr: xdp.AddrToNet(snat.Addr()), NatPort: xdp.PortToNet(snat.Port()), Flags: flags,
			TcpState: uint8(xdp.CtTcpStateCT_TCP_SYN | xdp.CtTcpStateCT_TCP_ESTABLISHED)}); err != nil {
			t.Fatal(err)
		}
		if err := dp.Maps.SNATBucketHints.Put(xdp.SNATHint(backend, snat.Addr(), dataplane.TCP), uint32(1)); err != nil {
			t.Fatal(err)
		}
		slot := xdp.SnatSlot{
			Key: xdp.NatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
				Daddr: xdp.AddrToNet(snat.Addr()), Dport: xdp.PortToNet(snat.Port()), Proto: dataplane.TCP},
			Rev: xdp.NatEntry{LastSeenNs: now, ClientAddr: key.Saddr, ClientPort: key.Sport, FrontendAddr: key.Daddr,
				FrontendPort: key.Dport, BackendId: ids[backend], SvcId: fe.SvcID, Flags: flags},
			Generation: 1,
		}
		if err := dp.Maps.SNATSlots.Put(xdp.SNATSlot(0, snat.Port(), xdp.SNATPortsOf(&cfg)), slot); err != nil {
			t.Fatal(err)
		}
		clients[backend] = client
	}

	// flowsLive checks which of the flows are live.
	flowsLive := func(when string, want func(backend netip.AddrPort) bool) {
		t.Helper()
		for backend, client := range clients {
			f, ok, err := a.plane.Flow(dataplane.FlowKey{Client: client, Frontend: frontend, Proto: dataplane.TCP})
			if err != nil {
				t.Fatal(err)
			}
			if live := ok && !f.Ended; live != want(backend) {
				t.Errorf("%s: flow to %s: live=%v, want %v (%+v)", when, backend, live, want(backend), f)
			}
		}
	}
	hasBackend := func(b netip.AddrPort) bool {
		bes, err := a.plane.Backends()
		if err != nil {
			t.Fatal(err)
		}
		for _, be := range bes {
			if netip.AddrPortFrom(be.Addr, be.Port) == b {
				return true
			}
		}
		return false
	}

	// A second port: the first gets a name. In a cluster the Service
	// changes first and the EndpointSlice controller renames the slice's
	// port after it: syncs in between keep the port's endpoints.
	renamed := []port{{"http", 80, 8080, 30080}, {"metrics", 9090, 9090, 30090}}
	newService, _ := service(renamed)
	src.put(newService, nil)
	syncedUntil("adding the second port", func() bool { _, ok := clusterIPPort(9090); return ok })
	purged()
	if now, _ := clusterIPPort(80); now.SvcID != fe.SvcID {
		t.Errorf("port 80 has service id %d after the rename, want %d", now.SvcID, fe.SvcID)
	}
	flowsLive("before the slice is renamed", func(netip.AddrPort) bool { return true })

	// The controller's slice, one backend gone meanwhile.
	src.put(service(renamed, kept))
	syncedUntil("removing a backend", func() bool { return !hasBackend(gone) })
	purged()
	if now, _ := clusterIPPort(80); now.SvcID != fe.SvcID {
		t.Errorf("port 80 has service id %d after the slice's rename, want %d", now.SvcID, fe.SvcID)
	}
	flowsLive("after the slice is renamed", func(b netip.AddrPort) bool { return b == kept })
}

// A purge that fails (a map error) is tried again with the same batch:
// the flows of removed backends would otherwise keep their SNAT ports
// until evicted, and the first sync's sweep is the only look at what
// changed while no agent ran.
func TestFlowPurgerRetriesAFailedPurge(t *testing.T) {
	var calls []reconcile.Stale
	purge := func(ctx context.Context, _ *dataplane.Dataplane, stale reconcile.Stale) (reconcile.Purged, error) {
		calls = append(calls, stale)
		if len(calls) == 1 {
			return reconcile.Purged{}, errors.New("map iteration failed")
		}
		return reconcile.Purged{Flows: 1}, nil
	}
	p := newFlowPurger(nil, discard(), purge)
	p.retryAfter = time.Millisecond
	defer p.Stop()
	b := dataplane.Backend{Addr: netip.MustParseAddr("10.0.0.5"), Port: 8080}
	p.Add(reconcile.Stale{Removed: map[uint32]dataplane.Backend{1: b}, Sweep: true})
	p.done.Wait()
	if len(calls) != 2 || !reflect.DeepEqual(calls[0], calls[1]) {
		t.Fatalf("purges %+v, want the failed batch purged again", calls)
	}
}
