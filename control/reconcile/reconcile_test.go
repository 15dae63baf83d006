package reconcile_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

var (
	nodeIP    = netip.MustParseAddr("192.0.2.1")
	clusterIP = netip.MustParseAddr("10.96.0.10")
	lbIP      = netip.MustParseAddr("203.0.113.10")
)

// newDatapath loads a small datapath; resize, if given, changes its sizes.
func newDatapath(t testing.TB, resize ...func(*loader.Options)) *dataplane.Dataplane {
	t.Helper()
	opts := loadertest.SmallOptions(testenv.BPFFS(t))
	opts.ServicesMax = 16 // as config() says
	for _, r := range resize {
		r(&opts)
	}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	return dataplane.New(&dp.Maps)
}

func config() reconcile.Config {
	return reconcile.Config{MaglevMaxSize: 16381, MaglevSeed: 42, ServicesMax: 16, BackendsMax: 64}
}

func ep(addr string, local, ready bool) model.Endpoint {
	return model.Endpoint{Addr: netip.MustParseAddr(addr), Port: 8080, Local: local,
		Ready: ready, Serving: true, Terminating: !ready, Weight: 1}
}

// web builds a service port the way the model would.
func web(eps ...model.Endpoint) model.Service {
	s := model.Service{
		Namespace: "default", Name: "web", Protocol: model.TCP, Port: 80, NodePort: 30080,
		Frontends: []model.Frontend{
			{Addr: clusterIP, Port: 80, Protocol: model.TCP, Kind: model.ClusterIP},
			{Addr: nodeIP, Port: 30080, Protocol: model.TCP, Kind: model.NodePort},
			{Addr: lbIP, Port: 80, Protocol: model.TCP, Kind: model.LoadBalancer},
		},
		Endpoints: eps,
	}
	for _, e := range eps {
		if e.Ready {
			s.ClusterSet = append(s.ClusterSet, e)
			if e.Local {
				s.LocalSet = append(s.LocalSet, e)
			}
		}
	}
	return s
}

// apply applies svcs, which must be programmed without a problem (tests
// that expect one use applyWithProblems and check them).
func apply(t *testing.T, r *reconcile.Reconciler, svcs ...model.Service) reconcile.Result {
	t.Helper()
	res := applyWithProblems(t, r, svcs...)
	if len(res.Problems) > 0 {
		t.Errorf("apply: problems %q", res.Problems)
	}
	return res
}

// applyWithProblems applies svcs; the caller checks res.Problems.
func applyWithProblems(t *testing.T, r *reconcile.Reconciler, svcs ...model.Service) reconcile.Result {
	t.Helper()
	res, err := r.Apply(context.Background(), model.State{Services: svcs})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	return res
}

func frontend(t *testing.T, dp *dataplane.Dataplane, addr netip.Addr, port uint16) (dataplane.Frontend, bool) {
	t.Helper()
	fes, err := dp.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := fes[dataplane.FrontendKey{Addr: addr, Port: port, Proto: dataplane.TCP}]
	return v, ok
}

// mustFrontend is frontend for a frontend that must be there.
func mustFrontend(t *testing.T, dp *dataplane.Dataplane, addr netip.Addr, port uint16) dataplane.Frontend {
	t.Helper()
	v, ok := frontend(t, dp, addr, port)
	if !ok {
		t.Fatalf("no frontend %s:%d", addr, port)
	}
	return v
}

