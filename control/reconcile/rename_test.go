package reconcile_test

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// named is web's port under a port name: what a one-port Service's port
// becomes when a second port is added (the API then requires names).
func named(name string, eps ...model.Endpoint) model.Service {
	s := web(eps...)
	s.PortName = name
	return s
}

// otherService is a second Service, on NodePort 30081, sharing endpoints
// with web.
func otherService(eps ...model.Endpoint) model.Service {
	s := web(eps...)
	s.Name, s.NodePort = "other", 30081
	s.Frontends = []model.Frontend{{Addr: nodeIP, Port: 30081, Protocol: model.TCP, Kind: model.NodePort}}
	return s
}

// replace applies the removal of the ports gone and the ports added, in
// one ApplyChanges or in one full Apply of want (the ports there are).
func replace(t *testing.T, r *reconcile.Reconciler, full bool, gone []model.Service, want ...model.Service) reconcile.Result {
	t.Helper()
	if full {
		return applyWithProblems(t, r, want...)
	}
	changed := map[string]*model.Service{}
	for _, s := range gone {
		changed[s.Key()] = nil
	}
	for i := range want {
		changed[want[i].Key()] = &want[i]
	}
	res, err := r.ApplyChanges(context.Background(), changed)
	if err != nil {
		t.Fatalf("apply changes: %v", err)
	}
	return res
}

// frontendsOf reads the frontends of svc from the map.
func frontendsOf(t *testing.T, dp *dataplane.Dataplane, svc model.Service) map[dataplane.FrontendKey]dataplane.Frontend {
	t.Helper()
	fes, err := dp.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	out := map[dataplane.FrontendKey]dataplane.Frontend{}
	for _, f := range svc.Frontends {
		k := dataplane.FrontendKey{Addr: f.Addr, Port: f.Port, Proto: uint8(f.Protocol)}
		v, ok := fes[k]
		if !ok {
			t.Fatalf("frontend %s of %s is not in the map", f, svc.Key())
		}
		out[k] = v
	}
	return out
}

