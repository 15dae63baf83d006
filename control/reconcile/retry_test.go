package reconcile_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
)

// cancelAfterTables is a context that turns cancelled once the outer
// Maglev map holds n tables: an install that stops between two batches.
type cancelAfterTables struct {
	context.Context
	dp *dataplane.Dataplane
	n  int
}

func (c cancelAfterTables) Err() error {
	if ids, err := c.dp.TableIDs(); err == nil && len(ids) >= c.n {
		return context.Canceled
	}
	return nil
}

// A cold sync whose table install stops after the first batch must write
// the missing tables when it is retried: no frontend may be left pointing
// at a table id the outer map does not hold.
func TestRetryWritesTablesAnInterruptedInstallLeftOut(t *testing.T) {
	const servicesMax, backendsMax = 8192, 16384
	dp := newDatapath(t, func(o *loader.Options) {
		o.ServicesMax, o.FrontendsMax, o.BackendsMax = servicesMax, servicesMax, backendsMax
	})
	r, err := reconcile.New(dp, reconcile.Config{MaglevMaxSize: 251, MaglevSeed: 42,
		ServicesMax: servicesMax, BackendsMax: backendsMax}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const ports = 3000 // more than one batch of tables
	var st model.State
	for i := 0; i < ports; i++ {
		e := model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: 8080,
			Ready: true, Serving: true, Weight: 1}
		st.Services = append(st.Services, model.Service{Namespace: "default", Name: fmt.Sprintf("s%d", i),
			Protocol: model.TCP, Port: 80,
			Frontends: []model.Frontend{{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
				Port: 80, Protocol: model.TCP, Kind: model.ClusterIP}},
			Endpoints: []model.Endpoint{e}, ClusterSet: []model.Endpoint{e}})
	}
	res, err := r.Apply(cancelAfterTables{Context: context.Background(), dp: dp, n: 1}, st)
	if err == nil || res.TablesWritten == 0 || res.TablesWritten >= ports {
		t.Fatalf("the first install did not stop between batches: %d tables written, %v", res.TablesWritten, err)
	}
	if _, err := r.Apply(context.Background(), st); err != nil {
		t.Fatalf("retry: %v", err)
	}
	ids, err := dp.TableIDs()
	if err != nil {
		t.Fatal(err)
	}
	held := map[uint32]bool{}
	for _, id := range ids {
		held[id] = true
	}
	fes, err := dp.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, fe := range fes {
		if fe.TableID != 0 && !held[fe.TableID] {
			missing++
		}
	}
	if missing > 0 || len(fes) != ports {
		t.Fatalf("after the retry %d of %d frontends point at a table the outer map does not hold", missing, len(fes))
	}
}

// A port removed in a sync whose write fails (here frontends written
// behind the reconciler's back fill the map, as a write that failed
// half-way leaves them) must not keep its service id: the full Apply that
// follows releases it, so ids do not run out over such failures.
func TestFailedWriteDoesNotLeakServiceIDs(t *testing.T) {
	dp := newDatapath(t)
	cfg := config()
	r, err := reconcile.New(dp, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := web(ep("10.244.1.10", false, true))
	apply(t, r, base)
	added := fePort("added", 1, 2)
	for i := 0; i < int(cfg.ServicesMax); i++ {
		temp := web(ep("10.244.1.12", false, true))
		temp.Name = fmt.Sprintf("temp%d", i)
		temp.Frontends = []model.Frontend{{Addr: nodeIP, Port: uint16(31000 + i), Protocol: model.TCP, Kind: model.NodePort}}
		if _, err := r.ApplyChanges(context.Background(), map[string]*model.Service{temp.Key(): &temp}); err != nil {
			t.Fatal(err)
		}
		// Fill the map: the test datapath holds 256 frontends.
		strays := map[dataplane.FrontendKey]dataplane.Frontend{}
		for j := 0; j < 256-len(base.Frontends)-1; j++ {
			strays[dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{198, 51, byte(j >> 8), byte(j)}), Port: 80,
				Proto: dataplane.TCP}] = dataplane.Frontend{SvcID: 9}
		}
		if err := dp.PutFrontends(strays); err != nil {
			t.Fatal(err)
		}
		_, err := r.ApplyChanges(context.Background(), map[string]*model.Service{temp.Key(): nil, added.Key(): &added})
		if err == nil {
			t.Fatal("frontends written into a full map")
		}
		if res, err := r.Apply(context.Background(), model.State{Services: []model.Service{base}}); err != nil || len(res.Problems) > 0 {
			t.Fatalf("round %d: full Apply after the failure: %v %v", i, err, res.Problems)
		}
	}
	names, err := dp.ServiceNames()
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 {
		t.Errorf("one port programmed, %d service ids named: %v", len(names), names)
	}
	if fes, err := dp.Frontends(); err != nil || len(fes) != len(base.Frontends) {
		t.Errorf("%d frontends in the map (%v), want the %d of the one port programmed", len(fes), err, len(base.Frontends))
	}
}
