/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * skb.h - packet handling in the TC programs: parsing with direct access,
 * rewrites through the checksum helpers (which keep partial and complete
 * checksums of the skb right), forwarding with neighbour resolution, and
 * answering a packet (a RST or ICMP port unreachable for a client no
 * backend serves, ICMP fragmentation needed for one too big) out of the
 * interface it came in on.
 */
#ifndef XDPLB_SKB_H
#define XDPLB_SKB_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "counters.h"
#include "route.h"
#include "reject.h"

/* Headers the TC programs read: Ethernet, IPv4 with options, TCP. */
#define SKB_HEADERS_LEN (sizeof(struct ethhdr) + 60 + sizeof(struct tcphdr))

static __always_inline enum parse_result skb_parse(struct __sk_buff *skb, struct packet *pkt,
						   int flags)
{
	__u32 want = skb->len < SKB_HEADERS_LEN ? skb->len : SKB_HEADERS_LEN;

	/* A VLAN's frame, its tag taken out of the frame into the skb before
	 * the hook: left to the stack, as XDP leaves a frame that carries
	 * its tag (a redirect would carry the tag to the egress device). A
	 * priority tag (VLAN id 0) marks untagged traffic: served. */
	if (skb->vlan_present && (skb->vlan_tci & 0x0fff)) {
		pkt->len = skb->len;
		return PARSE_NOT_IPV4;
	}
	/* Make the headers linear for direct access (fails only on
	 * memory pressure; the parse below then reports them missing). */
	bpf_skb_pull_data(skb, want);
	pkt->len = skb->len;
	return parse_packet_flags((void *)(long)skb->data, (void *)(long)skb->data_end, pkt,
				  flags | PARSE_F_SKB);
}

/*
 * Parse the headers where they are, without making them linear first: for
 * a hook that leaves almost every packet alone. Pulling would copy the
 * headers of every cloned skb (TCP keeps a clone of each segment it
 * sends); a packet whose headers are not all linear is left alone.
 */
static __always_inline enum parse_result skb_parse_in_place(struct __sk_buff *skb,
							    struct packet *pkt, int flags)
{
	pkt->len = skb->len;
	return parse_packet_flags((void *)(long)skb->data, (void *)(long)skb->data_end, pkt,
				  flags | PARSE_F_SKB);
}

static __always_inline __u32 l4_csum_off(const struct packet *pkt)
{
	return pkt->l4_off + (pkt->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							: offsetof(struct udphdr, check));
}

/* Replace one IPv4 address field (offset in the IP header) and fix the IP
 * checksum, and the L4 checksum when the packet carries one. */
static __always_inline int skb_set_addr(struct __sk_buff *skb, const struct packet *pkt,
					__u32 field, __be32 from, __be32 to, int with_l4)
{
	__u64 l4_flags = BPF_F_PSEUDO_HDR | sizeof(to);

	if (from == to)
		return 0;
	if (with_l4) {
		if (pkt->proto == IPPROTO_UDP)
			l4_flags |= BPF_F_MARK_MANGLED_0;
		if (bpf_l4_csum_replace(skb, l4_csum_off(pkt), from, to, l4_flags))
			return -1;
	}
	if (bpf_l3_csum_replace(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, check), from, to,
				sizeof(to)))
		return -1;
	return bpf_skb_store_bytes(skb, sizeof(struct ethhdr) + field, &to, sizeof(to), 0) ? -1 : 0;
}

static __always_inline int skb_set_port(struct __sk_buff *skb, const struct packet *pkt,
					__u32 field, __be16 from, __be16 to)
{
	__u64 l4_flags = sizeof(to);

	if (from == to)
		return 0;
	if (pkt->proto == IPPROTO_UDP)
		l4_flags |= BPF_F_MARK_MANGLED_0;
	if (bpf_l4_csum_replace(skb, l4_csum_off(pkt), from, to, l4_flags))
		return -1;
	return bpf_skb_store_bytes(skb, pkt->l4_off + field, &to, sizeof(to), 0) ? -1 : 0;
}

/*
 * Rewrite addresses and ports of a TCP or UDP packet (a first fragment
 * included). Direct packet pointers in pkt are invalid afterwards; the
 * tuple fields are updated.
 */
