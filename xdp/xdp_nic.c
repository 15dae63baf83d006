//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_nic.c - the XDP program on the node's NIC: the north-south fast path.
 *
 * A packet to a NodePort, LoadBalancer ingress IP or externalIP is checked
 * against the frontend's source ranges, matched to its tracked flow or given
 * a backend (Maglev or ClientIP affinity), DNATed (and SNATed to the node
 * when the backend is elsewhere and the policy is Cluster) and forwarded.
 * Replies from remote backends to a SNAT port are translated back here, and
 * so are ICMP errors about translated flows. Anything else is left untouched
 * for the stack, after one parse and one lookup.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/parse.h"
#include "include/csum.h"
#include "include/counters.h"
#include "include/conntrack.h"
#include "include/maglev.h"
#include "include/nat.h"
#include "include/forward.h"
#include "include/reject.h"
#include "include/icmp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline int pass(enum stat reason, __u32 bytes)
{
	count(reason, bytes);
	return XDP_PASS;
}

static __always_inline int drop(enum stat reason, __u32 bytes)
{
	count(reason, bytes);
	return XDP_DROP;
}

/* No usable backend: refuse the client at once, or drop for policy Local. */
static __always_inline int refuse(struct xdp_md *ctx, struct packet *pkt,
				  const struct frontend *fe)
{
	if (fe->flags & FE_DROP_IF_EMPTY)
		return drop(STAT_DROP_NO_LOCAL_BACKEND, pkt->len);
	if (pkt->proto == IPPROTO_TCP) {
		count(STAT_REJECT_TCP, pkt->len);
		/* Never answer a RST with a RST. */
		if (pkt->tcp_flags & TCP_FLAG_RST)
			return XDP_DROP;
		return xdp_reply_tcp_rst(ctx, pkt);
	}
	count(STAT_REJECT_ICMP, pkt->len);
	return xdp_reply_icmp_port_unreachable(ctx, pkt);
}

/* Does the tracked backend still exist as it was when the flow started? */
static __always_inline int ct_backend_alive(const struct ct_entry *ct)
{
	struct backend be;

	return backend_get(ct->backend_id, &be) && be.addr == ct->backend_addr &&
	       be.port == ct->backend_port;
}

/*
 * May a packet follow this entry? Not when it expired, when a SYN reuses
 * the tuple of a closed connection, or when its backend is gone. The
 * reason is counted here.
 */