// Reads of the datapath that fail the test on an error, which would
// otherwise pass for an empty map.
func mustFrontends(t *testing.T, dp *dataplane.Dataplane) map[dataplane.FrontendKey]dataplane.Frontend {
	t.Helper()
	v, err := dp.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustBackends(t *testing.T, dp *dataplane.Dataplane) map[uint32]dataplane.Backend {
	t.Helper()
	v, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustTableIDs(t *testing.T, dp *dataplane.Dataplane) []uint32 {
	t.Helper()
	v, err := dp.TableIDs()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustSourceRanges(t *testing.T, dp *dataplane.Dataplane) []dataplane.SourceRange {
	t.Helper()
	v, err := dp.SourceRanges()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// tableBackends reads a table back as backend addresses per slot.
func tableBackends(t *testing.T, dp *dataplane.Dataplane, id uint32) []netip.Addr {
	t.Helper()
	slots, err := dp.Table(id)
	if err != nil {
		t.Fatal(err)
	}
	bes, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]netip.Addr, len(slots))
	for i, s := range slots {
		b, ok := bes[s]
		if !ok {
			t.Fatalf("slot %d names backend %d, which does not exist", i, s)
		}
		out[i] = b.Addr
	}
	return out
}

func TestApplyProgramsServicePort(t *testing.T) {
	dp := newDatapath(t)
	r, err := reconcile.New(dp, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	svc := web(ep("10.244.1.10", false, true), ep("10.244.1.11", false, true), ep("10.244.0.5", true, true),
		ep("10.244.0.6", true, false))
	res := apply(t, r, svc)
	if res.BackendsAdded != 4 || res.FrontendsWritten != 3 || res.TablesWritten != 1 {
		t.Fatalf("result %+v, want 4 backends, 3 frontends, 1 table", res)
	}

	cases := []struct {
		addr  netip.Addr
		port  uint16
		flags uint16
	}{
		{clusterIP, 80, 0},
		{nodeIP, 30080, dataplane.FrontendExternal | dataplane.FrontendSNATRemote},
		{lbIP, 80, dataplane.FrontendExternal | dataplane.FrontendSNATRemote},
	}
	var tableID uint32
	for _, c := range cases {
		v, ok := frontend(t, dp, c.addr, c.port)
		if !ok {
			t.Fatalf("frontend %s:%d missing", c.addr, c.port)
		}
		if v.Flags != c.flags {
			t.Errorf("frontend %s:%d flags %#x, want %#x", c.addr, c.port, v.Flags, c.flags)
		}
		if v.TableID == 0 || (tableID != 0 && v.TableID != tableID) {
			t.Errorf("frontend %s:%d table %d; all frontends should share one non-zero table", c.addr, c.port, v.TableID)
		}
		tableID = v.TableID
	}
	addrs := tableBackends(t, dp, tableID)
	if len(addrs) != 509 {
		t.Errorf("table of %d slots for 3 backends, want 509 (smallest size >= 100x)", len(addrs))
	}
	count := map[netip.Addr]int{}
	for _, a := range addrs {
		count[a]++
	}
	if count[netip.MustParseAddr("10.244.0.6")] != 0 {
		t.Error("not-ready endpoint has slots while ready ones exist")
	}
	if len(count) != 3 {
		t.Errorf("table uses %d backends, want the 3 ready ones: %v", len(count), count)
	}
	bes := mustBackends(t, dp)
	for _, b := range bes {
		if b.Addr == netip.MustParseAddr("10.244.0.6") && !b.Terminating {
			t.Error("not-ready endpoint is not marked terminating")
		}
		if b.Addr == netip.MustParseAddr("10.244.0.5") && !b.Local {
			t.Error("local endpoint not marked local")
		}
	}

	if res := apply(t, r, svc); res.Changed() {
		t.Errorf("second apply of the same state changed %+v", res)
	}
}

// A ready endpoint that topology hints leave out of the set in use (for
// this node's zone) is draining: it keeps its flows, gets no slots, and a
// ClientIP affinity does not lead back to it. Without hints nothing is.
func TestEndpointsHintedOutAreDraining(t *testing.T) {
	in, out := ep("10.244.1.40", false, true), ep("10.244.1.41", false, true)
	for _, tc := range []struct {
		name     string
		set      []model.Endpoint
		draining bool
	}{
		{"left out by hints", []model.Endpoint{in}, true},
		{"no hints", []model.Endpoint{in, out}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := newDatapath(t)
			r, _ := reconcile.New(dp, config(), nil)
			svc := web(in, out)
			svc.ClusterSet = tc.set
			svc.AffinityTimeout = time.Hour
			apply(t, r, svc)
			bes, err := dp.Backends()
			if err != nil {
				t.Fatal(err)
			}
			found := map[netip.Addr]bool{}
			for _, b := range bes {
				found[b.Addr] = true
				if b.Addr == out.Addr && b.Terminating != tc.draining {
					t.Errorf("%s marked draining=%v, want %v", b.Addr, b.Terminating, tc.draining)
				}
				if b.Addr == in.Addr && b.Terminating {
					t.Errorf("%s in the set marked draining", b.Addr)
				}
			}
			// Both stay programmed: a draining backend keeps its flows.
			if !found[in.Addr] || !found[out.Addr] {
				t.Errorf("backends programmed %v, want %s and %s", found, in.Addr, out.Addr)
			}
		})
	}
}

// An endpoint that is not ready is marked draining whatever its other
// conditions say: it is in no set (unless as the fallback) and a ClientIP
// affinity must not lead back to it.
func TestUnreadyEndpointsAreDraining(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		ready, serving, terminating bool
		draining                    bool
	}{
		{"ready", true, true, false, false},
		{"not ready, serving, not terminating (only ready set)", false, true, false, true},
		{"not ready, not serving", false, false, false, true},
		{"terminating, serving", false, true, true, true},
		{"ready but terminating (odd object)", true, true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dp := newDatapath(t)
			r, _ := reconcile.New(dp, config(), nil)
			e := model.Endpoint{Addr: netip.MustParseAddr("10.244.1.30"), Port: 8080,
				Ready: tc.ready, Serving: tc.serving, Terminating: tc.terminating, Weight: 1}
			svc := web(ep("10.244.1.31", false, true), e)
			svc.AffinityTimeout = time.Hour
			apply(t, r, svc)
			bes, err := dp.Backends()
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, b := range bes {
				if b.Addr == e.Addr {
					found = true
					if b.Terminating != tc.draining {
						t.Errorf("backend marked terminating=%v, want %v", b.Terminating, tc.draining)
					}
				}
			}
			if !found {
				t.Error("endpoint not programmed as a backend")
			}
		})
	}
}

