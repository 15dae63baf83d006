package main

import (
	"strings"
	"testing"

	"github.com/xdplb/xdplb/loader"
)

// TestMapMemoryCheck checks the refusal of map sizes the machine's memory,
// or what a memory limit leaves beside the agent, cannot hold: the message
// names the flag whose maps take the most, and what bounds them.
func TestMapMemoryCheck(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name     string
		set      func(o *loader.Options)
		memTotal uint64
		limit    uint64 // --memory-limit; 0 for none
		wantFlag string // "" for accepted
		byLimit  bool   // refused for the limit, not the machine's memory
	}{
		{"defaults on a small node", func(*loader.Options) {}, 2 * gib, 0, "", false},
		{"largest conntrack", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 16 * gib, 0, "conntrack-max", false},
		{"largest conntrack, huge machine", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 1024 * gib, 0, "", false},
		{"largest NAT", func(o *loader.Options) { o.NATMax = 1 << 27 }, 16 * gib, 0, "nat-max", false},
		// Small flow tables: the flag with the largest share is named.
		{"largest backends", func(o *loader.Options) { o.BackendsMax, o.ConntrackMax, o.NATMax = 1<<24, 1<<16, 1<<16 }, 256 << 20, 0, "backends-max", false},
		{"largest frontends", func(o *loader.Options) { o.FrontendsMax = 1 << 24 }, 1 * gib, 0, "frontends-max", false},
		{"unknown memory", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 0, 0, "", false},
		{"defaults in the DaemonSet's limit", func(*loader.Options) {}, 16 * gib, 1 * gib, "", false},
		{"4M flows in the DaemonSet's limit", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<22, 1<<22 }, 16 * gib, 1 * gib, "conntrack-max", true},
		{"4M flows in a larger limit", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<22, 1<<22 }, 16 * gib, 4 * gib, "", false},
		{"a limit above the machine's memory", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 16 * gib, 1024 * gib, "conntrack-max", false},
		{"a limit, memory unknown", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<22, 1<<22 }, 0, 1 * gib, "conntrack-max", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := loader.DefaultOptions()
			tc.set(&opts)
			opts.AffinityMax = max(opts.ConntrackMax/8, 1024)
			err := checkMapMemory(opts, mapBudget(tc.memTotal, tc.limit))
			switch {
			case tc.wantFlag == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.wantFlag != "" && err == nil:
				t.Errorf("accepted, want --%s refused", tc.wantFlag)
			case tc.wantFlag != "" && (!strings.Contains(err.Error(), "--"+tc.wantFlag+" ") ||
				!strings.Contains(err.Error(), "memory")):
				t.Errorf("error %q: want it to name --%s and the memory", err, tc.wantFlag)
			case tc.wantFlag != "" && tc.byLimit != strings.Contains(err.Error(), "that --memory-limit"):
				t.Errorf("error %q: want --memory-limit named %v", err, tc.byLimit)
			}
		})
	}
}
