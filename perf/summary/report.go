// Package summary holds the perf suite's results and renders them: JSON
// (the record), a Markdown table (for docs/performance.md) and an SVG chart, with
// the facts of the machine they were measured on. It also states the
// targets as ratios between modes of the same run, and the check that
// `make perf-quick` runs: every mode that could run produced a figure.
package summary

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"
)

// Mode names, in the order reports list them.
const (
	ModeBaseline      = "baseline"
	ModeXDPLB         = "xdplb-xdp"
	ModeXDPLBTC       = "xdplb-tc"
	ModeKPIPTables    = "kube-proxy-iptables"
	ModeKPNFTables    = "kube-proxy-nftables"
	ModeKPIPVS        = "kube-proxy-ipvs"
	unknownModeWeight = 100
)

// ModeOrder is the column order of every table.
var ModeOrder = []string{ModeBaseline, ModeXDPLB, ModeXDPLBTC, ModeKPIPTables, ModeKPNFTables, ModeKPIPVS}

// Machine is what the figures were measured on.
type Machine struct {
	Kernel    string  `json:"kernel"`
	CPU       string  `json:"cpu"`
	CPUs      int     `json:"cpus"`
	MemoryGiB float64 `json:"memory_gib"`
	NICDriver string  `json:"nic_driver"`
	XDPMode   string  `json:"xdp_mode"`
	Generator string  `json:"generator"`
	// NoPktgen says why kernel pktgen was not the generator ("" when it
	// was).
	NoPktgen    string   `json:"pktgen_unavailable,omitempty"`
	GoVersion   string   `json:"go_version"`
	KubeProxy   string   `json:"kube_proxy,omitempty"`
	XDPLB       string   `json:"xdplb,omitempty"`
	LoadAverage string   `json:"load_average,omitempty"`
	Threads     int      `json:"generator_threads"`
	FrameBytes  int      `json:"frame_bytes"`
	Notes       []string `json:"notes,omitempty"`
}

// Mode says whether a mode ran, and if not, why.
type Mode struct {
	Name      string `json:"name"`
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// Detail: how the mode was set up (versions, flags).
	Detail string `json:"detail,omitempty"`
}

// Result is one mode in one scenario: the median of its repetitions.
type Result struct {
	Mode     string `json:"mode"`
	Scenario string `json:"scenario"`
	Services int    `json:"services"`
	Reps     int    `json:"reps"`

	Sent    uint64  `json:"sent"`    // frames the generator sent (median repetition)
	Arrived uint64  `json:"arrived"` // frames the sink counted (median repetition)
	Seconds float64 `json:"seconds"` // length of the median repetition

	Mpps        float64   `json:"mpps"`         // forwarded: arrived / seconds
	OfferedMpps float64   `json:"offered_mpps"` // sent / seconds
	Loss        float64   `json:"loss"`         // 1 - arrived / sent
	AllMpps     []float64 `json:"all_mpps"`     // every repetition

	// CPU seconds per million forwarded packets for the whole pipeline
	// (generator, node and sinks share the generator's cores), and the
	// node's share estimated by subtracting a calibration run without the
	// node. Zero when not measured.
	CPUSecPerMpkt     float64 `json:"cpu_s_per_mpkt"`
	NodeCPUSecPerMpkt float64 `json:"node_cpu_s_per_mpkt"`
	// MachineCPUSecPerMpkt is the busy time of all CPUs (/proc/stat),
	// other processes on the machine included.
	MachineCPUSecPerMpkt float64 `json:"machine_cpu_s_per_mpkt"`

	Exhaustion *Exhaustion `json:"exhaustion,omitempty"`
	Flood      *Flood      `json:"flood,omitempty"`
	Datapath   *Datapath   `json:"datapath,omitempty"`
	Conntrack  *Conntrack  `json:"kernel_conntrack,omitempty"`

	Note  string `json:"note,omitempty"`
	Error string `json:"error,omitempty"`

	// Alongside, for a reference figure (Report.References), is the
	// Service count of the step it was measured in, in rounds
	// alternating with that step's own figure.
	Alongside int `json:"alongside,omitempty"`
}

// OK reports whether the result is a figure: measured without error and
// something arrived.
func (r Result) OK() bool { return r.Error == "" && r.Arrived > 0 && r.Mpps > 0 }

