package summary

import (
	"encoding/xml"
	"errors"
	"io"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
		idx  int
	}{
		{nil, 0, -1},
		{[]float64{3}, 3, 0},
		{[]float64{5, 1, 3}, 3, 2},
		{[]float64{4, 1, 3, 2}, 2.5, 2}, // middle two: 2 (index 3) and 3 (index 2)
	} {
		got, idx := Median(c.in)
		if got != c.want || idx != c.idx {
			t.Errorf("Median(%v) = %v, %d; want %v, %d", c.in, got, idx, c.want, c.idx)
		}
	}
	if !math.IsNaN(Ratio(1, 0)) || Ratio(6, 3) != 2 {
		t.Error("Ratio")
	}
}

func TestFormat(t *testing.T) {
	for in, want := range map[float64]string{
		0: "0", 4.2345: "4.23", 0.2049: "0.205", 0.00783: "0.00783", 12.34: "12.3", 150: "150", 0.0411: "0.0411",
	} {
		if got := FormatMpps(in); got != want {
			t.Errorf("FormatMpps(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int]string{1: "1", 1000: "1k", 10000: "10k", 100000: "100k", 1500: "1500"} {
		if got := FormatServices(in); got != want {
			t.Errorf("FormatServices(%d) = %q, want %q", in, got, want)
		}
	}
}

// sample is a report as a run would leave it.
func sample() *Report {
	r := &Report{
		Started:  time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC),
		Duration: 42,
		Machine:  Machine{Kernel: "6.18", CPU: "Test CPU", CPUs: 2, NICDriver: "veth", XDPMode: "native", Generator: "bpf", Threads: 1, FrameBytes: 64},
		Modes: []Mode{
			{Name: ModeBaseline, Available: true},
			{Name: ModeXDPLB, Available: true},
			{Name: ModeKPIPTables, Available: true},
			{Name: ModeKPNFTables, Available: true},
			{Name: ModeKPIPVS, Reason: "IPVS is not built into this kernel | really"},
		},
		Scenarios: []Scenario{{"est-remote", "established flows"}, {"new-remote", "new flows"}},
	}
	add := func(mode, sc string, n int, mpps, cpu float64) {
		r.Results = append(r.Results, Result{Mode: mode, Scenario: sc, Services: n, Reps: 3,
			Sent: uint64(mpps * 1e6), Arrived: uint64(mpps * 1e6), Seconds: 1, Mpps: mpps, OfferedMpps: mpps,
			CPUSecPerMpkt: cpu})
		r.Scheduled = append(r.Scheduled, Key{mode, sc, n})
	}
	add(ModeBaseline, "est-remote", 1, 5, 0.2)
	add(ModeXDPLB, "est-remote", 1, 4, 0.25)
	add(ModeKPIPTables, "est-remote", 1, 0.6, 1.6)
	add(ModeKPNFTables, "est-remote", 1, 0.8, 1.2)
	add(ModeXDPLB, "new-remote", 1, 1.2, 0.8)
	add(ModeKPIPTables, "new-remote", 1, 0.2, 5)
	add(ModeKPNFTables, "new-remote", 1, 0.3, 3.3)
	add(ModeXDPLB, "new-remote", 10000, 1.1, 0.9)
	add(ModeKPIPTables, "new-remote", 10000, 0.008, 120)
	add(ModeKPNFTables, "new-remote", 10000, 0.25, 4)
	return r
}

func TestCheck(t *testing.T) {
	r := sample()
	if err := r.Check(); err != nil {
		t.Fatalf("complete report: %v", err)
	}

	r = sample()
	r.Results = r.Results[1:] // baseline/est-remote missing
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "baseline/est-remote@1: no result") {
		t.Errorf("missing result: %v", err)
	}

	r = sample()
	r.Results[2].Error = "start: boom"
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failed result: %v", err)
	}

	r = sample()
	r.Results[3].Arrived, r.Results[3].Mpps = 0, 0
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "nothing arrived") {
		t.Errorf("empty result: %v", err)
	}

	r = sample()
	r.Modes[4].Reason = ""
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "without a reason") {
		t.Errorf("unavailable without reason: %v", err)
	}

	r = sample()
	r.Modes = append(r.Modes, Mode{Name: ModeXDPLBTC, Available: true})
	if err := r.Check(); err == nil || !strings.Contains(err.Error(), "nothing was scheduled") {
		t.Errorf("available but never run: %v", err)
	}
}

