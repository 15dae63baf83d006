package reconcile_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/loader"
)

// withEP gives s the single ready endpoint addr.
func withEP(s model.Service, addr string) model.Service {
	e := ep(addr, false, true)
	s.Endpoints = []model.Endpoint{e}
	s.ClusterSet = []model.Endpoint{e}
	s.LocalSet = nil
	return s
}

// failAfter is a context whose Err is nil for the first n calls, then
// Canceled: a sync whose write stops part-way.
type failAfter struct {
	context.Context
	n *atomic.Int32
}

func (c failAfter) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// consistent checks that every frontend's tables exist and every slot of
// them names a backend that exists.
func consistent(t *testing.T, dp *dataplane.Dataplane) {
	t.Helper()
	fes := mustFrontends(t, dp)
	bes := mustBackends(t, dp)
	ids := mustTableIDs(t, dp)
	have := map[uint32]bool{}
	for _, id := range ids {
		have[id] = true
	}
	for k, fe := range fes {
		for _, tid := range []uint32{fe.TableID, fe.InternalTableID} {
			if tid == 0 {
				continue
			}
			if !have[tid] {
				t.Errorf("frontend %v (svc %d) points at table %d, which is not in the map", k, fe.SvcID, tid)
				continue
			}
			slots, err := dp.Table(tid)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range slots {
				if _, ok := bes[s]; !ok {
					t.Errorf("frontend %v (svc %d): table %d names backend %d, which is not in the backends map (%v)", k, fe.SvcID, tid, s, bes)
					break
				}
			}
		}
	}
}

// A port refused after a sync whose write failed must not be kept at the
// record of that sync, whose tables were never written: the table in the
// map still names the backend that sync removed, and the full Apply
// deletes that backend. Every frontend's table must name only backends
// in the map.
func TestKeptPortKeepsItsTables(t *testing.T) {
	h := newCapacityHarness(t, func(o *loader.Options) { o.FrontendsMax = frontendsMax })
	a0 := withEP(fePort("a", 1, 2), "10.244.1.1")
	b := withEP(fePort("b", 2, 5), "10.244.2.1")
	h.full(a0, b)
	consistent(t, h.dp)

	// The endpoint of a moves; the write stops at the table install.
	a1 := withEP(fePort("a", 1, 2), "10.244.1.2")
	var n atomic.Int32
	n.Store(1)
	if _, err := h.r.ApplyChanges(failAfter{context.Background(), &n}, map[string]*model.Service{a1.Key(): &a1}); err == nil {
		t.Fatal("the write did not fail")
	}
	// The full Apply that follows: a also grows past the frontends map.
	a2 := withEP(fePort("a", 1, 4), "10.244.1.2")
	res := h.full(a2, b)
	t.Logf("problems %q", res.Problems)
	consistent(t, h.dp)
}

// After a restart the reconciler has no records: a port whose pinned
// frontends carry its adopted service id counts as programmed, so an
// unchanged, working port is not refused in favour of one that grew (and
// was kept at its previous version before the restart).
func TestRestartKeepsProgrammedPorts(t *testing.T) {
	h := newCapacityHarness(t, func(o *loader.Options) { o.FrontendsMax = frontendsMax })
	h.full(withEP(fePort("a", 1, 3), "10.244.1.1"), withEP(fePort("b", 2, 4), "10.244.2.1"))
	res := h.change(nil, withEP(fePort("a", 1, 5), "10.244.1.1"))
	t.Logf("before restart: %v problems %q", h.programmed(), res.Problems)
	h.restart()
	res = h.full(withEP(fePort("a", 1, 5), "10.244.1.1"), withEP(fePort("b", 2, 4), "10.244.2.1"))
	got := h.programmed()
	t.Logf("after restart: %v problems %q", got, res.Problems)
	if got["b"] != 4 {
		t.Errorf("unchanged port b lost its frontends over the restart: %v", got)
	}
}

// The ranges of a port whose frontends do not fit are not counted: a port
// after it in the order, whose ranges and frontends both fit, is
// programmed rather than refused at every sync.
func TestRangesOfRefusedPortsDoNotBlockOthers(t *testing.T) {
	h := newCapacityHarness(t, func(o *loader.Options) {
		o.FrontendsMax = frontendsMax
		o.SourceRangesMax = sourceRangesMax
	})
	big := withEP(rangedPort("big", 2, 6, 0), "10.244.2.1")
	for i := 1; i <= frontendsMax; i++ { // 9 frontends: never fits
		big.Frontends = append(big.Frontends, model.Frontend{Addr: netip.AddrFrom4([4]byte{198, 18, 20, byte(i)}),
			Port: 80, Protocol: model.TCP, Kind: model.ExternalIP})
	}
	c := withEP(rangedPort("c", 3, 4, 0), "10.244.3.1")
	var res = h.full(big, c)
	for i := 0; i < 2; i++ {
		res = h.full(big, c)
	}
	t.Logf("frontends %v ranges %v problems %q", h.programmed(), h.sourceRanges(), res.Problems)
	if h.programmed()["c"] != 1 {
		t.Errorf("c (4 ranges, 1 frontend) not programmed into empty maps of 8")
	}
}
