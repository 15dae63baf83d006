/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * reject.h - refusing a client from XDP: a TCP RST, or an ICMP port
 * unreachable for UDP, built in place from the client's packet and sent
 * back out of the device it came in on (XDP_TX). The reply comes from the
 * address the client connected to, as kube-proxy's REJECT rule does.
 */
#ifndef XDPLB_REJECT_H
#define XDPLB_REJECT_H

#include "parse.h"
#include "csum.h"
#include "counters.h"

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

/* Answer a TCP segment with a RST (RFC 9293, 3.10.7.1). */
static __always_inline int xdp_reply_tcp_rst(struct xdp_md *ctx, struct packet *pkt)
{
	struct ethhdr *eth = pkt->eth;
	struct iphdr *ip = pkt->ip;
	struct tcphdr *tcp = pkt->l4;
	__be32 client = pkt->saddr, frontend = pkt->daddr;
	__be16 client_port = pkt->sport, frontend_port = pkt->dport;
	__u8 flags = pkt->tcp_flags;
	__u32 seg_len, acc;
	__be32 seq, ack;

	if ((void *)(tcp + 1) > pkt->data_end)
		return XDP_DROP;
	seg_len = bpf_ntohs(ip->tot_len) - sizeof(*ip) - tcp->doff * 4;
	if (flags & TCP_FLAG_SYN)
		seg_len++;
	if (flags & TCP_FLAG_FIN)
		seg_len++;
	if (flags & TCP_FLAG_ACK) {
		seq = tcp->ack_seq;
		ack = 0;
	} else {
		seq = 0;
		ack = bpf_htonl(bpf_ntohl(tcp->seq) + seg_len);
	}

	swap_macs(eth);
	ipv4_header_init(ip, frontend, client, IPPROTO_TCP, sizeof(*ip) + sizeof(*tcp));

	__builtin_memset(tcp, 0, sizeof(*tcp));
	tcp->source = frontend_port;
	tcp->dest = client_port;
	tcp->seq = seq;
	tcp->ack_seq = ack;
	tcp->doff = sizeof(*tcp) / 4;
	tcp->rst = 1;
	tcp->ack = !(flags & TCP_FLAG_ACK);

	/* Pseudo header: addresses, protocol, TCP length. */
	acc = csum_words((__u16 *)&ip->saddr, 4, 0);
	acc += bpf_htons(IPPROTO_TCP) + bpf_htons(sizeof(*tcp));
	acc = csum_words((__u16 *)tcp, sizeof(*tcp) / 2, acc);
	tcp->check = ~csum_fold32(acc);

	if (pkt->len > RST_FRAME_LEN &&
	    bpf_xdp_adjust_tail(ctx, (int)RST_FRAME_LEN - (int)pkt->len)) {
		count(STAT_DROP_ADJUST, pkt->len);
		return XDP_DROP;
	}
	return XDP_TX;
}

/* Answer a UDP datagram with ICMP destination/port unreachable. */
static __always_inline int xdp_reply_icmp_port_unreachable(struct xdp_md *ctx, struct packet *pkt)
{
	__be32 client = pkt->saddr, frontend = pkt->daddr;
	__u32 old_len = pkt->len;
	struct ethhdr *eth, *old_eth;
	struct iphdr *ip;
	struct icmphdr *icmp;
	void *data, *data_end;

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
	ipv4_header_init(ip, frontend, client, IPPROTO_ICMP,
			 ICMP_PREPEND_LEN + ICMP_QUOTE_LEN);

	icmp = (void *)(ip + 1);
	icmp->type = ICMP_DEST_UNREACH;
	icmp->code = ICMP_PORT_UNREACH;
	icmp->checksum = 0;
	icmp->un.gateway = 0;
	icmp->checksum = ~csum_fold32(
		csum_words((__u16 *)icmp, (sizeof(*icmp) + ICMP_QUOTE_LEN) / 2, 0));

	if (bpf_xdp_adjust_tail(ctx, (int)ICMP_FRAME_LEN - (int)(old_len + ICMP_PREPEND_LEN)))
		goto fail;
	return XDP_TX;
fail:
	count(STAT_DROP_ADJUST, old_len);
	return XDP_DROP;
}

#endif /* XDPLB_REJECT_H */