func TestComputeTargets(t *testing.T) {
	r := sample()
	r.ComputeTargets()
	got := map[string]Target{}
	for _, tg := range r.Targets {
		got[tg.Name] = tg
	}
	check := func(name string, ratio float64, met bool) {
		t.Helper()
		tg, ok := got[name]
		if !ok {
			t.Fatalf("no target %q", name)
		}
		if !tg.Measured || math.Abs(tg.Ratio-ratio) > 1e-9 || tg.Met != met {
			t.Errorf("%s: measured %v ratio %v met %v; want ratio %v met %v", name, tg.Measured, tg.Ratio, tg.Met, ratio, met)
		}
	}
	check("XDP fast path vs. the machine's limit", 0.8, true)
	check("new flows vs. kube-proxy iptables, 1 Service", 6, true)
	check("new flows vs. kube-proxy nftables, 1 Service", 4, false)
	check("new flows vs. kube-proxy iptables, 10k Services", 137.5, true)
	check("new flows vs. kube-proxy nftables, 10k Services", 4.4, false)
	check("xdplb at 10k Services vs. 1 Service", 1.1/1.2, true)
	if tg := got["new flows vs. kube-proxy iptables, 1 Service"]; math.Abs(tg.CPURatio-5/0.8) > 1e-9 {
		t.Errorf("CPU ratio %v, want %v", tg.CPURatio, 5/0.8)
	}

	// A 1-Service reference measured alongside the 10k step is the base
	// of the scale ratio, in place of the first step's figure.
	r.References = append(r.References, Result{Mode: ModeXDPLB, Scenario: "new-remote", Services: 1,
		Alongside: 10000, Reps: 3, Sent: 100, Arrived: 100, Mpps: 1.0})
	r.ComputeTargets()
	for _, tg := range r.Targets {
		if tg.Name == "xdplb at 10k Services vs. 1 Service" &&
			(math.Abs(tg.Ratio-1.1) > 1e-9 || !strings.Contains(tg.Detail, "alongside")) {
			t.Errorf("scale target with a reference: ratio %v (%s), want 1.1 against the reference", tg.Ratio, tg.Detail)
		}
	}
	if md := r.Markdown(""); !strings.Contains(md, "**References**") {
		t.Error("the Markdown report does not list the reference figure")
	}

	r.References = nil
	r.Results = r.Results[:4] // no new-flow figures
	r.ComputeTargets()
	for _, tg := range r.Targets[1:] {
		if tg.Measured || !strings.Contains(tg.Detail, "not measured") {
			t.Errorf("%s: %+v, want not measured", tg.Name, tg)
		}
	}
}

