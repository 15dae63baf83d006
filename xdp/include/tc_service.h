/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tc_service.h - the service and reply paths of the TC programs, the same
 * on a pod's interface (traffic from this node, ORIGIN_INTERNAL) and on the
 * NIC (traffic XDP left to TC, or all of it with XDP off).
 */
#ifndef XDPLB_TC_SERVICE_H
#define XDPLB_TC_SERVICE_H

#include "maps.h"
#include "parse.h"
#include "counters.h"
#include "conntrack.h"
#include "flow.h"
#include "skb.h"
#include "frag.h"
#include "icmp.h"

/*
 * Translate a packet of a flow of service svc_id and send it on, to the
 * next hop cached in *hop or a fresh route (cached there). A packet too
 * big for its way on is answered untranslated (DF set) or left to the
 * stack to fragment.
 */
static __always_inline int tc_translate_and_send(struct __sk_buff *skb, struct packet *pkt,
						 struct flow_result *res, __u32 svc_id,
						 struct next_hop *hop, __be32 saddr, __be16 sport,
						 __be32 daddr, __be16 dport)
{
	struct packet orig = *pkt;
	int rc;

	/* The FIB parameters live in the scratch map: the stack is full. */
	rc = skb_route(skb, pkt, skb->ifindex, saddr, sport, daddr, dport, hop, &res->fib);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && dont_fragment(pkt))
		return skb_reply_too_big(skb, pkt, res->fib.mtu_result);
	if (skb_rewrite_tuple(skb, pkt, saddr, sport, daddr, dport)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	frag_remember(&orig, pkt, svc_id, 0);
	return skb_send(skb, &res->fib, rc, hop);
}

/* Translate a packet for a backend at this node's address and let it go
 * on into the stack, which delivers it locally. */
static __always_inline int tc_deliver_to_host(struct __sk_buff *skb, struct packet *pkt,
					      __u32 svc_id, __be32 saddr, __be16 sport,
					      __be32 daddr, __be16 dport)
{
	struct packet orig = *pkt;

	if (skb_rewrite_tuple(skb, pkt, saddr, sport, daddr, dport)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	frag_remember(&orig, pkt, svc_id, FRAG_F_HOST);
	count(STAT_PASS_TO_HOST, skb->len);
	return TC_ACT_OK;
}

/* A packet to a port some frontend uses. */
static __always_inline int tc_serve(struct __sk_buff *skb, struct packet *pkt, enum origin origin,
				    const struct datapath_config *cfg)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct flow_result *res = flow_result_get();
	struct ct_entry *ct = NULL;
	__be32 saddr;
	__be16 sport;

	if (!res)
		return TC_ACT_UNSPEC;
	switch (flow_classify(skb, skb->ifindex, pkt, origin, HOOK_PLAIN, cfg, now, res, &ct)) {
	case FLOW_PASS:
		return TC_ACT_UNSPEC;
	case FLOW_DROP:
		count(res->reason, skb->len);
		return TC_ACT_SHOT;
	case FLOW_REFUSE:
		return skb_refuse(skb, pkt,
				  pkt->proto == IPPROTO_TCP ? STAT_REJECT_TCP : STAT_REJECT_ICMP);
	case FLOW_RESET:
		return skb_refuse(skb, pkt, res->reason);
	case FLOW_COOKIE:
		/* Not without HOOK_SYN_PROXY: admitted as usual. */
		return TC_ACT_UNSPEC;
	case FLOW_NEW:
	case FLOW_PENDING:
		break;
	case FLOW_TRACKED:
		if (!ct)
			break;
		switch (flow_touch(skb, res, ct, pkt, cfg, now)) {
		case FLOW_TRACKED:
			break;
		case FLOW_RESET:
			return skb_refuse(skb, pkt, res->reason);
		default:
			count(res->reason, skb->len);
			return TC_ACT_SHOT;
		}
		count_service(ct->svc_id, skb->len, 0);
		break;
	}
	if (!ct) {
		count(STAT_DROP_CT_FULL, skb->len);
		return TC_ACT_SHOT;
	}
	/* Its sequence numbers are translated in XDP only. */
	if (ct->flags & CT_F_SYNPROXY) {
		count(STAT_DROP_SYNPROXY_IN_TC, skb->len);
		return TC_ACT_SHOT;
	}
	flow_source(ct, pkt, &saddr, &sport);
	if (ct->flags & CT_F_HOST)
		return tc_deliver_to_host(skb, pkt, ct->svc_id, saddr, sport, ct->backend_addr,
					  ct->backend_port);
	return tc_translate_and_send(skb, pkt, res, ct->svc_id, &ct->hop, saddr, sport, ct->backend_addr,
				     ct->backend_port);
}