// Exhaustion describes a run that ran out of NAT source ports (or
// conntrack room) part-way.
type Exhaustion struct {
	// Detected is false when the run never slowed down.
	Detected bool `json:"detected"`
	// ForwardedBefore is how many flows got through before it.
	ForwardedBefore uint64 `json:"forwarded_before"`
	// MppsBefore is the forwarding rate sampled before it.
	MppsBefore float64 `json:"mpps_before"`
	// AfterSeconds is when it set in.
	AfterSeconds float64 `json:"after_seconds"`
}

// Flood is what a SYN flood scenario measures beyond its rate: Mpps is
// the flood's frames the node absorbed per second (forwarded, answered
// or dropped), not forwarded frames.
type Flood struct {
	// Established connections open before the flood, and how many of them
	// still carried data after it.
	Established int `json:"established"`
	Kept        int `json:"kept"`
	// New connections a real client tried during the flood, and how many
	// of them completed a request and its answer.
	Attempts  int `json:"attempts"`
	Connected int `json:"connected"`
	// ConnectMillis is the mean time of a connection that completed:
	// connect, one request, its answer.
	ConnectMillis float64 `json:"connect_ms"`
	// ToBackend is how many flood frames reached the backend's node.
	ToBackend uint64 `json:"to_backend"`
	// PerCPUSecond is flood frames per second of the pipeline's CPU time.
	PerCPUSecond float64 `json:"per_cpu_second"`
}

// Datapath is xdplb's own view of a run: counter deltas and map fill.
type Datapath struct {
	Counters          map[string]uint64 `json:"counters"` // non-zero deltas
	Drops             map[string]uint64 `json:"drops"`    // drop_* counters
	NewFlows          uint64            `json:"new_flows"`
	ConntrackEntries  int               `json:"conntrack_entries"`
	ConntrackCapacity int               `json:"conntrack_capacity"`
	NATEntries        int               `json:"nat_entries"`
	NATCapacity       int               `json:"nat_capacity"`
	// Evictions are inferred: flows created minus the growth of the
	// conntrack map (the datapath deletes entries only on expiry or a
	// removed backend, neither of which happens during a run).
	Evictions uint64 `json:"evictions_inferred"`
}

// Conntrack is the kernel's conntrack in the node, for the kube-proxy modes.
type Conntrack struct {
	Entries      int    `json:"entries"`
	Max          int    `json:"max"`
	InsertFailed uint64 `json:"insert_failed"`
	Drop         uint64 `json:"drop"`
	EarlyDrop    uint64 `json:"early_drop"`
}

// Target is one of the suite's goals, as a ratio within this run.
type Target struct {
	Name  string  `json:"name"`
	Want  string  `json:"want"`
	Ratio float64 `json:"ratio"` // of forwarded Mpps: what the target is about
	// CPURatio compares packets per CPU second instead (the inverse of
	// the pipeline's CPU s/Mpkt): what the ratio would be if neither side
	// lost CPU time to other processes. Zero when CPU was not measured.
	CPURatio float64 `json:"cpu_ratio"`
	Min      float64 `json:"min"`
	Measured bool    `json:"measured"`
	Met      bool    `json:"met"`
	Detail   string  `json:"detail,omitempty"`
}

// Scenario describes a scenario for the report's legend.
type Scenario struct {
	ID    string `json:"id"`
	Title string `json:"title"`
}

// Report is everything one run produced.
type Report struct {
	Started   time.Time  `json:"started"`
	Duration  float64    `json:"duration_seconds"`
	Quick     bool       `json:"quick"`
	Machine   Machine    `json:"machine"`
	Modes     []Mode     `json:"modes"`
	Scenarios []Scenario `json:"scenarios"`
	Results   []Result   `json:"results"`
	// References are figures measured only as the base of a target's
	// ratio, alongside the figure they divide (see Result.Alongside).
	References []Result `json:"references,omitempty"`
	Targets    []Target `json:"targets"`
	// Scheduled lists mode/scenario/services triples that were meant to
	// produce a figure: the check compares Results against it.
	Scheduled []Key    `json:"scheduled"`
	Problems  []string `json:"problems,omitempty"`
}

