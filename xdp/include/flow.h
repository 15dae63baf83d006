/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * flow.h - what happens to a packet sent to a frontend, the same for every
 * hook: follow its tracked flow, or admit it (source ranges), choose a
 * backend, claim the reverse-NAT half and track it. The hooks differ only
 * in how they rewrite and send the packet afterwards.
 *
 * The origin of the packet matters: traffic from outside the node
 * (ORIGIN_EXTERNAL, seen on the NIC) follows externalTrafficPolicy and is
 * SNATed to the node when its backend is elsewhere; traffic from this
 * node's pods and host (ORIGIN_INTERNAL) uses the cluster-wide set (for
 * ClusterIPs, internalTrafficPolicy) and keeps its source address, except
 * for hairpin flows, where a pod reaches itself.
 */
#ifndef XDPLB_FLOW_H
#define XDPLB_FLOW_H

#include "maps.h"
#include "parse.h"
#include "counters.h"
#include "conntrack.h"
#include "maglev.h"
#include "nat.h"
#include "route.h"
#include "synproxy.h"

enum origin {
	ORIGIN_EXTERNAL = 0,
	ORIGIN_INTERNAL,
};

enum flow_verdict {
	FLOW_TRACKED,  /* follow res->ct, a live conntrack entry */
	FLOW_NEW,      /* a new flow: res->ct points at res->fresh, tracked */
	FLOW_PENDING,  /* an unconfirmed flow, touched, counted: res->ct points at a copy in res->fresh */
	FLOW_REFUSE,   /* no usable backend: refuse the client */
	FLOW_RESET,    /* mid-connection TCP that cannot go on: RST, counted as res->reason */
	FLOW_DROP,     /* drop, counted as res->reason */
	FLOW_PASS,     /* not service traffic for this hook: res->reason */
	FLOW_COOKIE,   /* a SYN to answer with the SYN cookie in res->cookie (synproxy.h) */
};

/* What a hook can do beyond translating: passed as a constant, so code a
 * hook cannot use is left out of it. */
enum hook_features {
	HOOK_PLAIN = 0,
	HOOK_SYN_PROXY = 1 << 0, /* answers SYNs with cookies (XDP on the NIC) */
};

/* The working state of one decision. It is too large for the BPF stack
 * next to everything else, so it lives in a per-CPU scratch map (programs
 * do not nest on a CPU, and each fills it before use). It holds no
 * pointers: the tracked entry is returned separately. */
struct flow_result {
	struct ct_key key;
	struct ct_entry fresh;
	/* FIB lookup parameters and result: toward a new flow's backend
	 * (flow_start), then TC's route of the packet (tc_translate_and_send). */
	struct bpf_fib_lookup fib;
	enum stat reason;
	/* FLOW_COOKIE: the cookie and its MSS. FLOW_NEW of a CT_F_SYNPROXY
	 * flow (its client's ACK answered a cookie): the cookie, the
	 * client's ISN and the MSS to open the backend's side with. */
	__u32 cookie;
	__u32 client_isn;
	__u16 cookie_mss;
};

/* Raw bytes as the map value: struct bpf_fib_lookup has anonymous unions,
 * which the Go bindings cannot express. */
struct flow_scratch_buf {
	__u8 bytes[sizeof(struct flow_result)];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flow_scratch_buf);
} flow_scratch SEC(".maps");

static __always_inline struct flow_result *flow_result_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&flow_scratch, &zero);
}

static __always_inline __u8 origin_ct_flags(enum origin origin)
{
	return origin == ORIGIN_EXTERNAL ? CT_F_EXTERNAL : 0;
}

/* Does the tracked backend still exist as it was when the flow started? */
static __always_inline int ct_backend_alive(const struct ct_entry *ct)
{
	struct backend be;

	return backend_get(ct->backend_id, &be) && be.addr == ct->backend_addr &&
	       be.port == ct->backend_port;
}

/*
 * May a packet follow this entry? Not when it was made for the other
 * origin, expired, is a closed connection whose tuple a SYN reuses, or
 * lost its backend. The reason is counted here.
 */
