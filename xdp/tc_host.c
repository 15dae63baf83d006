//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc_host.c - the TC egress program on the NIC and on the host side of
 * every pod interface: replies of this node itself.
 *
 * A backend at an address of this node (a hostNetwork pod here, an API
 * server on a control-plane node) gets its packets translated by xdp_nic,
 * tc_nic or tc_pod and delivered to the node's stack. Its replies leave
 * through the NIC (to clients outside) or a pod interface (to pods on this
 * node); here they are translated back to the frontend the client reached,
 * as a pod backend's replies are by tc_pod. So are the later fragments of
 * such a reply, and the ICMP errors the node sends about packets of
 * translated flows. Everything else leaves untouched, after a parse of the
 * headers in place and one bitmap test (a later fragment: one lookup of
 * its datagram, which a first fragment not translated here forgets; an
 * ICMP error: one lookup of the flow it quotes).
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/counters.h"
#include "include/conntrack.h"
#include "include/flow.h"
#include "include/frag.h"
#include "include/icmp.h"
#include "include/skb.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/*
 * Whether a SYN-ACK answers a SYN that came through a frontend: its flow
 * is tracked and live. A client that once used a port through the
 * frontend and now reaches the node's address directly from it finds a
 * reverse entry that outlived its flow, which must not take the answer.
 */
static __always_inline int answers_live_flow(const struct nat_key *key,
					     const struct nat_entry *rev, __u64 now)
{
	struct datapath_config *cfg = config_get();
	struct ct_entry *ct, rebuilt;
	struct ct_key flow;

	if (!cfg)
		return 0;
	ct_of_nat(key, rev, now, &flow, &rebuilt);
	ct = ct_lookup(&flow);
	return ct && ct_answers_to(ct, key) && !ct_expired(ct, key->proto, cfg, now);
}

/* A packet the node sends from a port a host backend listens on: a reply
 * if its flow's reverse entry is a host flow's. */
static __always_inline int host_reply(struct __sk_buff *skb, struct packet *pkt)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct packet orig = *pkt;
	struct nat_entry *rev;
	struct nat_key key;
	__be32 frontend_addr;
	__be16 frontend_port;
	enum stat reason;
	__u32 svc_id;

	/* Keyed by the reply's own tuple (host flows are not source-NATed;
	 * reverse_lookup finds a SNAT slot's entry all the same). */
	nat_key_set(&key, pkt->saddr, pkt->daddr, pkt->sport, pkt->dport, pkt->proto);
	rev = reverse_lookup(&key, 1);
	if (!rev || !(rev->flags & CT_F_HOST))
		return TC_ACT_UNSPEC;
	if ((pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == (TCP_FLAG_SYN | TCP_FLAG_ACK) &&
	    !answers_live_flow(&key, rev, now))
		return TC_ACT_UNSPEC;
	if (reverse_touch(&key, rev, pkt, now, &reason)) {
		count(reason, skb->len);
		return TC_ACT_SHOT;
	}
	svc_id = rev->svc_id;
	frontend_addr = rev->frontend_addr;
	frontend_port = rev->frontend_port;
	if (skb_rewrite_tuple(skb, pkt, frontend_addr, frontend_port, pkt->daddr, pkt->dport)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	frag_remember(&orig, pkt, svc_id, FRAG_F_HOST);
	count(STAT_HOST_REPLY, skb->len);
	count_service(svc_id, skb->len, 0);
	return TC_ACT_OK;
}

/* The headers of an ICMP error the node sends, copied off the packet. */
struct icmp_error_copy {
	struct iphdr ip;
	struct icmphdr icmp;
	struct icmp_quote quote;
};

/*
 * An ICMP error the node itself sends about a packet of a live translated
 * flow that it received: "port unreachable" from a host backend with
 * nothing listening on its port, "host unreachable" for a packet it could
 * not deliver to a local pod. It quotes the packet as translated; the
 * client gets it about the packet it sent, from the frontend (see icmp.h).
 * A flow that ended does not count: the client may be talking to the
 * address the flow was translated to, directly. Errors that would have to
 * change their destination (about a SNAT flow's packet, whose source was
 * this node) are not for here.
 *
 * The headers are rewritten in a copy and stored back: a program that
 * writes packet data directly makes the kernel un-clone every packet it
 * runs on first, and this one runs on everything the node sends.
 */
static __always_inline int host_icmp_error(struct __sk_buff *skb, const struct packet *pkt)
{
	struct icmp_error_copy e;
	struct icmp_rewrite rw;
	struct nat_entry *rev;
	struct nat_key key;

	if (pkt->ip->ihl != 5 || bpf_skb_load_bytes(skb, sizeof(struct ethhdr), &e, sizeof(e)))
		return TC_ACT_UNSPEC;
	if (!icmp_is_error(&e.icmp) || !icmp_quote_usable(&e.quote, pkt))
		return TC_ACT_UNSPEC;
	icmp_quoted_reply(&e.quote, &key);
	rev = reverse_lookup(&key, 1);
	if (!rev || !answers_live_flow(&key, rev, bpf_ktime_get_coarse_ns()))
		return TC_ACT_UNSPEC;
	icmp_forward_rewrite(pkt, &e.quote, rev, &rw);
	if (rw.daddr != pkt->daddr)
		return TC_ACT_UNSPEC;
	icmp_rewrite_headers(&e.ip, &e.icmp, &e.quote, &rw);
	if (bpf_skb_store_bytes(skb, sizeof(struct ethhdr), &e, sizeof(e), 0)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	count(STAT_ICMP_TRANSLATED, skb->len);
	return TC_ACT_OK;
}

/* A later fragment of a reply whose first fragment was translated here. */
static __always_inline int host_reply_fragment(struct __sk_buff *skb, struct packet *pkt)
{
	struct frag_entry *entry;
	struct frag_key key;
	__u32 svc_id;

	if (pkt->proto != IPPROTO_UDP && pkt->proto != IPPROTO_TCP)
		return TC_ACT_UNSPEC;
	frag_key_of(pkt, &key);
	entry = bpf_map_lookup_elem(&fragments, &key);
	if (!entry || !(entry->flags & FRAG_F_HOST))
		return TC_ACT_UNSPEC;
	svc_id = entry->svc_id;
	if (skb_rewrite_addrs(skb, pkt, entry->saddr, entry->daddr)) {
		count(STAT_DROP_ADJUST, skb->len);
		return TC_ACT_SHOT;
	}
	count(STAT_HOST_REPLY, skb->len);
	count_service(svc_id, skb->len, 0);
	return TC_ACT_OK;
}

SEC("tc")
int xdplb_host_reply(struct __sk_buff *skb)
{
	struct packet pkt;
	int ret;

	switch (skb_parse_in_place(skb, &pkt, PARSE_F_OPTIONS | PARSE_F_FRAGMENTS)) {
	case PARSE_OK:
		break;
	case PARSE_FRAGMENT:
		return host_reply_fragment(skb, &pkt);
	default:
		return TC_ACT_UNSPEC;
	}
	if (pkt.proto == IPPROTO_ICMP)
		return host_icmp_error(skb, &pkt);
	if (pkt.proto != IPPROTO_TCP && pkt.proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	if (port_in_bitmap(&host_backend_ports, pkt.sport)) {
		ret = host_reply(skb, &pkt);
		if (ret != TC_ACT_UNSPEC)
			return ret;
	}
	/* A first fragment left alone: its later fragments are too,
	 * whatever an earlier datagram of the same id left here. */
	frag_forget_first(&pkt);
	return TC_ACT_UNSPEC;
}
