package suite

import (
	"context"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/xdplb/xdplb/control/source"
	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/testenv"
)

func timeline(rates ...uint64) []sample {
	var out []sample
	var total uint64
	for i, r := range rates {
		total += r
		out = append(out, sample{at: time.Duration(i+1) * 100 * time.Millisecond, arrived: total})
	}
	return out
}

func TestDetectExhaustion(t *testing.T) {
	// 64k flows in 0.4 s, then nothing for 0.6 s while the generator sent
	// on: exhausted.
	stall := timeline(16000, 16000, 16000, 16000, 0, 0, 0, 0, 0, 0)
	ex := detectExhaustion(stall, 100000, 64000, time.Second)
	if !ex.Detected || ex.ForwardedBefore != 64000 || math.Abs(ex.AfterSeconds-0.4) > 1e-9 ||
		math.Abs(ex.MppsBefore-0.16) > 1e-9 {
		t.Errorf("stall: %+v", ex)
	}
	// Steady to the end: not exhausted.
	steady := timeline(10000, 10000, 10000, 10000, 10000)
	if ex := detectExhaustion(steady, 50000, 50000, 500*time.Millisecond); ex.Detected {
		t.Errorf("steady run detected as exhausted: %+v", ex)
	}
	// Slow but lossless to the end: not exhausted either.
	if ex := detectExhaustion(steady, 52000, 50000, 500*time.Millisecond); ex.Detected {
		t.Errorf("small loss detected as exhausted: %+v", ex)
	}
	if ex := detectExhaustion(nil, 10, 0, time.Second); ex.Detected {
		t.Error("nothing arrived: nothing to say")
	}
}

func TestParseConntrackState(t *testing.T) {
	out := "64513\n262144\n" +
		"entries  clashres found new invalid ignore delete chainlength insert insert_failed drop early_drop icmp_error  expect_new expect_create expect_delete search_restart\n" +
		"0000fc01  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00004200 00004200 00000010 00000000 00000000 00000000 00000000 00000000\n" +
		"0000fc01  00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000100 00000100 00000001 00000000 00000000 00000000 00000000 00000000\n"
	c, err := parseConntrackState(out)
	if err != nil {
		t.Fatal(err)
	}
	want := summary.Conntrack{Entries: 64513, Max: 262144, InsertFailed: 0x4300, Drop: 0x4300, EarlyDrop: 0x11}
	if *c != want {
		t.Errorf("parseConntrackState = %+v, want %+v", *c, want)
	}
	if _, err := parseConntrackState("1\n"); err == nil {
		t.Error("short input must be an error")
	}
}

func TestParseCPUTimes(t *testing.T) {
	c, err := parseCPULine("cpu  685550 10 275294 138843 1745 5 2851 7 0 0")
	if err != nil {
		t.Fatal(err)
	}
	if want := (685550 + 10 + 275294 + 5 + 2851) / 100.0; math.Abs(c.Busy()-want) > 1e-6 {
		t.Errorf("Busy = %v, want %v", c.Busy(), want)
	}
	if _, err := parseCPULine("cpu0 1 2 3"); err == nil {
		t.Error("want an error for a per-CPU or short line")
	}
	// A command name with spaces and parentheses.
	s, err := parseTaskStat("14 (ksoftirqd/0) S 2 0 0 0 -1 69238848 0 0 0 0 120 345 0 0 20 0 1 0 3 0 0")
	if err != nil || math.Abs(s-4.65) > 1e-9 {
		t.Errorf("parseTaskStat = %v, %v; want 4.65", s, err)
	}
	s, err = parseTaskStat("7 (a (b) c) R 2 0 0 0 -1 0 0 0 0 0 1 2 0 0")
	if err != nil || math.Abs(s-0.03) > 1e-9 {
		t.Errorf("parseTaskStat with parentheses = %v, %v", s, err)
	}
}

func TestDatapathDelta(t *testing.T) {
	before := &observation{counters: map[string]uint64{"new_flow": 10, "redirect": 100, "drop_ct_full": 1}, ctEntries: 1000}
	after := &observation{counters: map[string]uint64{"new_flow": 5010, "redirect": 5100, "drop_ct_full": 1,
		"drop_nat_exhausted": 7}, ctEntries: 4000, ctMax: 4096, natEnts: 4000, natMax: 4096}
	d := datapathDelta(before, after)
	if d.NewFlows != 5000 || d.Evictions != 2000 || d.Drops["drop_nat_exhausted"] != 7 || len(d.Drops) != 1 ||
		d.Counters["redirect"] != 5000 || d.ConntrackCapacity != 4096 {
		t.Errorf("datapathDelta = %+v", d)
	}
}