// serviceNames reads the names of the service ids.
func serviceNames(t *testing.T, dp *dataplane.Dataplane) map[uint32]string {
	t.Helper()
	names, err := dp.ServiceNames()
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// A port renamed (ns/web/TCP becomes ns/web:http/TCP once the Service has
// a second port) keeps its frontends' service id, its tables and its
// counters; nothing departs, so no flow or affinity entry is purged; the
// id's name is the new key. So in one ApplyChanges (the agent's syncs)
// and in one full Apply.
func TestRenamedPortKeepsItsServiceID(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "changes", true: "full"}[full], func(t *testing.T) {
			dp := newDatapath(t)
			r, err := reconcile.New(dp, config(), nil)
			if err != nil {
				t.Fatal(err)
			}
			a, b := ep("10.244.1.10", false, true), ep("10.244.2.10", true, true)
			before := web(a, b)
			before.ExternalTrafficPolicyLocal = true // a node-local table too
			apply(t, r, before)
			fes := frontendsOf(t, dp, before)
			id := fes[dataplane.FrontendKey{Addr: nodeIP, Port: 30080, Proto: dataplane.TCP}].SvcID
			tables := map[uint32][]netip.Addr{}
			for _, fe := range fes {
				for _, tid := range []uint32{fe.TableID, fe.InternalTableID} {
					if tid != 0 {
						tables[tid] = tableBackends(t, dp, tid)
					}
				}
			}
			if len(tables) != 2 {
				t.Fatalf("tables %v, want the cluster-wide and the node-local one", slices.Collect(maps.Keys(tables)))
			}
			counted := make([]xdp.SvcCounter, ebpf.MustPossibleCPU())
			counted[0] = xdp.SvcCounter{Packets: 5, Bytes: 500, NewFlows: 1}
			if err := dp.Maps().SvcStats.Put(id, counted); err != nil {
				t.Fatal(err)
			}

			after := named("http", a, b)
			after.ExternalTrafficPolicyLocal = true
			res := replace(t, r, full, []model.Service{before}, after)
			if len(res.Departed) != 0 || len(res.RemovedBackends) != 0 {
				t.Errorf("departed %+v, removed %v: the renamed port keeps its endpoints", res.Departed, res.RemovedBackends)
			}
			if res.TablesWritten != 0 || res.TablesRemoved != 0 || res.BackendsAdded != 0 || res.BackendsRemoved != 0 {
				t.Errorf("%d tables written, %d removed, %d backends written, %d removed; want the port's as they were",
					res.TablesWritten, res.TablesRemoved, res.BackendsAdded, res.BackendsRemoved)
			}
			if got := frontendsOf(t, dp, after); !maps.Equal(got, fes) {
				t.Errorf("frontends after the rename %+v, want them as before %+v", got, fes)
			}
			for tid, want := range tables {
				if got := tableBackends(t, dp, tid); !slices.Equal(got, want) {
					t.Errorf("table %d changed", tid)
				}
			}
			if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{id: after.Key()}) {
				t.Errorf("service names %v, want %d named %s", names, id, after.Key())
			}
			if c, err := dp.ServiceCounters(id); err != nil || c.Packets != 5 || c.NewFlows != 1 {
				t.Errorf("counters of service port %d: %+v (%v), want them kept", id, c, err)
			}

			// The id is the renamed port's: a full Apply keeps it and its
			// name, and a port added later gets another.
			if res := apply(t, r, after); res.Changed() || len(res.Departed) != 0 {
				t.Errorf("a full Apply of the same state changed something: %+v", res)
			}
			metrics := named("metrics")
			metrics.Port, metrics.NodePort = 9090, 30090
			metrics.Frontends = []model.Frontend{{Addr: clusterIP, Port: 9090, Protocol: model.TCP, Kind: model.ClusterIP}}
			apply(t, r, after, metrics)
			got := frontendsOf(t, dp, metrics)[dataplane.FrontendKey{Addr: clusterIP, Port: 9090, Proto: dataplane.TCP}].SvcID
			if got == id {
				t.Errorf("the port added later got service id %d, the renamed port's", got)
			}
			if names := serviceNames(t, dp); names[id] != after.Key() || names[got] != metrics.Key() {
				t.Errorf("service names %v, want %d named %s and %d named %s", names, id, after.Key(), got, metrics.Key())
			}
		})
	}
}

// A rename whose Apply stops (its context cancelled before anything is
// written) leaves the port as it was, name included, and its id the
// port's: the full Apply that follows renames it.
func TestStoppedRenameLeavesThePort(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	a := ep("10.244.1.10", false, true)
	before := web(a)
	apply(t, r, before)
	fe := mustFrontend(t, dp, nodeIP, 30080)
	after := named("http", a)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.ApplyChanges(ctx, map[string]*model.Service{before.Key(): nil, after.Key(): &after}); err == nil {
		t.Fatal("an Apply with its context cancelled went ahead")
	}
	if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{fe.SvcID: before.Key()}) {
		t.Errorf("service names %v after the stopped Apply, want %d named %s", names, fe.SvcID, before.Key())
	}
	if res := apply(t, r, after); len(res.Departed) != 0 {
		t.Errorf("departed %+v", res.Departed)
	}
	if now := mustFrontend(t, dp, nodeIP, 30080); now.SvcID != fe.SvcID {
		t.Errorf("service id %d after the rename, want %d", now.SvcID, fe.SvcID)
	}
	if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{fe.SvcID: after.Key()}) {
		t.Errorf("service names %v, want %d named %s", names, fe.SvcID, after.Key())
	}
}