/* Add delta to the TCP sequence field at offset field of the TCP header,
 * keeping the checksum. Direct packet pointers are invalid afterwards. */
static __always_inline int skb_tcp_seq_shift(struct __sk_buff *skb, const struct packet *pkt,
					     __u32 field, __u32 delta)
{
	__be32 from, to;

	if (bpf_skb_load_bytes(skb, pkt->l4_off + field, &from, sizeof(from)))
		return -1;
	to = bpf_htonl(bpf_ntohl(from) + delta);
	if (bpf_l4_csum_replace(skb, l4_csum_off(pkt), from, to, sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, pkt->l4_off + field, &to, sizeof(to), 0) ? -1 : 0;
}

/*
 * A reply of a backend on this node in a flow the SYN proxy opened: the
 * TC side of synproxy_backend in xdp_nic.c. The proxy's ACK goes back
 * into the pod's interface. Returns -1 to translate the reply and send it
 * on, or the verdict.
 */
static __always_inline int tc_synproxy_backend(struct __sk_buff *skb, struct packet *pkt,
					       const struct nat_key *key, struct nat_entry *rev)
{
	/* Two bytes of padding put the IPv4 header on a 4-byte boundary
	 * (see skb_refuse). */
	__u8 buf[2 + TCP_FRAME_LEN] __attribute__((aligned(8)));
	struct ethhdr *eth = (void *)(buf + 2);
	struct iphdr *ip = (void *)(eth + 1);
	struct synproxy_seq *sp;
	__u32 bytes = skb->len;
	__be32 ack_seq;
	struct tcp_frame f;
	struct ct_key flow;
	__u32 delta = 0;

	if (key->proto != IPPROTO_TCP)
		return -1;
	ct_key_of_nat(key, rev, &flow);
	sp = bpf_map_lookup_elem(&synproxy_flows, &flow);
	if (!sp) {
		count(STAT_DROP_SYNPROXY_LOST, bytes);
		return TC_ACT_SHOT;
	}
	if (bpf_skb_load_bytes(skb, pkt->l4_off + offsetof(struct tcphdr, ack_seq), &ack_seq,
			       sizeof(ack_seq)))
		goto fail;
	switch (synproxy_reply_plan(sp, pkt->tcp_flags, pkt->tcp_seq, bpf_ntohl(ack_seq), &delta)) {
	case SYNPROXY_REPLY_FIRST_ANSWER:
		flow_confirm_proxied(&flow, rev, bpf_ktime_get_coarse_ns());
		/* fall through */
	case SYNPROXY_REPLY_ANSWER:
		__builtin_memset(buf, 0, sizeof(buf));
		if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)))
			goto fail;
		synproxy_ack_frame(&f, pkt, eth, sp);
		__builtin_memcpy(eth->h_dest, f.dmac, ETH_ALEN);
		__builtin_memcpy(eth->h_source, f.smac, ETH_ALEN);
		eth->h_proto = bpf_htons(ETH_P_IP);
		tcp_frame_fill(&f, ip, (void *)(ip + 1), sizeof(struct tcphdr));
		if (bpf_skb_change_tail(skb, TCP_FRAME_LEN, 0) ||
		    bpf_skb_store_bytes(skb, 0, eth, TCP_FRAME_LEN, 0))
			goto fail;
		count(STAT_SYNPROXY_ACK, bytes);
		return bpf_redirect(skb->ifindex, 0);
	case SYNPROXY_REPLY_SHIFT:
		if (skb_tcp_seq_shift(skb, pkt, offsetof(struct tcphdr, seq), delta))
			goto fail;
		return -1;
	default:
		count(STAT_DROP_SYNPROXY_PENDING, bytes);
		return TC_ACT_SHOT;
	}
