/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * reject.h - answering a packet instead of forwarding it: a TCP RST or an
 * ICMP port unreachable for a client no backend can serve, and an ICMP
 * fragmentation needed for a packet too big for its way on. The headers are
 * built the same way for both hooks; XDP builds them in place in the
 * packet and sends it back out of the device it came in on (XDP_TX); TC
 * does the same through skb helpers (skb_refuse). The answer comes from the
 * address the packet was sent to, as kube-proxy's REJECT rule does.
 */
#ifndef XDPLB_REJECT_H
#define XDPLB_REJECT_H

#include "parse.h"
#include "csum.h"
#include "counters.h"
#include "icmp_limit.h"

#define RST_FRAME_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr))
/* ICMP quotes the original IP header and the first 8 bytes after it. */
#define ICMP_QUOTE_LEN (sizeof(struct iphdr) + 8)
#define ICMP_PREPEND_LEN (sizeof(struct iphdr) + sizeof(struct icmphdr))
#define ICMP_FRAME_LEN (sizeof(struct ethhdr) + ICMP_PREPEND_LEN + ICMP_QUOTE_LEN)

static __always_inline void swap_macs(struct ethhdr *eth)
{
	__u8 tmp[ETH_ALEN];

	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
}

/* Fill in a fresh option-less IPv4 header and its checksum. */
static __always_inline void ipv4_header_init(struct iphdr *ip, __be32 saddr, __be32 daddr,
					     __u8 proto, __u16 tot_len)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(tot_len);
	ip->id = 0;
	ip->frag_off = bpf_htons(IP_DF);
	ip->ttl = XDPLB_DEFAULT_TTL;
	ip->protocol = proto;
	ip->check = 0;
	ip->saddr = saddr;
	ip->daddr = daddr;
	ip->check = ~csum_fold32(csum_words((__u16 *)ip, sizeof(*ip) / 2, 0));
}

/*
 * The IPv4 and TCP headers of the RST that answers a TCP segment (RFC 9293,
 * 3.10.7.1), from the segment's addresses, ports and flags in pkt, its
 * sequence numbers and its payload length. ip and tcp may point into the
 * segment itself: nothing is read from them.
 */
static __always_inline void tcp_rst_init(struct iphdr *ip, struct tcphdr *tcp,
					 const struct packet *pkt, __be32 seq, __be32 ack_seq,
					 __u32 payload_len)
{
	__u32 seg_len = payload_len, acc;

	if (pkt->tcp_flags & TCP_FLAG_SYN)
		seg_len++;
	if (pkt->tcp_flags & TCP_FLAG_FIN)
		seg_len++;
	ipv4_header_init(ip, pkt->daddr, pkt->saddr, IPPROTO_TCP, sizeof(*ip) + sizeof(*tcp));

	__builtin_memset(tcp, 0, sizeof(*tcp));
	tcp->source = pkt->dport;
	tcp->dest = pkt->sport;
	tcp->doff = sizeof(*tcp) / 4;
	tcp->rst = 1;
	if (pkt->tcp_flags & TCP_FLAG_ACK) {
		tcp->seq = ack_seq;
	} else {
		tcp->ack = 1;
		tcp->ack_seq = bpf_htonl(bpf_ntohl(seq) + seg_len);
	}

	/* Pseudo header: addresses, protocol, TCP length. */
	acc = csum_words((__u16 *)&ip->saddr, 4, 0);
	acc += bpf_htons(IPPROTO_TCP) + bpf_htons(sizeof(*tcp));
	acc = csum_words((__u16 *)tcp, sizeof(*tcp) / 2, acc);
	tcp->check = ~csum_fold32(acc);
}

/*
 * The IPv4 and ICMP headers of a destination unreachable about pkt, with
 * its code and, for ICMP_FRAG_NEEDED, the next hop's MTU (RFC 1191); the
 * quote (ICMP_QUOTE_LEN bytes) must follow icmp already, as the checksum
 * covers it.
 */
static __always_inline void icmp_unreachable_init(struct iphdr *ip, struct icmphdr *icmp,
						  const struct packet *pkt, __u8 code, __u16 mtu)
{
	ipv4_header_init(ip, pkt->daddr, pkt->saddr, IPPROTO_ICMP,
			 ICMP_PREPEND_LEN + ICMP_QUOTE_LEN);
	icmp->type = ICMP_DEST_UNREACH;
	icmp->code = code;
	icmp->checksum = 0;
	icmp->un.gateway = 0;
	icmp->un.frag.mtu = bpf_htons(mtu);
	icmp->checksum = ~csum_fold32(
		csum_words((__u16 *)icmp, (sizeof(*icmp) + ICMP_QUOTE_LEN) / 2, 0));
}

/* Answer a TCP segment with a RST, in place. */
static __always_inline int xdp_reply_tcp_rst(struct xdp_md *ctx, struct packet *pkt)
{
	struct iphdr *ip = pkt->ip;
	struct tcphdr *tcp = pkt->l4;

	if ((void *)(tcp + 1) > pkt->data_end) {
		count(STAT_DROP_ADJUST, pkt->len);
		return XDP_DROP;
	}
	swap_macs(pkt->eth);
	tcp_rst_init(ip, tcp, pkt, tcp->seq, tcp->ack_seq,
		     bpf_ntohs(ip->tot_len) - sizeof(*ip) - tcp->doff * 4);

	if (pkt->len > RST_FRAME_LEN &&
	    bpf_xdp_adjust_tail(ctx, (int)RST_FRAME_LEN - (int)pkt->len)) {
		count(STAT_DROP_ADJUST, pkt->len);
		return XDP_DROP;
	}
	return XDP_TX;
}

/*
 * Answer a packet with an ICMP destination unreachable (code, and mtu for
 * ICMP_FRAG_NEEDED) that quotes its IPv4 header and first 8 bytes, in place.
 * Over the ICMP error budget the packet is dropped unanswered, counted here.
 */
static __always_inline int xdp_reply_icmp_unreachable(struct xdp_md *ctx, struct packet *pkt,
						      __u8 code, __u16 mtu)
{
	__u32 old_len = pkt->len;
	struct ethhdr *eth, *old_eth;
	void *data, *data_end;
	struct iphdr *ip;

	if (!icmp_error_allowed(code)) {
		count(STAT_DROP_ICMP_RATE_LIMIT, old_len);
		return XDP_DROP;
	}
	if (bpf_xdp_adjust_head(ctx, -(int)ICMP_PREPEND_LEN))
		goto fail;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + ICMP_FRAME_LEN > data_end)
		goto fail;

	/* The original Ethernet header now starts ICMP_PREPEND_LEN bytes in;
	 * the original IP header is already where the quote belongs. */
	eth = data;
	old_eth = data + ICMP_PREPEND_LEN;
	__builtin_memcpy(eth->h_dest, old_eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, old_eth->h_dest, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	ip = (void *)(eth + 1);
	icmp_unreachable_init(ip, (void *)(ip + 1), pkt, code, mtu);

	if (bpf_xdp_adjust_tail(ctx, (int)ICMP_FRAME_LEN - (int)(old_len + ICMP_PREPEND_LEN)))
		goto fail;
	return XDP_TX;
fail:
	count(STAT_DROP_ADJUST, old_len);
	return XDP_DROP;
}

#endif /* XDPLB_REJECT_H */