static __always_inline int skb_rewrite_tuple(struct __sk_buff *skb, struct packet *pkt,
					     __be32 saddr, __be16 sport, __be32 daddr, __be16 dport)
{
	if (skb_set_addr(skb, pkt, offsetof(struct iphdr, saddr), pkt->saddr, saddr, 1) ||
	    skb_set_addr(skb, pkt, offsetof(struct iphdr, daddr), pkt->daddr, daddr, 1) ||
	    skb_set_port(skb, pkt, 0, pkt->sport, sport) ||
	    skb_set_port(skb, pkt, 2, pkt->dport, dport))
		return -1;
	pkt->saddr = saddr;
	pkt->daddr = daddr;
	pkt->sport = sport;
	pkt->dport = dport;
	return 0;
}

/* Rewrite only the addresses (a later fragment, which has no L4 header). */
static __always_inline int skb_rewrite_addrs(struct __sk_buff *skb, struct packet *pkt,
					     __be32 saddr, __be32 daddr)
{
	if (skb_set_addr(skb, pkt, offsetof(struct iphdr, saddr), pkt->saddr, saddr, 0) ||
	    skb_set_addr(skb, pkt, offsetof(struct iphdr, daddr), pkt->daddr, daddr, 0))
		return -1;
	pkt->saddr = saddr;
	pkt->daddr = daddr;
	return 0;
}

static __always_inline int skb_decrease_ttl(struct __sk_buff *skb)
{
	__u32 off = sizeof(struct ethhdr) + offsetof(struct iphdr, ttl);
	__u16 before, after;
	__u8 ttl;

	if (bpf_skb_load_bytes(skb, off, &before, sizeof(before)))
		return -1;
	ttl = ((__u8 *)&before)[0];
	if (ttl <= 1)
		return -1;
	after = before;
	((__u8 *)&after)[0] = ttl - 1;
	if (bpf_l3_csum_replace(skb, sizeof(struct ethhdr) + offsetof(struct iphdr, check), before,
				after, sizeof(after)))
		return -1;
	return bpf_skb_store_bytes(skb, off, &after, sizeof(after), 0) ? -1 : 0;
}

/*
 * Is the packet too big for device ifindex? Measured by its IPv4 length
 * (not the frame's: an L3 device, a tunnel, has no Ethernet header), a GSO
 * packet by its segments. Returns 1 with *mtu the device's MTU when it is,
 * 0 when it fits, and -1 when the device cannot be measured (gone).
 */
static __always_inline int skb_too_big_for(struct __sk_buff *skb, const struct packet *pkt,
					   __u32 ifindex, __u32 *mtu)
{
	long rc;

	/* The kernel takes a length to measure, or measures segments. */
	if (skb->gso_size) {
		*mtu = 0;
		rc = bpf_check_mtu(skb, ifindex, mtu, 0, BPF_MTU_CHK_SEGS);
	} else {
		*mtu = pkt->tot_len;
		rc = bpf_check_mtu(skb, ifindex, mtu, 0, 0);
	}
	if (rc == BPF_MTU_CHK_RET_SUCCESS)
		return 0;
	if (rc == BPF_MTU_CHK_RET_FRAG_NEEDED || rc == BPF_MTU_CHK_RET_SEGS_TOOBIG)
		return 1;
	return -1;
}

/*
 * Route a packet as it will leave once translated (from saddr:sport to
 * daddr:dport), as if it arrived on ifindex, and check that it fits: the
 * flow's cached next hop (cache, may be NULL; dropped when its device is
 * gone) against its device's MTU, or a FIB lookup, which checks the
 * route's MTU too. A GSO packet (a pod's TCP sends them far larger than
 * the MTU) is routed without its length and measured by its segments
 * against the device. Returns a BPF_FIB_LKUP_RET_* code; fib->ifindex is
 * the egress device, and on BPF_FIB_LKUP_RET_FRAG_NEEDED fib->mtu_result
 * the MTU to tell the sender.
 */
static __always_inline int skb_route(struct __sk_buff *skb, const struct packet *pkt, __u32 ifindex,
				     __be32 saddr, __be16 sport, __be32 daddr, __be16 dport,
				     struct next_hop *cache, struct bpf_fib_lookup *fib)
{
	__u32 mtu = 0;
	int rc;

