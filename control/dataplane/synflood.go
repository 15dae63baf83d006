package dataplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/xdp"
)

// synFloodWindow is the window the datapath counts a service port's
// handshakes in (SYN_FLOOD_WINDOW_NS in xdp/include/synproxy.h).
const synFloodWindow = time.Second

// SYNCookiePorts returns the ids of the service ports whose SYNs the XDP
// program answers with SYN cookies at now, as syn_flood_due in
// xdp/include/synproxy.h judges them from their handshake counts with
// SYN cookies on auto: this window's or the last one's incomplete
// handshakes reach threshold. Nil for a datapath pinned before the counts.
func (d *Dataplane) SYNCookiePorts(threshold uint32, now time.Duration) ([]uint32, error) {
	if d.m.SYNFloods == nil {
		return nil, nil
	}
	var ports []uint32
	keys := make([]uint32, batchChunk)
	vals := make([]xdp.SynFlood, batchChunk)
	var cursor ebpf.MapBatchCursor
	for {
		n, err := d.m.SYNFloods.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if synCookiesDue(vals[i], threshold, now) {
				ports = append(ports, keys[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return ports, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read SYN flood counts: %w", err)
		}
	}
}

// synCookiesDue judges one service port's counts: the window the counts
// are of rolls over at its next SYN, so counts a window old are the
// "last window" the datapath would judge by then.
func synCookiesDue(f xdp.SynFlood, threshold uint32, now time.Duration) bool {
	if f.WindowNs == 0 || threshold == 0 {
		return false
	}
	incomplete := uint32(0)
	if f.Opened > f.Completed {
		incomplete = f.Opened - f.Completed
	}
	age := now - time.Duration(f.WindowNs)
	switch {
	case age < synFloodWindow:
		return incomplete >= threshold || f.IncompleteBefore >= threshold
	case age < 2*synFloodWindow:
		return incomplete >= threshold
	default:
		return false
	}
}
