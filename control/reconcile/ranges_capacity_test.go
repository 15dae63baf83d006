package reconcile_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
)

// sourceRangesMax is the size of the source ranges map in the capacity
// tests.
const sourceRangesMax = 8

// rangedPort is service port `name` with one LoadBalancer frontend (on
// 198.18.<net>.1) admitting n source ranges 10.<net>.<from+i>.0/24, and
// one endpoint.
func rangedPort(name string, net byte, n, from int) model.Service {
	s := fePort(name, net, 1)
	s.Frontends[0].Kind = model.LoadBalancer
	s.SourceRangesSet = true
	for i := range n {
		s.SourceRanges = append(s.SourceRanges, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, net, byte(from + i), 0}), 24))
	}
	return s
}

// sourceRanges lists the prefixes in the source ranges map by the name of
// the service their id is named for ("?" for an id no port is named for).
func (h *capacityHarness) sourceRanges() map[string][]netip.Prefix {
	h.t.Helper()
	srs, err := h.dp.SourceRanges()
	if err != nil {
		h.t.Fatal(err)
	}
	names, err := h.dp.ServiceNames()
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string][]netip.Prefix{}
	for _, sr := range srs {
		name, ok := names[sr.SvcID]
		if !ok {
			name = "?"
		}
		name = strings.TrimSuffix(strings.TrimPrefix(name, "default/"), "/TCP")
		out[name] = append(out[name], sr.Prefix)
	}
	for _, ps := range out {
		slices.SortFunc(ps, netip.Prefix.Compare)
	}
	return out
}

// strayRanges writes n source ranges under service id 9, which no port
// has (as an earlier agent may have left them).
func (h *capacityHarness) strayRanges(n int) {
	h.t.Helper()
	for i := range n {
		if err := h.dp.PutSourceRange(9, netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(i), 0}), 24)); err != nil {
			h.t.Fatal(err)
		}
	}
}

