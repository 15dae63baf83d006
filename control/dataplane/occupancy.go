package dataplane

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// sizedMaps are the maps whose fill level matters to operators.
func (d *Dataplane) sizedMaps() map[string]*ebpf.Map {
	maps := map[string]*ebpf.Map{
		"conntrack":     d.m.Conntrack,
		"nat":           d.m.NAT,
		"snat_slots":    d.m.SNATSlots,
		"affinity":      d.m.Affinity,
		"frontends":     d.m.Frontends,
		"backends":      d.m.Backends,
		"maglev_tables": d.m.MaglevTables,
		"source_ranges": d.m.SourceRanges,
		"services":      d.m.SvcNames,
	}
	if d.m.CtUnconfirmed != nil {
		maps["ct_unconfirmed"] = d.m.CtUnconfirmed
	}
	if d.m.NATUnconfirmed != nil {
		maps["nat_unconfirmed"] = d.m.NATUnconfirmed
	}
	if d.m.SYNProxyFlows != nil {
		maps["synproxy_flows"] = d.m.SYNProxyFlows
	}

	return maps
}

// Capacities returns the capacity of each sized map.
func (d *Dataplane) Capacities() map[string]uint32 {
	out := map[string]uint32{}
	for name, m := range d.sizedMaps() {
		out[name] = m.MaxEntries()
		if name == "backends" {
			out[name]-- // id 0 is reserved
		}
	}
	return out
}

// Occupancy counts the entries of each sized map. It walks the hash maps
// in batches; on a map with a million flows it takes a noticeable fraction
// of a second.
func (d *Dataplane) Occupancy() (map[string]int, error) {
	out := map[string]int{}
	for name, m := range d.sizedMaps() {
		var n int
		var err error
		switch name {
		case "conntrack", "ct_unconfirmed":
			n, err = countEntries[xdp.CtKey, xdp.CtEntry](m)
		case "synproxy_flows":
			n, err = countEntries[xdp.CtKey, xdp.SynproxySeq](m)
		case "nat", "nat_unconfirmed":
			n, err = countEntries[xdp.NatKey, xdp.NatEntry](m)
		case "affinity":
			n, err = countEntries[xdp.AffinityKey, xdp.AffinityEntry](m)
		case "frontends":
			n, err = countEntries[xdp.FrontendKey, xdp.Frontend](m)
		case "services":
			n, err = countEntries[uint32, xdp.SvcName](m)
		case "backends":
			var bes map[uint32]Backend
			bes, err = d.Backends()
			n = len(bes)
		case "snat_slots":
			n, err = claimedSlots(m)
		case "source_ranges":
			var rs []SourceRange
			rs, err = d.SourceRanges()
			n = len(rs)
		case "maglev_tables":
			err = d.eachTable(func(uint32, uint32) { n++ })
		default:
			err = errors.New("no way to count its entries")
		}
		if err != nil {
			return nil, fmt.Errorf("count %s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// countEntries counts a hash map's keys, in batches.
func countEntries[K, V any](m *ebpf.Map) (int, error) {
	keys, values := make([]K, flowBatch), make([]V, flowBatch)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, values, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// MemoryUsage is the kernel memory charged for the datapath's maps,
// including every Maglev table.
func (d *Dataplane) MemoryUsage() (uint64, error) {
	var total uint64
	add := func(m *ebpf.Map) {
		if info, err := m.Info(); err == nil {
			if mem, ok := info.Memlock(); ok {
				total += mem
			}
		}
	}
	for _, m := range d.m.All() {
		if m != nil {
			add(m)
		}
	}
	err := d.eachTable(func(_, innerID uint32) {
		inner, err := ebpf.NewMapFromID(ebpf.MapID(innerID))
		if err != nil {
			return // replaced since it was read
		}
		add(inner)
		inner.Close()
	})
	if err != nil {
		return 0, err
	}
	return total, nil
}

// QuarantinedSNATPorts counts the SNAT ports of closed TCP flows (reset,
// or a FIN each way) still within their timeout: the datapath gives such
// a port to no new flow until then, as TIME_WAIT keeps a socket's, so a
// late segment of the old connection meets no new one.
func (d *Dataplane) QuarantinedSNATPorts() (int, error) {
	var cfg xdp.DatapathConfig
	if err := d.m.Config.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("read datapath config: %w", err)
	}
	now := uint64(Now())
	total := 0
	for _, t := range d.flowTables() {
		err := eachEntry(t.m, func(k xdp.CtKey, e xdp.CtEntry) bool {
			if k.Proto == TCP && e.Flags&uint8(xdp.CtFlagsCT_F_SNAT) != 0 && TCPClosed(e.TcpState) &&
				now-e.LastSeenNs <= ctTimeout(e, k.Proto, cfg) {
				total++
			}
			return true
		})
		if err != nil {
			return total, fmt.Errorf("read %s: %w", t.name, err)
		}
	}
	return total, nil
}