static __always_inline int ct_usable(const struct ct_entry *ct, const struct packet *pkt,
				     const struct datapath_config *cfg, __u64 now)
{
	if (!(ct->flags & CT_F_EXTERNAL))
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

static __always_inline __be32 iface_addr(__u32 ifindex)
{
	struct iface *dev = bpf_map_lookup_elem(&ifaces, &ifindex);

	return dev ? dev->addr : 0;
}

static __always_inline int port_has_frontend(__be16 port)
{
	__u32 p = bpf_ntohs(port), word = p / 64;
	__u64 *bits = bpf_map_lookup_elem(&frontend_ports, &word);

	return bits && ((*bits >> (p % 64)) & 1);
}

/*
 * The established fast path: a packet of a tracked flow whose backend is
 * alive. Once a second the entry's timestamp, its reverse half and its
 * cached next hop are refreshed; in between, the packet costs one conntrack
 * lookup, a backend check and the rewrite.
 */
static __always_inline int forward_tracked(struct xdp_md *ctx, struct packet *pkt,
					   const struct ct_key *flow, struct ct_entry *ct,
					   const struct datapath_config *cfg, __u64 now)
{
	struct bpf_fib_lookup fib;
	int refresh = now - ct->last_seen_ns > NSEC_PER_SEC;
	__be32 saddr = pkt->saddr;
	__be16 sport = pkt->sport;
	int fib_rc;

	if (pkt->proto == IPPROTO_TCP) {
		__u8 next = ct_tcp_next_state(ct->tcp_state, pkt->tcp_flags);

		if (next != ct->tcp_state)
			ct->tcp_state = next;
	}
	if (refresh) {
		ct->last_seen_ns = now;
		if (ct->flags & CT_F_AFFINITY)
			affinity_touch(ct->svc_id, flow->saddr, now);
		switch (nat_ensure(flow, ct, cfg)) {
		case NAT_OK:
			break;
		case NAT_REPAIRED:
			count(STAT_NAT_REPAIRED, 0);
			break;
		case NAT_PORT_MOVED:
			count(STAT_NAT_PORT_MOVED, 0);
			break;
		default:
			return drop(STAT_DROP_CT_FULL, pkt->len);
		}
	}

	count_service(ct->svc_id, pkt->len, 0);
	if (ct->flags & CT_F_SNAT) {
		saddr = ct->nat_addr;
		sport = ct->nat_port;
	}
	if (rewrite_tuple(pkt, saddr, sport, ct->backend_addr, ct->backend_port))
		return drop(STAT_DROP_ADJUST, pkt->len);
	if (!refresh && ct->hop.ifindex)
		return xdp_send(ctx, pkt, &ct->hop);
	fib_rc = fib_lookup_ipv4(ctx, pkt, pkt->daddr, &fib);
	return xdp_forward(ctx, pkt, &fib, fib_rc, &ct->hop);
}

/* A new flow to an external frontend: admit, choose, track, translate. */
static __always_inline int start_flow(struct xdp_md *ctx, struct packet *pkt,
				      const struct ct_key *flow, const struct datapath_config *cfg,
				      __u64 now)
{
	struct frontend_key fkey = {
		.addr = pkt->daddr,
		.port = pkt->dport,
		.proto = pkt->proto,
	};
	struct bpf_fib_lookup fib;
	struct frontend *fe;
	struct ct_entry fresh, *ct;
	struct pick pick;
	int fib_rc, err;
	__be32 saddr = pkt->saddr;
	__be16 sport = pkt->sport;

	fe = bpf_map_lookup_elem(&frontends, &fkey);
	if (!fe)
		return pass(STAT_PASS_NOT_SERVICE, pkt->len);
	if (!(fe->flags & FE_EXTERNAL))
		return pass(STAT_PASS_INTERNAL, pkt->len);

	if (fe->flags & FE_SOURCE_RANGES) {
		struct source_range_key range = {
			.prefixlen = 64,
			.svc_id = bpf_htonl(fe->svc_id),
			.addr = pkt->saddr,
		};

		if (!bpf_map_lookup_elem(&source_ranges, &range))
			return drop(STAT_DROP_SOURCE_RANGE, pkt->len);
	}

	switch (pick_backend(fe, flow, cfg->hash_seed, now, &pick)) {
	case PICK_OK:
		break;
	case PICK_EMPTY:
		return refuse(ctx, pkt, fe);
	default:
		return drop(STAT_DROP_BAD_TABLE, pkt->len);
	}

	__builtin_memset(&fresh, 0, sizeof(fresh));
	fresh.created_ns = now;
	fresh.last_seen_ns = now;
	fresh.backend_id = pick.backend_id;
	fresh.svc_id = fe->svc_id;
	fresh.backend_addr = pick.backend.addr;
	fresh.backend_port = pick.backend.port;
	fresh.flags = CT_F_EXTERNAL;
	if (fe->affinity_timeout)
		fresh.flags |= CT_F_AFFINITY;
	if (pkt->proto == IPPROTO_TCP)
		fresh.tcp_state = ct_tcp_next_state(0, pkt->tcp_flags);

	fib_rc = fib_lookup_ipv4(ctx, pkt, fresh.backend_addr, &fib);
	if (fib_rc == BPF_FIB_LKUP_RET_SUCCESS)
		next_hop_from_fib(&fresh.hop, &fib);
	if ((fe->flags & FE_SNAT_REMOTE) && !(pick.backend.flags & BE_LOCAL)) {
		fresh.flags |= CT_F_SNAT;
		fresh.nat_addr = iface_addr(fib.ifindex);
		if (!fresh.nat_addr)
			fresh.nat_addr = iface_addr(ctx->ingress_ifindex);
		if (!fresh.nat_addr)
			return drop(STAT_DROP_NO_NODE_ADDR, pkt->len);
	}

	err = nat_claim(flow, &fresh, cfg);
	if (err == -1)
		return drop(STAT_DROP_NAT_EXHAUSTED, pkt->len);
	if (err)
		return drop(STAT_DROP_CT_FULL, pkt->len);
	if (bpf_map_update_elem(&conntrack, flow, &fresh, BPF_NOEXIST)) {
		/* The tuple is tracked already: a retransmitted SYN, or another
		 * CPU was first. Follow a live entry; replace a dead one. */
		ct = bpf_map_lookup_elem(&conntrack, flow);
		if (ct && ct_usable(ct, pkt, cfg, now)) {
			nat_release(flow, &fresh);
			return forward_tracked(ctx, pkt, flow, ct, cfg, now);
		}
		if (ct)
			nat_release(flow, ct);
		if (bpf_map_update_elem(&conntrack, flow, &fresh, BPF_ANY)) {
			nat_release(flow, &fresh);
			return drop(STAT_DROP_CT_FULL, pkt->len);
		}
	}

	count(STAT_NEW_FLOW, 0);
	count_service(fe->svc_id, pkt->len, 1);
	if (fresh.flags & CT_F_SNAT) {
		saddr = fresh.nat_addr;
		sport = fresh.nat_port;
	}
	if (rewrite_tuple(pkt, saddr, sport, fresh.backend_addr, fresh.backend_port))
		return drop(STAT_DROP_ADJUST, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc, NULL);
}

/* Traffic from a client to a port some frontend uses. */
static __always_inline int serve_frontend_port(struct xdp_md *ctx, struct packet *pkt,
					       const struct datapath_config *cfg)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct ct_entry *ct;
	struct ct_key flow;

	ct_key_from_packet(pkt, &flow);
	/* A SYN starts a connection: skip the lookup that would miss; the
	 * NOEXIST insert in start_flow catches a tuple that is tracked. */
	if (pkt->proto == IPPROTO_TCP &&
	    (pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
		return start_flow(ctx, pkt, &flow, cfg, now);

	ct = bpf_map_lookup_elem(&conntrack, &flow);
	if (ct && (ct->flags & CT_F_EXTERNAL)) {
		if (ct_usable(ct, pkt, cfg, now))
			return forward_tracked(ctx, pkt, &flow, ct, cfg, now);
		if (!ct_expired(ct, pkt->proto, cfg, now) && !ct_backend_alive(ct) &&
		    pkt->proto == IPPROTO_TCP && !(pkt->tcp_flags & TCP_FLAG_SYN)) {
			/* Mid-connection and its backend is gone: tell the client. */
			nat_release(&flow, ct);
			bpf_map_delete_elem(&conntrack, &flow);
			count(STAT_RST_BACKEND_GONE, pkt->len);
			if (pkt->tcp_flags & TCP_FLAG_RST)
				return XDP_DROP;
			return xdp_reply_tcp_rst(ctx, pkt);
		}
		nat_release(&flow, ct);
		bpf_map_delete_elem(&conntrack, &flow);
	}
	return start_flow(ctx, pkt, &flow, cfg, now);
}

/* A reply from a remote backend to a SNAT port of this node. */
static __always_inline int serve_reply(struct xdp_md *ctx, struct packet *pkt,
				       const struct nat_key *key, struct nat_entry *rev)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	int refresh = now - rev->last_seen_ns > NSEC_PER_SEC;
	struct bpf_fib_lookup fib;
	struct ct_entry *ct, rebuilt;
	struct ct_key flow;
	int fib_rc;

	/* Once a second, and on FIN or RST, the forward half is checked. */
	if (refresh || (pkt->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))) {
		ct_of_nat(key, rev, now, &flow, &rebuilt);
		ct = bpf_map_lookup_elem(&conntrack, &flow);
		if (!ct) {
			bpf_map_update_elem(&conntrack, &flow, &rebuilt, BPF_NOEXIST);
			count(STAT_CT_REPAIRED, 0);
		} else if (ct->backend_addr != key->saddr || ct->backend_port != key->sport ||
			   ((ct->flags & CT_F_SNAT) &&
			    (ct->nat_addr != key->daddr || ct->nat_port != key->dport))) {
			/* The client tuple now belongs to a newer flow. */
			bpf_map_delete_elem(&nat, key);
			return drop(STAT_DROP_STALE_NAT, pkt->len);
		} else {
			if (pkt->tcp_flags & TCP_FLAG_RST)
				ct->tcp_state |= CT_TCP_RST;
			if (pkt->tcp_flags & TCP_FLAG_FIN)
				ct->tcp_state |= CT_TCP_FIN;
			if (refresh)
				ct->last_seen_ns = now;
		}
		if (refresh)
			rev->last_seen_ns = now;
	}

	count(STAT_REVERSE_NAT, 0);
	count_service(rev->svc_id, pkt->len, 0);
	if (rewrite_tuple(pkt, rev->frontend_addr, rev->frontend_port, rev->client_addr,
			  rev->client_port))
		return drop(STAT_DROP_ADJUST, pkt->len);
	if (!refresh && rev->hop.ifindex)
		return xdp_send(ctx, pkt, &rev->hop);
	fib_rc = fib_lookup_ipv4(ctx, pkt, pkt->daddr, &fib);
	return xdp_forward(ctx, pkt, &fib, fib_rc, &rev->hop);
}

