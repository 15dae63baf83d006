/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * rewrite.h - the XDP programs' header rewrite of a translated packet:
 * addresses and ports, with incremental checksums (skb.h has the TC
 * programs' twin, through the skb helpers).
 */
#ifndef XDPLB_REWRITE_H
#define XDPLB_REWRITE_H

#include "parse.h"
#include "csum.h"

/*
 * Rewrite the IPv4 and L4 addresses/ports of a parsed TCP or UDP packet and
 * update the IP, TCP or UDP checksums incrementally.
 */
static __always_inline int xdp_rewrite_tuple(struct packet *pkt, __be32 saddr, __be16 sport,
					     __be32 daddr, __be16 dport)
{
	struct iphdr *ip = pkt->ip;
	__u32 addr_delta = 0, l4_delta;

	addr_delta = csum_delta32(addr_delta, ip->saddr, saddr);
	addr_delta = csum_delta32(addr_delta, ip->daddr, daddr);
	ip->check = csum_apply(ip->check, addr_delta);
	ip->saddr = saddr;
	ip->daddr = daddr;

	l4_delta = csum_delta16(addr_delta, pkt->sport, sport);
	l4_delta = csum_delta16(l4_delta, pkt->dport, dport);

	if (pkt->proto == IPPROTO_TCP) {
		struct tcphdr *tcp = pkt->l4;

		if ((void *)(tcp + 1) > pkt->data_end)
			return -1;
		tcp->check = csum_apply(tcp->check, l4_delta);
		tcp->source = sport;
		tcp->dest = dport;
	} else {
		struct udphdr *udp = pkt->l4;

		if ((void *)(udp + 1) > pkt->data_end)
			return -1;
		udp->check = csum_apply_udp(udp->check, l4_delta);
		udp->source = sport;
		udp->dest = dport;
	}
	pkt->saddr = saddr;
	pkt->daddr = daddr;
	pkt->sport = sport;
	pkt->dport = dport;
	return 0;
}

#endif /* XDPLB_REWRITE_H */