func TestApplyFollowsChanges(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	a, b, c := ep("10.244.1.10", false, true), ep("10.244.1.11", false, true), ep("10.244.1.12", false, true)
	apply(t, r, web(a, b, c))
	fe := mustFrontend(t, dp, nodeIP, 30080)

	res := apply(t, r, web(a, c))
	if res.BackendsRemoved != 1 || res.TablesWritten != 1 || len(res.RemovedBackends) != 1 {
		t.Fatalf("removing an endpoint: %+v", res)
	}
	for _, addr := range tableBackends(t, dp, fe.TableID) {
		if addr == b.Addr {
			t.Fatal("removed endpoint still in the table")
		}
	}

	// Scale to zero: the frontends stay and refuse; the table goes.
	res = apply(t, r, web())
	if res.TablesRemoved != 1 || res.BackendsRemoved != 2 {
		t.Fatalf("scale to zero: %+v", res)
	}
	if v, ok := frontend(t, dp, nodeIP, 30080); !ok || v.TableID != 0 || v.Flags&dataplane.FrontendDropIfEmpty != 0 {
		t.Fatalf("frontend with no endpoints %+v, want table 0 and reject", v)
	}

	// And back.
	apply(t, r, web(a))
	if v := mustFrontend(t, dp, nodeIP, 30080); v.TableID == 0 {
		t.Fatal("no table after scaling back up")
	}

	// Deleted: nothing left.
	res = apply(t, r)
	if res.FrontendsRemoved != 3 {
		t.Fatalf("delete: %+v", res)
	}
	if fes := mustFrontends(t, dp); len(fes) != 0 {
		t.Fatalf("%d frontends left", len(fes))
	}
	if bes := mustBackends(t, dp); len(bes) != 0 {
		t.Fatalf("%d backends left", len(bes))
	}
	if ids := mustTableIDs(t, dp); len(ids) != 0 {
		t.Fatalf("tables left: %v", ids)
	}
}

func TestApplyTrafficPolicies(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	remote := ep("10.244.1.10", false, true)
	local := ep("10.244.0.5", true, true)

	onlyRemote := web(remote)
	onlyRemote.ExternalTrafficPolicyLocal = true
	apply(t, r, onlyRemote)
	nodePort := mustFrontend(t, dp, nodeIP, 30080)
	if want := dataplane.FrontendExternal | dataplane.FrontendDropIfEmpty | dataplane.FrontendLocalSet; nodePort.TableID != 0 || nodePort.Flags != want {
		t.Errorf("eTP=Local without local endpoints: %+v, want drop, no SNAT, the local set (flags %#x)", nodePort, want)
	}
	ci := mustFrontend(t, dp, clusterIP, 80)
	if ci.TableID == 0 {
		t.Error("ClusterIP lost its endpoints under eTP=Local")
	}

	both := web(remote, local)
	both.ExternalTrafficPolicyLocal = true
	apply(t, r, both)
	nodePort, _ = frontend(t, dp, nodeIP, 30080)
	ci, _ = frontend(t, dp, clusterIP, 80)
	if nodePort.TableID == ci.TableID {
		t.Fatal("external and ClusterIP frontends share a table under eTP=Local")
	}
	for _, a := range tableBackends(t, dp, nodePort.TableID) {
		if a != local.Addr {
			t.Fatalf("eTP=Local table names %s", a)
		}
	}
	// Which frontends use the node-local set, for traffic from outside
	// and from this node (ClientIP affinity returns only to local
	// backends there).
	inner := web(remote, local)
	inner.InternalTrafficPolicyLocal = true
	for _, tc := range []struct {
		name      string
		svc       model.Service
		addr      netip.Addr
		port      uint16
		wantFlags uint16
	}{
		{"eTP=Local NodePort", both, nodeIP, 30080, dataplane.FrontendLocalSet},
		{"eTP=Local ClusterIP", both, clusterIP, 80, 0},
		// A ClusterIP follows internalTrafficPolicy for every origin.
		{"iTP=Local ClusterIP", inner, clusterIP, 80, dataplane.FrontendLocalSet | dataplane.FrontendInternalLocalSet},
		{"iTP=Local NodePort (this node's traffic to it uses the cluster-wide set)", inner, nodeIP, 30080, 0},
	} {
		apply(t, r, tc.svc)
		v := mustFrontend(t, dp, tc.addr, tc.port)
		if got := v.Flags & (dataplane.FrontendLocalSet | dataplane.FrontendInternalLocalSet); got != tc.wantFlags {
			t.Errorf("%s: local-set flags %#x, want %#x", tc.name, got, tc.wantFlags)
		}
	}

	// loadBalancerSourceRanges: only the LB frontend checks them.
	ranged := web(remote)
	ranged.SourceRangesSet = true
	ranged.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	apply(t, r, ranged)
	lb := mustFrontend(t, dp, lbIP, 80)
	np := mustFrontend(t, dp, nodeIP, 30080)
	if lb.Flags&dataplane.FrontendSourceRanges == 0 || np.Flags&dataplane.FrontendSourceRanges != 0 {
		t.Errorf("source-range flag: LB %#x, NodePort %#x", lb.Flags, np.Flags)
	}
	srs := mustSourceRanges(t, dp)
	if len(srs) != 1 || srs[0].SvcID != lb.SvcID || srs[0].Prefix != ranged.SourceRanges[0] {
		t.Errorf("source ranges %v", srs)
	}

	affine := web(remote)
	affine.AffinityTimeout = 3 * time.Hour
	apply(t, r, affine)
	if v := mustFrontend(t, dp, lbIP, 80); v.AffinityTimeout != 10800 {
		t.Errorf("affinity timeout %d s, want 10800", v.AffinityTimeout)
	}
	if srs := mustSourceRanges(t, dp); len(srs) != 0 {
		t.Errorf("source ranges left behind: %v", srs)
	}
}