func TestMarkdown(t *testing.T) {
	r := sample()
	r.Machine.NoPktgen = "/proc/net/pktgen does not exist"
	r.Results = append(r.Results, Result{Mode: ModeXDPLB, Scenario: "new-remote", Services: 100000, Error: "start: agent | died"})
	r.Results[5].Exhaustion = &Exhaustion{Detected: true, ForwardedBefore: 64000, MppsBefore: 0.1, AfterSeconds: 0.6}
	r.SortResults()
	r.ComputeTargets()
	md := r.Markdown("report.svg")
	for _, want := range []string{
		"| scenario | baseline | xdplb-xdp | kube-proxy-iptables | kube-proxy-nftables | kube-proxy-ipvs |",
		"| established flows | 5.00 | 4.00 | 0.600 | 0.800 | n/a |",
		"| new flows | – | 1.20 | 0.200* | 0.300 | n/a |",
		"**Forwarded Mpps, 10k Service(s)**",
		"- kube-proxy-ipvs: IPVS is not built into this kernel \\| really",
		"| new flows vs. kube-proxy iptables, 1 Service | xdplb-xdp >= 5x kube-proxy-iptables | 6.00x | yes | 6.25x |",
		"exhausted after 64000 flows",
		"error: start: agent \\| died",
		"![Forwarded Mpps",
		"| kernel | 6.18 |",
		"| kernel pktgen | not used: /proc/net/pktgen does not exist |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "SYN flood") {
		t.Errorf("a run without a flood scenario has a flood table:\n%s", md)
	}
	if md := sample().Markdown(""); strings.Contains(md, "pktgen") {
		t.Errorf("a run with pktgen (no reason against it) mentions it:\n%s", md)
	}
	// Rows come in service-count order.
	if strings.Index(md, "**Forwarded Mpps, 1 Service(s)**") > strings.Index(md, "**Forwarded Mpps, 10k Service(s)**") {
		t.Error("service counts out of order")
	}
}

// A flood's figures have a table of their own, not a column of the
// forwarded Mpps tables or a bar of the chart: its rate is not forwarded
// frames.
func TestFloodTable(t *testing.T) {
	r := sample()
	r.Scenarios = append(r.Scenarios, Scenario{"syn-flood", "SYN flood beside real connections"})
	r.Results = append(r.Results,
		Result{Mode: ModeXDPLB, Scenario: "syn-flood", Services: 1, Reps: 1, Sent: 2e6, Arrived: 1.5e6, Seconds: 1, Mpps: 1.5,
			Flood: &Flood{Established: 100, Kept: 100, Attempts: 400, Connected: 399, ConnectMillis: 2.5, ToBackend: 1000, PerCPUSecond: 1.4e6}},
		Result{Mode: ModeKPIPTables, Scenario: "syn-flood", Services: 1, Reps: 1, Sent: 2e6, Arrived: 1.2e5, Seconds: 1, Mpps: 0.12,
			Flood: &Flood{Established: 100, Kept: 97, Attempts: 30, Connected: 21, ConnectMillis: 340, ToBackend: 57000, PerCPUSecond: 6.8e4}})
	r.SortResults()
	md := r.Markdown("report.svg")
	for _, want := range []string{
		"**SYN flood beside real connections**",
		"| xdplb-xdp | 100 of 100 | 399 of 400 | 2.5 ms | 1.50 | 1000 | 1.40 |",
		"| kube-proxy-iptables | 97 of 100 | 21 of 30 | 340.0 ms | 0.120 | 57000 | 0.0680 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "| SYN flood beside real connections |") {
		t.Errorf("the flood has a row in a forwarded Mpps table:\n%s", md)
	}
	if strings.Contains(r.SVG(), "SYN flood") {
		t.Error("the flood has bars in the chart")
	}
}

func wellFormed(t *testing.T, svg string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
	}
}

func TestSVG(t *testing.T) {
	r := sample()
	svg := r.SVG()
	wellFormed(t, svg)
	for _, want := range []string{"<svg", "xdplb-xdp", "kube-proxy-iptables", "established flows", "Services", "10k"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	// The unavailable mode gets no legend entry, and no bars.
	if strings.Contains(svg, ">kube-proxy-ipvs<") {
		t.Error("unavailable mode in the legend")
	}
	empty := (&Report{}).SVG()
	wellFormed(t, empty)
}

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	r := sample()
	r.ComputeTargets()
	if err := r.Write(dir); err != nil {
		t.Fatal(err)
	}
	back, err := Read(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(r.Results) || back.Results[0].Mpps != r.Results[0].Mpps || len(back.Targets) != len(r.Targets) {
		t.Errorf("round trip lost data: %+v", back)
	}
	if err := back.Check(); err != nil {
		t.Errorf("check after round trip: %v", err)
	}
}
