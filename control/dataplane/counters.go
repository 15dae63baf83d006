package dataplane

import (
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// Counter is a packet and byte count.
type Counter struct {
	Packets, Bytes uint64
}

// Counters returns the datapath counters summed over CPUs, indexed by
// xdp.Stat (names from xdp.StatNames). Pins of an older datapath have
// fewer: those it lacks read as zero.
func (d *Dataplane) Counters() ([]Counter, error) {
	out := make([]Counter, xdp.StatSTAT_MAX)
	pinned := d.m.Stats.MaxEntries()
	var perCPU []xdp.Counter
	for i := range min(len(out), int(pinned)) {
		if err := d.m.Stats.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, c := range perCPU {
			out[i].Packets += c.Packets
			out[i].Bytes += c.Bytes
		}
	}
	return out, nil
}

// ServiceCounter is the traffic of one service port.
type ServiceCounter struct {
	Packets, Bytes, NewFlows uint64
}

// ServiceCounters returns the counters of one service port, summed over CPUs.
func (d *Dataplane) ServiceCounters(svcID uint32) (ServiceCounter, error) {
	var perCPU []xdp.SvcCounter
	if err := d.m.SvcStats.Lookup(svcID, &perCPU); err != nil {
		return ServiceCounter{}, fmt.Errorf("read service %d counters: %w", svcID, err)
	}
	var out ServiceCounter
	for _, c := range perCPU {
		out.Packets += c.Packets
		out.Bytes += c.Bytes
		out.NewFlows += c.NewFlows
	}
	return out, nil
}

// ResetServicesCounters zeroes the counters of many service ports at once
// (batched).
func (d *Dataplane) ResetServicesCounters(ids []uint32) error {
	cpus := possibleCPUs()
	for start := 0; start < len(ids); start += batchChunk {
		keys := ids[start:min(start+batchChunk, len(ids))]
		zero := make([]xdp.SvcCounter, len(keys)*cpus)
		if _, err := d.m.SvcStats.BatchUpdate(keys, zero, nil); err != nil {
			return fmt.Errorf("reset counters of %d services: %w", len(keys), err)
		}
	}
	return nil
}

// possibleCPUs is the number of per-CPU slots a per-CPU map value has.
func possibleCPUs() int {
	n, err := ebpf.PossibleCPU()
	if err != nil || n < 1 {
		return 1
	}
	return n
}
