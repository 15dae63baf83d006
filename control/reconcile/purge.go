package reconcile

import (
	"context"

	"github.com/xdplb/xdplb/control/dataplane"
)

// PurgeFlows forgets tracked flows (both halves) whose backend was
// removed, so their SNAT ports are free at once. The datapath already
// stops following such flows on their next packet (a TCP client gets a
// RST, a UDP flow picks a new backend); the purge also covers flows that
// send nothing more. A flow counts only if its backend id and address both
// match, so flows of a new backend that reuses the id are left alone.
func PurgeFlows(ctx context.Context, dp *dataplane.Dataplane, removed map[uint32]dataplane.Backend) (int, error) {
	if len(removed) == 0 {
		return 0, nil
	}
	var stale []dataplane.Flow
	err := dp.Flows(func(f dataplane.Flow) bool {
		if b, ok := removed[f.BackendID]; ok && b.Addr == f.Backend.Addr() && b.Port == f.Backend.Port() {
			stale = append(stale, f)
		}
		return ctx.Err() == nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, f := range stale {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		if err := dp.DeleteFlow(f); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}
