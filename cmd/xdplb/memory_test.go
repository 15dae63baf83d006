package main

import (
	"strings"
	"testing"

	"github.com/xdplb/xdplb/loader"
)

// TestMapMemoryCheck checks the refusal of map sizes the machine's memory
// cannot hold: the message names the flag whose maps take the most.
func TestMapMemoryCheck(t *testing.T) {
	const gib = 1 << 30
	for _, tc := range []struct {
		name     string
		set      func(o *loader.Options)
		memTotal uint64
		wantFlag string // "" for accepted
	}{
		{"defaults on a small node", func(*loader.Options) {}, 2 * gib, ""},
		{"largest conntrack", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 16 * gib, "conntrack-max"},
		{"largest conntrack, huge machine", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 1024 * gib, ""},
		{"largest NAT", func(o *loader.Options) { o.NATMax = 1 << 27 }, 16 * gib, "nat-max"},
		{"largest backends", func(o *loader.Options) { o.BackendsMax = 1 << 24 }, 384 << 20, "backends-max"},
		{"largest frontends", func(o *loader.Options) { o.FrontendsMax = 1 << 24 }, 1 * gib, "frontends-max"},
		{"unknown memory", func(o *loader.Options) { o.ConntrackMax, o.NATMax = 1<<27, 1<<27 }, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := loader.DefaultOptions()
			tc.set(&opts)
			opts.AffinityMax = max(opts.ConntrackMax/8, 1024)
			err := checkMapMemory(opts, tc.memTotal)
			switch {
			case tc.wantFlag == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.wantFlag != "" && err == nil:
				t.Errorf("accepted, want --%s refused", tc.wantFlag)
			case tc.wantFlag != "" && (!strings.Contains(err.Error(), "--"+tc.wantFlag+" ") ||
				!strings.Contains(err.Error(), "memory")):
				t.Errorf("error %q: want it to name --%s and the memory", err, tc.wantFlag)
			}
		})
	}
}