func TestRestartAdoptsPinnedState(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	other := web(ep("10.244.1.20", false, true))
	other.Name = "other"
	other.Frontends = []model.Frontend{{Addr: nodeIP, Port: 30081, Protocol: model.TCP, Kind: model.NodePort}}
	svc := web(ep("10.244.1.10", false, true), ep("10.244.1.11", false, true))
	apply(t, r, other, svc)
	before := mustFrontends(t, dp)
	beforeBackends := mustBackends(t, dp)

	// A new agent, and the services arrive in another order.
	r2, err := reconcile.New(dp, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	res := apply(t, r2, svc, other)
	if res.FrontendsWritten != 0 || res.FrontendsRemoved != 0 || res.BackendsAdded != 0 || res.BackendsRemoved != 0 {
		t.Fatalf("restart changed frontends or backends: %+v", res)
	}
	after := mustFrontends(t, dp)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("frontend %s: %+v became %+v", k, v, after[k])
		}
	}
	afterBackends := mustBackends(t, dp)
	for id, b := range beforeBackends {
		if afterBackends[id] != b {
			t.Errorf("backend %d: %+v became %+v", id, b, afterBackends[id])
		}
	}
	if res := apply(t, r2, svc, other); res.Changed() {
		t.Errorf("third apply changed %+v", res)
	}
}

func TestTwoNodesBuildIdenticalTables(t *testing.T) {
	eps := []model.Endpoint{}
	for i := 0; i < 20; i++ {
		eps = append(eps, ep(netip.AddrFrom4([4]byte{10, 244, byte(i % 3), byte(10 + i)}).String(), false, true))
	}
	nodeA, nodeB := newDatapath(t), newDatapath(t)
	ra, _ := reconcile.New(nodeA, config(), nil)
	rb, _ := reconcile.New(nodeB, config(), nil)
	// Node B learnt the endpoints in another order, and has an unrelated
	// service first, so its backend ids differ.
	unrelated := web(ep("10.9.9.9", false, true))
	unrelated.Name = "unrelated"
	unrelated.Frontends = unrelated.Frontends[:1]
	unrelated.Frontends[0].Addr = netip.MustParseAddr("10.96.9.9")
	apply(t, ra, web(eps...))
	reversed := make([]model.Endpoint, len(eps))
	for i := range eps {
		reversed[i] = eps[len(eps)-1-i]
	}
	apply(t, rb, unrelated, web(reversed...))

	fa := mustFrontend(t, nodeA, lbIP, 80)
	fb := mustFrontend(t, nodeB, lbIP, 80)
	ta, tb := tableBackends(t, nodeA, fa.TableID), tableBackends(t, nodeB, fb.TableID)
	if len(ta) != len(tb) {
		t.Fatalf("table sizes %d and %d", len(ta), len(tb))
	}
	for i := range ta {
		if ta[i] != tb[i] {
			t.Fatalf("slot %d: node A says %s, node B %s", i, ta[i], tb[i])
		}
	}
}

func TestOutOfIDsIsReportedNotFatal(t *testing.T) {
	dp := newDatapath(t)
	cfg := config()
	cfg.ServicesMax = 3 // ids 1 and 2
	r, _ := reconcile.New(dp, cfg, nil)
	var svcs []model.Service
	for i := 0; i < 3; i++ {
		s := web(ep("10.244.1.10", false, true))
		s.Name = string(rune('a' + i))
		s.Frontends = []model.Frontend{{Addr: nodeIP, Port: uint16(30000 + i), Protocol: model.TCP, Kind: model.NodePort}}
		svcs = append(svcs, s)
	}
	res, err := r.Apply(context.Background(), model.State{Services: svcs})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || res.FrontendsWritten != 2 {
		t.Fatalf("result %+v, want two service ports programmed and one problem", res)
	}
}