// Key names one figure.
type Key struct {
	Mode     string `json:"mode"`
	Scenario string `json:"scenario"`
	Services int    `json:"services"`
}

func (k Key) String() string { return fmt.Sprintf("%s/%s@%d", k.Mode, k.Scenario, k.Services) }

// Find returns the result for a key.
func (r *Report) Find(mode, scenario string, services int) (Result, bool) {
	for _, res := range r.Results {
		if res.Mode == mode && res.Scenario == scenario && res.Services == services {
			return res, true
		}
	}
	return Result{}, false
}

// FindReference returns the reference figure of a mode and scenario at
// `services` Services measured alongside the step of `alongside`.
func (r *Report) FindReference(mode, scenario string, services, alongside int) (Result, bool) {
	for _, res := range r.References {
		if res.Mode == mode && res.Scenario == scenario && res.Services == services && res.Alongside == alongside {
			return res, true
		}
	}
	return Result{}, false
}

// ModeInfo returns a mode's entry.
func (r *Report) ModeInfo(name string) (Mode, bool) {
	for _, m := range r.Modes {
		if m.Name == name {
			return m, true
		}
	}
	return Mode{}, false
}

// Check is the perf-quick gate: every available mode produced a figure
// for every scenario it was scheduled for (the figures themselves are not
// judged). Unavailable modes pass: they say why.
func (r *Report) Check() error {
	var errs []error
	for _, m := range r.Modes {
		if !m.Available {
			if m.Reason == "" {
				errs = append(errs, fmt.Errorf("mode %s is unavailable without a reason", m.Name))
			}
			continue
		}
		scheduled := 0
		for _, k := range r.Scheduled {
			if k.Mode != m.Name {
				continue
			}
			scheduled++
			res, ok := r.Find(k.Mode, k.Scenario, k.Services)
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s: no result", k))
			case !res.OK():
				why := res.Error
				if why == "" {
					why = "nothing arrived"
				}
				errs = append(errs, fmt.Errorf("%s: no figure: %s", k, why))
			}
		}
		if scheduled == 0 {
			errs = append(errs, fmt.Errorf("mode %s is available but nothing was scheduled for it", m.Name))
		}
	}
	return errors.Join(errs...)
}

// Median returns the median of xs (the mean of the middle two for an
// even count), and the index of the element closest to it.
func Median(xs []float64) (float64, int) {
	if len(xs) == 0 {
		return 0, -1
	}
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return xs[idx[a]] < xs[idx[b]] })
	n := len(xs)
	if n%2 == 1 {
		return xs[idx[n/2]], idx[n/2]
	}
	m := (xs[idx[n/2-1]] + xs[idx[n/2]]) / 2
	return m, idx[n/2]
}

// Ratio is a/b, or NaN when b is zero.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}

