package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/xdplb/xdplb/loader"
)

// mapFlags names, per map, the flag its size follows.
func mapFlags() map[string]string {
	return map[string]string{
		"conntrack":          "conntrack-max",
		"affinity":           "conntrack-max", // an eighth of it
		"nat":                "nat-max",
		"snat_slots":         "nat-max", // twice it, in copies of the SNAT range
		"snat_bucket_hands":  "nat-max",
		"frontends":          "frontends-max",
		"backends":           "backends-max",
		"snat_backend_hands": "backends-max",
		"maglev_tables":      "services-max",
		"svc_stats":          "services-max",
		"svc_names":          "services-max",
		"source_ranges":      "services-max",
	}
}

// checkMapMemory refuses map sizes whose maps, by loader's estimate, need
// more memory than the machine has (memTotal bytes, MemTotal of
// /proc/meminfo; 0 if unknown, which skips the check): creating them
// would fail, or leave the node nothing. The error names the flag whose
// maps take the most.
func checkMapMemory(opts loader.Options, memTotal uint64) error {
	if memTotal == 0 {
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
	if total <= memTotal {
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
		"more than the machine's memory (MemTotal %s)", gib(total), gib(perFlag[flag]), gib(memTotal)))
}

func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

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
