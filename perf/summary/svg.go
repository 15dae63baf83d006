package summary

import (
	"fmt"
	"html"
	"math"
	"slices"
	"strings"
)

// Colours of the modes in charts.
var modeColor = map[string]string{
	ModeBaseline:   "#7f7f7f",
	ModeXDPLB:      "#2ca02c",
	ModeXDPLBTC:    "#17becf",
	ModeKPIPTables: "#ff7f0e",
	ModeKPNFTables: "#1f77b4",
	ModeKPIPVS:     "#9467bd",
}

func colorOf(mode string) string {
	if c, ok := modeColor[mode]; ok {
		return c
	}
	return "#d62728"
}

// logScale maps [lo, hi] (decades) onto [0, width].
type logScale struct {
	lo, hi float64 // log10 of the ends
	width  float64
}

func newLogScale(values []float64, width float64) logScale {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, v := range values {
		if v > 0 {
			lo = math.Min(lo, math.Log10(v))
			hi = math.Max(hi, math.Log10(v))
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = -2, 1
	}
	lo, hi = math.Floor(lo), math.Ceil(hi)
	if hi <= lo {
		hi = lo + 1
	}
	return logScale{lo: lo, hi: hi, width: width}
}

func (s logScale) at(v float64) float64 {
	if v <= 0 {
		return 0
	}
	return (math.Log10(v) - s.lo) / (s.hi - s.lo) * s.width
}

func (s logScale) decades() []float64 {
	var out []float64
	for e := s.lo; e <= s.hi+1e-9; e++ {
		out = append(out, math.Pow(10, e))
	}
	return out
}

func tickLabel(v float64) string {
	switch {
	case v >= 1:
		return fmt.Sprintf("%g", v)
	default:
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.6f", v), "0"), ".")
	}
}

// SVG renders two charts: forwarded Mpps per scenario and mode at the
// smallest number of Services (log scale), and the CPU cost of a new flow
// against the number of Services.
func (r *Report) SVG() string {
	const (
		width   = 960
		left    = 170
		right   = 50
		barH    = 12
		groupGp = 8
		titleH  = 18
		top     = 64
	)
	modes := r.modesInReport()
	counts := r.serviceCounts()
	var b strings.Builder

	// Panel 1 data.
	type bar struct {
		mode string
		v    float64
		mark string
	}
	type group struct {
		title string
		bars  []bar
	}
	var groups []group
	var values []float64
	if len(counts) > 0 {
		n := counts[0]
		for _, s := range r.Scenarios {
			g := group{title: s.Title}
			for _, mode := range modes {
				res, ok := r.Find(mode, s.ID, n)
				if !ok || !res.OK() || res.Flood != nil {
					continue
				}
				mark := ""
				if res.Exhaustion != nil && res.Exhaustion.Detected {
					mark = "*"
				}
				g.bars = append(g.bars, bar{mode, res.Mpps, mark})
				values = append(values, res.Mpps)
			}
			if len(g.bars) > 0 {
				groups = append(groups, g)
			}
		}
	}
	plotW := float64(width - left - right)
	xs := newLogScale(values, plotW)
	panel1H := 0
	for _, g := range groups {
		panel1H += titleH + len(g.bars)*barH + groupGp
	}
	panel2Top := top + panel1H + 90
	panel2H := 260
	height := panel2Top + panel2H + 90

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	services := "1"
	if len(counts) > 0 {
		services = FormatServices(counts[0])
	}
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="16" font-weight="bold">Forwarded Mpps per scenario and mode (%s Service(s), log scale)</text>`+"\n",
		10, services)
	fmt.Fprintf(&b, `<text x="%d" y="42" fill="#555">%s</text>`+"\n", 10, html.EscapeString(r.subtitle()))

	// Legend.
	lx := left
	for _, mode := range modes {
		if m, ok := r.ModeInfo(mode); ok && !m.Available {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, top-12, colorOf(mode), lx+14, top-3, html.EscapeString(mode))
		lx += 24 + 7*len(mode)
	}

	// Grid.
	y := top + 6
	for _, d := range xs.decades() {
		x := float64(left) + xs.at(d)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, y, x, y+panel1H)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x, y+panel1H+14, tickLabel(d))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">Mpps</text>`+"\n", float64(left)+plotW/2, y+panel1H+30)
	for _, g := range groups {
		fmt.Fprintf(&b, `<text x="10" y="%d" font-weight="bold">%s</text>`+"\n", y+titleH-5, html.EscapeString(g.title))
		y += titleH
		for _, br := range g.bars {
			w := math.Max(xs.at(br.v), 1)
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end" font-size="10" fill="#333">%s</text>`+"\n",
				left-6, y+barH-3, html.EscapeString(br.mode))
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %s Mpps</title></rect>`+"\n",
				left, y, w, barH-1, colorOf(br.mode), html.EscapeString(br.mode), FormatMpps(br.v))
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="10">%s%s</text>`+"\n",
				float64(left)+w+4, y+barH-2, FormatMpps(br.v), br.mark)
			y += barH
		}
		y += groupGp
	}

	// Panel 2: CPU cost of a new flow against the number of Services.
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="16" font-weight="bold">Cost of a new flow against the number of Services (CPU µs per forwarded packet, log-log)</text>`+"\n",
		10, panel2Top-34)
	type point struct {
		n    int
		cost float64
	}
	series := map[string][]point{}
	var costs []float64
	for _, mode := range modes {
		for _, n := range counts {
			res, ok := r.Find(mode, "new-remote", n)
			if !ok || !res.OK() {
				continue
			}
			cost := res.CPUSecPerMpkt
			if cost <= 0 {
				continue
			}
			series[mode] = append(series[mode], point{n, cost})
			costs = append(costs, cost)
		}
	}
	var ns []float64
	for _, n := range counts {
		ns = append(ns, float64(n))
	}
	plot2W := float64(width - left - right)
	xn := newLogScale(ns, plot2W)
	yc := newLogScale(costs, float64(panel2H))
	py := func(v float64) float64 { return float64(panel2Top+panel2H) - yc.at(v) }
	for _, d := range yc.decades() {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(d), float64(left)+plot2W, py(d))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s µs</text>`+"\n", left-6, py(d)+4, tickLabel(d))
	}
	for _, d := range xn.decades() {
		x := float64(left) + xn.at(d)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, panel2Top, x, panel2Top+panel2H)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x, panel2Top+panel2H+16, FormatServices(int(d)))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="#555">Services</text>`+"\n", float64(left)+plot2W/2, panel2Top+panel2H+34)
	lx2 := left
	for _, mode := range modes {
		pts := series[mode]
		if len(pts) == 0 {
			continue
		}
		slices.SortFunc(pts, func(a, b point) int { return a.n - b.n })
		var path []string
		for _, p := range pts {
			x, yy := float64(left)+xn.at(float64(p.n)), py(p.cost)
			path = append(path, fmt.Sprintf("%.1f,%.1f", x, yy))
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s, %s Services: %.3g µs</title></circle>`+"\n",
				x, yy, colorOf(mode), html.EscapeString(mode), FormatServices(p.n), p.cost)
		}
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"/>`+"\n", strings.Join(path, " "), colorOf(mode))
		}
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx2, panel2Top-16, colorOf(mode), lx2+14, panel2Top-7, html.EscapeString(mode))
		lx2 += 24 + 7*len(mode)
	}
	if len(series) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#555">no new-flow figures with CPU time in this run</text>`+"\n", left, panel2Top+panel2H/2)
	}
	fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555" font-size="11">* ran out of NAT ports or conntrack room part-way.</text>`+"\n", height-26)
	fmt.Fprintf(&b, `<text x="10" y="%d" fill="#555" font-size="11">CPU: the pipeline's own CPU time per forwarded packet (generator threads and ksoftirqd, which carry the node's and the sinks' softirq work).</text>`+"\n",
		height-12)
	b.WriteString("</svg>\n")
	return b.String()
}

func (r *Report) subtitle() string {
	m := r.Machine
	parts := []string{}
	if m.Kernel != "" {
		parts = append(parts, "Linux "+m.Kernel)
	}
	if m.CPU != "" {
		parts = append(parts, fmt.Sprintf("%s x%d", m.CPU, m.CPUs))
	}
	if m.NICDriver != "" {
		parts = append(parts, "NIC "+m.NICDriver)
	}
	if m.XDPMode != "" {
		parts = append(parts, "XDP "+m.XDPMode)
	}
	if m.Generator != "" {
		parts = append(parts, m.Generator)
	}
	if !r.Started.IsZero() {
		parts = append(parts, r.Started.UTC().Format("2006-01-02"))
	}
	return strings.Join(parts, " · ")
}
