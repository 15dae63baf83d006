package reconcile

import (
	"context"
	"net/netip"

	"github.com/xdplb/xdplb/control/dataplane"
)

// Departure is a backend that left one service port while other ports
// keep it (so its id stays): that port's tracked flows and ClientIP
// affinity clients to it are stale, as they are for a removed backend.
// AffinityOnly: it is still an endpoint of the port, but topology hints
// left it out of the sets the port's tables are built from; only the
// affinity entries naming it are stale (its flows go on).
type Departure struct {
	SvcID        uint32 // the service port's id
	BackendID    uint32
	Backend      dataplane.Backend
	AffinityOnly bool
}

// Stale is what an Apply leaves for a purge: the backends it freed and the
// backends that left a service port. Sweep asks for every tracked flow and
// affinity entry to be checked against the records instead (the first
// sync after a start, which has no earlier records to compare with: what
// changed while no agent ran is found so).
type Stale struct {
	Removed  map[uint32]dataplane.Backend
	Departed []Departure
	Sweep    bool
}

// Empty reports whether there is nothing to purge.
func (s Stale) Empty() bool { return len(s.Removed) == 0 && len(s.Departed) == 0 && !s.Sweep }

// departureKey identifies a departure: service port and backend id.
type departureKey struct{ svc, backend uint32 }

// PurgeFlows forgets tracked flows (both halves) whose backend was
// removed, or left the flow's service port, so their SNAT ports are free
// at once, and the ClientIP affinity entries of departed backends. The
// datapath already stops following flows of a removed backend on their
// next packet (a TCP client gets a RST, a UDP flow picks a new backend);
// the purge also covers flows that send nothing more, and flows of a
// backend still in use by another port, which the datapath cannot tell
// from live ones. A flow of a removed backend counts only if its backend
// id and address both match, so flows of a new backend that reuses the
// id are left alone; departures and sweeps are checked by address and
// port against the records (still).
//
// still says whether a departure holds now (Reconciler.StillDeparted): a
// purge runs after the Apply that reported it, and a backend that came
// back meanwhile keeps what it got since. Affinity entries go first, so
// no client is led back to a departed backend while its flows are being
// purged. It returns how many flows and affinity entries it deleted.
func PurgeFlows(ctx context.Context, dp *dataplane.Dataplane, stale Stale, still func(Departure) bool) (Purged, error) {
	var purged Purged
	if stale.Empty() {
		return purged, nil
	}
	affinity := map[departureKey]dataplane.Backend{}
	departed := map[departureKey]dataplane.Backend{}
	for _, d := range stale.Departed {
		if still != nil && !still(d) {
			continue
		}
		k := departureKey{d.SvcID, d.BackendID}
		affinity[k] = d.Backend
		if !d.AffinityOnly {
			departed[k] = d.Backend
		}
	}
	// An entry of a sweep is stale when the records say its backend is
	// not (or no longer) what its port uses.
	swept := func(svc, id uint32, ap netip.AddrPort, affinityOnly bool) bool {
		return stale.Sweep && still != nil && still(Departure{SvcID: svc, BackendID: id,
			Backend: dataplane.Backend{Addr: ap.Addr(), Port: ap.Port()}, AffinityOnly: affinityOnly})
	}
	if len(affinity) > 0 || stale.Sweep {
		n, err := dp.DeleteAffinities(func(e dataplane.AffinityEntry) bool {
			b, ok := affinity[departureKey{e.SvcID, e.BackendID}]
			return ok && b.Addr == e.Backend.Addr() && b.Port == e.Backend.Port() ||
				swept(e.SvcID, e.BackendID, e.Backend, true)
		})
		purged.Affinities = n
		if err != nil {
			return purged, err
		}
	}
	if len(stale.Removed) == 0 && len(departed) == 0 && !stale.Sweep {
		return purged, nil
	}
	same := func(b dataplane.Backend, ok bool, f dataplane.Flow) bool {
		return ok && b.Addr == f.Backend.Addr() && b.Port == f.Backend.Port()
	}
	var flows []dataplane.Flow
	err := dp.Flows(func(f dataplane.Flow) bool {
		if f.Ended {
			return ctx.Err() == nil
		}
		b, removed := stale.Removed[f.BackendID]
		d, left := departed[departureKey{f.SvcID, f.BackendID}]
		if same(b, removed, f) || same(d, left, f) || swept(f.SvcID, f.BackendID, f.Backend, false) {
			flows = append(flows, f)
		}
		return ctx.Err() == nil
	})
	if err != nil {
		return purged, err
	}
	for _, f := range flows {
		if err := ctx.Err(); err != nil {
			return purged, err
		}
		deleted, err := dp.DeleteFlow(f)
		if err != nil {
			return purged, err
		}
		if deleted {
			purged.Flows++
		}
	}
	return purged, nil
}

// Purged is what a purge deleted: tracked flows (both halves) and ClientIP
// affinity entries.
type Purged struct {
	Flows, Affinities int
}