	/* A flow's egress device, cached once a second like XDP's next
	 * hop; the kernel resolves the neighbour itself. */
	if (cache && cache->ifindex) {
		fib->ifindex = cache->ifindex;
		if (skb->len <= MTU_CHECK_MIN)
			return BPF_FIB_LKUP_RET_SUCCESS;
		switch (skb_too_big_for(skb, pkt, cache->ifindex, &mtu)) {
		case 0:
			return BPF_FIB_LKUP_RET_SUCCESS;
		case 1:
			fib->mtu_result = mtu;
			return BPF_FIB_LKUP_RET_FRAG_NEEDED;
		default:
			cache->ifindex = 0;
			break;
		}
	}
	fib_params_translated(ifindex, pkt, saddr, sport, daddr, dport, fib);
	if (skb->gso_size)
		fib->tot_len = 0;
	rc = bpf_fib_lookup(skb, fib, sizeof(*fib), 0);
	if (skb->gso_size && (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH) &&
	    skb_too_big_for(skb, pkt, fib->ifindex, &mtu) == 1) {
		fib->mtu_result = mtu;
		return BPF_FIB_LKUP_RET_FRAG_NEEDED;
	}
	return rc;
}

/*
 * Send a translated packet on to the egress device skb_route found,
 * where the kernel fills in the next hop's MAC (resolving it if needed).
 * Routed, so the TTL drops. A complete next hop is cached in cache.
 */
static __always_inline int skb_send(struct __sk_buff *skb, const struct bpf_fib_lookup *fib, int rc,
				    struct next_hop *cache)
{
	switch (rc) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		/* DF clear (the callers answer the others before
		 * translating): the stack fragments it. */
		count(STAT_PASS_FRAG_NEEDED, skb->len);
		return TC_ACT_OK;
	case BPF_FIB_LKUP_RET_FWD_DISABLED:
		count(STAT_DROP_FWD_DISABLED, skb->len);
		return TC_ACT_SHOT;
	default:
		count(STAT_DROP_NO_ROUTE, skb->len);
		return TC_ACT_SHOT;
	}
	/* Cache only a complete next hop: XDP may follow the same entry. */
	if (cache && !cache->ifindex && rc == BPF_FIB_LKUP_RET_SUCCESS)
		next_hop_from_fib(cache, fib);
	if (skb_decrease_ttl(skb)) {
		count(STAT_DROP_TTL, skb->len);
		return TC_ACT_SHOT;
	}
	count(STAT_TC_REDIRECT, skb->len);
	return bpf_redirect_neigh(fib->ifindex, NULL, 0, 0);
}

/* Route and send a packet that is already translated (a later fragment). */
static __always_inline int skb_forward(struct __sk_buff *skb, const struct packet *pkt,
				       __u32 ifindex)
{
	struct bpf_fib_lookup fib;
	int rc;

	rc = skb_route(skb, pkt, ifindex, pkt->saddr, pkt->sport, pkt->daddr, pkt->dport, NULL,
		       &fib);
	return skb_send(skb, &fib, rc, NULL);
}

/*
 * The quote of an ICMP error about the packet: its IPv4 header (options
 * dropped) and the first 8 bytes of its payload. 0 on success.
 */
static __always_inline int skb_load_quote(struct __sk_buff *skb, const struct packet *pkt,
					  struct iphdr *quoted)
{
	if (bpf_skb_load_bytes(skb, sizeof(struct ethhdr), quoted, sizeof(*quoted)) ||
	    bpf_skb_load_bytes(skb, pkt->l4_off, quoted + 1, 8))
		return -1;
	if (quoted->ihl != 5) {
		/* The receiver finds the ports after the header length the
		 * quote gives: make it the header as quoted. */
		quoted->tot_len = bpf_htons(pkt->tot_len - (quoted->ihl * 4 - sizeof(*quoted)));
		quoted->ihl = 5;
		quoted->check = 0;
		quoted->check = ~csum_fold32(csum_words((__u16 *)quoted, sizeof(*quoted) / 2, 0));
	}
	return 0;
}

/*
 * Answer a packet from TC with an ICMP destination unreachable (code, and
 * mtu for ICMP_FRAG_NEEDED; headers from reject.h), sent back out of the
 * interface it came in on. The caller counts why; a packet over the ICMP
 * error budget is dropped unanswered and counted here.
 */