// A backend that leaves the port in the same change as its rename is
// reported departed under the id the renamed port keeps (the others are
// not), and the purge finds it still departed.
func TestRenamedPortReportsBackendsThatLeave(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(map[bool]string{false: "changes", true: "full"}[full], func(t *testing.T) {
			dp := newDatapath(t)
			r, _ := reconcile.New(dp, config(), nil)
			a, shared, gone := ep("10.244.1.10", false, true), ep("10.244.1.20", false, true), ep("10.244.1.30", false, true)
			before := web(a, shared, gone)
			apply(t, r, before, otherService(shared))
			fe := mustFrontend(t, dp, nodeIP, 30080)

			after := named("http", a)
			res := replace(t, r, full, []model.Service{before}, after, otherService(shared))
			if now := mustFrontend(t, dp, nodeIP, 30080); now.SvcID != fe.SvcID {
				t.Fatalf("service id %d after the rename, want %d", now.SvcID, fe.SvcID)
			}
			if len(res.Departed) != 1 {
				t.Fatalf("departed %+v, want %s alone", res.Departed, shared.Addr)
			}
			d := res.Departed[0]
			if d.SvcID != fe.SvcID || d.Backend.Addr != shared.Addr || d.AffinityOnly {
				t.Errorf("departure %+v, want %s from service port %d", d, shared.Addr, fe.SvcID)
			}
			if !r.StillDeparted(d) {
				t.Error("the departure does not hold right after it")
			}
			if len(res.RemovedBackends) != 1 {
				t.Fatalf("removed %v, want %s", res.RemovedBackends, gone.Addr)
			}
			for _, b := range res.RemovedBackends {
				if b.Addr != gone.Addr {
					t.Errorf("removed %v, want %s", res.RemovedBackends, gone.Addr)
				}
			}
		})
	}
}

// Only a frontend (address, port, protocol) shared with a port removed in
// the same Apply hands that port's id on, to one port: the first, in key
// order, of those that take over one of its frontends.
func TestPortsTakingOverRemovedFrontends(t *testing.T) {
	a, shared := ep("10.244.1.10", false, true), ep("10.244.1.20", false, true)
	nodePort := dataplane.FrontendKey{Addr: nodeIP, Port: 30080, Proto: dataplane.TCP}
	lb := dataplane.FrontendKey{Addr: lbIP, Port: 80, Proto: dataplane.TCP}

	t.Run("two ports share the frontends", func(t *testing.T) {
		dp := newDatapath(t)
		r, _ := reconcile.New(dp, config(), nil)
		before := web(a, shared)
		apply(t, r, before)
		fe := mustFrontend(t, dp, nodeIP, 30080)
		// http takes the ClusterIP and the NodePort; alt, first in key
		// order, the LoadBalancer address.
		http, alt := named("http", a, shared), named("alt", a, shared)
		http.Frontends = http.Frontends[:2]
		alt.Frontends = alt.Frontends[2:]
		res := replace(t, r, false, []model.Service{before}, http, alt)
		if got := frontendsOf(t, dp, alt)[lb].SvcID; got != fe.SvcID {
			t.Errorf("%s has service id %d, want %d (the first in key order to take a frontend over)", alt.Key(), got, fe.SvcID)
		}
		if got := frontendsOf(t, dp, http)[nodePort].SvcID; got == fe.SvcID || got == 0 {
			t.Errorf("%s has service id %d, want one of its own", http.Key(), got)
		}
		if names := serviceNames(t, dp); names[fe.SvcID] != alt.Key() {
			t.Errorf("service %d is named %q, want %s", fe.SvcID, names[fe.SvcID], alt.Key())
		}
		if len(res.Departed) != 0 {
			t.Errorf("departed %+v: %s keeps every endpoint", res.Departed, alt.Key())
		}
	})

	t.Run("one port takes over frontends of two", func(t *testing.T) {
		// Its first frontend that a removed port had decides.
		dp := newDatapath(t)
		r, _ := reconcile.New(dp, config(), nil)
		first, second := web(a), otherService(shared)
		apply(t, r, first, second)
		fe1 := mustFrontend(t, dp, nodeIP, 30080)
		fe2 := mustFrontend(t, dp, nodeIP, 30081)
		both := named("http", a, shared)
		both.Frontends = append(both.Frontends, second.Frontends...)
		res := replace(t, r, false, []model.Service{first, second}, both)
		for k, v := range frontendsOf(t, dp, both) {
			if v.SvcID != fe1.SvcID {
				t.Errorf("frontend %s has service id %d, want %d", k, v.SvcID, fe1.SvcID)
			}
		}
		if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{fe1.SvcID: both.Key()}) {
			t.Errorf("service names %v, want %d named %s", names, fe1.SvcID, both.Key())
		}
		if len(res.Departed) != 1 || res.Departed[0].SvcID != fe2.SvcID || res.Departed[0].Backend.Addr != shared.Addr {
			t.Errorf("departed %+v, want %s from service port %d", res.Departed, shared.Addr, fe2.SvcID)
		}
	})

	t.Run("another Service on other frontends", func(t *testing.T) {
		dp := newDatapath(t)
		r, _ := reconcile.New(dp, config(), nil)
		before := web(a, shared)
		apply(t, r, before)
		fe := mustFrontend(t, dp, nodeIP, 30080)
		other := otherService(a, shared)
		res := replace(t, r, false, []model.Service{before}, other)
		if got := mustFrontend(t, dp, nodeIP, 30081); got.SvcID == fe.SvcID {
			t.Errorf("%s took service id %d over without a frontend of the port removed", other.Key(), got.SvcID)
		}
		if len(res.Departed) != 2 {
			t.Errorf("departed %+v, want both backends from service port %d", res.Departed, fe.SvcID)
		}
		for _, d := range res.Departed {
			if d.SvcID != fe.SvcID || !r.StillDeparted(d) {
				t.Errorf("departure %+v, want one from service port %d that holds", d, fe.SvcID)
			}
		}
		if name, ok := serviceNames(t, dp)[fe.SvcID]; ok {
			t.Errorf("service id %d of the removed port still named %q", fe.SvcID, name)
		}
	})

	t.Run("another Service on the same frontend", func(t *testing.T) {
		// Counters and names are a Service's: another Service that
		// takes the frontend over starts afresh, and the flows of the
		// one removed end as when any Service goes.
		dp := newDatapath(t)
		r, _ := reconcile.New(dp, config(), nil)
		before := web(a, shared)
		apply(t, r, before)
		fe := mustFrontend(t, dp, nodeIP, 30080)
		api := web(a)
		api.Name = "api"
		res := replace(t, r, false, []model.Service{before}, api)
		got := mustFrontend(t, dp, nodeIP, 30080)
		if got.SvcID == fe.SvcID {
			t.Errorf("%s took service id %d of %s over", api.Key(), got.SvcID, before.Key())
		}
		if name := serviceNames(t, dp)[got.SvcID]; name != api.Key() {
			t.Errorf("service id %d named %q, want %q", got.SvcID, name, api.Key())
		}
		if len(res.Departed) != 1 || res.Departed[0].SvcID != fe.SvcID || len(res.RemovedBackends) != 1 {
			t.Errorf("departed %+v, removed %v; want %s departed from service port %d and %s removed",
				res.Departed, res.RemovedBackends, a.Addr, fe.SvcID, shared.Addr)
		}
	})
}