static __always_inline int serve_icmp(struct xdp_md *ctx, struct packet *pkt)
{
	struct bpf_fib_lookup fib;
	struct icmp_quote *quote;
	struct nat_entry *rev;
	struct nat_key key;
	int fib_rc;

	quote = icmp_error_flow(pkt, &key, &rev);
	if (!quote)
		return pass(STAT_PASS_ICMP, pkt->len);
	fib_rc = fib_lookup_ipv4(ctx, pkt, rev->client_addr, &fib);
	icmp_error_translate(pkt, quote, rev);
	count(STAT_ICMP_TRANSLATED, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc, NULL);
}

static __always_inline int in_snat_range(const struct datapath_config *cfg, __be16 port)
{
	__u16 p = bpf_ntohs(port);

	return p >= cfg->snat_port_min && p <= cfg->snat_port_max;
}

SEC("xdp")
int xdplb_nic(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct datapath_config *cfg;
	struct packet pkt;

	switch (parse_packet(data, data_end, &pkt)) {
	case PARSE_OK:
		break;
	case PARSE_NOT_IPV4:
		return pass(STAT_PASS_NOT_IPV4, pkt.len);
	case PARSE_IP_OPTIONS:
		return pass(STAT_PASS_IP_OPTIONS, pkt.len);
	case PARSE_FRAGMENT:
		return pass(STAT_PASS_FRAGMENT, pkt.len);
	case PARSE_OTHER_L4:
		return pass(STAT_PASS_NOT_SERVICE, pkt.len);
	default:
		return pass(STAT_PASS_MALFORMED, pkt.len);
	}

	if (pkt.proto == IPPROTO_ICMP)
		return serve_icmp(ctx, &pkt);

	cfg = config_get();
	if (!cfg)
		return pass(STAT_PASS_NOT_SERVICE, pkt.len);
	if (port_has_frontend(pkt.dport))
		return serve_frontend_port(ctx, &pkt, cfg);
	if (in_snat_range(cfg, pkt.dport)) {
		struct nat_key key = {
			.saddr = pkt.saddr,
			.daddr = pkt.daddr,
			.sport = pkt.sport,
			.dport = pkt.dport,
			.proto = pkt.proto,
		};
		struct nat_entry *rev = bpf_map_lookup_elem(&nat, &key);

		if (rev)
			return serve_reply(ctx, &pkt, &key, rev);
	}
	return pass(STAT_PASS_NOT_SERVICE, pkt.len);
}
