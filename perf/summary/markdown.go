package summary

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// FormatMpps prints a rate with three significant digits.
func FormatMpps(v float64) string {
	switch {
	case v <= 0 || math.IsNaN(v):
		return "0"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	case v >= 1:
		return fmt.Sprintf("%.2f", v)
	case v >= 0.1:
		return fmt.Sprintf("%.3f", v)
	case v >= 0.01:
		return fmt.Sprintf("%.4f", v)
	default:
		return fmt.Sprintf("%.5f", v)
	}
}

// FormatServices prints 1, 1k, 10k, 100k.
func FormatServices(n int) string {
	if n >= 1000 && n%1000 == 0 {
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// modesInReport lists the modes of the report in table order.
func (r *Report) modesInReport() []string {
	seen := map[string]bool{}
	var out []string
	for _, m := range r.Modes {
		if !seen[m.Name] {
			seen[m.Name] = true
			out = append(out, m.Name)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return modeWeight(out[i]) < modeWeight(out[j]) })
	return out
}

// serviceCounts lists the service counts with results, ascending.
func (r *Report) serviceCounts() []int {
	var out []int
	for _, res := range r.Results {
		if !slices.Contains(out, res.Services) {
			out = append(out, res.Services)
		}
	}
	slices.Sort(out)
	return out
}

func (r *Report) scenarioTitle(id string) string {
	for _, s := range r.Scenarios {
		if s.ID == id {
			return s.Title
		}
	}
	return id
}

// cell is a table cell for one mode in one scenario.
func (r *Report) cell(mode, scenario string, services int) string {
	if m, ok := r.ModeInfo(mode); ok && !m.Available {
		return "n/a"
	}
	res, ok := r.Find(mode, scenario, services)
	switch {
	case !ok:
		return "–"
	case res.Error != "":
		return "error"
	}
	s := FormatMpps(res.Mpps)
	if res.Exhaustion != nil && res.Exhaustion.Detected {
		s += "*"
	}
	return s
}

// Markdown renders the report; svg is the chart's path relative to where
// the Markdown will live (empty: no image).
func (r *Report) Markdown(svg string) string {
	var b strings.Builder
	modes := r.modesInReport()
	kind := "full run (`make perf`)"
	if r.Quick {
		kind = "quick run (`make perf-quick`)"
	}
	m := r.Machine
	fmt.Fprintf(&b, "Measured %s, %s, in %.0f s.\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"), kind, r.Duration)
	fmt.Fprintf(&b, "| machine | |\n|---|---|\n")
	for _, row := range [][2]string{
		{"kernel", m.Kernel},
		{"CPU", fmt.Sprintf("%s, %d CPUs", m.CPU, m.CPUs)},
		{"memory", fmt.Sprintf("%.0f GiB", m.MemoryGiB)},
		{"NIC driver", m.NICDriver},
		{"XDP mode", m.XDPMode},
		{"generator", fmt.Sprintf("%s, %d thread(s), %d-byte frames", m.Generator, m.Threads, m.FrameBytes)},
		{"kernel pktgen", notUsed(m.NoPktgen)},
		{"load average at start", m.LoadAverage},
		{"xdplb", m.XDPLB},
		{"kube-proxy", m.KubeProxy},
		{"Go", m.GoVersion},
	} {
		if row[1] != "" {
			fmt.Fprintf(&b, "| %s | %s |\n", row[0], mdEscape(row[1]))
		}
	}
	b.WriteString("\n")
	if svg != "" {
		fmt.Fprintf(&b, "![Forwarded Mpps per scenario and mode; cost per packet against the number of Services](%s)\n\n", svg)
	}

	for _, n := range r.serviceCounts() {
		var scen []string
		for _, s := range r.Scenarios {
			for _, res := range r.Results {
				if res.Services == n && res.Scenario == s.ID && res.Flood == nil && !slices.Contains(scen, s.ID) {
					scen = append(scen, s.ID)
				}
			}
		}
		if len(scen) == 0 {
			continue
		}
		fmt.Fprintf(&b, "**Forwarded Mpps, %s Service(s)**\n\n", FormatServices(n))
		b.WriteString("| scenario |")
		for _, mode := range modes {
			fmt.Fprintf(&b, " %s |", mode)
		}
		b.WriteString("\n|---|")
		for range modes {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
		for _, s := range scen {
			fmt.Fprintf(&b, "| %s |", mdEscape(r.scenarioTitle(s)))
			for _, mode := range modes {
				fmt.Fprintf(&b, " %s |", r.cell(mode, s, n))
			}
			b.WriteString("\n")
		}
		b.WriteString("\n")
	}
	b.WriteString("n/a: mode unavailable here (see below); –: not part of this run; *: ran out of NAT ports or conntrack room part-way (see details).\n\n")
	r.floodTable(&b)

	if len(r.Targets) > 0 {
		b.WriteString("**Targets (ratios within this run)**\n\n")
		b.WriteString("| target | want | measured (Mpps) | met | per CPU second |\n|---|---|---:|:---:|---:|\n")
		for _, t := range r.Targets {
			got, met, cpu := "not measured", "–", "–"
			if t.Measured {
				got = fmt.Sprintf("%.2fx", t.Ratio)
				met = "no"
				if t.Met {
					met = "yes"
				}
				if t.CPURatio > 0 {
					cpu = fmt.Sprintf("%.2fx", t.CPURatio)
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", mdEscape(t.Name), mdEscape(t.Want), got, met, cpu)
		}
		b.WriteString("\nThe targets are judged on forwarded Mpps. \"Per CPU second\" compares packets per second of the pipeline's own CPU time instead: the same ratio with the time other processes took away from either side removed.\n\n")
	}

	var unavailable []Mode
	for _, m := range r.Modes {
		if !m.Available {
			unavailable = append(unavailable, m)
		}
	}
	if len(unavailable) > 0 {
		b.WriteString("**Unavailable modes**\n\n")
		for _, m := range unavailable {
			fmt.Fprintf(&b, "- %s: %s\n", m.Name, mdEscape(m.Reason))
		}
		b.WriteString("\n")
	}

	b.WriteString("**Details** (median of the repetitions; CPU: seconds per million forwarded packets, for the whole pipeline and the node's estimated share)\n\n")
	b.WriteString("| mode | scenario | services | Mpps | offered Mpps | loss | CPU s/Mpkt | node CPU s/Mpkt | notes |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, res := range r.Results {
		if res.Error != "" {
			fmt.Fprintf(&b, "| %s | %s | %s | – | – | – | – | – | error: %s |\n", res.Mode, res.Scenario,
				FormatServices(res.Services), mdEscape(res.Error))
			continue
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.1f%% | %s | %s | %s |\n", res.Mode, res.Scenario,
			FormatServices(res.Services), FormatMpps(res.Mpps), FormatMpps(res.OfferedMpps), 100*res.Loss,
			formatCost(res.CPUSecPerMpkt), formatCost(res.NodeCPUSecPerMpkt), mdEscape(Notes(res)))
	}
	if len(r.References) > 0 {
		b.WriteString("\n**References** (measured only as the base of a target's ratio, in rounds alternating with the figure it divides)\n\n")
		b.WriteString("| mode | scenario | services | alongside | Mpps | reps | CPU s/Mpkt | node CPU s/Mpkt |\n")
		b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|\n")
		for _, res := range r.References {
			mpps := FormatMpps(res.Mpps)
			if res.Error != "" {
				mpps = "error: " + mdEscape(res.Error)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %d | %s | %s |\n", res.Mode, res.Scenario,
				FormatServices(res.Services), FormatServices(res.Alongside), mpps, res.Reps,
				formatCost(res.CPUSecPerMpkt), formatCost(res.NodeCPUSecPerMpkt))
		}
	}
	if len(r.Problems) > 0 {
		b.WriteString("\n**Problems during the run**\n\n")
		for _, p := range r.Problems {
			fmt.Fprintf(&b, "- %s\n", mdEscape(p))
		}
	}
	if len(m.Notes) > 0 {
		b.WriteString("\n**How it was measured**\n\n")
		for _, n := range m.Notes {
			fmt.Fprintf(&b, "- %s\n", mdEscape(n))
		}
	}
	return b.String()
}

// floodTable renders the flood scenarios' results, if any.
func (r *Report) floodTable(b *strings.Builder) {
	first := true
	for _, res := range r.Results {
		f := res.Flood
		if f == nil || res.Error != "" {
			continue
		}
		if first {
			fmt.Fprintf(b, "**%s**\n\n", mdEscape(r.scenarioTitle(res.Scenario)))
			b.WriteString("| mode | established connections kept | new connections during the flood | time per new connection | flood Mpps absorbed | flood frames to the backend | flood Mpkts per CPU second |\n")
			b.WriteString("|---|---:|---:|---:|---:|---:|---:|\n")
			first = false
		}
		fmt.Fprintf(b, "| %s | %d of %d | %d of %d | %.1f ms | %s | %d | %s |\n", res.Mode, f.Kept, f.Established,
			f.Connected, f.Attempts, f.ConnectMillis, FormatMpps(res.Mpps), f.ToBackend, FormatMpps(f.PerCPUSecond/1e6))
	}
	if !first {
		b.WriteString("\nEstablished connections open before the flood and still answering after it; new connections from a real client while it lasts (connect, request, answer, one after the other); the flood's frames the node took in per second (the generator offers more: the rest the veth drops) and per second of the pipeline's CPU time.\n\n")
	}
}

func formatCost(v float64) string {
	if v <= 0 || math.IsNaN(v) {
		return "–"
	}
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// Notes summarises a result's counters in one line.
func Notes(res Result) string {
	var parts []string
	if res.Note != "" {
		parts = append(parts, res.Note)
	}
	if e := res.Exhaustion; e != nil && e.Detected {
		parts = append(parts, fmt.Sprintf("exhausted after %d flows (%.2f s), %s Mpps before",
			e.ForwardedBefore, e.AfterSeconds, FormatMpps(e.MppsBefore)))
	}
	if d := res.Datapath; d != nil {
		if len(d.Drops) > 0 {
			var ds []string
			for _, k := range sortedKeys(d.Drops) {
				ds = append(ds, fmt.Sprintf("%s %d", k, d.Drops[k]))
			}
			parts = append(parts, "drops: "+strings.Join(ds, ", "))
		}
		if d.ConntrackCapacity > 0 {
			parts = append(parts, fmt.Sprintf("conntrack %d/%d, nat %d/%d", d.ConntrackEntries, d.ConntrackCapacity,
				d.NATEntries, d.NATCapacity))
		}
		if d.NewFlows > 0 {
			parts = append(parts, fmt.Sprintf("new flows %d", d.NewFlows))
		}
		if d.Evictions > 0 {
			parts = append(parts, fmt.Sprintf("evictions ~%d", d.Evictions))
		}
	}
	if c := res.Conntrack; c != nil {
		s := fmt.Sprintf("conntrack %d/%d", c.Entries, c.Max)
		if c.InsertFailed > 0 || c.Drop > 0 || c.EarlyDrop > 0 {
			s += fmt.Sprintf(", insert_failed %d, drop %d, early_drop %d", c.InsertFailed, c.Drop, c.EarlyDrop)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func sortedKeys(m map[string]uint64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func mdEscape(s string) string {
	s = strings.ReplaceAll(s, "|", "\\|")
	return strings.ReplaceAll(s, "\n", " ")
}

// notUsed is "not used: why", or "" without a reason.
func notUsed(why string) string {
	if why == "" {
		return ""
	}
	return "not used: " + why
}
