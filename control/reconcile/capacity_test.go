package reconcile_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
)

// frontendsMax is the size of the frontends map in the capacity tests.
const frontendsMax = 8

// fePort is service port `name` with n externalIP frontends (on
// 198.18.<net>.1..n, so ports with different nets never share one) and
// one endpoint.
func fePort(name string, net byte, n int) model.Service {
	s := web(ep("10.244.1.10", false, true))
	s.Name = name
	s.Frontends = nil
	for i := 1; i <= n; i++ {
		s.Frontends = append(s.Frontends, model.Frontend{Addr: netip.AddrFrom4([4]byte{198, 18, net, byte(i)}),
			Port: 80, Protocol: model.TCP, Kind: model.ExternalIP})
	}
	return s
}

// capacityHarness drives a reconciler over a datapath whose frontends map
// holds frontendsMax entries.
type capacityHarness struct {
	t  *testing.T
	dp *dataplane.Dataplane
	r  *reconcile.Reconciler
}

// newCapacityHarness loads a datapath sized by resize and a reconciler
// over it.
func newCapacityHarness(t *testing.T, resize ...func(*loader.Options)) *capacityHarness {
	t.Helper()
	h := &capacityHarness{t: t, dp: newDatapath(t, resize...)}
	h.restart()
	return h
}

// full applies the full state svcs.
func (h *capacityHarness) full(svcs ...model.Service) reconcile.Result {
	h.t.Helper()
	res, err := h.r.Apply(context.Background(), model.State{Services: svcs})
	if err != nil {
		h.t.Fatalf("full Apply: %v", err)
	}
	return res
}

// change applies svcs as changed and the ports named in gone as removed.
func (h *capacityHarness) change(gone []string, svcs ...model.Service) reconcile.Result {
	h.t.Helper()
	changed := map[string]*model.Service{}
	for _, name := range gone {
		changed[(&model.Service{Namespace: "default", Name: name, Protocol: model.TCP}).Key()] = nil
	}
	for i := range svcs {
		changed[svcs[i].Key()] = &svcs[i]
	}
	res, err := h.r.ApplyChanges(context.Background(), changed)
	if err != nil {
		h.t.Fatalf("ApplyChanges: %v", err)
	}
	return res
}

// restart replaces the reconciler by a new one over the pinned maps.
func (h *capacityHarness) restart() {
	h.t.Helper()
	r, err := reconcile.New(h.dp, config(), nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.r = r
}

// strays writes n frontends no port has (as a write that failed half-way
// before a restart left them), under service id 9.
func (h *capacityHarness) strays(n int) {
	h.t.Helper()
	fes := map[dataplane.FrontendKey]dataplane.Frontend{}
	for i := 1; i <= n; i++ {
		fes[dataplane.FrontendKey{Addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), Port: 80, Proto: dataplane.TCP}] =
			dataplane.Frontend{SvcID: 9}
	}
	if err := h.dp.PutFrontends(fes); err != nil {
		h.t.Fatal(err)
	}
}

// programmed counts the frontends in the map by the name of the service
// their id is named for ("?" for an id no port is named for).
func (h *capacityHarness) programmed() map[string]int {
	h.t.Helper()
	fes, err := h.dp.Frontends()
	if err != nil {
		h.t.Fatal(err)
	}
	names, err := h.dp.ServiceNames()
	if err != nil {
		h.t.Fatal(err)
	}
	out := map[string]int{}
	for _, fe := range fes {
		name, ok := names[fe.SvcID]
		if !ok {
			name = "?"
		}
		name = strings.TrimSuffix(strings.TrimPrefix(name, "default/"), "/TCP")
		out[name]++
	}
	return out
}