func TestResultAggregation(t *testing.T) {
	e := &env{calibration: 0.1}
	mk := func(arrived uint64, secs float64) rep {
		return rep{sent: arrived * 2, arrived: arrived, elapsed: time.Duration(secs * float64(time.Second)),
			pipelineCPU: float64(arrived) / 1e6, timeline: timeline(arrived/4, arrived/4, arrived/4, arrived/4)}
	}
	reps := []rep{mk(1_000_000, 1), mk(3_000_000, 1), mk(2_000_000, 1)}
	res := e.result(&baselineMode{}, scenario{id: "x", traffic: trafficNew, target: targetOne}, ServiceSet{Count: 1}, reps)
	if res.Mpps != 2 || res.Arrived != 2_000_000 || res.Reps != 3 || !slices.Equal(res.AllMpps, []float64{1, 3, 2}) {
		t.Errorf("median repetition: %+v", res)
	}
	if res.Loss != 0.5 || res.OfferedMpps != 4 || res.CPUSecPerMpkt != 1 || math.Abs(res.NodeCPUSecPerMpkt-0.9) > 1e-9 {
		t.Errorf("derived figures: %+v", res)
	}
	if res.Exhaustion == nil {
		t.Error("the single-backend scenario always reports its exhaustion analysis")
	}
	if r := e.result(&baselineMode{}, scenario{id: "x"}, ServiceSet{Count: 1}, nil); r.Error == "" {
		t.Error("no repetitions must be an error")
	}
}

func TestServiceSet(t *testing.T) {
	set := ServiceSet{Count: 1000, Targets: 16, Backends: 4}
	if err := set.Validate(); err != nil {
		t.Fatal(err)
	}
	svcs, slices := set.Objects()
	if len(svcs) != 1002 || len(slices) != 1002 {
		t.Fatalf("%d services, %d slices", len(svcs), len(slices))
	}
	first, count, stride := set.Destinations()
	targets := 0
	names, cips, eips := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for i, s := range svcs {
		names[s.Name], cips[s.Spec.ClusterIP], eips[s.Spec.ExternalIPs[0]] = true, true, true
		if slices[i].Labels["kubernetes.io/service-name"] != s.Name {
			t.Fatalf("slice %s does not belong to %s", slices[i].Name, s.Name)
		}
		if len(slices[i].Endpoints) == 4 {
			targets++
			eip := netip.MustParseAddr(s.Spec.ExternalIPs[0])
			k := uint32(i)
			if eip != traffic.AddrAdd(first, k) || k%stride != 0 || k/stride >= count {
				t.Errorf("target %s at %s is not where the generator sends", s.Name, eip)
			}
		}
	}
	if targets != 16 || len(names) != 1002 || len(cips) != 1002 || len(eips) != 1002 {
		t.Errorf("targets %d, distinct names %d, cluster IPs %d, external IPs %d", targets, len(names), len(cips), len(eips))
	}
	local := svcs[1000]
	if local.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal || *slices[1000].Endpoints[0].NodeName != edgeNode {
		t.Errorf("perf-local: %+v", local.Spec)
	}
	for _, bad := range []ServiceSet{{Count: 0, Targets: 1, Backends: 1}, {Count: 4, Targets: 5, Backends: 1}, {Count: 1, Targets: 1, Backends: 201}} {
		if bad.Validate() == nil {
			t.Errorf("%+v must be invalid", bad)
		}
	}
}

// TestServicesFileParses checks the agent's own parser accepts the file.
func TestServicesFileParses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "services.yaml")
	set := ServiceSet{Count: 20, Targets: 4, Backends: 3}
	if err := set.WriteServicesFile(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	svcs, slices, err := source.ParseObjects(path, data)
	if err != nil {
		t.Fatalf("the agent rejects the services file: %v", err)
	}
	if len(svcs) != 22 || len(slices) != 22 {
		t.Errorf("parsed %d services and %d slices, want 22 each", len(svcs), len(slices))
	}
}

func TestPlan(t *testing.T) {
	quick := plan(true, nil, 16)
	if len(quick) != 1 || quick[0].set.Count != 1 || len(quick[0].scenarios) != 2 {
		t.Fatalf("quick plan: %+v", quick)
	}
	for _, m := range summary.ModeOrder {
		if !slices.Contains(quick[0].modes, m) {
			t.Errorf("quick plan lacks mode %s: every mode must produce a figure", m)
		}
	}
	full := plan(false, nil, 16)
	var counts []int
	for _, st := range full {
		counts = append(counts, st.set.Count)
		if st.set.Count >= 100000 && slices.Contains(st.modes, summary.ModeKPIPTables) {
			t.Error("kube-proxy at 100k Services is not part of the plan")
		}
		if st.set.Targets != min(st.set.Count, targetsPerSet) {
			t.Errorf("%d services: %d targets", st.set.Count, st.set.Targets)
		}
	}
	if !slices.Equal(counts, []int{1, 1000, 10000, 100000}) || len(full[0].scenarios) != len(scenarios(false)) {
		t.Errorf("full plan: counts %v, %d scenarios at 1 Service", counts, len(full[0].scenarios))
	}
	for _, sc := range full[0].scenarios {
		if sc.traffic == trafficFlood && (sc.appliesTo(summary.ModeBaseline) || !sc.appliesTo(summary.ModeKPIPTables)) {
			t.Errorf("%s: runs for the baseline, or not for kube-proxy", sc.id)
		}
	}
	if !slices.ContainsFunc(full[0].scenarios, func(sc scenario) bool { return sc.traffic == trafficFlood }) {
		t.Error("the full plan has no flood scenario")
	}
	if custom := plan(false, []int{5, 50}, 2); len(custom) != 2 || custom[1].set.Backends != 2 {
		t.Errorf("custom plan: %+v", custom)
	}
}

