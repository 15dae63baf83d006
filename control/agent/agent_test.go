package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/control/metrics"
	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

func TestPodInterfacePatterns(t *testing.T) {
	a := &Agent{cfg: Config{PodInterfaces: "veth*, lxc*,cali?x", Interfaces: []string{"veth-nic"}}}
	for name, want := range map[string]bool{
		"veth12ab": true, "lxc0": true, "cali1x": true, "cali12x": false,
		"eth0": false, "veth-nic": false, // an agent NIC is never a pod interface
	} {
		if got := a.isPodInterface(name); got != want {
			t.Errorf("isPodInterface(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestNodePortsOutsideTheRangeAreSkipped(t *testing.T) {
	a := &Agent{cfg: Config{NodePortMin: 30000, NodePortMax: 32767}}
	st := model.State{Services: []model.Service{{
		Namespace: "ns", Name: "web",
		Frontends: []model.Frontend{
			{Addr: netip.MustParseAddr("10.96.0.1"), Port: 80, Kind: model.ClusterIP},
			{Addr: netip.MustParseAddr("192.0.2.1"), Port: 30080, Kind: model.NodePort},
			{Addr: netip.MustParseAddr("192.0.2.1"), Port: 8080, Kind: model.NodePort},
		},
	}}}
	var problems []model.Problem
	filtered := a.filterNodePorts(st, &problems)
	if n := len(filtered.Services[0].Frontends); n != 2 {
		t.Fatalf("%d frontends left, want the ClusterIP and NodePort 30080", n)
	}
	if len(problems) != 1 || !strings.Contains(problems[0].Message, "node port 8080 outside --nodeport-range") {
		t.Fatalf("problems %v", problems)
	}
	// The model keeps its state between syncs: filtering must not change
	// it, or the next sync would neither program nor report the port.
	if n := len(st.Services[0].Frontends); n != 3 {
		t.Fatalf("the model's state lost frontends to filtering: %d left, want 3", n)
	}
}

func TestSNATRangeIsReservedFromEphemeralPorts(t *testing.T) {
	ns := testenv.NewNetns(t, "sysctl")
	bpffs := testenv.BPFFS(t)
	cases := []struct {
		name         string
		lo, hi       uint16
		ephemeral    string
		reserved     string
		wantReserved string
		wantError    string
	}{
		{"overlap", 40000, 60999, "32768 60999", "", "40000-60999", ""},
		{"kept with others", 40000, 60999, "32768 60999", "22", "22,40000-60999", ""},
		{"no overlap", 61000, 65535, "32768 60999", "", "", ""},
		{"partly within: the overlap only", 50000, 65535, "32768 60999", "", "50000-60999", ""},
		{"leaves the host too few ports", 1024, 65535, "32768 60999", "", "",
			"would leave the host 0 of its ephemeral ports"},
		{"leaves the host just enough", 32768, 59975, "32768 60999", "", "32768-59975", ""},
		{"one port short", 32768, 59976, "32768 60999", "", "", "would leave the host 1023"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns.Sysctl("net.ipv4.ip_local_port_range", c.ephemeral)
			ns.Sysctl("net.ipv4.ip_local_reserved_ports", c.reserved)
			var got string
			var err error
			if derr := ns.Do(func() error {
				// A pin root of its own: no record of an earlier case.
				if err = ProcSys("").CheckSNATRange(xdp.SNATPorts{{Min: c.lo, Max: c.hi}}); err == nil {
					_, err = reserveSNATPorts(filepath.Join(bpffs, fmt.Sprint(i)), "", xdp.SNATPorts{{Min: c.lo, Max: c.hi}}, discard())
				}
				b, rerr := os.ReadFile(ProcSys("").localReservedPorts())
				got = strings.TrimSpace(string(b))
				return rerr
			}); derr != nil {
				t.Fatal(derr)
			}
			switch {
			case c.wantError == "" && err != nil:
				t.Fatal(err)
			case c.wantError != "" && (err == nil || !strings.Contains(err.Error(), c.wantError)):
				t.Fatalf("error %v, want one saying %q", err, c.wantError)
			}
			if got != c.wantReserved {
				t.Errorf("ip_local_reserved_ports %q, want %q", got, c.wantReserved)
			}
		})
	}
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// A start that fails leaves nothing attached: not when a step after the
// attach fails (a cgroup root that is no cgroup v2 hierarchy), nor when a
// server address is in use (kube-proxy's, while both run during a
// cutover), which ends the start before anything is attached.
func TestFailedStartDetaches(t *testing.T) {
	for _, c := range []struct {
		name     string
		config   func(cfg *Config, busy string)
		errorHas string
	}{
		{"cgroup root is no cgroup v2 hierarchy", func(cfg *Config, _ string) { cfg.CgroupRoot = t.TempDir() }, "cgroup"},
		{"healthz address in use", func(cfg *Config, busy string) { cfg.HealthzAddress = busy }, "healthz server on"},
		{"metrics address in use", func(cfg *Config, busy string) { cfg.MetricsAddress = busy }, "metrics server on"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "start")
			ns.IP("link", "add", "edge0", "type", "veth", "peer", "name", "edge1")
			ns.IP("link", "set", "edge0", "up")
			ns.IP("link", "set", "edge1", "up")
			ns.IP("link", "set", "lo", "up")
			services := filepath.Join(t.TempDir(), "services.yaml")
			if err := os.WriteFile(services, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			opts := loader.DefaultOptions()
			opts.PinRoot = testenv.BPFFS(t)
			cfg := Config{
				Interfaces:   []string{"edge0"},
				XDPMode:      loader.XDPNative,
				Datapath:     opts,
				ServicesFile: services,
			}
			err := ns.Do(func() error {
				busy, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					return err
				}
				defer busy.Close()
				c.config(&cfg, busy.Addr().String())
				a, err := Start(context.Background(), cfg, discard())
				if err == nil {
					a.Close()
					return errors.New("Start succeeded")
				}
				if !strings.Contains(err.Error(), c.errorHas) {
					return fmt.Errorf("Start failed with %q, want the cause (%q)", err, c.errorHas)
				}
				link, lerr := netlink.LinkByName("edge0")
				if lerr != nil {
					return lerr
				}
				if x := link.Attrs().Xdp; x != nil && x.Attached {
					return fmt.Errorf("after a failed start (%v), edge0 still runs XDP program %d", err, x.ProgId)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if loader.NICAttached(opts.PinRoot, "edge0") {
				t.Error("after a failed start, edge0's links are still pinned")
			}
		})
	}
}

// A start that fails after it attached, over an earlier agent's datapath
// with a map to resize, leaves that datapath as it was: the pins name its
// maps, with its flows, and every interface (a NIC, a pod interface) runs
// its programs; a NIC the failed start attached afresh runs none. The
// next start that succeeds copies from those maps.
func TestFailedStartLeavesTheEarlierDatapath(t *testing.T) {
	ns := testenv.NewNetns(t, "revert")
	vethUp(ns, "edge0", "edge1", "192.0.2.1/24")
	vethUp(ns, "edge2", "edge3", "198.51.100.1/24")
	vethUp(ns, "pod0", "pod1", "10.244.0.1/32")
	cfg := fileConfig(t, "edge0")
	cfg.PodInterfaces = "pod0"
	root := cfg.Datapath.PinRoot
	flow := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 80, Proto: 6}

	// The pinned maps' ids and the programs the pinned links run.
	pins := func() (map[string]ebpf.MapID, map[string]ebpf.ProgramID) {
		t.Helper()
		return loadertest.PinnedMapIDs(t, root), loadertest.LinkPrograms(t, root)
	}

	if err := ns.Do(func() error {
		a, err := Start(context.Background(), cfg, discard())
		if err != nil {
			return fmt.Errorf("earlier agent: %w", err)
		}
		defer a.Close()
		return a.dp.Maps.Conntrack.Put(flow, xdp.CtEntry{BackendId: 7})
	}); err != nil {
		t.Fatal(err)
	}
	mapIDs, links := pins()
	if links["tc-pod-pod0"] == 0 {
		t.Fatalf("the earlier agent left no pod link: %v", links)
	}

	bigger := cfg
	bigger.Datapath.ConntrackMax *= 2
	failing := bigger
	failing.Interfaces = []string{"edge0", "edge2"}
	failing.CgroupRoot = t.TempDir() // no cgroup v2: fails after the attach
	var xdpProgs map[string]uint32
	if err := ns.Do(func() error {
		if a, err := Start(context.Background(), failing, discard()); err == nil {
			a.Close()
			return errors.New("Start succeeded")
		}
		xdpProgs = map[string]uint32{}
		for _, name := range []string{"edge0", "edge2"} {
			dev, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if x := dev.Attrs().Xdp; x != nil && x.Attached {
				xdpProgs[name] = x.ProgId
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mapsAfter, linksAfter := pins()
	for name, id := range mapIDs {
		if mapsAfter[name] != id {
			t.Errorf("map %s pinned as id %d after the failed start, want %d as before", name, mapsAfter[name], id)
		}
	}
	if !reflect.DeepEqual(linksAfter, links) {
		t.Errorf("after the failed start the pinned links run %v, want %v as before", linksAfter, links)
	}
	if want := map[string]uint32{"edge0": uint32(links["xdp-native-edge0"])}; !reflect.DeepEqual(xdpProgs, want) {
		t.Errorf("after the failed start the interfaces run XDP programs %v, want %v", xdpProgs, want)
	}

	if err := ns.Do(func() error {
		a, err := Start(context.Background(), bigger, discard())
		if err != nil {
			return fmt.Errorf("next agent: %w", err)
		}
		defer a.Close()
		var e xdp.CtEntry
		if err := a.dp.Maps.Conntrack.Lookup(flow, &e); err != nil || e.BackendId != 7 ||
			a.dp.Maps.Conntrack.MaxEntries() != bigger.Datapath.ConntrackMax {
			t.Errorf("the next start's conntrack of %d entries holds %+v (%v), want the flow to backend 7",
				a.dp.Maps.Conntrack.MaxEntries(), e, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An agent restarted without pod interfaces detaches those an earlier
// agent attached: their links would run its programs on maps the pins
// no longer name.
func TestRestartWithoutPodInterfacesDetachesThem(t *testing.T) {
	ns := testenv.NewNetns(t, "nopods")
	vethUp(ns, "edge0", "edge1", "192.0.2.1/24")
	vethUp(ns, "pod0", "pod1", "10.244.0.1/32")
	cfg := fileConfig(t, "edge0")
	cfg.PodInterfaces = "pod0"
	podProgs := func() int { return tcxPrograms(t, ns, "pod0") }
	run := func(cfg Config) {
		t.Helper()
		if err := ns.Do(func() error {
			a, err := Start(context.Background(), cfg, discard())
			if err != nil {
				return err
			}
			defer a.Close()
			defer a.hcNodes.Close()
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // one pass over the interfaces, no watch
			a.watchPods(ctx)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	run(cfg)
	if n := podProgs(); n != 2 {
		t.Fatalf("pod0 runs %d programs after a start with pod interfaces, want 2", n)
	}
	cfg.PodInterfaces = ""
	run(cfg)
	if n := podProgs(); n != 0 {
		t.Errorf("pod0 runs %d programs after a start without pod interfaces, want none", n)
	}
	if pinned, err := loader.PodInterfaces(cfg.Datapath.PinRoot); err != nil || len(pinned) != 0 {
		t.Errorf("pinned pod interfaces %v (%v), want none", pinned, err)
	}
}

// The SNAT hint sweep runs at the first sync, then at the first sync an
// interval after a removal (the purge of its flows is done by then).
func TestHintSweepIsDue(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	syncs := []struct {
		at      time.Duration // since start
		removed int
		want    bool
	}{
		{0, 0, true},                  // first sync: hints from before a restart
		{time.Second, 0, false},       // nothing left since
		{2 * time.Second, 3, false},   // backends left: wait an interval
		{30 * time.Second, 1, false},  // more left; the first removal counts
		{61 * time.Second, 0, false},  // not yet an interval after it
		{62 * time.Second, 0, true},   // due
		{200 * time.Second, 0, false}, // nothing left since
		{201 * time.Second, 1, false},
		{262 * time.Second, 0, true},
	}
	h := newHintSweep(time.Minute)
	for i, s := range syncs {
		if got := h.due(s.removed, start.Add(s.at)); got != s.want {
			t.Errorf("sync %d (at %s, %d removed): due %v, want %v", i, s.at, s.removed, got, s.want)
		}
	}
	// A sweep that failed runs again at the next sync.
	h.retry()
	if !h.due(0, start.Add(263*time.Second)) {
		t.Error("a failed sweep is not due at the next sync")
	}
}

func TestRetryRefused(t *testing.T) {
	waiting := []string{"service port default/big:http/TCP not programmed: its 6 frontends do not fit"}
	other := []string{"service port default/huge:http/TCP: 20000 endpoints exceed the largest Maglev table"}
	cases := []struct {
		name string
		full bool
		res  reconcile.Result
		want bool
	}{
		{"incremental sync freed frontends", false, reconcile.Result{Problems: waiting, WaitingForRoom: 1, FrontendsRemoved: 2}, true},
		{"incremental sync freed source ranges", false, reconcile.Result{Problems: waiting, WaitingForRoom: 1, RangesRemoved: 1}, true},
		{"incremental sync freed a table", false, reconcile.Result{Problems: waiting, WaitingForRoom: 1, TablesRemoved: 1}, true},
		{"incremental sync freed backends", false, reconcile.Result{Problems: waiting, WaitingForRoom: 1, BackendsRemoved: 1}, true},
		{"nothing freed", false, reconcile.Result{Problems: waiting, WaitingForRoom: 1, FrontendsWritten: 3}, false},
		{"nothing refused", false, reconcile.Result{FrontendsRemoved: 2}, false},
		{"problems, none for room", false, reconcile.Result{Problems: other, BackendsRemoved: 1}, false},
		{"a full sync fitted every port already", true, reconcile.Result{Problems: waiting, WaitingForRoom: 1, FrontendsRemoved: 2}, false},
	}
	for _, tc := range cases {
		if got := retryRefused(tc.full, tc.res); got != tc.want {
			t.Errorf("%s: retry %v, want %v", tc.name, got, tc.want)
		}
	}
}

// A change is observed once a sync programs its port: not while the port
// is refused (it has problems), and then from its trigger time.
func TestProgrammingIsObservedOnceThePortIsProgrammed(t *testing.T) {
	m := metrics.New(nil, discard())
	a := &Agent{lastTrigger: map[string]time.Time{}, metrics: m, syncs: 1}
	trigger := time.Now().Add(-3 * time.Second)
	web := model.Service{Namespace: "ns", Name: "web", Protocol: model.TCP, LastChangeTriggerTime: trigger}
	state := model.State{Services: []model.Service{web}}
	observed := func() (uint64, float64) {
		t.Helper()
		families, err := m.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range families {
			if f.GetName() == "xdplb_network_programming_duration_seconds" {
				h := f.GetMetric()[0].GetHistogram()
				return h.GetSampleCount(), h.GetSampleSum()
			}
		}
		t.Fatal("no programming duration histogram")
		return 0, 0
	}

	a.observeProgramming(state, nil, map[string]bool{web.Key(): true})
	if n, _ := observed(); n != 0 {
		t.Fatalf("%d observations for a refused port, want none", n)
	}
	a.observeProgramming(state, nil, nil)
	if n, sum := observed(); n != 1 || sum < 3 {
		t.Fatalf("%d observations summing %.1f s once programmed, want one of at least 3 s", n, sum)
	}
	a.observeProgramming(state, nil, nil)
	if n, _ := observed(); n != 1 {
		t.Errorf("the same change observed again: %d observations", n)
	}
}

// The last-change times kept per service port go with their port, whether
// it is removed in an incremental or in a full sync.
func TestProgrammingTimesForgetRemovedPorts(t *testing.T) {
	a := &Agent{lastTrigger: map[string]time.Time{}, metrics: metrics.New(nil, discard()), syncs: 1}
	port := func(name string) model.Service {
		return model.Service{Namespace: "ns", Name: name, Protocol: model.TCP, LastChangeTriggerTime: time.Now()}
	}
	both := model.State{Services: []model.Service{port("web"), port("db")}}
	a.observeProgramming(both, nil, nil)
	if len(a.lastTrigger) != 2 {
		t.Fatalf("%d ports recorded, want 2", len(a.lastTrigger))
	}
	a.observeProgramming(model.State{Services: []model.Service{port("web")}}, nil, nil)
	if _, ok := a.lastTrigger["ns/db/TCP"]; ok || len(a.lastTrigger) != 1 {
		t.Errorf("after a full sync without ns/db: %v", a.lastTrigger)
	}
	a.observeProgramming(model.State{}, nil, nil)
	if len(a.lastTrigger) != 0 {
		t.Errorf("after a full sync without ports: %v", a.lastTrigger)
	}
}

// A pod interface whose attach failed is tried again on its own, without
// waiting for another event of the interface: a pod whose interface came
// up while the attach could not be made must not stay untranslated.
func TestFailedPodAttachIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryEvery time.Duration
		wait       time.Duration // for the attach, once it can succeed
		want       int           // programs on pod0 then
	}{
		{"retried", 20 * time.Millisecond, 10 * time.Second, 2},
		// Control: no retry within the wait, so no late link event of
		// pod0 attaches it either.
		{"not retried yet", time.Hour, 2 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "podretry")
			vethUp(ns, "edge0", "edge1", "192.0.2.1/24")
			cfg := fileConfig(t, "edge0")
			cfg.PodInterfaces = "pod0"
			// Something not a link pinned where pod0's link goes: its
			// attach fails until it is removed.
			blocker := filepath.Join(loader.Dir(cfg.Datapath.PinRoot), "links",
				loader.LinkPin{Hook: loader.HookTCPod, Mode: "tcx", Ifname: "pod0"}.Name())
			podProgs := func() int { return tcxPrograms(t, ns, "pod0") }

			var a *Agent
			if err := ns.Do(func() (err error) {
				a, err = Start(context.Background(), cfg, discard())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			defer a.hcNodes.Close()
			a.podRetryEvery = tc.retryEvery
			ctx, cancel := context.WithCancel(context.Background())
			watching := make(chan error, 1)
			go func() { watching <- ns.Do(func() error { a.watchPods(ctx); return nil }) }()
			defer func() {
				cancel()
				if err := <-watching; err != nil {
					t.Error(err)
				}
			}()
			// After the first pass, which removes pins of pod interfaces
			// not there (a pin that is no link too).
			<-a.podsListed
			m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := m.Pin(blocker); err != nil {
				t.Fatal(err)
			}
			vethUp(ns, "pod0", "pod1", "10.244.0.1/32")
			time.Sleep(200 * time.Millisecond) // its link events came
			if n := podProgs(); n != 0 {
				t.Fatalf("pod0 runs %d programs while its attach must fail", n)
			}
			if err := m.Unpin(); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(tc.wait)
			for podProgs() != 2 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := podProgs(); n != tc.want {
				t.Errorf("pod0 runs %d programs %s after its attach can succeed, want %d", n, tc.wait, tc.want)
			}
		})
	}
}

// tcxPrograms counts the tcx programs on both hooks of an interface of ns.
func tcxPrograms(t *testing.T, ns *testenv.Netns, ifname string) int {
	t.Helper()
	n := 0
	if err := ns.Do(func() error {
		dev, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			r, err := link.QueryPrograms(link.QueryOptions{Target: dev.Attrs().Index, Attach: at})
			if err != nil {
				return err
			}
			n += len(r.Programs)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