static __always_inline int ct_usable(const struct ct_entry *ct, const struct packet *pkt,
				     enum origin origin, const struct datapath_config *cfg,
				     __u64 now)
{
	if ((ct->flags & CT_F_EXTERNAL) != origin_ct_flags(origin))
		return 0;
	if (ct_expired(ct, pkt->proto, cfg, now) || ct_reused_tuple(ct, pkt->tcp_flags)) {
		count(STAT_CT_EXPIRED, 0);
		return 0;
	}
	if (!ct_backend_alive(ct)) {
		if (pkt->proto != IPPROTO_TCP || (pkt->tcp_flags & TCP_FLAG_SYN))
			count(STAT_RESELECT_BACKEND_GONE, 0);
		return 0;
	}
	return 1;
}

/* Is the entry a live flow of the other origin? A client tuple is one
 * origin's at a time: a packet from outside that spoofs a pod's flow (or
 * the other way round) is dropped, and the flow keeps its entry. */
static __always_inline int ct_live_for_other_origin(const struct ct_entry *ct,
						    const struct packet *pkt, enum origin origin,
						    const struct datapath_config *cfg, __u64 now)
{
	return (ct->flags & CT_F_EXTERNAL) != origin_ct_flags(origin) &&
	       !ct_expired(ct, pkt->proto, cfg, now);
}

/* A TCP packet without SYN: part of a connection under way, which a RST
 * ends at the client at once. */
static __always_inline int tcp_mid_connection(const struct packet *pkt)
{
	return pkt->proto == IPPROTO_TCP && !(pkt->tcp_flags & TCP_FLAG_SYN);
}

