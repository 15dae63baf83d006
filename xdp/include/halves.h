/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * halves.h - the two halves of a translated flow: the forward conntrack
 * entry and the reverse entry, each rebuilt from the other, and whether the
 * flow a reverse half stands for still lives (which decides whether its
 * reply tuple, a SNAT port, may be taken).
 */
#ifndef XDPLB_HALVES_H
#define XDPLB_HALVES_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"
#include "conntrack.h"
#include "maglev.h"

/* The reply tuple a backend sends for a forward entry. */
static __always_inline void nat_key_of(const struct ct_key *flow, const struct ct_entry *ct,
				       struct nat_key *key)
{
	if (ct->flags & CT_F_SNAT)
		nat_key_set(key, ct->backend_addr, ct->nat_addr, ct->backend_port, ct->nat_port,
			    flow->proto);
	else
		nat_key_set(key, ct->backend_addr, flow->saddr, ct->backend_port, flow->sport,
			    flow->proto);
}

static __always_inline void nat_entry_of(const struct ct_key *flow, const struct ct_entry *ct,
					 struct nat_entry *entry)
{
	entry->client_addr = flow->saddr;
	entry->client_port = flow->sport;
	entry->frontend_addr = flow->daddr;
	entry->frontend_port = flow->dport;
	entry->backend_id = ct->backend_id;
	entry->svc_id = ct->svc_id;
	entry->flags = ct->flags;
	entry->reply_seq_known = 0;
	entry->reply_seq_mark = 0;
	entry->last_seen_ns = ct->last_seen_ns;
	__builtin_memset(&entry->hop, 0, sizeof(entry->hop));
}

/* Does a reverse entry belong to this forward flow? */
static __always_inline int nat_entry_matches(const struct nat_entry *entry,
					     const struct ct_key *flow)
{
	return entry->client_addr == flow->saddr && entry->client_port == flow->sport &&
	       entry->frontend_addr == flow->daddr && entry->frontend_port == flow->dport;
}

static __always_inline int nat_keys_equal(const struct nat_key *a, const struct nat_key *b)
{
	return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport &&
	       a->dport == b->dport && a->proto == b->proto;
}

/* The forward key a reverse entry stands for. */
static __always_inline void ct_key_of_nat(const struct nat_key *key, const struct nat_entry *entry,
					  struct ct_key *flow)
{
	ct_key_set(flow, entry->client_addr, entry->frontend_addr, entry->client_port,
		   entry->frontend_port, key->proto);
}

/*
 * The forward key and entry a reverse entry stands for, rebuilt when a
 * reply finds the forward half evicted. A confirmed flow is past its
 * handshake. An unconfirmed one has just been answered by its backend,
 * and stays unconfirmed (see ct_confirmed_by).
 */
static __always_inline void ct_of_nat(const struct nat_key *key, const struct nat_entry *entry,
				      __u64 now, struct ct_key *flow, struct ct_entry *ct)
{
	ct_key_of_nat(key, entry, flow);
	__builtin_memset(ct, 0, sizeof(*ct));
	ct->created_ns = now;
	ct->last_seen_ns = now;
	ct->backend_id = entry->backend_id;
	ct->svc_id = entry->svc_id;
	ct->backend_addr = key->saddr;
	ct->backend_port = key->sport;
	ct->flags = entry->flags;
	if (entry->flags & CT_F_SNAT) {
		ct->nat_addr = key->daddr;
		ct->nat_port = key->dport;
	}
	if (!(entry->flags & CT_F_UNCONFIRMED))
		ct->tcp_state = CT_TCP_SYN | CT_TCP_ESTABLISHED;
	else if (key->proto == IPPROTO_TCP)
		ct->tcp_state = CT_TCP_SYN | CT_TCP_REPLY;
	else
		ct->tcp_state = CT_TCP_REPLY;
}

/* Does a live forward entry translate to exactly this reply tuple? */
static __always_inline int ct_answers_to(const struct ct_entry *ct, const struct nat_key *key)
{
	return ct->backend_addr == key->saddr && ct->backend_port == key->sport &&
	       (!(ct->flags & CT_F_SNAT) ||
		(ct->nat_addr == key->daddr && ct->nat_port == key->dport));
}

/* Do two forward entries of one client tuple have the same reverse half? */
static __always_inline int ct_same_reverse(const struct ct_entry *a, const struct ct_entry *b)
{
	return a->backend_addr == b->backend_addr && a->backend_port == b->backend_port &&
	       (a->flags & CT_F_SNAT) == (b->flags & CT_F_SNAT) &&
	       (!(a->flags & CT_F_SNAT) || (a->nat_addr == b->nat_addr && a->nat_port == b->nat_port));
}

