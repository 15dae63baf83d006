package main

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/xdplb/xdplb/loader"
)

// mapFlags names, per map, the flag its size follows.
func mapFlags() map[string]string {
	return map[string]string{
		"conntrack":          "conntrack-max",
		"ct_unconfirmed":     "conntrack-max", // a quarter of it
		"synproxy_flows":     "conntrack-max",
		"affinity":           "conntrack-max", // an eighth of it
		"nat":                "nat-max",
		"nat_unconfirmed":    "conntrack-max", // a quarter of it
		"snat_slots":         "nat-max",       // twice it, in copies of the SNAT range
		"snat_bucket_hands":  "nat-max",
		"frontends":          "frontends-max",
		"backends":           "backends-max",
		"snat_backend_hands": "backends-max",
		"maglev_tables":      "services-max",
		"svc_stats":          "services-max",
		"svc_names":          "services-max",
		"syn_floods":         "services-max",
		"source_ranges":      "services-max",
	}
}

// agentReserve is the memory the agent's own process needs beside the
// maps under a memory limit: its RSS measured up to 176 MiB at 10k
// Services under the DaemonSet's GOMEMLIMIT (docs/performance.md).
const agentReserve = 192 << 20

// minMemoryLimit is the least --memory-limit: the agent and small maps.
const minMemoryLimit = 256 << 20

// memoryBudget is how much memory the maps may take, and what sets it.
type memoryBudget struct {
	bytes uint64 // 0: unknown, no check
	what  string // ends "more than ..." in the refusal
}

// mapBudget is the memory the maps may take: the machine's (memTotal
// bytes, MemTotal of /proc/meminfo; 0 if unknown) or, when smaller, what
// a memory limit (0 for none) leaves beside the agent. Map memory is
// charged to the memory cgroup of the process that creates the maps, so
// in a container creating maps beyond its limit fails, or gets the agent
// killed.
func mapBudget(memTotal, limit uint64) memoryBudget {
	if limit != 0 && (memTotal == 0 || limit-agentReserve < memTotal) {
		return memoryBudget{limit - agentReserve, fmt.Sprintf("the %s that --memory-limit %s leaves beside the agent's %s",
			byteSize(limit-agentReserve), byteSize(limit), byteSize(agentReserve))}
	}
	return memoryBudget{memTotal, fmt.Sprintf("the machine's memory (MemTotal %s)", byteSize(memTotal))}
}

// checkMapMemory refuses map sizes whose maps, by loader's estimate, need
// more memory than the budget: creating them would fail, get the agent
// killed, or leave the node nothing. The error names the flag whose maps
// take the most.
func checkMapMemory(opts loader.Options, budget memoryBudget) error {
	if budget.bytes == 0 {
		return nil
	}
	sizes, err := opts.MapMemory()
	if err != nil {
		return err
	}
	var total uint64
	perFlag := map[string]uint64{}
	flags := mapFlags()
	for name, n := range sizes {
		total += n
		if f := flags[name]; f != "" {
			perFlag[f] += n
		}
	}
	if total <= budget.bytes {
		return nil
	}
	if opts.NATMax == opts.ConntrackMax {
		// --nat-max follows --conntrack-max unless given: blame the
		// flag that sizes both.
		perFlag["conntrack-max"] += perFlag["nat-max"]
		perFlag["nat-max"] = 0
	}
	var flag string
	for _, f := range []string{"conntrack-max", "nat-max", "frontends-max", "backends-max", "services-max"} {
		if flag == "" || perFlag[f] > perFlag[flag] {
			flag = f
		}
	}
	value := map[string]uint32{
		"conntrack-max": opts.ConntrackMax, "nat-max": opts.NATMax, "frontends-max": opts.FrontendsMax,
		"backends-max": opts.BackendsMax, "services-max": opts.ServicesMax,
	}[flag]
	return flagError(flag, value, fmt.Sprintf("the BPF maps would need about %s (%s of it for the maps this flag sizes), "+
		"more than %s", byteSize(total), byteSize(perFlag[flag]), budget.what))
}

// memoryLimit validates --memory-limit: a Kubernetes quantity of bytes
// (what the downward API gives, or 1Gi and the like), 0 when not set.
func memoryLimit(c *cli.Context) (uint64, error) {
	v := c.String("memory-limit")
	if v == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return 0, flagError("memory-limit", v, "not a quantity of bytes (such as 1073741824, 1024Mi or 1Gi)")
	}
	if q.Cmp(*resource.NewQuantity(minMemoryLimit, resource.BinarySI)) < 0 {
		return 0, flagError("memory-limit", v, "below "+byteSize(minMemoryLimit)+": the agent alone takes up to "+byteSize(agentReserve))
	}
	if q.CmpInt64(math.MaxInt64) >= 0 { // ParseQuantity caps larger values there
		return 0, flagError("memory-limit", v, "out of range")
	}
	return uint64(q.Value()), nil // fractions of a byte round up
}

// byteSize is n bytes in GiB, or MiB below one GiB.
func byteSize(n uint64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// memTotal reads MemTotal from /proc/meminfo, in bytes; 0 if it cannot.
func memTotal() uint64 {
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb * 1024
		}
	}
	return 0
}