/* Does the packet open a TCP connection: a SYN without ACK? */
static __always_inline int tcp_opening(const struct packet *pkt)
{
	return pkt->proto == IPPROTO_TCP &&
	       (pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
}

/* Whether a port's bit is set in a port bitmap (frontend_ports,
 * host_backend_ports). */
static __always_inline int port_in_bitmap(void *bitmap, __be16 port)
{
	__u32 p = bpf_ntohs(port), word = p / 64;
	__u64 *bits = bpf_map_lookup_elem(bitmap, &word);

	return bits && ((*bits >> (p % 64)) & 1);
}

static __always_inline int port_has_frontend(__be16 port)
{
	return port_in_bitmap(&frontend_ports, port);
}

/*
 * A TCP packet from outside with no flow, to a backend that is not the
 * node itself, in a hook with HOOK_SYN_PROXY: is it the SYN proxy's (see
 * synproxy.h)? Returns FLOW_COOKIE for a SYN to answer with a cookie
 * (res->cookie, res->cookie_mss); FLOW_NEW for an ACK that answered a
 * cookie, whose flow, flagged CT_F_SYNPROXY in fresh, opens as if by its
 * SYN (res->cookie, res->client_isn, res->cookie_mss); FLOW_DROP for
 * another segment without SYN to a backend it would be SNATed to (snat),
 * which claims no port (STAT_DROP_NO_FLOW); FLOW_PASS to admit it as
 * usual.
 */
static __always_inline enum flow_verdict flow_syn_proxy(const struct packet *pkt, int snat,
							 struct ct_entry *fresh,
							 const struct datapath_config *cfg, __u64 now,
							 struct flow_result *res)
{
	if (tcp_opening(pkt)) {
		/* A retransmitted SYN of a flow begun before the flood follows
		 * its flow: its client may yet get the backend's SYN-ACK. */
		if (!syn_flood_due(cfg, fresh->svc_id, now) ||
		    bpf_map_lookup_elem(&ct_unconfirmed, &res->key) ||
		    syncookie_make(pkt, &res->cookie, &res->cookie_mss))
			return FLOW_PASS;
		syn_flood_count(cfg, fresh->svc_id, SYN_FLOOD_OPENED, now);
		res->reason = STAT_SYNCOOKIE_SENT;
		return FLOW_COOKIE;
	}
	/* A TCP segment without SYN and without state claims no port: the
	 * backend holds no connection on a new one, and a port an evicted
	 * flow left is not free. Its backend's next reply rebuilds an
	 * evicted flow (reverse_touch). Unless it answers a cookie. */
	if (!tcp_mid_connection(pkt))
		return FLOW_PASS;
	if (!syncookie_answered(pkt, &res->cookie, &res->client_isn)) {
		if (!snat)
			return FLOW_PASS; /* picked up mid-stream, as ever */
		res->reason = STAT_DROP_NO_FLOW;
		return FLOW_DROP;
	}
	res->cookie_mss = syncookie_mss(pkt, res->cookie, res->client_isn);
	fresh->flags |= CT_F_SYNPROXY;
	fresh->tcp_state = CT_TCP_SYN | CT_TCP_SEQ_KNOWN;
	syn_flood_count(cfg, fresh->svc_id, SYN_FLOOD_COMPLETED, now);
	count(STAT_SYNCOOKIE_VALID, 0);
	return FLOW_NEW;
}

/* Admit and track a new flow to a frontend. */
static __always_inline enum flow_verdict flow_start(void *ctx, __u32 ifindex, struct packet *pkt,
						    enum origin origin, enum hook_features features,
						    const struct datapath_config *cfg, __u64 now,
						    struct flow_result *res, struct ct_entry **ctp)
{
	struct frontend_key fkey = {
		.addr = pkt->daddr,
		.port = pkt->dport,
		.proto = pkt->proto,
	};
	struct ct_entry *fresh = &res->fresh;
	struct frontend *fe;
	struct pick pick;
	__u32 table_id, egress = 0;
	__u16 drop_flag, local_flag;
	int snat, err;

	fe = bpf_map_lookup_elem(&frontends, &fkey);
	if (!fe) {
		res->reason = STAT_PASS_NOT_SERVICE;
		return FLOW_PASS;
	}
	if (origin == ORIGIN_EXTERNAL) {
		if (!(fe->flags & FE_EXTERNAL)) {
			res->reason = STAT_PASS_INTERNAL;
			return FLOW_PASS;
		}
		table_id = fe->table_id;
		drop_flag = FE_DROP_IF_EMPTY;
		local_flag = FE_LOCAL_SET;
	} else {
		table_id = fe->internal_table_id;
		drop_flag = FE_INTERNAL_DROP_IF_EMPTY;
		local_flag = FE_INTERNAL_LOCAL_SET;
	}

	if (fe->flags & FE_SOURCE_RANGES) {
		struct source_range_key range = {
			.prefixlen = 64,
			.svc_id = bpf_htonl(fe->svc_id),
			.addr = pkt->saddr,
		};

		if (!bpf_map_lookup_elem(&source_ranges, &range)) {
			res->reason = STAT_DROP_SOURCE_RANGE;
			return FLOW_DROP;
		}
	}

	switch (pick_backend(fe, table_id, fe->flags & local_flag, &res->key, cfg->hash_seed, now, &pick)) {
	case PICK_OK:
		break;
	case PICK_EMPTY:
		if (fe->flags & drop_flag) {
			res->reason = STAT_DROP_NO_LOCAL_BACKEND;
			return FLOW_DROP;
		}
		return FLOW_REFUSE;
	default:
		res->reason = STAT_DROP_BAD_TABLE;
		return FLOW_DROP;
	}

	__builtin_memset(fresh, 0, sizeof(*fresh));
	fresh->created_ns = now;
	fresh->last_seen_ns = now;
	fresh->backend_id = pick.backend_id;
	fresh->svc_id = fe->svc_id;
	fresh->backend_addr = pick.backend.addr;
	fresh->backend_port = pick.backend.port;
	fresh->flags = origin_ct_flags(origin) | CT_F_UNCONFIRMED;
	if (fe->affinity_timeout)
		fresh->flags |= CT_F_AFFINITY;
	/* The node itself: delivered to the stack, never routed (always
	 * BE_LOCAL too, so never source-NATed but for a hairpin). */
	if (pick.backend.flags & BE_HOST)
		fresh->flags |= CT_F_HOST;
	if (pkt->proto == IPPROTO_TCP) {
		fresh->tcp_state = ct_tcp_next_state(0, pkt->tcp_flags) | CT_TCP_SEQ_KNOWN;
		fresh->seq_mark = seq_mark_of(pkt->tcp_seq);
	}

	/* Before the route: a SYN answered with a cookie costs no lookup. */
	if ((features & HOOK_SYN_PROXY) && pkt->proto == IPPROTO_TCP &&
	    origin == ORIGIN_EXTERNAL && !(pick.backend.flags & BE_HOST)) {
		snat = (fe->flags & FE_SNAT_REMOTE) && !(pick.backend.flags & BE_LOCAL);
		switch (flow_syn_proxy(pkt, snat, fresh, cfg, now, res)) {
		case FLOW_COOKIE:
			return FLOW_COOKIE;
		case FLOW_DROP:
			return FLOW_DROP;
		default:
			break;
		}
	}

	/* With the packet's length, so the route's MTU is checked: a packet
	 * too big (or a GSO packet, from TC) caches no next hop, and the hook
	 * routes it again, answering or measuring it by its segments. */
	if (!(fresh->flags & CT_F_HOST))
		egress = route_new_flow(ctx, pkt, ifindex, fresh, &res->fib);

	if (origin == ORIGIN_EXTERNAL) {
		snat = (fe->flags & FE_SNAT_REMOTE) && !(pick.backend.flags & BE_LOCAL);
		if (snat) {
			fresh->nat_addr = iface_snat_addr(egress, pkt->saddr, pkt->sport);
			if (!fresh->nat_addr)
				fresh->nat_addr = iface_snat_addr(ifindex, pkt->saddr, pkt->sport);
		}
	} else {
		/* A pod reaching itself through its service: the source must
		 * change, or the pod would see its own address coming in. */
		snat = pick.backend.addr == pkt->saddr;
		if (snat)
			fresh->nat_addr = cfg->hairpin_addr;
	}
	if (snat) {
		fresh->flags |= CT_F_SNAT;
		if (!fresh->nat_addr) {
			res->reason = STAT_DROP_NO_NODE_ADDR;
			return FLOW_DROP;
		}
		/* A TCP segment without SYN and without state claims no
		 * port: the backend holds no connection on a new one, and a
		 * port an evicted flow left is not free. Its backend's next
		 * reply rebuilds an evicted flow (reverse_touch). */
		if (tcp_mid_connection(pkt) && !(fresh->flags & CT_F_SYNPROXY)) {
			res->reason = STAT_DROP_NO_FLOW;
			return FLOW_DROP;
		}
	}

	err = nat_claim(ctx, &res->key, fresh, tcp_opening(pkt) || (fresh->flags & CT_F_SYNPROXY), cfg,
			now);
	if (err) {
		if (err == -3 && tcp_mid_connection(pkt)) {
			/* The backend has a connection from this client port
			 * already, another flow's: this one cannot go on. */
			res->reason = STAT_RST_REPLY_TUPLE_TAKEN;
			return FLOW_RESET;
		}
		if (err == -1)
			res->reason = STAT_DROP_NAT_EXHAUSTED;
		else if (err == -3)
			res->reason = STAT_DROP_REPLY_TUPLE_TAKEN;
		else
			res->reason = STAT_DROP_CT_FULL;
		return FLOW_DROP;
	}
	/* A new flow is unconfirmed: it can only displace other unconfirmed
	 * flows (see ct_unconfirmed in maps.h). */
	if (bpf_map_update_elem(&ct_unconfirmed, &res->key, fresh, BPF_NOEXIST)) {
		/* The tuple is tracked already: a retransmitted SYN, or another
		 * CPU was first. Follow a live entry; replace a dead one. */
		struct ct_entry *ct = bpf_map_lookup_elem(&ct_unconfirmed, &res->key);

		if (ct && ct_live_for_other_origin(ct, pkt, origin, cfg, now)) {
			nat_release(&res->key, fresh);
			res->reason = STAT_DROP_TUPLE_TAKEN;
			return FLOW_DROP;
		}
		if (ct && ct_usable(ct, pkt, origin, cfg, now)) {
			/* Give back what was claimed, unless it is the live
			 * entry's own reverse half, taken over in the claim.
			 * The packet goes on with a copy (see flow_pending). */
			if (!ct_same_reverse(fresh, ct))
				nat_release(&res->key, fresh);
			count_service(ct->svc_id, pkt->len, 0);
			*fresh = *ct;
			*ctp = fresh;
			return FLOW_PENDING;
		}
		/* The dead entry's reverse half goes, unless the claim took
		 * it over (the same port of the same backend came round). */
		if (ct && !ct_same_reverse(fresh, ct))
			nat_release(&res->key, ct);
		if (bpf_map_update_elem(&ct_unconfirmed, &res->key, fresh, BPF_ANY)) {
			nat_release(&res->key, fresh);
			res->reason = STAT_DROP_CT_FULL;
			return FLOW_DROP;
		}
	}
	*ctp = fresh;
	count(STAT_NEW_FLOW, 0);
	count_service(fe->svc_id, pkt->len, 1);
	if ((features & HOOK_SYN_PROXY) && tcp_opening(pkt) && origin == ORIGIN_EXTERNAL)
		syn_flood_count(cfg, fe->svc_id, SYN_FLOOD_OPENED, now);
	return FLOW_NEW;
}

/*
 * Confirm a confirmed flow's reverse half too, so that its replies take
 * the fast path and an eviction of its forward half is judged by the
 * confirmed flow's timeout (evicted_flow_alive).
 */
static __always_inline void nat_confirm_reverse(const struct ct_key *flow,
						const struct ct_entry *ct)
{
	struct nat_entry *rev;
	struct nat_key key;

	nat_key_of(flow, ct, &key);
	if (ct->flags & CT_F_SNAT) {
		rev = reverse_of_flow(flow, ct);
		if (rev)
			nat_confirm_entry(&key, rev);
		return;
	}
	rev = bpf_map_lookup_elem(&nat_unconfirmed, &key);
	if (rev && nat_entry_matches(rev, flow))
		nat_confirm_entry(&key, rev);
}

/*
 * Confirm a flow the SYN proxy opened (flow: its client tuple; key and
 * rev: its reverse half), once the proxy answered its backend's SYN-ACK:
 * the handshake is complete both ways then (its client completed it with
 * the cookie), though its client may not send again for a long while,
 * and nothing would confirm it before its unconfirmed entry timed out. A
 * SNAT flow's reverse half is confirmed in place; a flow without SNAT's
 * moves to nat at its next reply (reverse_touch), which keeps the copy
 * off this path's stack: the TC programs' is nearly full.
 */
static __always_inline void flow_confirm_proxied(const struct ct_key *flow, struct nat_entry *rev,
						 __u64 now)
{
	struct ct_entry *pending = bpf_map_lookup_elem(&ct_unconfirmed, flow);

	if (!pending || !ct_confirm(flow, pending, now))
		return;
	if (rev->flags & CT_F_SNAT)
		rev->flags &= ~CT_F_UNCONFIRMED;
}

/* Date an unconfirmed SNAT flow's reverse half from its client's side
 * (nat_keep_dated), as nat_ensure does for a confirmed one: a one-way
 * stream whose answers are rare stays alive by it. */
static __always_inline void snat_keep_dated(const struct ct_key *flow, const struct ct_entry *ct,
					    const struct datapath_config *cfg, __u64 now)
{
	struct nat_entry *rev = reverse_of_flow(flow, ct);

	if (rev)
		nat_keep_dated(rev, cfg, now);
}

/*
 * A packet of a live unconfirmed flow (pending, its entry in
 * ct_unconfirmed). The ACK that confirms a TCP flow moves it to conntrack:
 * FLOW_TRACKED, *ctp the confirmed entry. Otherwise the entry is touched
 * here (TCP state; once a second its date and its reverse half's, or for
 * a flow without SNAT its reply tuple, which may have been taken: then
 * the flow ends as in flow_touch) and the packet goes on with a copy of
 * it in res->fresh (FLOW_PENDING), so the hooks translate tracked packets
 * from conntrack or res->fresh only: each kind of entry the verifier
 * follows through a hook's whole path costs it a pass. An unconfirmed
 * flow's next hop is therefore looked up for each packet (a handshake's
 * few). A SNAT flow's port cannot be taken while it lives
 * (evicted_flow_alive).
 */
static __always_inline enum flow_verdict flow_pending(const struct packet *pkt,
						      struct ct_entry *pending,
						      enum hook_features features,
						      const struct datapath_config *cfg, __u64 now,
						      struct flow_result *res, struct ct_entry **ctp)
{
	struct ct_entry *confirmed;

	if (pkt->proto == IPPROTO_TCP) {
		if (!ct_seq_acceptable(pending, pkt)) {
			res->reason = out_of_window_reason(pkt);
			return FLOW_DROP;
		}
		ct_seq_track(pending, pkt);
	}
	if (ct_confirmed_by(pending, pkt->proto, pkt->tcp_flags, now)) {
		confirmed = ct_confirm(&res->key, pending, now);
		if (confirmed) {
			if ((features & HOOK_SYN_PROXY) && pkt->proto == IPPROTO_TCP &&
			    (confirmed->flags & CT_F_EXTERNAL) && !(confirmed->flags & CT_F_SYNPROXY))
				syn_flood_count(cfg, confirmed->svc_id, SYN_FLOOD_COMPLETED, now);
			nat_confirm_reverse(&res->key, confirmed);
			*ctp = confirmed;
			return FLOW_TRACKED;
		}
	}
	if (pkt->proto == IPPROTO_TCP)
		ct_add_tcp_state(pending, ct_tcp_next_state(0, pkt->tcp_flags));
	if (time_since(pending->last_seen_ns, now) > NSEC_PER_SEC) {
		pending->last_seen_ns = now;
		if (pending->flags & CT_F_SNAT)
			snat_keep_dated(&res->key, pending, cfg, now);
		else if (dnat_ensure(&res->key, pending, cfg, now) == NAT_TAKEN) {
			ct_delete(&res->key, pending);
			res->reason = tcp_mid_connection(pkt) ? STAT_RST_REPLY_TUPLE_TAKEN
							      : STAT_DROP_REPLY_TUPLE_TAKEN;
			return tcp_mid_connection(pkt) ? FLOW_RESET : FLOW_DROP;
		}
	}
	count_service(pending->svc_id, pkt->len, 0);
	res->fresh = *pending;
	*ctp = &res->fresh;
	return FLOW_PENDING;
}

/*
 * Forget a tracked flow that a packet may not follow (see ct_usable), and
 * its reverse half. Returns 1 when the packet is mid-connection TCP whose
 * backend is gone, or left the service port (the agent ended the flow):
 * the client is told (FLOW_RESET) rather than left to retransmit into a
 * drop (a segment without SYN starts no SNAT flow: STAT_DROP_NO_FLOW).
 */
static __always_inline int flow_forget_dead(const struct ct_entry *ct, const struct packet *pkt,
					    const struct datapath_config *cfg, __u64 now,
					    struct flow_result *res)
{
	int gone = (ct->flags & CT_F_ENDED) ||
		   (!ct_expired(ct, pkt->proto, cfg, now) && !ct_backend_alive(ct));
	int reset = gone && tcp_mid_connection(pkt);

	nat_release(&res->key, ct);
	if (ct->flags & CT_F_SYNPROXY)
		bpf_map_delete_elem(&synproxy_flows, &res->key);
	ct_delete(&res->key, ct);
	if (reset)
		res->reason = STAT_RST_BACKEND_GONE;
	return reset;
}

/*
 * Classify a packet to a port some frontend uses: a packet of a live
 * tracked flow (*ctp: its entry in conntrack), of a live unconfirmed one
 * (see flow_pending), a new flow (*ctp: res->fresh, tracked now), or
 * something to refuse, drop or pass. A SYN opening a connection skips the
 * unconfirmed table: the NOEXIST insert in flow_start catches a tuple
 * tracked there.
 */
static __always_inline enum flow_verdict flow_classify(void *ctx, __u32 ifindex, struct packet *pkt,
						       enum origin origin, enum hook_features features,
						       const struct datapath_config *cfg, __u64 now,
						       struct flow_result *res, struct ct_entry **ctp)
{
	struct ct_entry *ct, *pending;

	ct_key_from_packet(pkt, &res->key);
	ct = bpf_map_lookup_elem(&conntrack, &res->key);
	if (ct) {
		if (ct_live_for_other_origin(ct, pkt, origin, cfg, now)) {
			res->reason = STAT_DROP_TUPLE_TAKEN;
			return FLOW_DROP;
		}
		if (ct_usable(ct, pkt, origin, cfg, now)) {
			*ctp = ct;
			return FLOW_TRACKED;
		}
		if (flow_forget_dead(ct, pkt, cfg, now, res))
			return FLOW_RESET;
	} else if (!tcp_opening(pkt)) {
		pending = bpf_map_lookup_elem(&ct_unconfirmed, &res->key);
		if (pending) {
			if (ct_live_for_other_origin(pending, pkt, origin, cfg, now)) {
				res->reason = STAT_DROP_TUPLE_TAKEN;
				return FLOW_DROP;
			}
			if (ct_usable(pending, pkt, origin, cfg, now))
				return flow_pending(pkt, pending, features, cfg, now, res, ctp);
			if (flow_forget_dead(pending, pkt, cfg, now, res))
				return FLOW_RESET;
		}
	}
	return flow_start(ctx, ifindex, pkt, origin, features, cfg, now, res, ctp);
}

/*
 * Keep a tracked flow's entry (ct, confirmed, for res->key) current for
 * this packet: TCP state on every packet (written only on change); once a
 * second the timestamp, the client's affinity entry and the reverse half,
 * and the cached next hop is dropped so the packet is routed afresh.
 * Returns FLOW_TRACKED to go on; FLOW_DROP with the reason in res->reason
 * when the reverse half could not be restored; and when another flow holds
 * its reply tuple now, the flow ends here (its entry is deleted, so ct must
 * not be used after): FLOW_RESET for TCP mid-connection, FLOW_DROP
 * otherwise.
 */
static __always_inline enum flow_verdict flow_touch(void *ctx, struct flow_result *res,
						    struct ct_entry *ct,
						    const struct packet *pkt,
						    const struct datapath_config *cfg, __u64 now)
{
	const struct ct_key *key = &res->key;

	if (pkt->proto == IPPROTO_TCP) {
		if (!ct_seq_acceptable(ct, pkt)) {
			res->reason = out_of_window_reason(pkt);
			return FLOW_DROP;
		}
		ct_seq_track(ct, pkt);
		ct_add_tcp_state(ct, ct_tcp_next_state(0, pkt->tcp_flags));
	}
	if (time_since(ct->last_seen_ns, now) <= NSEC_PER_SEC)
		return FLOW_TRACKED;
	ct->last_seen_ns = now;
	ct->hop.ifindex = 0;
	if (ct->flags & CT_F_AFFINITY)
		affinity_touch(ct->svc_id, key->saddr, now);
	switch (nat_ensure(ctx, key, ct, cfg, now)) {
	case NAT_OK:
		break;
	case NAT_REPAIRED:
		count(STAT_NAT_REPAIRED, 0);
		break;
	case NAT_PORT_MOVED:
		count(STAT_NAT_PORT_MOVED, 0);
		break;
	case NAT_TAKEN:
		ct_delete(key, ct);
		if (tcp_mid_connection(pkt)) {
			res->reason = STAT_RST_REPLY_TUPLE_TAKEN;
			return FLOW_RESET;
		}
		res->reason = STAT_DROP_REPLY_TUPLE_TAKEN;
		return FLOW_DROP;
	default:
		res->reason = STAT_DROP_CT_FULL;
		return FLOW_DROP;
	}
	return FLOW_TRACKED;
}

/* The address and port a tracked flow's packets leave with. */
static __always_inline void flow_source(const struct ct_entry *ct, const struct packet *pkt,
					__be32 *saddr, __be16 *sport)
{
	if (ct->flags & CT_F_SNAT) {
		*saddr = ct->nat_addr;
		*sport = ct->nat_port;
	} else {
		*saddr = pkt->saddr;
		*sport = pkt->sport;
	}
}

/* Is a tracked flow over, by the datapath's configured timeouts? */
static __always_inline int ct_over(const struct ct_entry *ct, __u8 proto, __u64 now)
{
	const struct datapath_config *cfg = config_get();

	return cfg && ct_expired(ct, proto, cfg, now);
}

/*
 * Check, once a second, on FIN or RST, and on every reply of an
 * unconfirmed flow, that a reverse entry's forward half is still there
 * (rebuilding it if evicted) and still this flow, and that the flow is
 * not over. A reply marks an unconfirmed flow answered (CT_TCP_REPLY):
 * its client's ACK then confirms a TCP flow (flow_pending), and any packet
 * a UDP flow that has become a stream (CT_UDP_STREAM_NS). A flow is not
 * rebuilt when its backend was removed, when it was idle past its timeout
 * (by its reverse half's date, when the forward half is gone:
 * evicted_flow_alive), or when the agent ended it (its backend left the
 * port): a late reply does not bring it back. A RST or FIN out of the
 * backend's window changes nothing (see seq_in_window). Returns 0 to
 * translate the reply, -1 to drop it, counted as *reason: the reverse
 * entry is stale (deleted), or the reply out of window.
 */
static __always_inline int reverse_touch(const struct nat_key *key, struct nat_entry *rev,
					 const struct packet *pkt, __u64 now, enum stat *reason)
{
	int refresh = time_since(rev->last_seen_ns, now) > NSEC_PER_SEC;
	struct ct_entry *ct, rebuilt;
	int confirmed = 0;
	struct ct_key flow;

	if (key->proto == IPPROTO_TCP) {
		if (!nat_seq_acceptable(rev, pkt)) {
			*reason = out_of_window_reason(pkt);
			return -1;
		}
		nat_seq_track(rev, pkt);
	}
	*reason = STAT_DROP_STALE_NAT;

	if (!refresh && !(rev->flags & CT_F_UNCONFIRMED) &&
	    !(pkt->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)))
		return 0;
	ct_of_nat(key, rev, now, &flow, &rebuilt);
	ct = ct_lookup(&flow);
	if (!ct) {
		if (!evicted_flow_alive(key, rev, now)) {
			nat_forget(key, rev);
			return -1;
		}
		ct_insert(&flow, &rebuilt, BPF_NOEXIST);
		count(STAT_CT_REPAIRED, 0);
	} else if (!ct_answers_to(ct, key) || ct_over(ct, key->proto, now)) {
		/* The client tuple belongs to a newer flow now, or the flow
		 * is over: its next client packet starts a new one. */
		nat_forget(key, rev);
		return -1;
	} else {
		if (pkt->tcp_flags & TCP_FLAG_RST)
			ct_add_tcp_state(ct, CT_TCP_RST);
		if (pkt->tcp_flags & TCP_FLAG_FIN)
			ct_add_tcp_state(ct, CT_TCP_REPLY_FIN);
		if (refresh)
			ct->last_seen_ns = now;
		if (!(ct->flags & CT_F_UNCONFIRMED)) {
			/* Confirmed by its client meanwhile. */
			confirmed = 1;
		} else if (key->proto == IPPROTO_TCP ||
			   !ct_confirmed_by(ct, key->proto, pkt->tcp_flags, now)) {
			ct_add_tcp_state(ct, CT_TCP_REPLY);
		} else if (ct_confirm(&flow, ct, now)) {
			/* A UDP stream: ct is gone to conntrack, not used after. */
			confirmed = 1;
		}
	}
	if (refresh) {
		rev->last_seen_ns = now;
		rev->hop.ifindex = 0; /* re-route the client once a second */
		nat_mark_spill(key, rev);
	}
	if (confirmed)
		nat_confirm_entry(key, rev);
	return 0;
}

#endif /* XDPLB_FLOW_H */
