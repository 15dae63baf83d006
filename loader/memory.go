package loader

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// MapMemory estimates the kernel memory of each map the options size, in
// bytes: entries times key and value (rounded up to 8 bytes, as the kernel
// stores them) plus a per-entry overhead by map type. Hash maps
// preallocate every entry, so the estimate is what creating them takes.
// The inner Maglev tables, sized per service by its backends, are not in
// it.
func (o Options) MapMemory() (map[string]uint64, error) {
	spec, err := xdp.LoadNic()
	if err != nil {
		return nil, fmt.Errorf("read embedded XDP object: %w", err)
	}
	if err := sizeMaps(spec, o); err != nil {
		return nil, err
	}
	// Per-CPU values exist for every possible CPU, not only those this
	// process may run on (runtime.NumCPU).
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	round := func(n uint32) uint64 { return (uint64(n) + 7) &^ 7 }
	out := map[string]uint64{}
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		entries, key, value := uint64(ms.MaxEntries), round(ms.KeySize), round(ms.ValueSize)
		switch ms.Type {
		case ebpf.Hash, ebpf.LRUHash:
			out[name] = entries * (key + value + 48) // htab_elem with its LRU node, and a bucket
		case ebpf.ArrayOfMaps:
			out[name] = entries * 8 // a pointer per slot
		case ebpf.LPMTrie:
			out[name] = entries * (key + value + 48)
		case ebpf.PerCPUArray:
			out[name] = entries * value * uint64(cpus)
		default:
			out[name] = entries * value
		}
	}
	return out, nil
}