// A SNAT flow (an external client through the NodePort to a backend on
// another node) outlives the rename of its port: the purge after it
// leaves its conntrack entry alone, and still ends the flow of a backend
// that left the port in the same change.
func TestRenameKeepsSNATFlows(t *testing.T) {
	dp := newDatapath(t)
	r, _ := reconcile.New(dp, config(), nil)
	a, shared := ep("10.244.1.10", false, true), ep("10.244.1.20", false, true)
	before := web(a, shared)
	apply(t, r, before, otherService(shared))
	fe := mustFrontend(t, dp, nodeIP, 30080)
	ids := map[netip.Addr]uint32{}
	bes, err := dp.Backends()
	if err != nil {
		t.Fatal(err)
	}
	for id, b := range bes {
		ids[b.Addr] = id
	}
	var cfg xdp.DatapathConfig
	if err := dp.Maps().Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}

	// One flow to each backend from its own client port, SNATed to the
	// node's address, its reply tuple in the slot of its SNAT port.
	client := netip.MustParseAddr("198.51.100.1")
	for i, e := range []model.Endpoint{a, shared} {
		natPort := cfg.SnatPortMin + uint16(i)
		key := xdp.CtKey{Saddr: xdp.AddrToNet(client), Daddr: xdp.AddrToNet(nodeIP),
			Sport: xdp.PortToNet(50000 + uint16(i)), Dport: xdp.PortToNet(30080), Proto: dataplane.TCP}
		flags := uint8(xdp.CtFlagsCT_F_SNAT | xdp.CtFlagsCT_F_EXTERNAL)
		ct := xdp.CtEntry{CreatedNs: uint64(dataplane.Now()), LastSeenNs: uint64(dataplane.Now()),
			SvcId: fe.SvcID, BackendId: ids[e.Addr], BackendAddr: xdp.AddrToNet(e.Addr), BackendPort: xdp.PortToNet(e.Port),
			NatAddr: xdp.AddrToNet(nodeIP), NatPort: xdp.PortToNet(natPort), Flags: flags,
			TcpState: uint8(xdp.CtTcpStateCT_TCP_SYN | xdp.CtTcpStateCT_TCP_ESTABLISHED)}
		if err := dp.Maps().Conntrack.Put(key, ct); err != nil {
			t.Fatal(err)
		}
		backend := netip.AddrPortFrom(e.Addr, e.Port)
		if err := dp.Maps().SNATBucketHints.Put(xdp.SNATHint(backend, nodeIP, dataplane.TCP), uint32(1)); err != nil {
			t.Fatal(err)
		}
		slot := xdp.SnatSlot{
			Key: xdp.NatKey{Saddr: ct.BackendAddr, Sport: ct.BackendPort, Daddr: ct.NatAddr, Dport: ct.NatPort,
				Proto: dataplane.TCP},
			Rev: xdp.NatEntry{LastSeenNs: ct.LastSeenNs, ClientAddr: key.Saddr, ClientPort: key.Sport,
				FrontendAddr: key.Daddr, FrontendPort: key.Dport, BackendId: ct.BackendId, SvcId: fe.SvcID, Flags: flags},
			Generation: 1,
		}
		if err := dp.Maps().SNATSlots.Put(xdp.SNATSlot(0, natPort, xdp.SNATPortsOf(&cfg)), slot); err != nil {
			t.Fatal(err)
		}
	}

	// Renamed; shared leaves the port (other keeps it).
	after := named("http", a)
	res := replace(t, r, false, []model.Service{before}, after, otherService(shared))
	purged, err := reconcile.PurgeFlows(context.Background(), dp, res.Stale(), r.StillDeparted)
	if err != nil {
		t.Fatal(err)
	}
	if purged.Flows != 1 {
		t.Errorf("purged %d flows, want 1 (the flow to %s)", purged.Flows, shared.Addr)
	}
	live := map[netip.Addr]bool{}
	err = dp.Flows(func(f dataplane.Flow) bool {
		live[f.Backend.Addr()] = !f.Ended && f.SvcID == fe.SvcID
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if !live[a.Addr] {
		t.Errorf("the SNAT flow to %s through the renamed port was ended", a.Addr)
	}
	if live[shared.Addr] {
		t.Errorf("the flow to %s, which left the port, was not ended", shared.Addr)
	}
}

// A renamed port that does not fit (its frontends, or its source ranges,
// do not fit in what the maps leave) is refused like any new port: it
// is not programmed and the id of the port it would have taken over goes
// with that port. So the id is freed and its name deleted, every backend
// of the removed port is reported departed from it (or removed), the
// id's frontends, tables and ranges are gone, and once there is room a
// full Apply programs the port under an id named for its new key.
func TestRefusedRenameFreesTheServiceID(t *testing.T) {
	// extra are the frontend and the source ranges the renamed port adds.
	extra := model.Frontend{Addr: netip.MustParseAddr("198.18.9.1"), Port: 80, Protocol: model.TCP, Kind: model.ExternalIP}
	ranges := func(from, n int) []netip.Prefix {
		var out []netip.Prefix
		for i := range n {
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 9, byte(from + i), 0}), 24))
		}
		return out
	}
	cases := []struct {
		name   string
		resize func(*loader.Options)
		// filler takes the room the renamed port needs; before is the
		// port, after its renamed version, which does not fit.
		filler        model.Service
		before, after func(model.Service) model.Service
	}{
		{
			name:   "frontends",
			resize: func(o *loader.Options) { o.FrontendsMax = frontendsMax },
			filler: fePort("filler", 1, frontendsMax-3), // web has 3
			before: func(s model.Service) model.Service { return s },
			after: func(s model.Service) model.Service {
				s.Frontends = append(slices.Clone(s.Frontends), extra)
				return s
			},
		},
		{
			name:   "source ranges",
			resize: func(o *loader.Options) { o.SourceRangesMax = sourceRangesMax },
			filler: rangedPort("filler", 1, sourceRangesMax-2, 0),
			before: func(s model.Service) model.Service {
				s.SourceRangesSet, s.SourceRanges = true, ranges(0, 2)
				return s
			},
			after: func(s model.Service) model.Service {
				s.SourceRangesSet, s.SourceRanges = true, ranges(0, 4)
				return s
			},
		},
	}
	for _, c := range cases {
		for _, full := range []bool{false, true} {
			t.Run(c.name+"/"+map[bool]string{false: "changes", true: "full"}[full], func(t *testing.T) {
				dp := newDatapath(t, c.resize)
				r, err := reconcile.New(dp, config(), nil)
				if err != nil {
					t.Fatal(err)
				}
				// shared is the filler's endpoint too: it stays in use.
				a, b, shared := ep("10.244.3.10", false, true), ep("10.244.3.20", true, true), ep("10.244.1.10", false, true)
				before := c.before(web(a, b, shared))
				before.ExternalTrafficPolicyLocal = true // a node-local table too
				if res := apply(t, r, c.filler, before); len(res.Problems) != 0 {
					t.Fatalf("problems %q before the rename", res.Problems)
				}
				fes := frontendsOf(t, dp, before)
				id := fes[dataplane.FrontendKey{Addr: nodeIP, Port: 30080, Proto: dataplane.TCP}].SvcID
				fillerID := frontendsOf(t, dp, c.filler)[dataplane.FrontendKey{Addr: c.filler.Frontends[0].Addr,
					Port: c.filler.Frontends[0].Port, Proto: dataplane.TCP}].SvcID
				var tables []uint32
				for _, fe := range fes {
					for _, tid := range []uint32{fe.TableID, fe.InternalTableID} {
						if tid != 0 && !slices.Contains(tables, tid) {
							tables = append(tables, tid)
						}
					}
				}
				if len(tables) != 2 {
					t.Fatalf("tables %v, want the cluster-wide and the node-local one", tables)
				}

				after := named("http", a, b, shared)
				after.ExternalTrafficPolicyLocal = true
				after = c.after(after)
				res := replace(t, r, full, []model.Service{before}, c.filler, after)
				if len(res.Problems) != 1 || !strings.Contains(res.Problems[0], after.Key()) || res.WaitingForRoom != 1 {
					t.Fatalf("problems %q, %d waiting for room; want %s refused for room", res.Problems, res.WaitingForRoom, after.Key())
				}
				refusedState(t, dp, r, res, id, fillerID, c.filler, tables, before.Endpoints)

				// Nothing changes while there is no room: the id stays free.
				res = applyWithProblems(t, r, c.filler, after)
				if res.WaitingForRoom != 1 || len(res.Departed) != 0 {
					t.Errorf("again: %d waiting for room, departed %+v; want %s refused, nothing departed",
						res.WaitingForRoom, res.Departed, after.Key())
				}
				if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{fillerID: c.filler.Key()}) {
					t.Errorf("service names %v, want only %d named %s", names, fillerID, c.filler.Key())
				}

				// Room made: the port is programmed, under an id named for
				// its new key.
				res = apply(t, r, after)
				if len(res.Problems) != 0 || res.WaitingForRoom != 0 || res.ServicePorts != 1 {
					t.Fatalf("after making room: problems %q, %d waiting, %d ports programmed", res.Problems, res.WaitingForRoom, res.ServicePorts)
				}
				now := frontendsOf(t, dp, after)
				newID := now[dataplane.FrontendKey{Addr: nodeIP, Port: 30080, Proto: dataplane.TCP}].SvcID
				if newID == 0 {
					t.Fatal("the renamed port has service id 0")
				}
				for k, fe := range now {
					if fe.SvcID != newID || fe.TableID == 0 {
						t.Errorf("frontend %v: %+v, want service id %d and a table", k, fe, newID)
					}
				}
				if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{newID: after.Key()}) {
					t.Errorf("service names %v, want %d named %s", names, newID, after.Key())
				}
				if c.after(model.Service{}).SourceRangesSet {
					srs, err := dp.SourceRanges()
					if err != nil {
						t.Fatal(err)
					}
					var got []netip.Prefix
					for _, sr := range srs {
						if sr.SvcID != newID {
							t.Errorf("source range %v, want only service %d's", sr, newID)
						}
						got = append(got, sr.Prefix)
					}
					slices.SortFunc(got, netip.Prefix.Compare)
					if !slices.Equal(got, after.SourceRanges) {
						t.Errorf("source ranges %v, want %v", got, after.SourceRanges)
					}
				}
				consistent(t, dp)
				// The ClusterIP's table is the cluster-wide one (the
				// NodePort's, under the Local policy, the node-local one).
				tid := now[dataplane.FrontendKey{Addr: clusterIP, Port: 80, Proto: dataplane.TCP}].TableID
				inTable := map[netip.Addr]bool{}
				for _, addr := range tableBackends(t, dp, tid) {
					inTable[addr] = true
				}
				if !maps.Equal(inTable, map[netip.Addr]bool{a.Addr: true, b.Addr: true, shared.Addr: true}) {
					t.Errorf("table %d holds %v, want %s, %s and %s", tid, slices.Collect(maps.Keys(inTable)), a.Addr, b.Addr, shared.Addr)
				}
			})
		}
	}
}

