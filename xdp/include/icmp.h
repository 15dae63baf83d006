/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * icmp.h - ICMP errors about translated flows, the same for both hooks.
 *
 * Whoever cannot deliver a packet xdplb translated (a router on the way,
 * the backend or client itself: "fragmentation needed" for path MTU
 * discovery, "port unreachable") reports it to the packet's source, quoting
 * the packet as it was sent on. Two kinds are translated back, while the
 * flow lives (an error about a flow that is over is left to the stack):
 *
 *   - about a packet sent towards a backend: addressed to the node's SNAT
 *     address (or the client itself, without SNAT), the quote is looked up
 *     as a reply would be; the error is rewritten to quote the packet the
 *     client sent and goes to the client;
 *   - about a reply sent to a client: addressed to the frontend, the quote
 *     is looked up as the client's own flow; the error is rewritten to
 *     quote the reply as the backend sent it and goes to the backend
 *     (handed to the stack when the backend is this node, BE_HOST).
 *
 * Only the quote's first 8 bytes after its IPv4 header (the ports, and the
 * UDP checksum) are rewritten; a quote with IP options is left alone.
 */
#ifndef XDPLB_ICMP_H
#define XDPLB_ICMP_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "nat.h"
#include "flow.h"

/* The part of an ICMP error xdplb reads and rewrites. */
struct icmp_quote {
	struct iphdr ip;
	__be16 sport;
	__be16 dport;
	__be16 len_or_seq_hi; /* UDP length, or upper half of the TCP sequence */
	__be16 check_or_seq_lo; /* UDP checksum, or lower half of the TCP sequence */
};

/* The addresses and ports an ICMP error is rewritten to. */
struct icmp_rewrite {
	__be32 saddr;       /* the error's own source */
	__be32 daddr;       /* and destination */
	__be32 quote_saddr; /* the quoted packet's */
	__be32 quote_daddr;
	__be16 quote_sport;
	__be16 quote_dport;
	__u8 to_host; /* daddr is this node's (a host backend's): deliver, not route */
	__u8 pad[3];
};

static __always_inline int icmp_is_error(const struct icmphdr *icmp)
{
	return icmp->type == ICMP_DEST_UNREACH || icmp->type == ICMP_TIME_EXCEEDED;
}

/* Is this the quote of a TCP or UDP packet whose source the error is
 * addressed to (anything else is no error about our packets)? Its ports
 * must be there: a whole packet or a first fragment is quoted (the bytes
 * of a later one are not ports), and within the error's own length, not
 * in the frame's padding. */
static __always_inline int icmp_quote_usable(const struct icmp_quote *quote,
					     const struct packet *pkt)
{
	__u32 ip_hlen = pkt->l4_off - sizeof(struct ethhdr);

	return quote->ip.version == 4 && quote->ip.ihl == 5 &&
	       !(bpf_ntohs(quote->ip.frag_off) & IP_OFFSET) &&
	       (quote->ip.protocol == IPPROTO_TCP || quote->ip.protocol == IPPROTO_UDP) &&
	       quote->ip.saddr == pkt->daddr &&
	       ip_hlen + sizeof(struct icmphdr) + sizeof(*quote) <= pkt->tot_len;
}

/*
 * The quote of an ICMP error about a TCP or UDP packet whose source the
 * error is addressed to (anything else is no error about our packets), or
 * NULL.
 */
static __always_inline struct icmp_quote *icmp_error_quote(const struct packet *pkt)
{
	struct icmphdr *icmp = pkt->l4;
	struct icmp_quote *quote;

	if ((void *)(icmp + 1) > pkt->data_end || !icmp_is_error(icmp))
		return NULL;
	quote = (void *)(icmp + 1);
	if ((void *)(quote + 1) > pkt->data_end)
		return NULL;
	return icmp_quote_usable(quote, pkt) ? quote : NULL;
}

/* The reply tuple a quote about a packet sent towards a backend names. */
static __always_inline void icmp_quoted_reply(const struct icmp_quote *quote, struct nat_key *key)
{
	nat_key_set(key, quote->ip.daddr, quote->ip.saddr, quote->dport, quote->sport,
		    quote->ip.protocol);
}

/* What an error about a packet sent towards a backend is rewritten to,
 * given the reverse entry of the reply tuple its quote names. */
static __always_inline void icmp_forward_rewrite(const struct packet *pkt,
						 const struct icmp_quote *quote,
						 const struct nat_entry *entry,
						 struct icmp_rewrite *rw)
{
	rw->quote_saddr = entry->client_addr;
	rw->quote_sport = entry->client_port;
	rw->quote_daddr = entry->frontend_addr;
	rw->quote_dport = entry->frontend_port;
	rw->daddr = entry->client_addr;
	rw->to_host = 0;
	/* From the backend itself, the error now comes from the frontend. */
	rw->saddr = pkt->saddr == quote->ip.daddr ? entry->frontend_addr : pkt->saddr;
}

/* An error about a packet sent towards a backend: the quote is a reply
 * tuple reversed. 0 and *rw filled when it is one of ours, and its flow
 * is live: not over, nor another's now (a flow whose forward entry was
 * evicted counts as live as it does for replies, which rebuild it then:
 * evicted_flow_alive). */
static __always_inline int icmp_about_forward(const struct packet *pkt,
					      const struct icmp_quote *quote,
					      struct icmp_rewrite *rw, const int unconfirmed)
{
	struct nat_entry *entry;
	struct ct_entry *ct;
	struct nat_key key;
	struct ct_key flow;
	__u64 now;