// A backend that leaves one service port while another keeps it is not
// freed, but reported as departed from that port, under its id there.
func TestApplyReportsBackendsLeavingAPort(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	a, shared := ep("10.244.1.10", false, true), ep("10.244.1.20", false, true)
	other := func(eps ...model.Endpoint) model.Service {
		s := web(eps...)
		s.Name, s.NodePort = "other", 30081
		s.Frontends = []model.Frontend{{Addr: nodeIP, Port: 30081, Protocol: model.TCP, Kind: model.NodePort}}
		return s
	}
	apply(t, r, web(a, shared), other(shared))
	webFE := mustFrontend(t, dp, nodeIP, 30080)

	res := apply(t, r, web(a), other(shared))
	if len(res.RemovedBackends) != 0 || len(res.Departed) != 1 {
		t.Fatalf("removed %v, departed %+v; want one departure and nothing freed", res.RemovedBackends, res.Departed)
	}
	d := res.Departed[0]
	if d.SvcID != webFE.SvcID || d.Backend.Addr != shared.Addr || d.Backend.Port != shared.Port {
		t.Errorf("departure %+v, want %s from service port %d", d, shared.Addr, webFE.SvcID)
	}
	bes, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := bes[d.BackendID]; !ok || b.Addr != shared.Addr {
		t.Errorf("backend id %d is %+v, want %s (still in use)", d.BackendID, b, shared.Addr)
	}

	if !r.StillDeparted(d) {
		t.Error("the departure does not hold right after it")
	}
	// It comes back before the purge runs: the purge must leave it alone.
	apply(t, r, web(a, shared), other(shared))
	if r.StillDeparted(d) {
		t.Error("a backend that came back is still taken for departed")
	}
	apply(t, r, web(a), other(shared))

	// Unchanged ports report nothing; the last port letting it go frees it.
	if res := apply(t, r, web(a), other(shared)); len(res.Departed) != 0 {
		t.Errorf("departures without a change: %+v", res.Departed)
	}
	if res := apply(t, r, web(a), other()); len(res.Departed) != 0 || len(res.RemovedBackends) != 1 {
		t.Errorf("the last user gone: departed %+v, removed %v; want it removed", res.Departed, res.RemovedBackends)
	}
}

// An endpoint that topology hints leave out of a port's sets departs for
// affinity only: its flows are the port's still.
func TestApplyReportsEndpointsHintedOut(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	in, out := ep("10.244.1.50", false, true), ep("10.244.1.51", false, true)
	apply(t, r, web(in, out))
	narrowed := web(in, out)
	narrowed.ClusterSet = []model.Endpoint{in}
	res := apply(t, r, narrowed)
	if len(res.Departed) != 1 || !res.Departed[0].AffinityOnly || res.Departed[0].Backend.Addr != out.Addr {
		t.Fatalf("departed %+v, want %s for affinity only", res.Departed, out.Addr)
	}
	if !r.StillDeparted(res.Departed[0]) {
		t.Error("the departure does not hold")
	}
	if res := apply(t, r, web(in, out)); len(res.Departed) != 0 {
		t.Errorf("back in the set: departed %+v", res.Departed)
	}
}

// After a restart the first Apply has no records to compare with: a sweep
// checks every flow and affinity entry against the new records, and
// forgets what a port no longer has (an endpoint that left one Service
// while no agent ran), keeping everything else.
func TestSweepAfterRestart(t *testing.T) {
	dp := newDatapath(t)
	a, shared := ep("10.244.1.60", false, true), ep("10.244.1.61", false, true)
	other := func(eps ...model.Endpoint) model.Service {
		s := web(eps...)
		s.Name, s.NodePort = "other", 30081
		s.Frontends = []model.Frontend{{Addr: nodeIP, Port: 30081, Protocol: model.TCP, Kind: model.NodePort}}
		return s
	}
	before, _ := reconcile.New(dp, config(), nil)
	apply(t, before, web(a, shared), other(shared))
	webFE := mustFrontend(t, dp, nodeIP, 30080)
	otherFE := mustFrontend(t, dp, nodeIP, 30081)
	bes, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[netip.Addr]uint32{}
	for id, b := range bes {
		ids[b.Addr] = id
	}
	client := netip.MustParseAddr("198.51.100.1")
	type entry struct {
		port    uint16
		svc     uint32
		backend netip.Addr
		stale   bool
	}
	entries := []entry{
		{2001, webFE.SvcID, shared.Addr, true}, // web no longer has it
		{2002, webFE.SvcID, a.Addr, false},
		{2003, otherFE.SvcID, shared.Addr, false},
	}
	for _, e := range entries {
		k := xdp.CtKey{Saddr: xdp.AddrToNet(client), Daddr: xdp.AddrToNet(nodeIP),
			Sport: xdp.PortToNet(e.port), Dport: xdp.PortToNet(30080), Proto: dataplane.TCP}
		v := xdp.CtEntry{SvcId: e.svc, BackendId: ids[e.backend], BackendAddr: xdp.AddrToNet(e.backend),
			BackendPort: xdp.PortToNet(8080)}
		if err := dp.Maps().Conntrack.Put(k, v); err != nil {
			t.Fatal(err)
		}
		ak := xdp.AffinityKey{SvcId: e.svc, ClientAddr: xdp.AddrToNet(netip.AddrFrom4([4]byte{198, 51, 100, byte(e.port % 200)}))}
		av := xdp.AffinityEntry{BackendId: ids[e.backend], BackendAddr: v.BackendAddr, BackendPort: v.BackendPort}
		if err := dp.Maps().Affinity.Put(ak, av); err != nil {
			t.Fatal(err)
		}
	}

	after, _ := reconcile.New(dp, config(), nil) // the restarted agent's
	if res := apply(t, after, web(a), other(shared)); len(res.Departed) != 0 {
		t.Fatalf("the first Apply reported departures %+v: it has nothing to compare with", res.Departed)
	}
	n, err := reconcile.PurgeFlows(context.Background(), dp, reconcile.Stale{Sweep: true}, after.StillDeparted)
	if err != nil || n.Flows != 1 {
		t.Fatalf("swept %+v (%v), want 1 flow", n, err)
	}
	flows := map[uint16]bool{}
	dp.Flows(func(f dataplane.Flow) bool { flows[f.Client.Port()] = !f.Ended; return true })
	for _, e := range entries {
		if flows[e.port] == e.stale {
			t.Errorf("flow from port %d (service port %d, %s): kept=%v, want %v", e.port, e.svc, e.backend, flows[e.port], !e.stale)
		}
		var av xdp.AffinityEntry
		ak := xdp.AffinityKey{SvcId: e.svc, ClientAddr: xdp.AddrToNet(netip.AddrFrom4([4]byte{198, 51, 100, byte(e.port % 200)}))}
		kept := dp.Maps().Affinity.Lookup(ak, &av) == nil
		if kept == e.stale {
			t.Errorf("affinity of service port %d to %s: kept=%v, want %v", e.svc, e.backend, kept, !e.stale)
		}
	}
}

