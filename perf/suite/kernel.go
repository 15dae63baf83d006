package suite

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
)

// kernelConntrack reads the fill level and the error counters of the
// kernel's conntrack in the edge node.
func kernelConntrack(e *env) (*summary.Conntrack, error) {
	out, err := e.topo.Edge.Exec("cat", "/proc/sys/net/netfilter/nf_conntrack_count",
		"/proc/sys/net/netfilter/nf_conntrack_max", "/proc/net/stat/nf_conntrack")
	if err != nil {
		return nil, fmt.Errorf("read conntrack state: %w", err)
	}
	return parseConntrackState(out)
}

// parseConntrackState parses nf_conntrack_count, nf_conntrack_max and the
// per-CPU statistics table (a header, then one line of hex numbers per
// CPU), concatenated.
func parseConntrackState(out string) (*summary.Conntrack, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		return nil, fmt.Errorf("conntrack state: %d lines", len(lines))
	}
	var c summary.Conntrack
	var err error
	if c.Entries, err = strconv.Atoi(strings.TrimSpace(lines[0])); err != nil {
		return nil, fmt.Errorf("nf_conntrack_count: %w", err)
	}
	if c.Max, err = strconv.Atoi(strings.TrimSpace(lines[1])); err != nil {
		return nil, fmt.Errorf("nf_conntrack_max: %w", err)
	}
	header := strings.Fields(lines[2])
	sums := make([]uint64, len(header))
	for _, l := range lines[3:] {
		f := strings.Fields(l)
		if len(f) != len(header) {
			continue
		}
		for i, v := range f {
			n, err := strconv.ParseUint(v, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("conntrack statistics %q: %w", l, err)
			}
			sums[i] += n
		}
	}
	for i, name := range header {
		switch name {
		case "insert_failed":
			c.InsertFailed = sums[i]
		case "drop":
			c.Drop = sums[i]
		case "early_drop":
			c.EarlyDrop = sums[i]
		}
	}
	return &c, nil
}

// conntrackReplies returns the reply tuples of the SNATed TCP flows in the
// edge node's conntrack table.
func conntrackReplies(e *env, limit int) ([]traffic.Tuple, error) {
	var flows []*netlink.ConntrackFlow
	err := e.topo.Edge.Do(func() error {
		var err error
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list conntrack in the edge node: %w", err)
	}
	var out []traffic.Tuple
	for _, f := range flows {
		if len(out) >= limit {
			break
		}
		if f.Forward.Protocol != e.proto {
			continue
		}
		src, ok1 := netip.AddrFromSlice(f.Reverse.SrcIP.To4())
		dst, ok2 := netip.AddrFromSlice(f.Reverse.DstIP.To4())
		if !ok1 || !ok2 || dst != EdgeNodeAddr {
			continue
		}
		out = append(out, traffic.Tuple{Src: src, Dst: dst, SrcPort: f.Reverse.SrcPort, DstPort: f.Reverse.DstPort})
	}
	return out, nil
}
