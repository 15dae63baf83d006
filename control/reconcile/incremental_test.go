package reconcile_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
)

// view is the datapath content in terms that do not depend on ids.
type view struct {
	Frontends map[string]string // frontend -> service, flags, table content
	Backends  []string
	Ranges    []string
}

func snapshot(t *testing.T, dp *dataplane.Dataplane) view {
	t.Helper()
	fes, err := dp.Frontends()
	if err != nil {
		t.Fatalf("frontends: %v", err)
	}
	names, err := dp.ServiceNames()
	if err != nil {
		t.Fatalf("service names: %v", err)
	}
	bes, err := dp.Backends()
	if err != nil {
		t.Fatalf("backends: %v", err)
	}
	v := view{Frontends: map[string]string{}}
	table := func(id uint32) string {
		if id == 0 {
			return "-"
		}
		slots, err := dp.Table(id)
		if err != nil {
			t.Fatalf("table %d: %v", id, err)
		}
		s := ""
		for _, sl := range slots {
			s += bes[sl].String() + ","
		}
		return s
	}
	for k, f := range fes {
		v.Frontends[k.String()] = fmt.Sprintf("%s flags=%#x aff=%d ext=%s int=%s",
			names[f.SvcID], f.Flags, f.AffinityTimeout, table(f.TableID), table(f.InternalTableID))
	}
	for _, b := range bes {
		v.Backends = append(v.Backends, fmt.Sprintf("%s local=%v term=%v", b, b.Local, b.Terminating))
	}
	sort.Strings(v.Backends)
	rs, err := dp.SourceRanges()
	if err != nil {
		t.Fatalf("source ranges: %v", err)
	}
	for _, r := range rs {
		v.Ranges = append(v.Ranges, names[r.SvcID]+" "+r.Prefix.String())
	}
	sort.Strings(v.Ranges)
	return v
}

func randomState(rng *rand.Rand) model.State {
	var st model.State
	for i := 0; i < 6; i++ {
		if rng.IntN(4) == 0 {
			continue // this service port is absent in this state
		}
		var eps []model.Endpoint
		for j := 0; j < rng.IntN(5); j++ {
			eps = append(eps, model.Endpoint{
				Addr: netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(2)), byte(10 + rng.IntN(6))}),
				Port: 8080, Local: rng.IntN(2) == 0, Ready: rng.IntN(4) > 0, Serving: true, Weight: 1,
			})
		}
		eps = dedup(eps)
		for k := range eps {
			eps[k].Terminating = !eps[k].Ready
		}
		s := web(eps...)
		s.Name = fmt.Sprintf("svc%d", i)
		if rng.IntN(3) == 0 {
			s.PortName = "http" // renamed from one state to the next: another key, the same frontends
		}
		s.Frontends = []model.Frontend{
			{Addr: netip.AddrFrom4([4]byte{10, 96, 0, byte(i + 1)}), Port: 80, Protocol: model.TCP, Kind: model.ClusterIP},
			{Addr: nodeIP, Port: uint16(30000 + i), Protocol: model.TCP, Kind: model.NodePort},
		}
		s.ExternalTrafficPolicyLocal = rng.IntN(3) == 0
		if rng.IntN(3) == 0 {
			s.SourceRangesSet = true
			s.SourceRanges = []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 51, 100, byte(rng.IntN(4) * 64)}), 26)}
			s.Frontends = append(s.Frontends, model.Frontend{Addr: netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}), Port: 80,
				Protocol: model.TCP, Kind: model.LoadBalancer})
		}
		st.Services = append(st.Services, s)
	}
	return st
}

func dedup(eps []model.Endpoint) []model.Endpoint {
	seen := map[netip.Addr]bool{}
	var out []model.Endpoint
	for _, e := range eps {
		if !seen[e.Addr] {
			seen[e.Addr] = true
			out = append(out, e)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out
}

// TestIncrementalApplyMatchesFullApply drives one datapath with
// incremental Applies (only the changed service ports) and another with
// full Applies from a fresh reconciler each time; their content must match
// after every step.
func TestIncrementalApplyMatchesFullApply(t *testing.T) {
	inc, full := newDatapath(t), newDatapath(t)
	r, err := reconcile.New(inc, config(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var prev map[string]model.Service
	for step := 0; step < 40; step++ {
		st := randomState(rng)
		cur := map[string]model.Service{}
		for _, s := range st.Services {
			cur[s.Key()] = s
		}
		var err error
		if prev == nil {
			_, err = r.Apply(context.Background(), st)
		} else {
			changed := map[string]*model.Service{}
			for k, s := range cur {
				if p, ok := prev[k]; !ok || !reflect.DeepEqual(p, s) {
					changed[k] = &s
				}
			}
			for k := range prev {
				if _, ok := cur[k]; !ok {
					changed[k] = nil
				}
			}
			_, err = r.ApplyChanges(context.Background(), changed)
		}
		if err != nil {
			t.Fatalf("step %d: incremental apply: %v", step, err)
		}
		fr, err := reconcile.New(full, config(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fr.Apply(context.Background(), st); err != nil {
			t.Fatalf("step %d: full apply: %v", step, err)
		}
		a, b := snapshot(t, inc), snapshot(t, full)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d: incremental and full datapaths differ:\nincremental %+v\nfull        %+v", step, a, b)
		}
		prev = cur
	}
}
