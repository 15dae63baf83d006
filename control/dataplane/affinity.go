package dataplane

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// AffinityEntry is one ClientIP affinity entry: a client of a service
// port, and the backend the datapath sends its new flows to.
type AffinityEntry struct {
	SvcID     uint32
	Client    netip.Addr
	BackendID uint32
	Backend   netip.AddrPort
}

// DeleteAffinities deletes the ClientIP affinity entries stale says are
// stale and returns how many it deleted. Entries deleted meanwhile by the
// datapath's LRU are not an error; an entry the datapath gave another
// backend after the walk read it (its client came back and was balanced
// afresh) is kept.
func (d *Dataplane) DeleteAffinities(stale func(AffinityEntry) bool) (int, error) {
	type walked struct {
		key   xdp.AffinityKey
		value xdp.AffinityEntry
	}
	var found []walked
	err := eachEntry(d.m.Affinity, func(k xdp.AffinityKey, v xdp.AffinityEntry) bool {
		e := AffinityEntry{SvcID: k.SvcId, Client: xdp.NetToAddr(k.ClientAddr), BackendID: v.BackendId,
			Backend: netip.AddrPortFrom(xdp.NetToAddr(v.BackendAddr), xdp.NetToPort(v.BackendPort))}
		if stale(e) {
			found = append(found, walked{k, v})
		}
		return true
	})
	if err != nil {
		return 0, fmt.Errorf("read affinity: %w", err)
	}
	n := 0
	for _, w := range found {
		var now xdp.AffinityEntry
		err := d.m.Affinity.Lookup(w.key, &now)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("read affinity entry: %w", err)
		}
		if now.BackendId != w.value.BackendId || now.BackendAddr != w.value.BackendAddr ||
			now.BackendPort != w.value.BackendPort {
			continue
		}
		err = d.m.Affinity.Delete(w.key)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("delete affinity entry: %w", err)
		}
		n++
	}
	return n, nil
}