fail:
	count(STAT_DROP_ADJUST, bytes);
	return TC_ACT_SHOT;
}

/* A reply of a backend: translate it back to what its client expects. */
static __always_inline int tc_reply(struct __sk_buff *skb, struct packet *pkt,
				    const struct nat_key *key, struct nat_entry *rev)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct flow_result *res = flow_result_get();
	__u32 svc_id = rev->svc_id;
	enum stat reason;

	if (!res)
		return TC_ACT_UNSPEC;
	if (reverse_touch(key, rev, pkt, now, &reason)) {
		count(reason, skb->len);
		return TC_ACT_SHOT;
	}
	if (rev->flags & CT_F_SYNPROXY) {
		int verdict = tc_synproxy_backend(skb, pkt, key, rev);

		if (verdict >= 0)
			return verdict;
	}
	count(STAT_REVERSE_NAT, 0);
	count_service(svc_id, skb->len, 0);
	return tc_translate_and_send(skb, pkt, res, svc_id, &rev->hop, rev->frontend_addr,
				     rev->frontend_port, rev->client_addr, rev->client_port);
}

/* Whether pkt is the reply of a SNAT flow: to a SNAT port, with NAT state. */
static __always_inline int is_snat_reply(const struct datapath_config *cfg, const struct packet *pkt)
{
	struct nat_key key;

	if (!snat_port_in_range(cfg, pkt->dport))
		return 0;
	nat_key_set(&key, pkt->saddr, pkt->daddr, pkt->sport, pkt->dport, pkt->proto);
	return reverse_lookup(&key, 1) != NULL;
}

/* Look for a reverse entry matching the packet as a reply. */
static __always_inline int tc_try_reply(struct __sk_buff *skb, struct packet *pkt)
{
	struct nat_entry *rev;
	struct nat_key key;

	nat_key_set(&key, pkt->saddr, pkt->daddr, pkt->sport, pkt->dport, pkt->proto);
	rev = reverse_lookup(&key, 1);
	if (!rev)
		return -1;
	return tc_reply(skb, pkt, &key, rev);
}

/* A later fragment: translate it as its first fragment was. */
static __always_inline int tc_later_fragment(struct __sk_buff *skb, struct packet *pkt)
{
	struct frag_key key;
	struct frag_entry *entry;
	__u32 flags;

	if (pkt->proto != IPPROTO_UDP && pkt->proto != IPPROTO_TCP)
		return TC_ACT_UNSPEC;
	frag_key_of(pkt, &key);
	entry = bpf_map_lookup_elem(&fragments, &key);
	if (!entry)
		return TC_ACT_UNSPEC; /* not of a translated datagram: the stack's */
	count(STAT_TC_FRAGMENT, skb->len);
	count_service(entry->svc_id, skb->len, 0);
	flags = entry->flags;
	if (skb_rewrite_addrs(skb, pkt, entry->saddr, entry->daddr)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	if (flags & FRAG_F_HOST)
		return TC_ACT_OK; /* the stack delivers it, as its first */
	return skb_forward(skb, pkt, skb->ifindex);
}

/* An ICMP error about a translated flow (see icmp.h): rewrite it and send
 * it on; anything else is left alone. */
static __always_inline int tc_icmp_error(struct __sk_buff *skb, struct packet *pkt)
{
	struct icmp_rewrite rw;
	struct icmp_quote *quote;

	quote = icmp_error_quote(pkt);
	if (!quote || icmp_error_lookup(pkt, quote, &rw, 1))
		return TC_ACT_UNSPEC;
	icmp_error_rewrite(pkt, quote, &rw);
	count(STAT_ICMP_TRANSLATED, skb->len);
	if (rw.to_host) {
		count(STAT_PASS_TO_HOST, skb->len);
		return TC_ACT_OK;
	}
	return skb_forward(skb, pkt, skb->ifindex);
}

#endif /* XDPLB_TC_SERVICE_H */
