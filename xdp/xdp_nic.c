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

static __always_inline __be32 iface_addr(__u32 ifindex)
{
	struct iface *dev = bpf_map_lookup_elem(&ifaces, &ifindex);

	return dev ? dev->addr : 0;
}

/* Traffic from a client to an external frontend. */
static __always_inline int serve_frontend(struct xdp_md *ctx, struct packet *pkt,
					  const struct frontend *fe, const struct datapath_config *cfg)
{
	struct bpf_fib_lookup fib;
	struct ct_entry *ct, fresh;
	struct ct_key flow;
	struct pick pick;
	__u64 now = bpf_ktime_get_ns();
	int new_flow = 0, fib_rc;
	__be32 saddr, daddr;
	__be16 sport, dport;

	if (fe->flags & FE_SOURCE_RANGES) {
		struct source_range_key range = {
			.prefixlen = 64,
			.svc_id = bpf_htonl(fe->svc_id),
			.addr = pkt->saddr,
		};

		if (!bpf_map_lookup_elem(&source_ranges, &range))
			return drop(STAT_DROP_SOURCE_RANGE, pkt->len);
	}

	ct_key_from_packet(pkt, &flow);
	ct = bpf_map_lookup_elem(&conntrack, &flow);
	if (ct) {
		if (ct_expired(ct, pkt->proto, cfg, now) || ct_reused_tuple(ct, pkt->tcp_flags)) {
			count(STAT_CT_EXPIRED, 0);
			nat_release(&flow, ct);
			bpf_map_delete_elem(&conntrack, &flow);
			ct = NULL;
		} else if (!ct_backend_alive(ct)) {
			nat_release(&flow, ct);
			bpf_map_delete_elem(&conntrack, &flow);
			if (pkt->proto == IPPROTO_TCP && !(pkt->tcp_flags & TCP_FLAG_SYN)) {
				count(STAT_RST_BACKEND_GONE, pkt->len);
				if (pkt->tcp_flags & TCP_FLAG_RST)
					return XDP_DROP;
				return xdp_reply_tcp_rst(ctx, pkt);
			}
			count(STAT_RESELECT_BACKEND_GONE, 0);
			ct = NULL;
		}
	}

	if (ct) {
		ct_touch(ct, pkt->proto, pkt->tcp_flags, now);
		affinity_touch(fe, flow.saddr, now);
		switch (nat_ensure(&flow, ct, cfg)) {
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
		fib_rc = fib_lookup_ipv4(ctx, pkt, ct->backend_addr, &fib);
	} else {
		switch (pick_backend(fe, &flow, cfg->hash_seed, now, &pick)) {
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
		if (pkt->proto == IPPROTO_TCP)
			fresh.tcp_state = ct_tcp_next_state(0, pkt->tcp_flags);

		fib_rc = fib_lookup_ipv4(ctx, pkt, fresh.backend_addr, &fib);
		if ((fe->flags & FE_SNAT_REMOTE) && !(pick.backend.flags & BE_LOCAL)) {
			fresh.flags |= CT_F_SNAT;
			fresh.nat_addr = iface_addr(fib.ifindex);
			if (!fresh.nat_addr)
				fresh.nat_addr = iface_addr(ctx->ingress_ifindex);
			if (!fresh.nat_addr)
				return drop(STAT_DROP_NO_NODE_ADDR, pkt->len);
		}
		if (nat_claim(&flow, &fresh, cfg))
			return drop((fresh.flags & CT_F_SNAT) ? STAT_DROP_NAT_EXHAUSTED
							      : STAT_DROP_CT_FULL,
				    pkt->len);
		if (bpf_map_update_elem(&conntrack, &flow, &fresh, BPF_NOEXIST)) {
			/* Lost a race with another CPU for this tuple: use its entry. */
			nat_release(&flow, &fresh);
			ct = bpf_map_lookup_elem(&conntrack, &flow);
			if (!ct)
				return drop(STAT_DROP_CT_FULL, pkt->len);
		} else {
			ct = &fresh;
			new_flow = 1;
			count(STAT_NEW_FLOW, 0);
		}
	}

	count_service(fe->svc_id, pkt->len, new_flow);
	daddr = ct->backend_addr;
	dport = ct->backend_port;
	if (ct->flags & CT_F_SNAT) {
		saddr = ct->nat_addr;
		sport = ct->nat_port;
	} else {
		saddr = pkt->saddr;
		sport = pkt->sport;
	}
	if (rewrite_tuple(pkt, saddr, sport, daddr, dport))
		return drop(STAT_DROP_ADJUST, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc);
}

/* A reply from a remote backend to a SNAT port of this node. */
static __always_inline int serve_reply(struct xdp_md *ctx, struct packet *pkt,
				       const struct nat_key *key, const struct nat_entry *rev)
{
	struct bpf_fib_lookup fib;
	struct ct_entry *ct, rebuilt;
	struct ct_key flow;
	__u64 now = bpf_ktime_get_ns();
	int fib_rc;

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
		if (pkt->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST))
			ct->tcp_state |= (pkt->tcp_flags & TCP_FLAG_RST) ? CT_TCP_RST : CT_TCP_FIN;
		if (now - ct->last_seen_ns > NSEC_PER_SEC)
			ct->last_seen_ns = now;
	}

	count(STAT_REVERSE_NAT, 0);
	count_service(rev->svc_id, pkt->len, 0);
	fib_rc = fib_lookup_ipv4(ctx, pkt, rev->client_addr, &fib);
	if (rewrite_tuple(pkt, rev->frontend_addr, rev->frontend_port, rev->client_addr,
			  rev->client_port))
		return drop(STAT_DROP_ADJUST, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc);
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
	return xdp_forward(ctx, pkt, &fib, fib_rc);
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
	struct frontend_key fkey = {};
	struct frontend *fe;
	struct datapath_config *cfg;
	struct packet pkt;

	count(STAT_RX, data_end - data);
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

	fkey.addr = pkt.daddr;
	fkey.port = pkt.dport;
	fkey.proto = pkt.proto;
	fe = bpf_map_lookup_elem(&frontends, &fkey);
	if (fe) {
		if (!(fe->flags & FE_EXTERNAL))
			return pass(STAT_PASS_INTERNAL, pkt.len);
		return serve_frontend(ctx, &pkt, fe, cfg);
	}

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
