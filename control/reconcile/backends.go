// Backends: the ports that use each, ids, departures and hostNetwork ports.

package reconcile

import (
	"net/netip"
	"slices"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
)

// backend is a port's view of one of its endpoints.
type backend struct{ dataplane.Backend }

func (b backend) addrPort() netip.AddrPort { return netip.AddrPortFrom(b.Addr, b.Port) }

// backendList is a port's backends ordered by address and port, each
// once: smaller than a map for the few endpoints most ports have.
type backendList []backend

// has reports whether the list holds the backend at ap.
func (l backendList) has(ap netip.AddrPort) bool {
	_, found := slices.BinarySearchFunc(l, ap, func(b backend, ap netip.AddrPort) int { return b.addrPort().Compare(ap) })
	return found
}

// hintedOut returns the ready endpoints of a service port that are in
// neither of its sets: those topology hints leave out of the cluster-wide
// set (model.Service.ClusterSet) and that are not in the node-local one.
// nil when the cluster-wide set has every ready endpoint, as it has
// without hints.
func hintedOut(svc *model.Service) map[netip.AddrPort]bool {
	ready := 0
	for _, e := range svc.Endpoints {
		if e.Ready {
			ready++
		}
	}
	if len(svc.ClusterSet) == 0 || !svc.ClusterSet[0].Ready || len(svc.ClusterSet) == ready {
		return nil
	}
	inSets := make(map[netip.AddrPort]bool, len(svc.ClusterSet)+len(svc.LocalSet))
	for _, set := range [][]model.Endpoint{svc.ClusterSet, svc.LocalSet} {
		for _, e := range set {
			inSets[netip.AddrPortFrom(e.Addr, e.Port)] = true
		}
	}
	out := map[netip.AddrPort]bool{}
	for _, e := range svc.Endpoints {
		if ap := netip.AddrPortFrom(e.Addr, e.Port); e.Ready && !inSets[ap] {
			out[ap] = true
		}
	}
	return out
}

// departure is a backend leaving a service port, or only the sets its
// tables are built from (see Result.Departed).
type departure struct {
	svcID        uint32
	backend      netip.AddrPort
	affinityOnly bool
}

// StillDeparted reports whether a departure still holds as the last Apply
// left the records: the backend is not among the port's endpoints (or,
// for an affinity-only departure, not in its sets). A backend that came
// back since must keep the flows and affinity it has got meanwhile.
func (r *Reconciler) StillDeparted(d Departure) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	key, ok := r.portOfID[d.SvcID]
	if !ok {
		return true // the port is gone
	}
	rec := r.ports[key]
	ap := netip.AddrPortFrom(d.Backend.Addr, d.Backend.Port)
	if rec == nil || !rec.backends.has(ap) {
		return true
	}
	return d.AffinityOnly && rec.hintedOut[ap]
}

// sorted orders l and keeps the last of duplicates, as a map filled in
// l's order would.
func (l backendList) sorted() backendList {
	slices.SortStableFunc(l, func(a, b backend) int { return a.addrPort().Compare(b.addrPort()) })
	out := l[:0]
	for _, b := range l {
		if n := len(out); n > 0 && out[n-1].addrPort() == b.addrPort() {
			out[n-1] = b
			continue
		}
		out = append(out, b)
	}
	return slices.Clip(out)
}

// backendState is what the reconciler keeps of one backend address: its
// id, and how many service ports have it in their view, how many of those
// see it local and how many see it serving (not terminating). A backend
// several ports share is merged from all their views: local if any sees it
// local, terminating only if all see it terminating.
type backendState struct {
	id                          uint32
	users, local, serving, host int32
	// touched is the number of the last Apply that changed the counts.
	touched uint64
}

// syncHostPorts writes the host backend port bitmap from the backends as
// written, when a backend at a node address came, changed or went since
// it was last written.
func (r *Reconciler) syncHostPorts() error {
	if !r.hostPortsStale {
		return nil
	}
	var ports []uint16
	for _, b := range r.backends {
		if b.Host {
			ports = append(ports, b.Port)
		}
	}
	if err := r.dp.SetHostBackendPorts(ports); err != nil {
		return err
	}
	r.hostPortsStale = false
	return nil
}

// merged is the backend's value as its users see it together.
func (s backendState) merged(ap netip.AddrPort) dataplane.Backend {
	return dataplane.Backend{Addr: ap.Addr(), Port: ap.Port(), Local: s.local > 0, Host: s.host > 0,
		Terminating: s.serving == 0}
}

// countBackendUse adds one port's view b of a backend to its counts (delta 1) or
// takes it away (delta -1), and appends the backend to touched the first
// time this Apply changes it. The backend must have an id.
func (r *Reconciler) countBackendUse(b backend, delta int32, touched []netip.AddrPort) []netip.AddrPort {
	ap := b.addrPort()
	st := r.addrs[ap]
	st.users += delta
	if b.Local {
		st.local += delta
	}
	if b.Host {
		st.host += delta
	}
	if !b.Terminating {
		st.serving += delta
	}
	if st.touched != r.applies {
		st.touched = r.applies
		touched = append(touched, ap)
	}
	r.addrs[ap] = st
	return touched
}

// allocateBackendID returns a free backend id.
func (r *Reconciler) allocateBackendID() (uint32, bool) {
	id, ok := nextFree(&r.nextBackendID, r.cfg.BackendsMax, func(id uint32) bool { return r.usedBackendIDs[id] })
	if ok {
		r.usedBackendIDs[id] = true
	}
	return id, ok
}