func TestPurgeFlowsForgetsRemovedBackends(t *testing.T) {
	dp := newDatapath(t)
	gone := netip.MustParseAddr("10.244.1.10")
	reused := netip.MustParseAddr("10.244.1.99")
	shared := netip.MustParseAddr("10.244.1.20")
	// Flow 1 is to the removed backend 7; flow 2 to backend 7 after the
	// id went to another address; flow 3 to backend 8. Backend 9 left
	// service port 2 and stays in service port 1: flow 4 (port 2) goes,
	// flow 5 (port 1) stays.
	flows := []struct {
		client  uint16
		svc, id uint32
		backend netip.Addr
		purged  bool
	}{
		{1001, 1, 7, gone, true},
		{1002, 1, 7, reused, false},
		{1003, 1, 8, gone, false},
		{1004, 2, 9, shared, true},
		{1005, 1, 9, shared, false},
		{1006, 3, 9, shared, false}, // port 3 left it out by hints: affinity only
	}
	for _, f := range flows {
		k := xdp.CtKey{Saddr: xdp.AddrToNet(netip.MustParseAddr("198.51.100.1")), Daddr: xdp.AddrToNet(nodeIP),
			Sport: xdp.PortToNet(f.client), Dport: xdp.PortToNet(30080), Proto: dataplane.TCP}
		v := xdp.CtEntry{SvcId: f.svc, BackendId: f.id, BackendAddr: xdp.AddrToNet(f.backend), BackendPort: xdp.PortToNet(8080)}
		if err := dp.Maps().Conntrack.Put(k, v); err != nil {
			t.Fatal(err)
		}
		// Without SNAT, the reverse half is in the nat map.
		rk := xdp.NatKey{Saddr: v.BackendAddr, Sport: v.BackendPort, Daddr: k.Saddr, Dport: k.Sport, Proto: k.Proto}
		rev := xdp.NatEntry{ClientAddr: k.Saddr, ClientPort: k.Sport, FrontendAddr: k.Daddr, FrontendPort: k.Dport, BackendId: f.id}
		if err := dp.Maps().NAT.Put(rk, rev); err != nil {
			t.Fatal(err)
		}
	}
	// ClientIP affinity to backend 9: the client of port 2 is sent
	// elsewhere from now on, the client of port 1 keeps it.
	client := netip.MustParseAddr("198.51.100.1")
	affinity := func(svc uint32) xdp.AffinityKey {
		return xdp.AffinityKey{SvcId: svc, ClientAddr: xdp.AddrToNet(client)}
	}
	for _, svc := range []uint32{1, 2, 3} {
		e := xdp.AffinityEntry{BackendId: 9, BackendAddr: xdp.AddrToNet(shared), BackendPort: xdp.PortToNet(8080)}
		if err := dp.Maps().Affinity.Put(affinity(svc), e); err != nil {
			t.Fatal(err)
		}
	}
	back := reconcile.Departure{SvcID: 1, BackendID: 8, Backend: dataplane.Backend{Addr: gone, Port: 8080}}
	stale := reconcile.Stale{
		Removed: map[uint32]dataplane.Backend{7: {Addr: gone, Port: 8080}},
		Departed: []reconcile.Departure{
			{SvcID: 2, BackendID: 9, Backend: dataplane.Backend{Addr: shared, Port: 8080}},
			back, // came back before the purge: flow 3 stays
			{SvcID: 3, BackendID: 9, Backend: dataplane.Backend{Addr: shared, Port: 8080}, AffinityOnly: true},
		},
	}
	still := func(d reconcile.Departure) bool { return d != back }
	n, err := reconcile.PurgeFlows(context.Background(), dp, stale, still)
	if err != nil || n != (reconcile.Purged{Flows: 2, Affinities: 2}) {
		t.Fatalf("purged %+v (%v), want 2 flows and 2 affinity entries", n, err)
	}
	var e xdp.AffinityEntry
	for _, svc := range []uint32{2, 3} {
		if err := dp.Maps().Affinity.Lookup(affinity(svc), &e); err == nil {
			t.Errorf("the affinity of port %d, which the backend left, is still there", svc)
		}
	}
	if err := dp.Maps().Affinity.Lookup(affinity(1), &e); err != nil {
		t.Errorf("the affinity of the port that keeps the backend: %v", err)
	}
	left := map[uint16]bool{}
	dp.Flows(func(f dataplane.Flow) bool { left[f.Client.Port()] = !f.Ended; return true })
	reverse := map[uint16]bool{}
	dp.ReverseHalves(func(_ xdp.NatKey, e xdp.NatEntry) bool {
		reverse[xdp.NetToPort(e.ClientPort)] = true
		return true
	})
	for _, f := range flows {
		if left[f.client] == f.purged {
			t.Errorf("flow from port %d: purged=%v, want %v", f.client, !left[f.client], f.purged)
		}
		if reverse[f.client] == f.purged {
			t.Errorf("reverse half of the flow from port %d: purged=%v, want %v", f.client, !reverse[f.client], f.purged)
		}
	}
}