// Service ports whose loadBalancerSourceRanges do not fit in the source
// ranges map are refused whole and reported, and the rest of the sync
// applies: one port with too many ranges must not make every sync fail.
// Ranges no frontend checks any more make room before any are written;
// ranges a frontend still checks go only after the new ones are in, so a
// port changing its ranges needs room for both.
func TestSourceRangesMapCapacity(t *testing.T) {
	cases := []struct {
		name string
		// run drives the reconciler; the result of its last sync is checked.
		run func(h *capacityHarness) reconcile.Result
		// wantRanges are the ranges in the map, by service: the first
		// third octet of each port's ranges and how many.
		wantRanges   map[string][2]int
		wantRefused  []string       // services named in the last sync's problems
		wantClosed   bool           // the problems say the refused port is closed
		wantFronts   map[string]int // frontends in the map, by service
		wantTableIDs int
	}{
		{
			name: "a new port whose ranges do not fit is refused whole, the others apply",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 3, 0))
				return h.change(nil, rangedPort("big", 2, 6, 0), rangedPort("c", 3, 2, 0))
			},
			wantRanges:   map[string][2]int{"a": {0, 3}, "c": {0, 2}},
			wantRefused:  []string{"big"},
			wantFronts:   map[string]int{"a": 1, "c": 1},
			wantTableIDs: 2,
		},
		{
			name: "a port that never fits does not stop later syncs",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("big", 2, sourceRangesMax+1, 0), rangedPort("a", 1, 2, 0))
				return h.full(rangedPort("big", 2, sourceRangesMax+1, 0), rangedPort("a", 1, 3, 0))
			},
			wantRanges:   map[string][2]int{"a": {0, 3}},
			wantRefused:  []string{"big"},
			wantFronts:   map[string]int{"a": 1},
			wantTableIDs: 1,
		},
		{
			name: "a port that grows past the room left keeps its previous version",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 3, 0), rangedPort("b", 2, 4, 0))
				return h.change(nil, rangedPort("a", 1, 5, 0))
			},
			wantRanges:   map[string][2]int{"a": {0, 3}, "b": {0, 4}},
			wantRefused:  []string{"a"},
			wantFronts:   map[string]int{"a": 1, "b": 1},
			wantTableIDs: 2,
		},
		{
			// Keeping the old ranges would admit the clients the
			// narrowing just excluded.
			name: "a port that narrows its ranges past the room left is closed, not kept",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 5, 0), rangedPort("b", 2, 3, 0))
				a := rangedPort("a", 1, 4, 0) // 10.1.4.0/24 becomes its lower half
				a.SourceRanges = append(a.SourceRanges, netip.MustParsePrefix("10.1.4.0/25"))
				return h.change(nil, a)
			},
			wantRanges:   map[string][2]int{"b": {0, 3}},
			wantClosed:   true,
			wantRefused:  []string{"a"},
			wantFronts:   map[string]int{"b": 1},
			wantTableIDs: 1,
		},
		{
			name: "a port that widens its ranges past the room left keeps its previous version",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 5, 0), rangedPort("b", 2, 3, 0))
				a := rangedPort("a", 1, 0, 0)
				a.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
				return h.change(nil, a)
			},
			wantRanges:   map[string][2]int{"a": {0, 5}, "b": {0, 3}},
			wantRefused:  []string{"a"},
			wantFronts:   map[string]int{"a": 1, "b": 1},
			wantTableIDs: 2,
		},
		{
			name: "a port open to all whose new ranges do not fit is closed, not kept",
			run: func(h *capacityHarness) reconcile.Result {
				a := rangedPort("a", 1, 0, 0)
				a.SourceRangesSet = false
				h.full(a, rangedPort("b", 2, sourceRangesMax, 0))
				return h.change(nil, rangedPort("a", 1, 1, 0))
			},
			wantRanges:   map[string][2]int{"b": {0, sourceRangesMax}},
			wantClosed:   true,
			wantRefused:  []string{"a"},
			wantFronts:   map[string]int{"b": 1},
			wantTableIDs: 1,
		},
		{
			name: "the ranges of a port that goes make room first",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 6, 0))
				return h.change([]string{"a"}, rangedPort("b", 2, 6, 0))
			},
			wantRanges:   map[string][2]int{"b": {0, 6}},
			wantFronts:   map[string]int{"b": 1},
			wantTableIDs: 1,
		},
		{
			name: "a port that changes its ranges swaps them while there is room for both",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 4, 0))
				return h.change(nil, rangedPort("a", 1, 4, 10))
			},
			wantRanges:   map[string][2]int{"a": {10, 4}},
			wantFronts:   map[string]int{"a": 1},
			wantTableIDs: 1,
		},
		{
			// Deleting the old ranges first would drop the port's
			// clients until the new ones are in; keeping them would
			// admit the clients the new ones exclude.
			name: "a port that replaces its ranges without room for both is closed, not kept",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 5, 0))
				return h.change(nil, rangedPort("a", 1, 5, 10))
			},
			wantClosed:  true,
			wantRefused: []string{"a"},
		},
		{
			name: "a port that drops its ranges frees them",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 6, 0), rangedPort("b", 2, 2, 0))
				h.change(nil, rangedPort("a", 1, 0, 0))
				return h.change(nil, rangedPort("b", 2, 8, 0))
			},
			wantRanges:   map[string][2]int{"b": {0, 8}},
			wantFronts:   map[string]int{"a": 1, "b": 1},
			wantTableIDs: 2,
		},
		{
			name: "after a restart, a port's pinned ranges are not counted twice",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 6, 0))
				h.restart()
				return h.full(rangedPort("a", 1, 6, 0))
			},
			wantRanges:   map[string][2]int{"a": {0, 6}},
			wantFronts:   map[string]int{"a": 1},
			wantTableIDs: 1,
		},
		{
			name: "after a restart, ranges no port has make room",
			run: func(h *capacityHarness) reconcile.Result {
				h.strayRanges(sourceRangesMax - 2)
				h.restart()
				return h.full(rangedPort("a", 1, 6, 0))
			},
			wantRanges:   map[string][2]int{"a": {0, 6}},
			wantFronts:   map[string]int{"a": 1},
			wantTableIDs: 1,
		},
		{
			// The frontend keeps the old port's id, and its ranges,
			// until it is rewritten: they cannot make room first.
			name: "a port taking over a frontend of a port that goes is programmed at the full resync",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(rangedPort("a", 1, 5, 0))
				b := rangedPort("b", 1, 5, 10) // a's frontend
				if res := h.change([]string{"a"}, b); len(res.Problems) != 1 {
					h.t.Errorf("taking over: problems %q, want b refused", res.Problems)
				}
				return h.full(b)
			},
			wantRanges:   map[string][2]int{"b": {10, 5}},
			wantFronts:   map[string]int{"b": 1},
			wantTableIDs: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newCapacityHarness(t, func(o *loader.Options) { o.SourceRangesMax = sourceRangesMax })
			res := c.run(h)

			got := h.sourceRanges()
			want := map[string][]netip.Prefix{}
			for name, fn := range c.wantRanges {
				net := byte(0)
				switch name {
				case "a", "?":
					net = 1
				case "big":
					net = 2
				case "b":
					net = 2
					if fn[0] >= 10 { // b took a's frontend
						net = 1
					}
				case "c":
					net = 3
				}
				for i := range fn[1] {
					want[name] = append(want[name], netip.PrefixFrom(netip.AddrFrom4([4]byte{10, net, byte(fn[0] + i), 0}), 24))
				}
			}
			if len(got) != len(want) {
				t.Errorf("source ranges by service %v, want %v", got, want)
			}
			for name, ps := range want {
				if !slices.Equal(got[name], ps) {
					t.Errorf("source ranges by service %v, want %v", got, want)
					break
				}
			}
			fes := h.programmed()
			if len(fes) != len(c.wantFronts) {
				t.Errorf("frontends by service %v, want %v", fes, c.wantFronts)
			}
			for name, n := range c.wantFronts {
				if fes[name] != n {
					t.Errorf("frontends by service %v, want %v", fes, c.wantFronts)
					break
				}
			}
			var refused []string
			for _, p := range res.Problems {
				if !strings.Contains(p, "source ranges") || !strings.Contains(p, "--services-max") {
					t.Errorf("unexpected problem %q", p)
					continue
				}
				if closed := strings.Contains(p, "closed until they fit"); closed != c.wantClosed {
					t.Errorf("problem %q: says closed %v, want %v", p, closed, c.wantClosed)
				}
				for _, name := range []string{"a", "b", "c", "big"} {
					if strings.Contains(p, "default/"+name+"/") {
						refused = append(refused, name)
					}
				}
			}
			if !slices.Equal(refused, c.wantRefused) {
				t.Errorf("refused %v (problems %q), want %v", refused, res.Problems, c.wantRefused)
			}
			ids, err := h.dp.TableIDs()
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) != c.wantTableIDs {
				t.Errorf("%d tables in the map, want %d (a refused port has none)", len(ids), c.wantTableIDs)
			}
		})
	}
}