// TestSandboxForwards builds the perf sandbox, forwards live frames with
// the baseline mode and checks that every frame sent arrives, then that
// the baseline leaves nothing behind.
func TestSandboxForwards(t *testing.T) {
	testenv.RequirePrivileged(t)
	testenv.RequireCommand(t, "ip")
	testenv.RequireCommand(t, "ethtool")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	topo, err := newTopology(ctx, "xlb-ptest-", "xlb-ptest-bpffs-")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := topo.Close(); err != nil {
			t.Errorf("remove sandbox: %v", err)
		}
	}()
	e := &env{log: slog.Default(), topo: topo, threads: 1, frameSize: 64, proto: traffic.TCP}
	if e.gen, err = traffic.NewGenerator(topo.Gen, "eth0"); err != nil {
		t.Fatal(err)
	}
	defer e.gen.Close()
	if e.softirqd, err = ksoftirqd(); err != nil {
		t.Fatal(err)
	}
	m := &baselineMode{}
	set := ServiceSet{Count: 1, Targets: 1, Backends: 1}
	if err := m.start(ctx, e, set); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []scenario{{id: "remote", target: targetRemote, traffic: trafficNew}, {id: "local", target: targetLocal, traffic: trafficEstablished, flows: 4}} {
		if err := m.prepare(ctx, e, sc); err != nil {
			t.Fatal(err)
		}
		spec := newFlowSpec(e, sc, set, newFlowSrc, 1<<20)
		if sc.traffic == trafficEstablished {
			spec = establishedSpec(e, sc, set)
		}
		r, err := e.send(ctx, e.gen, spec, sinkOf(e, sc), traffic.RunOptions{Count: 20000}, nil)
		if err != nil {
			t.Fatal(err)
		}
		// At least the count: an interrupted call is run again whole.
		if r.sent < 20000 || r.arrived != r.sent {
			t.Errorf("%s: sent %d (want at least 20000), arrived %d", sc.id, r.sent, r.arrived)
		}
		if r.pipelineCPU <= 0 {
			t.Errorf("%s: no CPU time measured", sc.id)
		}
	}
	if err := m.stop(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := e.assertClean(); err != nil {
		t.Errorf("baseline left state behind: %v", err)
	}
}

func TestCheckSelection(t *testing.T) {
	tests := []struct {
		modes, scenarios []string
		want             string // "" for no error
	}{
		{nil, nil, ""},
		{[]string{"baseline", "xdplb-xdp"}, []string{"est-remote", "snat-exhaust"}, ""},
		{[]string{"xdplb"}, nil, `unknown mode "xdplb"`},
		{nil, []string{"est"}, `unknown scenario "est"`},
	}
	for _, tt := range tests {
		err := CheckSelection(tt.modes, tt.scenarios)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckSelection(%v, %v) = %v, want %q", tt.modes, tt.scenarios, err, tt.want)
		}
	}
}

// The 10k step measures xdplb's 1-Service reference in rounds with its own
// xdplb figure; other steps and modes run once.
func TestAddReference(t *testing.T) {
	all := scenarios(false)
	newFlows := pick(all, referenceScenario)
	one := ServiceSet{Count: 1, Targets: 1, Backends: 16}
	xdpMode, tcMode := &xdplbMode{}, &xdplbMode{xdpOff: true}
	step := func(n int) []stepEntry {
		set := ServiceSet{Count: n, Targets: min(n, targetsPerSet), Backends: 16}
		return []stepEntry{{m: xdpMode, set: set}, {m: tcMode, set: set}}
	}
	got := addReference(step(referenceFor), one, newFlows)
	if len(got) != 3 || !got[0].inRounds || got[2].inRounds {
		t.Fatalf("10k step: %+v, want xdplb in rounds with a reference right after it, the TC mode once", got)
	}
	if ref := got[1]; ref.m.name() != summary.ModeXDPLB || ref.set != one || !ref.inRounds || ref.alongside != referenceFor ||
		len(ref.scenarios(newFlows)) != 1 {
		t.Errorf("reference entry %+v", ref)
	}
	if got := addReference(step(1000), one, newFlows); len(got) != 2 || got[0].inRounds {
		t.Errorf("1k step: %+v, want no reference", got)
	}
	if got := addReference(step(referenceFor), one, pick(all, "est-remote")); len(got) != 2 {
		t.Errorf("10k step without new flows: %+v, want no reference", got)
	}
}

func TestPktgenWhy(t *testing.T) {
	checked := "/proc/net/pktgen does not exist"
	for config, want := range map[string]string{
		"n": "pktgen is not built into this kernel (CONFIG_NET_PKTGEN is not set)",
		"m": "the pktgen module is not loaded (modprobe pktgen to use it)",
		"y": checked,
		"":  checked,
	} {
		if got := pktgenWhy(config, checked); got != want {
			t.Errorf("pktgenWhy(%q) = %q, want %q", config, got, want)
		}
	}
}
