/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * forward.h - sending a translated packet on its way from XDP.
 *
 * bpf_fib_lookup() picks the egress device and next hop. The packet leaves
 * with XDP_TX (same device) or XDP_REDIRECT through tx_ports. When XDP cannot
 * finish (next hop not resolved yet, or an egress device outside tx_ports)
 * the translated packet is passed up with a metadata note; the TC ingress
 * program on the same device reads it and finishes with bpf_redirect_neigh().
 */
#ifndef XDPLB_FORWARD_H
#define XDPLB_FORWARD_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "counters.h"
#include "route.h"
#include "reject.h"
#include "handoff.h"

/*
 * TTL minus one, and the header checksum updated for it (RFC 1624): the
 * 16-bit word (TTL, protocol) drops by 0x0100, so the checksum rises by
 * as much, with the end-around carry. Computed from the old checksum
 * alone: reading the word back after writing its TTL byte would stall the
 * CPU on a partial store.
 */
static __always_inline void ip_decrease_ttl(struct iphdr *ip)
{
	__u32 check = ip->check;

	check += bpf_htons(0x0100);
	ip->check = (__u16)(check + (check >= 0xffff));
	ip->ttl--;
}

/* Pass a translated packet up for the TC program to redirect. */
static __always_inline int handoff_to_tc(struct xdp_md *ctx, __u32 ifindex, enum stat reason,
					 __u32 bytes)
{
	struct xdp_handoff *meta;
	void *data;

	count(reason, bytes);
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(*meta)) == 0) {
		meta = (void *)(long)ctx->data_meta;
		data = (void *)(long)ctx->data;
		if ((void *)(meta + 1) <= data) {
			meta->magic = XDP_HANDOFF_MAGIC;
			meta->ifindex = ifindex;
		}
	}
	/* Without metadata the stack forwards it (works for DNAT-only flows). */
	return XDP_PASS;
}

/*
 * The MTU of the cached next hop's device when the packet, as it is (a
 * translation does not change its size), is too big for it; 0 when it
 * fits or cannot be measured (the redirect then fails and hands it on).
 * XDP_TX leaves by the device the packet came in on, which it fitted. The
 * packet is measured by its IPv4 length, as the route lookup does: the
 * frame's length would count an Ethernet header that an L3 device (a
 * tunnel) does not have.
 */
static __always_inline __u32 hop_mtu_exceeded(struct xdp_md *ctx, const struct packet *pkt,
					      const struct next_hop *hop)
{
	__u32 mtu = pkt->tot_len;

	if (pkt->tot_len <= MTU_CHECK_MIN || hop->ifindex == ctx->ingress_ifindex)
		return 0;
	if (bpf_check_mtu(ctx, hop->ifindex, &mtu, 0, 0) != BPF_MTU_CHK_RET_FRAG_NEEDED)
		return 0;
	return mtu;
}

/*
 * Tell the sender of a packet too big for its way on (DF set) the MTU it
 * must fit, with an ICMP fragmentation needed built from the packet as it
 * arrived: the sender's own addresses and ports are quoted, so path MTU
 * discovery works through the translation.
 */
static __always_inline int xdp_reply_too_big(struct xdp_md *ctx, struct packet *pkt, __u32 mtu)
{
	__u32 bytes = pkt->len;
	int verdict;

	verdict = xdp_reply_icmp_unreachable(ctx, pkt, ICMP_FRAG_NEEDED, (__u16)mtu);
	if (verdict == XDP_TX)
		count(STAT_REJECT_TOO_BIG, bytes);
	return verdict;
}

/* A translated packet too big for its egress device, DF clear: the stack
 * fragments it on its way. */
static __always_inline int pass_to_fragment(const struct packet *pkt)
{
	count(STAT_PASS_FRAG_NEEDED, pkt->len);
	return XDP_PASS;
}

/* Send a translated packet to a known next hop. */
static __always_inline int xdp_send(struct xdp_md *ctx, struct packet *pkt,
				    const struct next_hop *hop)
{
	__u32 bytes = pkt->len;

	if (pkt->ip->ttl <= 1) {
		count(STAT_DROP_TTL, bytes);
		return XDP_DROP;
	}
	ip_decrease_ttl(pkt->ip);
	if (hop->ifindex == ctx->ingress_ifindex) {
		__builtin_memcpy(pkt->eth->h_dest, hop->dmac, ETH_ALEN);
		__builtin_memcpy(pkt->eth->h_source, hop->smac, ETH_ALEN);
		count(STAT_TX, bytes);
		return XDP_TX;
	}
	if (bpf_redirect_map(&tx_ports, hop->ifindex, 0) == XDP_REDIRECT) {
		__builtin_memcpy(pkt->eth->h_dest, hop->dmac, ETH_ALEN);
		__builtin_memcpy(pkt->eth->h_source, hop->smac, ETH_ALEN);
		count(STAT_REDIRECT, bytes);
		return XDP_REDIRECT;
	}
	return handoff_to_tc(ctx, hop->ifindex, STAT_PASS_TO_STACK, bytes);
}

/*
 * Forward a translated packet after a FIB lookup of its final destination.
 * A successful result is stored in *cache (if given) for the flow's next
 * packets; anything else clears it.
 */
static __always_inline int xdp_forward(struct xdp_md *ctx, struct packet *pkt,
				       const struct bpf_fib_lookup *fib, int fib_rc,
				       struct next_hop *cache)
{
	struct next_hop hop;
	__u32 bytes = pkt->len;

	if (fib_rc == BPF_FIB_LKUP_RET_SUCCESS) {
		next_hop_from_fib(&hop, fib);
		if (cache)
			*cache = hop;
		return xdp_send(ctx, pkt, &hop);
	}
	if (cache)
		cache->ifindex = 0;
	if (pkt->ip->ttl <= 1) {
		count(STAT_DROP_TTL, bytes);
		return XDP_DROP;
	}
	switch (fib_rc) {
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		ip_decrease_ttl(pkt->ip);
		return handoff_to_tc(ctx, fib->ifindex, STAT_PASS_NO_NEIGH, bytes);
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		/* The callers answer a flow's DF-set packets before
		 * translating them; the rest is the stack's to fragment. */
		return pass_to_fragment(pkt);
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		count(STAT_DROP_FWD_DISABLED, bytes);
		return XDP_DROP;
	default:
		count(STAT_DROP_NO_ROUTE, bytes);
		return XDP_DROP;
	}
}

#endif /* XDPLB_FORWARD_H */