// ComputeTargets evaluates the suite's goals on the results.
func (r *Report) ComputeTargets() {
	find := func(k Key) (Result, bool) {
		res, ok := r.Find(k.Mode, k.Scenario, k.Services)
		return res, ok && res.OK()
	}
	type spec struct {
		name, want string
		a, b       Key
		min        float64
		// alongside: b is preferably the reference measured in a's
		// step, in alternating rounds (minutes apart, a shared machine
		// moved this ratio by 0.7-1.3x).
		alongside bool
	}
	specs := []spec{
		{"XDP fast path vs. the machine's limit", "xdplb-xdp >= 0.7x baseline (established flows, remote backend)",
			Key{ModeXDPLB, "est-remote", 1}, Key{ModeBaseline, "est-remote", 1}, 0.7, false},
		{"new flows vs. kube-proxy iptables, 1 Service", "xdplb-xdp >= 5x kube-proxy-iptables",
			Key{ModeXDPLB, "new-remote", 1}, Key{ModeKPIPTables, "new-remote", 1}, 5, false},
		{"new flows vs. kube-proxy nftables, 1 Service", "xdplb-xdp >= 5x kube-proxy-nftables",
			Key{ModeXDPLB, "new-remote", 1}, Key{ModeKPNFTables, "new-remote", 1}, 5, false},
		{"new flows vs. kube-proxy iptables, 10k Services", "xdplb-xdp >= 100x kube-proxy-iptables",
			Key{ModeXDPLB, "new-remote", 10000}, Key{ModeKPIPTables, "new-remote", 10000}, 100, false},
		{"new flows vs. kube-proxy nftables, 10k Services", "xdplb-xdp >= 5x kube-proxy-nftables",
			Key{ModeXDPLB, "new-remote", 10000}, Key{ModeKPNFTables, "new-remote", 10000}, 5, false},
		{"new UDP flows vs. kube-proxy iptables, 1 Service", "xdplb-xdp >= 8x kube-proxy-iptables",
			Key{ModeXDPLB, "new-udp", 1}, Key{ModeKPIPTables, "new-udp", 1}, 8, false},
		{"new UDP flows vs. kube-proxy nftables, 1 Service", "xdplb-xdp >= 8x kube-proxy-nftables",
			Key{ModeXDPLB, "new-udp", 1}, Key{ModeKPNFTables, "new-udp", 1}, 8, false},
		{"new flows to one backend vs. kube-proxy iptables", "xdplb-xdp >= 8x kube-proxy-iptables",
			Key{ModeXDPLB, "new-one", 1}, Key{ModeKPIPTables, "new-one", 1}, 8, false},
		{"new flows to one backend vs. kube-proxy nftables", "xdplb-xdp >= 8x kube-proxy-nftables",
			Key{ModeXDPLB, "new-one", 1}, Key{ModeKPNFTables, "new-one", 1}, 8, false},
		{"xdplb at 10k Services vs. 1 Service", "within 10% (>= 0.9x)",
			Key{ModeXDPLB, "new-remote", 10000}, Key{ModeXDPLB, "new-remote", 1}, 0.9, true},
	}
	r.Targets = r.Targets[:0]
	for _, s := range specs {
		t := Target{Name: s.name, Want: s.want, Min: s.min}
		a, okA := find(s.a)
		b, okB := find(s.b)
		note := ""
		if s.alongside {
			if ref, ok := r.FindReference(s.b.Mode, s.b.Scenario, s.b.Services, s.a.Services); ok && ref.OK() {
				b, okB, note = ref, true, " (measured alongside, in alternating rounds)"
			} else if ok {
				note = " (the reference alongside failed: the first step's figure)"
			}
		}
		switch {
		case okA && okB:
			t.Measured = true
			t.Ratio = a.Mpps / b.Mpps
			t.Met = t.Ratio >= s.min
			if a.CPUSecPerMpkt > 0 && b.CPUSecPerMpkt > 0 {
				t.CPURatio = b.CPUSecPerMpkt / a.CPUSecPerMpkt
			}
			t.Detail = fmt.Sprintf("%s %s Mpps / %s %s Mpps%s", s.a, FormatMpps(a.Mpps), s.b, FormatMpps(b.Mpps), note)
		default:
			var missing []string
			if !okA {
				missing = append(missing, s.a.String())
			}
			if !okB {
				missing = append(missing, s.b.String())
			}
			t.Detail = "not measured in this run: " + joinComma(missing)
		}
		r.Targets = append(r.Targets, t)
	}
}

func joinComma(s []string) string {
	out := ""
	for i, x := range s {
		if i > 0 {
			out += ", "
		}
		out += x
	}
	return out
}

// SortResults orders results by services, scenario order, then mode order.
func (r *Report) SortResults() {
	scen := map[string]int{}
	for i, s := range r.Scenarios {
		scen[s.ID] = i
	}
	sort.SliceStable(r.Results, func(i, j int) bool {
		a, b := r.Results[i], r.Results[j]
		if a.Services != b.Services {
			return a.Services < b.Services
		}
		if scen[a.Scenario] != scen[b.Scenario] {
			return scen[a.Scenario] < scen[b.Scenario]
		}
		return modeWeight(a.Mode) < modeWeight(b.Mode)
	})
}

func modeWeight(m string) int {
	if i := slices.Index(ModeOrder, m); i >= 0 {
		return i
	}
	return unknownModeWeight
}

// Write stores report.json, report.md and report.svg in dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode report: %w", err)
	}
	files := map[string][]byte{
		"report.json": append(js, '\n'),
		"report.md":   []byte(r.Markdown("report.svg")),
		"report.svg":  []byte(r.SVG()),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	return nil
}

// Read loads a report.json.
func Read(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read report: %w", err)
	}
	var r Report
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return &r, nil
}
