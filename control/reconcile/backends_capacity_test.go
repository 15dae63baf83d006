package reconcile_test

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
)

// backendsMax is the size of the backends map in the capacity test: ids
// 1 to 7.
const backendsMax = 8

// epPort is service port `name` with one externalIP frontend (on
// 198.18.<net>.1) and n ready endpoints 10.<net>.0.1..n.
func epPort(name string, net byte, n int) model.Service {
	var eps []model.Endpoint
	for i := 1; i <= n; i++ {
		eps = append(eps, ep(fmt.Sprintf("10.%d.0.%d", net, i), false, true))
	}
	s := web(eps...)
	s.Name = name
	s.Frontends = []model.Frontend{{Addr: netip.AddrFrom4([4]byte{198, 18, net, 1}), Port: 80, Protocol: model.TCP,
		Kind: model.ExternalIP}}
	return s
}

// A reconciler whose Config allows more backend ids than the backends map
// holds (the map is sized by --backends-max, the Config by the caller)
// must not hand out ids the map refuses: the write of the batch would
// fail at every sync, half-way, and nothing after it would be applied.
// The endpoints without an id are reported and left out, and a later
// sync programs them once ids are free.
func TestBackendsMapCapacity(t *testing.T) {
	cases := []struct {
		name string
		// run drives the reconciler; the result of its last sync is checked.
		run func(h *capacityHarness) reconcile.Result
		// wantBackends are the backends in the map, by the service
		// network (third octet of 10.<net>.0.x), and wantProblems how
		// many endpoints the last sync reported.
		wantBackends map[byte]int
		wantProblems int
	}{
		{
			name:         "endpoints beyond the map's ids are left out and reported",
			run:          func(h *capacityHarness) reconcile.Result { return h.full(epPort("a", 1, 1), epPort("b", 2, 10)) },
			wantBackends: map[byte]int{1: 1, 2: backendsMax - 2},
			wantProblems: 10 - (backendsMax - 2),
		},
		{
			name: "an ApplyChanges past the ids fails nothing",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(epPort("a", 1, 1))
				return h.change(nil, epPort("b", 2, 10))
			},
			wantBackends: map[byte]int{1: 1, 2: backendsMax - 2},
			wantProblems: 10 - (backendsMax - 2),
		},
		{
			// Ids of backends that go are freed after the sync's
			// writes (flows tracked to them must not reach another
			// backend), so the next sync gives them out.
			name: "endpoints left out get the ids freed, at the next full Apply",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(epPort("a", 1, 1), epPort("b", 2, 10))
				if res := h.full(epPort("a", 1, 1), epPort("c", 3, 3)); len(res.Problems) != 3 {
					h.t.Errorf("problems %q, want c's 3 endpoints", res.Problems)
				}
				return h.full(epPort("a", 1, 1), epPort("c", 3, 3))
			},
			wantBackends: map[byte]int{1: 1, 3: 3},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newCapacityHarness(t, func(o *loader.Options) { o.BackendsMax = backendsMax }) // config() says 64 backend ids
			res := c.run(h)
			bes, err := h.dp.Backends()
			if err != nil {
				t.Fatal(err)
			}
			got := map[byte]int{}
			for _, b := range bes {
				got[b.Addr.As4()[1]]++
			}
			if fmt.Sprint(got) != fmt.Sprint(c.wantBackends) {
				t.Errorf("backends by network %v, want %v", got, c.wantBackends)
			}
			if n := problemsAbout(res.Problems, "--backends-max"); n != len(res.Problems) || n != c.wantProblems {
				t.Errorf("problems %q, want %d about --backends-max", res.Problems, c.wantProblems)
			}
			// Every port is programmed, with a table of the backends
			// that have ids.
			fes := h.programmed()
			for _, svc := range []model.Service{epPort("a", 1, 1), epPort("b", 2, 10), epPort("c", 3, 3)} {
				net := svc.Frontends[0].Addr.As4()[2]
				if c.wantBackends[net] == 0 {
					continue
				}
				if fes[svc.Name] != 1 {
					t.Errorf("frontends by service %v, want one of %s", fes, svc.Name)
					continue
				}
				fe, ok := frontend(t, h.dp, svc.Frontends[0].Addr, 80)
				if !ok || fe.TableID == 0 {
					t.Errorf("%s: frontend %+v has no table", svc.Name, fe)
					continue
				}
				if n := len(distinct(tableBackends(t, h.dp, fe.TableID))); n != c.wantBackends[net] {
					t.Errorf("%s: table over %d backends, want %d", svc.Name, n, c.wantBackends[net])
				}
			}
		})
	}
}

// distinct returns the addresses in addrs, each once.
func distinct(addrs []netip.Addr) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, a := range addrs {
		out[a] = true
	}
	return out
}

// problemsAbout counts the problems naming what.
func problemsAbout(problems []string, what string) int {
	n := 0
	for _, p := range problems {
		if strings.Contains(p, what) {
			n++
		}
	}
	return n
}