// Service ports whose frontends do not fit in the frontends map are
// refused whole and reported; the rest of the sync applies, deletions
// make room before anything is written, and a restart over frontends no
// port has still converges.
func TestFrontendsMapCapacity(t *testing.T) {
	cases := []struct {
		name string
		// run drives the reconciler; the result of its last sync is checked.
		run          func(h *capacityHarness) reconcile.Result
		want         map[string]int // frontends in the map, by service
		wantRefused  []string       // services named in the last sync's problems
		wantTableIDs int            // tables in the map
	}{
		{
			name: "a new port that does not fit is refused whole, the others apply",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 3))
				return h.change(nil, fePort("big", 2, 6), fePort("c", 3, 2))
			},
			want:         map[string]int{"a": 3, "c": 2},
			wantRefused:  []string{"big"},
			wantTableIDs: 2,
		},
		{
			name: "removals in the same sync make room first",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 6))
				return h.change([]string{"a"}, fePort("b", 2, 6))
			},
			want:         map[string]int{"b": 6},
			wantTableIDs: 1,
		},
		{
			name: "a port that is refused does not block the removal of another",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 4), fePort("b", 2, 4))
				return h.change([]string{"a"}, fePort("big", 3, 9))
			},
			want:         map[string]int{"b": 4},
			wantRefused:  []string{"big"},
			wantTableIDs: 1,
		},
		{
			name: "a port that grows past the room left keeps its previous version",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 3), fePort("b", 2, 4))
				return h.change(nil, fePort("a", 1, 5))
			},
			want:         map[string]int{"a": 3, "b": 4},
			wantRefused:  []string{"a"},
			wantTableIDs: 2,
		},
		{
			// Its previous version would admit clients its new source
			// ranges exclude: the port is closed, not kept.
			name: "a port that grows past the room left and narrows its ranges is closed",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 3), fePort("b", 2, 4))
				grown := fePort("a", 1, 5)
				grown.Frontends[0].Kind = model.LoadBalancer
				grown.SourceRangesSet = true
				grown.SourceRanges = []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}
				return h.change(nil, grown)
			},
			want:         map[string]int{"b": 4},
			wantRefused:  []string{"a"},
			wantTableIDs: 1,
		},
		{
			name: "a refused port is programmed by the full Apply after room is made",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 3), fePort("b", 2, 4))
				h.change(nil, fePort("a", 1, 5))
				h.change([]string{"b"})
				return h.full(fePort("a", 1, 5))
			},
			want:         map[string]int{"a": 5},
			wantTableIDs: 1,
		},
		{
			name: "a full Apply keeps the ports programmed before over new ones",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("z", 1, 5))
				return h.full(fePort("a", 2, 5), fePort("z", 1, 5))
			},
			want:         map[string]int{"z": 5},
			wantRefused:  []string{"a"},
			wantTableIDs: 1,
		},
		{
			name: "a full Apply after a failed write finds the frontends it did not know of",
			run: func(h *capacityHarness) reconcile.Result {
				h.full(fePort("a", 1, 2))
				h.strays(frontendsMax - 2) // as a write that failed half-way
				b := fePort("b", 2, 2)
				if _, err := h.r.ApplyChanges(context.Background(), map[string]*model.Service{b.Key(): &b}); err == nil {
					h.t.Fatal("frontends written into a full map")
				}
				return h.full(fePort("a", 1, 2), b)
			},
			want:         map[string]int{"a": 2, "b": 2},
			wantTableIDs: 2,
		},
		{
			name: "after a restart, frontends no port has make room for those wanted",
			run: func(h *capacityHarness) reconcile.Result {
				h.strays(frontendsMax - 2)
				h.restart()
				return h.full(fePort("a", 1, 6))
			},
			want:         map[string]int{"a": 6},
			wantTableIDs: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newCapacityHarness(t, func(o *loader.Options) { o.FrontendsMax = frontendsMax })
			res := c.run(h)
			got := h.programmed()
			if len(got) != len(c.want) {
				t.Errorf("frontends by service %v, want %v", got, c.want)
			}
			for name, n := range c.want {
				if got[name] != n {
					t.Errorf("frontends by service %v, want %v", got, c.want)
					break
				}
			}
			var refused []string
			for _, p := range res.Problems {
				if !strings.Contains(p, "frontends") {
					t.Errorf("unexpected problem %q", p)
					continue
				}
				for _, name := range []string{"a", "b", "c", "z", "big"} {
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

// A sync's Result says when it deleted from a map a port can be refused
// for room in, so the agent knows when refused ports may fit again.
func TestResultSaysWhenRoomWasFreed(t *testing.T) {
	cases := []struct {
		name string
		run  func(h *capacityHarness) reconcile.Result
		want bool
	}{
		{"a port removed", func(h *capacityHarness) reconcile.Result {
			h.full(fePort("a", 1, 2), fePort("b", 2, 2))
			return h.change([]string{"a"})
		}, true},
		{"a port's frontends shrank", func(h *capacityHarness) reconcile.Result {
			h.full(fePort("a", 1, 3))
			return h.change(nil, fePort("a", 1, 1))
		}, true},
		{"a port's source ranges narrowed", func(h *capacityHarness) reconcile.Result {
			h.full(rangedPort("a", 1, 3, 0))
			return h.change(nil, rangedPort("a", 1, 1, 0))
		}, true},
		{"a port added", func(h *capacityHarness) reconcile.Result {
			h.full(fePort("a", 1, 2))
			return h.change(nil, fePort("b", 2, 2))
		}, false},
		{"a port's frontends grew", func(h *capacityHarness) reconcile.Result {
			h.full(fePort("a", 1, 1))
			return h.change(nil, fePort("a", 1, 3))
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newCapacityHarness(t, func(o *loader.Options) { o.FrontendsMax = frontendsMax })
			res := c.run(h)
			if got := res.FreedRoom(); got != c.want {
				t.Errorf("FreedRoom %v, want %v (result %+v)", got, c.want, res)
			}
		})
	}
}

// A port refused for room stays in every later Apply's problems, also of
// incremental Applies that do not change it, and counts as waiting for
// room: when another port's removal frees room, the Result says both, so
// the agent runs the full Apply that fits it. Meanwhile it is not counted
// among the programmed ports.
func TestRefusedPortWaitsForRoomAcrossIncrementalApplies(t *testing.T) {
	h := newCapacityHarness(t, func(o *loader.Options) { o.FrontendsMax = frontendsMax })
	res := h.full(fePort("a", 1, 6), fePort("big", 2, 6))
	if res.WaitingForRoom != 1 || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "big") {
		t.Fatalf("full Apply: %d waiting for room, problems %q; want big refused", res.WaitingForRoom, res.Problems)
	}
	if res.ServicePorts != 1 {
		t.Errorf("full Apply: %d service ports programmed, want 1 (big refused)", res.ServicePorts)
	}
	big := fePort("big", 2, 6)
	if !res.ProblemPorts[big.Key()] || len(res.ProblemPorts) != 1 {
		t.Errorf("full Apply: problem ports %v, want %s alone", res.ProblemPorts, big.Key())
	}
	res = h.change(nil, fePort("c", 3, 1))
	if res.WaitingForRoom != 1 || len(res.Problems) != 1 || !strings.Contains(res.Problems[0], "big") {
		t.Errorf("incremental Apply of another port: %d waiting for room, problems %q; want big still reported",
			res.WaitingForRoom, res.Problems)
	}
	if res.ServicePorts != 2 {
		t.Errorf("incremental Apply: %d service ports programmed, want 2 (a and c)", res.ServicePorts)
	}
	res = h.change([]string{"a"})
	if !res.FreedRoom() || res.WaitingForRoom != 1 {
		t.Errorf("removal of a: freed room %v, %d waiting for room; want both", res.FreedRoom(), res.WaitingForRoom)
	}
	res = h.full(fePort("big", 2, 6), fePort("c", 3, 1))
	if res.WaitingForRoom != 0 || len(res.Problems) != 0 || len(res.ProblemPorts) != 0 {
		t.Errorf("full Apply after the removal: %d waiting for room, problems %q in %v; want big programmed",
			res.WaitingForRoom, res.Problems, res.ProblemPorts)
	}
	if got := h.programmed(); got["big"] != 6 || got["c"] != 1 || len(got) != 2 {
		t.Errorf("frontends by service %v, want big 6 and c 1", got)
	}
	if res.ServicePorts != 2 {
		t.Errorf("full Apply after the removal: %d service ports programmed, want 2", res.ServicePorts)
	}
}