static __always_inline int skb_reply_icmp_unreachable(struct __sk_buff *skb,
						      const struct packet *pkt, __u8 code,
						      __u16 mtu)
{
	/* Two bytes of padding put the IPv4 header on a 4-byte boundary:
	 * the verifier rejects misaligned stack access. */
	__u8 buf[2 + ICMP_FRAME_LEN] __attribute__((aligned(8)));
	struct ethhdr *eth = (void *)(buf + 2);
	struct iphdr *ip = (void *)(eth + 1);
	struct icmphdr *icmp = (void *)(ip + 1);

	if (!icmp_error_allowed(code)) {
		count(STAT_DROP_ICMP_RATE_LIMIT, skb->len);
		return TC_ACT_SHOT;
	}
	__builtin_memset(buf, 0, sizeof(buf));
	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)) ||
	    skb_load_quote(skb, pkt, (void *)(icmp + 1)))
		goto fail;
	swap_macs(eth);
	icmp_unreachable_init(ip, icmp, pkt, code, mtu);
	if (bpf_skb_change_tail(skb, ICMP_FRAME_LEN, 0) ||
	    bpf_skb_store_bytes(skb, 0, eth, ICMP_FRAME_LEN, 0))
		goto fail;
	return bpf_redirect(skb->ifindex, 0);
fail:
	count(STAT_DROP_ADJUST, skb->len);
	return TC_ACT_SHOT;
}

/* Tell the sender of a packet too big for its way on (DF set) the MTU it
 * must fit, quoting the packet as it arrived (see xdp_reply_too_big). */
static __always_inline int skb_reply_too_big(struct __sk_buff *skb, const struct packet *pkt,
					     __u32 mtu)
{
	__u32 bytes = skb->len;
	int verdict;

	verdict = skb_reply_icmp_unreachable(skb, pkt, ICMP_FRAG_NEEDED, (__u16)mtu);
	if (verdict != TC_ACT_SHOT)
		count(STAT_REJECT_TOO_BIG, bytes);
	return verdict;
}

/*
 * Refuse a client from TC: turn its packet into a TCP RST or an ICMP port
 * unreachable (headers from reject.h) and send it back out of the interface
 * it came in on, counted as reason (a failed rewrite as drop_adjust; a RST
 * from the client is dropped unanswered, drop_client_rst).
 */
static __always_inline int skb_refuse(struct __sk_buff *skb, struct packet *pkt,
				      enum stat reason)
{
	/* Two bytes of padding put the IPv4 header on a 4-byte boundary:
	 * the verifier rejects misaligned stack access. */
	__u8 buf[2 + RST_FRAME_LEN] __attribute__((aligned(8)));
	struct ethhdr *eth = (void *)(buf + 2);
	struct iphdr *ip = (void *)(eth + 1);
	__u32 bytes = skb->len;
	struct tcphdr in;
	int verdict;

	if (pkt->proto != IPPROTO_TCP) {
		verdict = skb_reply_icmp_unreachable(skb, pkt, ICMP_PORT_UNREACH, 0);
		if (verdict != TC_ACT_SHOT)
			count(reason, bytes);
		return verdict;
	}
	/* Never answer a RST with a RST. */
	if (pkt->tcp_flags & TCP_FLAG_RST) {
		count(STAT_DROP_CLIENT_RST, bytes);
		return TC_ACT_SHOT;
	}
	__builtin_memset(buf, 0, sizeof(buf));
	if (bpf_skb_load_bytes(skb, 0, eth, sizeof(*eth)) ||
	    bpf_skb_load_bytes(skb, pkt->l4_off, &in, sizeof(in)))
		goto fail;
	swap_macs(eth);
	tcp_rst_init(ip, (void *)(ip + 1), pkt, in.seq, in.ack_seq,
		     pkt->tot_len - (pkt->l4_off - sizeof(*eth)) - in.doff * 4);
	if (bpf_skb_change_tail(skb, RST_FRAME_LEN, 0) ||
	    bpf_skb_store_bytes(skb, 0, eth, RST_FRAME_LEN, 0))
		goto fail;
	count(reason, bytes);
	return bpf_redirect(skb->ifindex, 0);
fail:
	count(STAT_DROP_ADJUST, bytes);
	return TC_ACT_SHOT;
}

#endif /* XDPLB_SKB_H */