// TestApplyBuildsOnlyChangedTables checks that a table is built and
// written again only when its endpoints (or their backend ids) change.
func TestApplyBuildsOnlyChangedTables(t *testing.T) {
	dp := newDatapath(t)
	r, err := reconcile.New(dp, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := ep("10.244.1.10", false, true), ep("10.244.1.11", false, true), ep("10.244.1.12", false, true)
	affinity := web(a, b)
	affinity.AffinityTimeout = time.Hour
	steps := []struct {
		name           string
		svc            model.Service
		builds, writes int
	}{
		{"first", web(a, b), 1, 1},
		{"same again", web(a, b), 0, 0},
		{"other settings, same endpoints", affinity, 0, 0},
		{"endpoint added", web(a, b, c), 1, 1},
		{"endpoint removed", web(a, b), 1, 1},
	}
	for _, st := range steps {
		res := apply(t, r, st.svc)
		if res.MaglevBuilds != st.builds || res.TablesWritten != st.writes {
			t.Errorf("%s: %d builds, %d tables written; want %d, %d", st.name, res.MaglevBuilds, res.TablesWritten,
				st.builds, st.writes)
		}
	}
	fe := mustFrontend(t, dp, nodeIP, 30080)
	if got := tableBackends(t, dp, fe.TableID); len(got) == 0 {
		t.Fatal("no table after the last step")
	}
}

// TestApplyWritesNewAndReplacedTables mixes, in one Apply, tables under
// new ids (installed while the backends are written) with tables that
// replace ones in use (installed after them): both are written once and
// recorded, so an unchanged state writes nothing.
func TestApplyWritesNewAndReplacedTables(t *testing.T) {
	dp := newDatapath(t)
	r, err := reconcile.New(dp, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := ep("10.244.1.10", false, true), ep("10.244.1.11", false, true), ep("10.244.1.12", false, true)
	other := func(eps ...model.Endpoint) model.Service {
		s := web(eps...)
		s.Name = "other"
		s.Frontends = []model.Frontend{{Addr: nodeIP, Port: 30081, Protocol: model.TCP, Kind: model.NodePort}}
		return s
	}
	steps := []struct {
		name   string
		svcs   []model.Service
		writes int
	}{
		{"first port", []model.Service{web(a, b)}, 1},
		{"port changed, port added", []model.Service{web(a, b, c), other(c)}, 2},
		{"same again", []model.Service{web(a, b, c), other(c)}, 0},
		{"both changed", []model.Service{web(a), other(b, c)}, 2},
		{"same again", []model.Service{web(a), other(b, c)}, 0},
	}
	for _, st := range steps {
		res := apply(t, r, st.svcs...)
		if res.TablesWritten != st.writes {
			t.Errorf("%s: %d tables written, want %d", st.name, res.TablesWritten, st.writes)
		}
	}
	for port, want := range map[uint16][]netip.Addr{30080: {a.Addr}, 30081: {b.Addr, c.Addr}} {
		fe, ok := frontend(t, dp, nodeIP, port)
		if !ok {
			t.Fatalf("no frontend on port %d", port)
		}
		got := tableBackends(t, dp, fe.TableID)
		slices.SortFunc(got, netip.Addr.Compare)
		if !slices.Equal(slices.Compact(got), want) {
			t.Errorf("port %d: table backends %v, want %v", port, slices.Compact(got), want)
		}
	}
}

// TestSharedBackendMergesViews checks the value of a backend that several
// service ports share as ports come, change and go: local if any port sees
// it local, terminating only if every port sees it terminating, removed
// once no port has it.
func TestSharedBackendMergesViews(t *testing.T) {
	port := func(name string, octet byte, e model.Endpoint) model.Service {
		s := web(e)
		s.Name = name
		s.Frontends = []model.Frontend{{Addr: netip.AddrFrom4([4]byte{10, 96, 1, octet}), Port: 80,
			Protocol: model.TCP, Kind: model.ClusterIP}}
		return s
	}
	const addr = "10.244.0.9"
	a := func(local, ready bool) *model.Service { s := port("a", 1, ep(addr, local, ready)); return &s }
	b := func(local, ready bool) *model.Service { s := port("b", 2, ep(addr, local, ready)); return &s }
	type want struct{ present, local, terminating bool }
	steps := []struct {
		name    string
		changed map[string]*model.Service // by key; nil: the port is gone
		want    want
	}{
		{"one port, remote, ready", map[string]*model.Service{a(false, true).Key(): a(false, true)},
			want{true, false, false}},
		{"second port sees it local", map[string]*model.Service{b(true, true).Key(): b(true, true)},
			want{true, true, false}},
		{"first port sees it terminating", map[string]*model.Service{a(false, true).Key(): a(false, false)},
			want{true, true, false}},
		{"both see it terminating", map[string]*model.Service{b(true, true).Key(): b(true, false)},
			want{true, true, true}},
		{"the local view goes", map[string]*model.Service{b(true, true).Key(): nil},
			want{true, false, true}},
		{"the first port is ready again", map[string]*model.Service{a(false, true).Key(): a(false, true)},
			want{true, false, false}},
		{"no port has it", map[string]*model.Service{a(false, true).Key(): nil},
			want{false, false, false}},
	}
	dp := newDatapath(t)
	r, err := reconcile.New(dp, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	apply(t, r) // the first Apply must be a full one
	for _, step := range steps {
		if _, err := r.ApplyChanges(context.Background(), step.changed); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		bes, err := dp.Backends()
		if err != nil {
			t.Fatal(err)
		}
		var got want
		for _, be := range bes {
			if be.Addr == netip.MustParseAddr(addr) {
				got = want{true, be.Local, be.Terminating}
			}
		}
		if got != step.want {
			t.Errorf("%s: backend present/local/terminating = %+v, want %+v", step.name, got, step.want)
		}
	}
}

// TestPortsShareBuilds checks that service ports with the same members
// (the ports of one Service, whose pods serve each on its own target
// port) share one Maglev build, and that each port's table still names
// its own backends: the same pods in the same slots, on its target port.
func TestPortsShareBuilds(t *testing.T) {
	port := func(name string, svcPort, target uint16, addrs ...string) model.Service {
		var eps []model.Endpoint
		for _, a := range addrs {
			e := ep(a, false, true)
			e.Port = target
			eps = append(eps, e)
		}
		s := web(eps...)
		s.PortName, s.Port = name, svcPort
		s.Frontends = []model.Frontend{{Addr: clusterIP, Port: svcPort, Protocol: model.TCP, Kind: model.ClusterIP}}
		return s
	}
	tests := []struct {
		name   string
		ports  []model.Service
		builds int
	}{
		{"one port", []model.Service{port("http", 80, 8080, "10.244.1.1", "10.244.1.2")}, 1},
		{"two ports, same pods", []model.Service{port("http", 80, 8080, "10.244.1.1", "10.244.1.2"),
			port("https", 443, 8443, "10.244.1.1", "10.244.1.2")}, 1},
		{"three ports, same pods", []model.Service{port("http", 80, 8080, "10.244.1.1", "10.244.1.2"),
			port("https", 443, 8443, "10.244.1.1", "10.244.1.2"), port("admin", 9000, 9000, "10.244.1.1", "10.244.1.2")}, 1},
		{"two ports, other pods", []model.Service{port("http", 80, 8080, "10.244.1.1", "10.244.1.2"),
			port("https", 443, 8443, "10.244.1.1", "10.244.1.3")}, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dp := newDatapath(t)
			r, err := reconcile.New(dp, config(), nil)
			if err != nil {
				t.Fatal(err)
			}
			res := apply(t, r, tc.ports...)
			if res.MaglevBuilds != tc.builds || res.TablesWritten != len(tc.ports) {
				t.Errorf("%d builds, %d tables written; want %d, %d", res.MaglevBuilds, res.TablesWritten,
					tc.builds, len(tc.ports))
			}
			bes, err := dp.Backends()
			if err != nil {
				t.Fatal(err)
			}
			var first []netip.Addr
			for _, p := range tc.ports {
				fe, ok := frontend(t, dp, clusterIP, p.Port)
				if !ok {
					t.Fatalf("no frontend for port %d", p.Port)
				}
				slots, err := dp.Table(fe.TableID)
				if err != nil {
					t.Fatal(err)
				}
				addrs := make([]netip.Addr, len(slots))
				for i, id := range slots {
					if b := bes[id]; b.Port != p.Endpoints[0].Port {
						t.Fatalf("port %d: slot %d names %s, not a backend on target port %d", p.Port, i, b, p.Endpoints[0].Port)
					}
					addrs[i] = bes[id].Addr
				}
				if tc.builds == 1 {
					if first == nil {
						first = addrs
					} else if !slices.Equal(addrs, first) {
						t.Errorf("port %d: its table puts the pods in other slots than the first port's", p.Port)
					}
				}
			}
		})
	}
}
