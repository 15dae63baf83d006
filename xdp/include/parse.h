/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * parse.h - Ethernet / IPv4 / TCP / UDP / ICMP parsing with bounds checks.
 *
 * The parser never writes. It stops at the first thing xdplb does not
 * translate (non-IPv4, IP options, fragments, truncated headers) and says
 * why, so the caller can count it and hand the packet on untouched.
 */
#ifndef XDPLB_PARSE_H
#define XDPLB_PARSE_H

#include "common.h"

enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_IPV4,
	PARSE_IP_OPTIONS,
	PARSE_FRAGMENT,
	PARSE_MALFORMED,
	PARSE_OTHER_L4, /* IPv4 but neither TCP, UDP nor ICMP */
};

/* A parsed packet. Pointers are into the packet and valid until the packet
 * is resized. Addresses and ports are in network byte order. */
struct packet {
	void *data;
	void *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;
	void *l4;
	__u32 len;      /* bytes from the Ethernet header to data_end */
	__u32 l4_off;   /* offset of the L4 header from the Ethernet header */
	__u16 tot_len;  /* IPv4 total length, host order */
	__u16 frag_off; /* IPv4 fragment field, host order */
	__u16 ip_id;    /* IPv4 identification, network order */
	__u8 tos;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;   /* ports: 0 for ICMP */
	__be16 dport;
	__u8 proto;
	__u8 tcp_flags; /* TCP_FLAG_* below, 0 for other protocols */
	__u32 tcp_seq;  /* TCP sequence number, host order; 0 for other protocols */
};

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_PSH 0x08
#define TCP_FLAG_ACK 0x10

/* The flags byte of a TCP header (byte 13). */
static __always_inline __u8 tcp_flags_of(struct tcphdr *tcp)
{
	return ((__u8 *)tcp)[13];
}

/* parse_packet flags: what the caller can handle beyond the fast path. */
enum parse_flags {
	PARSE_F_OPTIONS = 1 << 0,   /* IPv4 options: parse past them */
	PARSE_F_FRAGMENTS = 1 << 1, /* a first fragment is parsed like a whole datagram */
	/* An skb: only the headers are linear, data_end is not the end of the
	 * packet; pkt->len holds the packet's real length on entry. */
	PARSE_F_SKB = 1 << 2,
};

/*
 * Parse Ethernet, IPv4 and the L4 header. flags is a compile-time constant,
 * so the XDP fast path (flags 0) carries none of the extra checks.
 */
static __always_inline enum parse_result parse_packet_flags(void *data, void *data_end,
							    struct packet *pkt, int flags)
{
	struct ethhdr *eth = data;
	struct iphdr *ip;
	__u32 hlen;

	pkt->data = data;
	pkt->data_end = data_end;
	if (!(flags & PARSE_F_SKB))
		pkt->len = data_end - data;
	pkt->tcp_flags = 0;
	pkt->tcp_seq = 0;
	pkt->sport = 0;
	pkt->dport = 0;

	if ((void *)(eth + 1) > data_end)
		return PARSE_MALFORMED;
	pkt->eth = eth;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;

	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > data_end)
		return PARSE_MALFORMED;
	pkt->ip = ip;
	if (ip->version != 4)
		return PARSE_MALFORMED;
	if (ip->ihl < 5)
		return PARSE_MALFORMED;
	if (ip->ihl != 5 && !(flags & PARSE_F_OPTIONS))
		return PARSE_IP_OPTIONS;
	/* A constant on the fast path, where options were refused above. */
	hlen = (flags & PARSE_F_OPTIONS) ? ip->ihl * 4 : sizeof(*ip);
	pkt->tot_len = bpf_ntohs(ip->tot_len);
	pkt->frag_off = bpf_ntohs(ip->frag_off);
	pkt->ip_id = ip->id;
	pkt->tos = ip->tos;
	pkt->saddr = ip->saddr;
	pkt->daddr = ip->daddr;
	pkt->proto = ip->protocol;
	pkt->l4_off = sizeof(*eth) + hlen;
	/* tot_len must cover the headers and fit the frame (padding allowed). */
	if (pkt->tot_len < hlen)
		return PARSE_MALFORMED;
	if ((flags & PARSE_F_SKB) ? sizeof(*eth) + pkt->tot_len > pkt->len
				  : (void *)ip + pkt->tot_len > data_end)
		return PARSE_MALFORMED;
	if (pkt->frag_off & (IP_MF | IP_OFFSET)) {
		/* Only a first fragment carries the L4 header. */
		if (!(flags & PARSE_F_FRAGMENTS) || (pkt->frag_off & IP_OFFSET))
			return PARSE_FRAGMENT;
	}

	pkt->l4 = (void *)ip + hlen;

	switch (ip->protocol) {
	case IPPROTO_TCP: {
		struct tcphdr *tcp = pkt->l4;

		if ((void *)(tcp + 1) > data_end || tcp->doff < 5 ||
		    tcp->doff * 4 > pkt->tot_len - hlen)
			return PARSE_MALFORMED;
		pkt->sport = tcp->source;
		pkt->dport = tcp->dest;
		pkt->tcp_flags = tcp_flags_of(tcp);
		pkt->tcp_seq = bpf_ntohl(tcp->seq);
		return PARSE_OK;
	}
	case IPPROTO_UDP: {
		struct udphdr *udp = pkt->l4;

		if ((void *)(udp + 1) > data_end || sizeof(*udp) > pkt->tot_len - hlen ||
		    bpf_ntohs(udp->len) < sizeof(*udp))
			return PARSE_MALFORMED;
		/* A first fragment holds only part of the datagram. */
		if (!(pkt->frag_off & IP_MF) && bpf_ntohs(udp->len) > pkt->tot_len - hlen)
			return PARSE_MALFORMED;
		pkt->sport = udp->source;
		pkt->dport = udp->dest;
		return PARSE_OK;
	}
	case IPPROTO_ICMP: {
		struct icmphdr *icmp = pkt->l4;

		if ((void *)(icmp + 1) > data_end || sizeof(*icmp) > pkt->tot_len - hlen)
			return PARSE_MALFORMED;
		return PARSE_OK;
	}
	default:
		return PARSE_OTHER_L4;
	}
}

/* The fast-path parser: no IP options, no fragments. */
static __always_inline enum parse_result parse_packet(void *data, void *data_end,
						      struct packet *pkt)
{
	return parse_packet_flags(data, data_end, pkt, 0);
}

#endif /* XDPLB_PARSE_H */
