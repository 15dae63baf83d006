// Service ids: kept by a port across renames (heirs), allocated, released
// and named.

package reconcile

import (
	"strings"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/model"
)

// portIDs chooses the service id of each port in keys that byKey does not
// remove, in the order of keys (0 when no id is free); heirs take the ids
// of the ports they take over.
func (r *Reconciler) portIDs(keys []string, byKey map[string]*model.Service, heirs heirs) map[string]uint32 {
	ids := make(map[string]uint32, len(keys))
	for _, k := range keys {
		if svc := byKey[k]; svc != nil {
			if from, ok := heirs.from[k]; ok {
				ids[k] = r.ports[from].id // in use already, named once the Apply goes ahead
				continue
			}
			ids[k], _ = r.serviceID(k, svc)
		}
	}
	return ids
}

// heirs pairs the ports an Apply removes with the ports it adds that take
// them over (see Reconciler.heirs), both ways.
type heirs struct {
	from map[string]string // new port -> the removed port whose id it takes
	to   map[string]string // removed port -> the new port that takes its id
}

// serviceOfKey is the namespace/name of the Service a port key (see
// model.Service.Key) belongs to.
func serviceOfKey(key string) string {
	s := key[:max(strings.LastIndexByte(key, '/'), 0)]
	if i := strings.IndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	return s
}

// heirs finds the ports new in this Apply (without a record, or one
// without an id) that take over a frontend (address, port, protocol) of a
// port of the same Service the Apply removes: such a port keeps the
// removed port's service id. (Another Service that takes the frontend
// over gets an id of its own: counters and names are the Service's.) A port key names the port (ns/web/TCP becomes ns/web:http/TCP once
// the Service has a second port), so a renamed port is removed and added;
// with the id, its frontends, tables, source ranges, counters, ClientIP
// affinity entries and tracked flows (all keyed by service id) carry on,
// and only backends that truly leave it are reported departed. Each
// removed port's id goes to one port, the first in the order of keys
// (sorted) that takes over one of its frontends; a new port whose
// frontends no removed port had gets an id of its own.
func (r *Reconciler) heirs(keys []string, byKey map[string]*model.Service) heirs {
	var h heirs
	var gone map[dataplane.FrontendKey]string
	for _, k := range keys {
		if old := r.ports[k]; byKey[k] == nil && old != nil && old.id != 0 {
			for fk := range old.frontends {
				if gone == nil {
					gone = map[dataplane.FrontendKey]string{}
				}
				gone[fk] = k
			}
		}
	}
	if gone == nil {
		return h // the common case: no port with an id goes
	}
	for _, k := range keys {
		svc := byKey[k]
		if svc == nil {
			continue
		}
		if old := r.ports[k]; old != nil && old.id != 0 {
			continue // keeps its own id
		}
		for _, f := range svc.Frontends {
			from, ok := gone[frontendKey(f)]
			if !ok || h.to[from] != "" || serviceOfKey(from) != svc.Namespace+"/"+svc.Name {
				continue
			}
			if h.from == nil {
				h.from, h.to = map[string]string{}, map[string]string{}
			}
			h.from[k], h.to[from] = from, k
			break
		}
	}
	return h
}

// releaseID frees a service id allocated in this Apply for a port that
// is refused: its counters were reset, its name is not written.
func (r *Reconciler) releaseID(id uint32) {
	delete(r.usedIDs, id)
	delete(r.newNames, id)
}

// serviceID returns the port's id: its current one, the one its pinned
// frontends carry (after a restart), or the lowest free one.
func (r *Reconciler) serviceID(key string, svc *model.Service) (uint32, bool) {
	if rec := r.ports[key]; rec != nil && rec.id != 0 {
		return rec.id, true
	}
	if r.adopted != nil {
		for _, f := range svc.Frontends {
			fe, ok := r.adopted[frontendKey(f)]
			if ok && fe.SvcID != 0 && fe.SvcID < r.cfg.ServicesMax && !r.usedIDs[fe.SvcID] {
				r.usedIDs[fe.SvcID] = true
				r.nameService(fe.SvcID, key)
				return fe.SvcID, true
			}
		}
	}
	if id, ok := nextFree(&r.nextServiceID, r.cfg.ServicesMax, func(id uint32) bool {
		return r.usedIDs[id] || r.adoptedIDs[id]
	}); ok {
		r.usedIDs[id] = true
		r.resetCounts = append(r.resetCounts, id)
		r.nameService(id, key)
		return id, true
	}
	return 0, false
}

// nextFree finds a free id in [1, limit), starting after *cursor and
// wrapping once; used reports the ids taken. Amortised constant time while
// ids are plentiful.
func nextFree(cursor *uint32, limit uint32, used func(uint32) bool) (uint32, bool) {
	if limit < 2 {
		return 0, false
	}
	for n := uint32(1); n < limit; n++ {
		id := (*cursor+n-1)%(limit-1) + 1
		if !used(id) {
			*cursor = id
			return id, true
		}
	}
	return 0, false
}

func (r *Reconciler) nameService(id uint32, key string) {
	r.newNames[id] = key
}

// flushIDs resets the counters and records the names of the service ids
// allocated since the last call.
func (r *Reconciler) flushIDs() {
	if len(r.resetCounts) > 0 {
		if err := r.dp.ResetServicesCounters(r.resetCounts); err != nil {
			r.log.Warn("reset service counters", "services", len(r.resetCounts), "error", err)
		}
		r.resetCounts = r.resetCounts[:0]
	}
	if len(r.newNames) > 0 {
		if err := r.dp.PutServiceNames(r.newNames); err != nil {
			r.log.Warn("name service ports", "services", len(r.newNames), "error", err)
		}
		clear(r.newNames)
	}
}