	icmp_quoted_reply(quote, &key);
	entry = reverse_lookup(&key, unconfirmed);
	if (!entry)
		return -1;
	ct_key_of_nat(&key, entry, &flow);
	ct = ct_lookup(&flow);
	now = bpf_ktime_get_coarse_ns();
	if (ct ? !ct_answers_to(ct, &key) || ct_over(ct, flow.proto, now)
	       : !evicted_flow_alive(&key, entry, now))
		return -1;
	icmp_forward_rewrite(pkt, quote, entry, rw);
	return 0;
}

/* An error about a reply sent to a client: the quote is the client's flow
 * reversed. 0 and *rw filled when it is one of ours, and live. */
static __always_inline int icmp_about_reply(const struct packet *pkt,
					    const struct icmp_quote *quote,
					    struct icmp_rewrite *rw)
{
	struct ct_entry *ct;
	struct ct_key flow;

	ct_key_set(&flow, quote->ip.daddr, quote->ip.saddr, quote->dport, quote->sport,
		   quote->ip.protocol);
	ct = ct_lookup(&flow);
	if (!ct || ct_over(ct, flow.proto, bpf_ktime_get_coarse_ns()))
		return -1;
	rw->quote_saddr = ct->backend_addr;
	rw->quote_sport = ct->backend_port;
	rw->quote_daddr = quote->ip.daddr;
	rw->quote_dport = quote->dport;
	rw->saddr = pkt->saddr;
	if (ct->flags & CT_F_SNAT) {
		rw->quote_daddr = ct->nat_addr;
		rw->quote_dport = ct->nat_port;
		/* From the client itself, the error now comes from the
		 * address the backend knows its peer by. */
		if (pkt->saddr == quote->ip.daddr)
			rw->saddr = ct->nat_addr;
	}
	rw->daddr = ct->backend_addr;
	rw->to_host = !!(ct->flags & CT_F_HOST);
	return 0;
}

/* What to rewrite an ICMP error about a translated flow to: 0 and *rw
 * filled, or -1 when the error is about none of ours. unconfirmed: see
 * reverse_lookup. */
static __always_inline int icmp_error_lookup(const struct packet *pkt,
					     const struct icmp_quote *quote,
					     struct icmp_rewrite *rw, const int unconfirmed)
{
	if (icmp_about_forward(pkt, quote, rw, unconfirmed) == 0)
		return 0;
	return icmp_about_reply(pkt, quote, rw);
}

/* Rewrite the headers of an ICMP error as icmp_error_lookup said, with
 * every checksum they carry (the error's IPv4 header, the ICMP checksum
 * over the quote, the quoted IPv4 header and a quoted UDP checksum): in
 * the packet, or in a copy of them. */
static __always_inline void icmp_rewrite_headers(struct iphdr *ip, struct icmphdr *icmp,
						 struct icmp_quote *quote,
						 const struct icmp_rewrite *rw)
{
	__u32 quote_ip_delta = 0, icmp_delta, outer_delta = 0;
	__u16 old_ip_check, l4_check;

	quote_ip_delta = csum_delta32(quote_ip_delta, quote->ip.saddr, rw->quote_saddr);
	quote_ip_delta = csum_delta32(quote_ip_delta, quote->ip.daddr, rw->quote_daddr);
	old_ip_check = quote->ip.check;
	quote->ip.check = csum_apply(old_ip_check, quote_ip_delta);

	icmp_delta = csum_delta16(quote_ip_delta, old_ip_check, quote->ip.check);
	icmp_delta = csum_delta16(icmp_delta, quote->sport, rw->quote_sport);
	icmp_delta = csum_delta16(icmp_delta, quote->dport, rw->quote_dport);

	if (quote->ip.protocol == IPPROTO_UDP && quote->check_or_seq_lo != 0) {
		__u32 udp_delta = csum_delta16(quote_ip_delta, quote->sport, rw->quote_sport);

		udp_delta = csum_delta16(udp_delta, quote->dport, rw->quote_dport);
		l4_check = csum_apply_udp(quote->check_or_seq_lo, udp_delta);
		icmp_delta = csum_delta16(icmp_delta, quote->check_or_seq_lo, l4_check);
		quote->check_or_seq_lo = l4_check;
	}

	quote->ip.saddr = rw->quote_saddr;
	quote->ip.daddr = rw->quote_daddr;
	quote->sport = rw->quote_sport;
	quote->dport = rw->quote_dport;
	icmp->checksum = csum_apply(icmp->checksum, icmp_delta);

	outer_delta = csum_delta32(outer_delta, ip->saddr, rw->saddr);
	outer_delta = csum_delta32(outer_delta, ip->daddr, rw->daddr);
	ip->check = csum_apply(ip->check, outer_delta);
	ip->saddr = rw->saddr;
	ip->daddr = rw->daddr;
}

/* Rewrite an ICMP error in the packet as icmp_error_lookup said. */
static __always_inline void icmp_error_rewrite(struct packet *pkt, struct icmp_quote *quote,
					       const struct icmp_rewrite *rw)
{
	icmp_rewrite_headers(pkt->ip, pkt->l4, quote, rw);
	pkt->saddr = rw->saddr;
	pkt->daddr = rw->daddr;
}

#endif /* XDPLB_ICMP_H */