// refusedState checks the maps and res after the rename of the port with
// service id id (its tables, its endpoints eps) was refused: only the
// filler (fillerID) is left, and every endpoint departed from id or was
// removed.
func refusedState(t *testing.T, dp *dataplane.Dataplane, r *reconcile.Reconciler, res reconcile.Result,
	id, fillerID uint32, filler model.Service, tables []uint32, eps []model.Endpoint) {
	t.Helper()
	if names := serviceNames(t, dp); !maps.Equal(names, map[uint32]string{fillerID: filler.Key()}) {
		t.Errorf("service names %v, want only %d named %s (the id of the port removed freed)", names, fillerID, filler.Key())
	}
	all, err := dp.Frontends()
	if err != nil {
		t.Fatal(err)
	}
	for k, fe := range all {
		if fe.SvcID != fillerID {
			t.Errorf("frontend %v of service %d in the map, want only the filler's (%d)", k, fe.SvcID, fillerID)
		}
	}
	srs, err := dp.SourceRanges()
	if err != nil {
		t.Fatal(err)
	}
	for _, sr := range srs {
		if sr.SvcID == id {
			t.Errorf("source range %v of the freed id in the map", sr)
		}
	}
	ids, err := dp.TableIDs()
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range ids {
		if slices.Contains(tables, tid) || (tid+1)/2 == id {
			t.Errorf("table %d of the freed id %d still in the map", tid, id)
		}
	}
	removed := map[netip.Addr]bool{}
	for _, b := range res.RemovedBackends {
		removed[b.Addr] = true
	}
	departed := map[netip.Addr]bool{}
	for _, d := range res.Departed {
		if d.SvcID != id || d.AffinityOnly {
			t.Errorf("departure %+v, want one from service port %d", d, id)
		}
		if !r.StillDeparted(d) {
			t.Errorf("departure %+v does not hold right after it", d)
		}
		departed[d.Backend.Addr] = true
	}
	for _, e := range eps {
		if departed[e.Addr] == removed[e.Addr] {
			t.Errorf("backend %s departed %v, removed %v; want one of them (departed %+v, removed %v)",
				e.Addr, departed[e.Addr], removed[e.Addr], res.Departed, res.RemovedBackends)
		}
	}
	if shared := filler.Endpoints[0].Addr; !departed[shared] {
		t.Errorf("%s, still the filler's, not reported departed from %d: %+v", shared, id, res.Departed)
	}
}