/* Is the backend a reply comes from still the one its entry names? */
static __always_inline int reverse_backend_alive(const struct nat_key *key,
						 const struct nat_entry *rev)
{
	struct backend be;

	return backend_get(rev->backend_id, &be) && be.addr == key->saddr &&
	       be.port == key->sport;
}

/* How long an unconfirmed flow evicted from its table keeps its reply
 * tuple (its SNAT port) after its last reply or start: the window of a
 * SYN-ACK's first retransmission. Evicted unconfirmed flows are what a
 * flood of spoofed new flows leaves, and each would otherwise hold a port
 * for its whole timeout, so a few hundred spoofed SYNs a second would use
 * up a backend's ports; this way they hold at most rate x 2 s. */
#define CT_UNCONFIRMED_HOLD_NS (2 * NSEC_PER_SEC)

/*
 * Does a flow whose forward half was evicted go on? While its backend
 * exists, and within its timeout by its reverse half's date: its last
 * reply, or its client's last packets (nat_keep_dated). The timeout is
 * the one its forward half would have had (a confirmed TCP flow's is the
 * established one: it may be closing, but the agent's view of it is gone
 * with its forward half); an unconfirmed flow's at most
 * CT_UNCONFIRMED_HOLD_NS.
 * Losing a forward half therefore never frees a confirmed flow's reply
 * tuple (its SNAT port) before the flow could be over.
 */
static __always_inline int evicted_flow_alive(const struct nat_key *key,
					      const struct nat_entry *rev, __u64 now)
{
	const struct datapath_config *cfg = config_get();
	__u64 timeout;

	if (!reverse_backend_alive(key, rev))
		return 0;
	if (!cfg)
		return 1;
	if (key->proto != IPPROTO_TCP)
		timeout = cfg->udp_timeout_ns;
	else if (rev->flags & CT_F_UNCONFIRMED)
		timeout = cfg->tcp_transient_timeout_ns;
	else
		timeout = cfg->tcp_established_timeout_ns;
	if ((rev->flags & CT_F_UNCONFIRMED) && timeout > CT_UNCONFIRMED_HOLD_NS)
		timeout = CT_UNCONFIRMED_HOLD_NS;
	return time_since(READ_ONCE(rev->last_seen_ns), now) <= timeout;
}

/*
 * Is the flow holding reverse half `rev` of reply tuple `key` gone: its
 * forward entry expired or translating elsewhere now, or evicted and past
 * its timeout by the reverse half's own date (evicted_flow_alive)? snat
 * is CT_F_SNAT for a SNAT flow's tuple, 0 for one without SNAT. A flow
 * whose forward entry was evicted keeps its tuple: its backend may still
 * hold the connection, and a new flow on the same tuple would share it.
 * opening is set when the flow asking opens a TCP connection (a SYN): a
 * holder that is closed (ct_tcp_closed: reset, or a FIN each way) counts
 * as gone then, as for a SYN on a closed connection's own tuple
 * (ct_reused_tuple): to the backend the two are one connection, its
 * tuple reused. A half-closed holder is not: its backend may still send.
 */
static __always_inline int reverse_holder_gone(const struct nat_key *key,
					       const struct nat_entry *rev, __u8 snat,
					       int opening,
					       const struct datapath_config *cfg, __u64 now)
{
	struct ct_key owner;
	struct ct_entry *ct;

	ct_key_of_nat(key, rev, &owner);
	/* One lookup, in the table the reverse half names: a flow confirmed
	 * a moment ago, found in neither, is judged alive by its date. */
	if (rev->flags & CT_F_UNCONFIRMED)
		ct = bpf_map_lookup_elem(&ct_unconfirmed, &owner);
	else
		ct = bpf_map_lookup_elem(&conntrack, &owner);
	if (!ct)
		return !evicted_flow_alive(key, rev, now);
	return (ct->flags & CT_F_SNAT) != snat || !ct_answers_to(ct, key) ||
	       ct_expired(ct, owner.proto, cfg, now) ||
	       (opening && ct_tcp_closed(ct));
}

static __always_inline int snat_holder_gone(const struct nat_key *key, const struct nat_entry *rev,
					    const struct datapath_config *cfg, __u64 now)
{
	return reverse_holder_gone(key, rev, CT_F_SNAT, 0, cfg, now);
}

#endif /* XDPLB_HALVES_H */
