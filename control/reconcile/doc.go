// Package reconcile makes the datapath maps hold the desired state computed
// by control/model, touching only what differs.
//
// Each service port gets a numeric id (counters, affinity, source ranges)
// and up to two Maglev tables: one over its cluster-wide endpoint set and
// one over its node-local set, each used by the frontends whose traffic
// policy selects it. Every endpoint address and port is a backend id. A
// port's id stays with its frontends when the port is renamed: a port new
// in an Apply that takes over a frontend of a port the Apply removes keeps
// that port's id, so its tables, counters and tracked flows carry on.
//
// Changes are applied in an order that never lets the datapath see a
// frontend pointing at a missing table or a table naming a missing backend:
// backends, then tables (each swapped in whole), then source ranges and
// frontends; deletions go in the reverse order. On start the reconciler
// adopts what an earlier agent left pinned (backend ids, service ids) so
// tracked flows and their counters carry on.
package reconcile
