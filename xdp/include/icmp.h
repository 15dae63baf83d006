/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * icmp.h - ICMP errors about translated flows.
 *
 * A router or backend that cannot deliver a packet xdplb sent (for example
 * "fragmentation needed" for path MTU discovery) reports it to the packet's
 * source: the node's SNAT address. The quoted packet is looked up as if it
 * were a reply; on a match the error is rewritten to quote the packet the
 * client actually sent and is forwarded to the client.
 */
#ifndef XDPLB_ICMP_H
#define XDPLB_ICMP_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "nat.h"

/* The part of an ICMP error xdplb reads and rewrites. */
struct icmp_quote {
	struct iphdr ip;
	__be16 sport;
	__be16 dport;
	__be16 len_or_seq_hi; /* UDP length, or upper half of the TCP sequence */
	__be16 check_or_seq_lo; /* UDP checksum, or lower half of the TCP sequence */
};

static __always_inline int icmp_is_error(const struct icmphdr *icmp)
{
	return icmp->type == ICMP_DEST_UNREACH || icmp->type == ICMP_TIME_EXCEEDED;
}

/*
 * Look up the flow an ICMP error quotes. Returns the quote, or NULL when the
 * packet is not an error about a flow with reverse NAT state.
 */
static __always_inline struct icmp_quote *icmp_error_flow(const struct packet *pkt,
							  struct nat_key *key,
							  struct nat_entry **entry)
{
	struct icmphdr *icmp = pkt->l4;
	struct icmp_quote *quote;

	if ((void *)(icmp + 1) > pkt->data_end || !icmp_is_error(icmp))
		return NULL;
	quote = (void *)(icmp + 1);
	if ((void *)(quote + 1) > pkt->data_end)
		return NULL;
	if (quote->ip.version != 4 || quote->ip.ihl != 5 ||
	    (quote->ip.protocol != IPPROTO_TCP && quote->ip.protocol != IPPROTO_UDP))
		return NULL;
	/* The quoted packet was sent by us to the backend; the error is
	 * addressed to its source. */
	if (quote->ip.saddr != pkt->daddr)
		return NULL;

	key->saddr = quote->ip.daddr;
	key->daddr = quote->ip.saddr;
	key->sport = quote->dport;
	key->dport = quote->sport;
	key->proto = quote->ip.protocol;
	key->pad[0] = key->pad[1] = key->pad[2] = 0;
	*entry = reverse_lookup(key);
	return *entry ? quote : NULL;
}

/* Rewrite an ICMP error so that it quotes the client's own packet. */
static __always_inline void icmp_error_translate(struct packet *pkt, struct icmp_quote *quote,
						 const struct nat_entry *entry)
{
	struct iphdr *ip = pkt->ip;
	struct icmphdr *icmp = pkt->l4;
	__u32 quote_ip_delta = 0, icmp_delta, outer_delta = 0;
	__u16 old_ip_check, l4_check;
	__be32 new_outer_saddr = ip->saddr;

	/* The quoted header: client -> frontend, as the client sent it. */
	quote_ip_delta = csum_delta32(quote_ip_delta, quote->ip.saddr, entry->client_addr);
	quote_ip_delta = csum_delta32(quote_ip_delta, quote->ip.daddr, entry->frontend_addr);
	old_ip_check = quote->ip.check;
	quote->ip.check = csum_apply(old_ip_check, quote_ip_delta);

	icmp_delta = csum_delta16(quote_ip_delta, old_ip_check, quote->ip.check);
	icmp_delta = csum_delta16(icmp_delta, quote->sport, entry->client_port);
	icmp_delta = csum_delta16(icmp_delta, quote->dport, entry->frontend_port);

	if (quote->ip.protocol == IPPROTO_UDP && quote->check_or_seq_lo != 0) {
		__u32 udp_delta = csum_delta16(quote_ip_delta, quote->sport, entry->client_port);

		udp_delta = csum_delta16(udp_delta, quote->dport, entry->frontend_port);
		l4_check = csum_apply_udp(quote->check_or_seq_lo, udp_delta);
		icmp_delta = csum_delta16(icmp_delta, quote->check_or_seq_lo, l4_check);
		quote->check_or_seq_lo = l4_check;
	}

	/* The error now comes from the frontend if the backend itself sent
	 * it, and goes to the client. */
	if (ip->saddr == quote->ip.daddr)
		new_outer_saddr = entry->frontend_addr;

	quote->ip.saddr = entry->client_addr;
	quote->ip.daddr = entry->frontend_addr;
	quote->sport = entry->client_port;
	quote->dport = entry->frontend_port;
	icmp->checksum = csum_apply(icmp->checksum, icmp_delta);

	outer_delta = csum_delta32(outer_delta, ip->saddr, new_outer_saddr);
	outer_delta = csum_delta32(outer_delta, ip->daddr, entry->client_addr);
	ip->check = csum_apply(ip->check, outer_delta);
	ip->saddr = new_outer_saddr;
	ip->daddr = entry->client_addr;
	pkt->saddr = new_outer_saddr;
	pkt->daddr = entry->client_addr;
}

#endif /* XDPLB_ICMP_H */
