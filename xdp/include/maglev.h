/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * maglev.h - backend choice for a new flow: Maglev table lookup and
 * ClientIP session affinity.
 */
#ifndef XDPLB_MAGLEV_H
#define XDPLB_MAGLEV_H

#include "maps.h"
#include "hash.h"

/* Result of a backend choice. */
struct pick {
	__u32 backend_id;
	struct backend backend;
};

enum pick_result {
	PICK_OK = 0,
	PICK_EMPTY,     /* the service port has no usable backend */
	PICK_BAD_TABLE, /* table missing, empty or pointing at a free backend */
};

/* Look up a backend by id and copy it; 0 if the slot is unused. */
static __always_inline int backend_get(__u32 id, struct backend *out)
{
	struct backend *be = bpf_map_lookup_elem(&backends, &id);

	if (!be || be->addr == 0)
		return 0;
	*out = *be;
	return 1;
}

/* Slot `hash mod M` of a Maglev table. */
static __always_inline enum pick_result maglev_pick(__u32 table_id, __u32 hash, struct pick *out)
{
	__u32 zero = 0, slot, *size, *id;
	void *table;

	if (table_id == 0)
		return PICK_EMPTY;
	table = bpf_map_lookup_elem(&maglev_tables, &table_id);
	if (!table)
		return PICK_BAD_TABLE;
	size = bpf_map_lookup_elem(table, &zero);
	if (!size || *size == 0)
		return PICK_BAD_TABLE;
	slot = hash % *size + 1;
	id = bpf_map_lookup_elem(table, &slot);
	if (!id || !backend_get(*id, &out->backend))
		return PICK_BAD_TABLE;
	out->backend_id = *id;
	return PICK_OK;
}

/*
 * Choose a backend for a new flow from table_id, which holds the node-local
 * set if local_set. With ClientIP affinity the choice is remembered per
 * (service port, client address) and reused while the client keeps coming
 * back within the timeout and the backend is still one of the set in use:
 * it exists, is not draining (terminating or not ready) and, for the
 * node-local set, runs on this node. The Maglev hash then covers the client
 * address only, so every node picks the same backend for a client.
 */
static __always_inline enum pick_result pick_backend(const struct frontend *fe, __u32 table_id,
						     int local_set, const struct ct_key *flow,
						     __u32 seed, __u64 now, struct pick *out)
{
	struct affinity_key akey = {};
	struct affinity_entry *aff, nentry = {};
	enum pick_result res;

	if (fe->affinity_timeout == 0)
		return maglev_pick(table_id, flow_hash(flow->saddr, flow->daddr, flow->sport,
						       flow->dport, flow->proto, seed),
				   out);

	akey.svc_id = fe->svc_id;
	akey.client_addr = flow->saddr;
	aff = bpf_map_lookup_elem(&affinity, &akey);
	if (aff && time_since(aff->last_seen_ns, now) < (__u64)fe->affinity_timeout * NSEC_PER_SEC &&
	    backend_get(aff->backend_id, &out->backend) &&
	    out->backend.addr == aff->backend_addr && out->backend.port == aff->backend_port &&
	    !(out->backend.flags & BE_TERMINATING) && (!local_set || (out->backend.flags & BE_LOCAL))) {
		out->backend_id = aff->backend_id;
		aff->last_seen_ns = now;
		return PICK_OK;
	}

	res = maglev_pick(table_id, client_hash(flow->saddr, seed), out);
	if (res != PICK_OK)
		return res;
	nentry.last_seen_ns = now;
	nentry.backend_id = out->backend_id;
	nentry.backend_addr = out->backend.addr;
	nentry.backend_port = out->backend.port;
	bpf_map_update_elem(&affinity, &akey, &nentry, BPF_ANY);
	return PICK_OK;
}

/* Refresh the affinity entry of an established flow's client. */
static __always_inline void affinity_touch(__u32 svc_id, __be32 client, __u64 now)
{
	struct affinity_key akey = { .svc_id = svc_id, .client_addr = client };
	struct affinity_entry *aff;

	aff = bpf_map_lookup_elem(&affinity, &akey);
	if (aff && time_since(aff->last_seen_ns, now) > NSEC_PER_SEC)
		aff->last_seen_ns = now;
}

#endif /* XDPLB_MAGLEV_H */
