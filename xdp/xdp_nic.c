//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp_nic.c - the XDP program on the node's NIC: the north-south fast path.
 *
 * A packet to a NodePort, LoadBalancer ingress IP or externalIP is checked
 * against the frontend's source ranges, matched to its tracked flow or given
 * a backend (Maglev or ClientIP affinity), DNATed (and SNATed to the node
 * when the backend is elsewhere and the policy is Cluster) and forwarded.
 * Replies from remote backends to a SNAT port are translated back here, and
 * so are ICMP errors about translated flows. A backend at an address of
 * this node gets its packets translated and passed to the stack; the
 * host_reply program translates the node's replies on their way out.
 * Under a SYN flood, a service port's SYNs are answered here with SYN
 * cookies, and the flows of clients that answered them are proxied
 * (synproxy.h).
 * Anything else is left untouched for the stack (or the TC program
 * behind), after one parse and one lookup.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/parse.h"
#include "include/csum.h"
#include "include/counters.h"
#include "include/conntrack.h"
#include "include/maglev.h"
#include "include/nat.h"
#include "include/flow.h"
#include "include/forward.h"
#include "include/reject.h"
#include "include/icmp.h"
#include "include/synproxy.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline int pass(enum stat reason, __u32 bytes)
{
	count(reason, bytes);
	return XDP_PASS;
}

static __always_inline int drop(enum stat reason, __u32 bytes)
{
	count(reason, bytes);
	return XDP_DROP;
}

/* A TCP connection that cannot go on (its backend is gone, say): tell the
 * client, counted as reason (a RST from the client is dropped unanswered:
 * drop_client_rst). */
static __always_inline int reset_client(struct xdp_md *ctx, struct packet *pkt, enum stat reason)
{
	__u32 bytes = pkt->len;
	int verdict;

	/* Never answer a RST with a RST. */
	if (pkt->tcp_flags & TCP_FLAG_RST)
		return drop(STAT_DROP_CLIENT_RST, bytes);
	verdict = xdp_reply_tcp_rst(ctx, pkt);
	if (verdict == XDP_TX)
		count(reason, bytes);
	return verdict;
}

/* No usable backend: refuse the client at once. */
static __always_inline int refuse(struct xdp_md *ctx, struct packet *pkt)
{
	__u32 bytes = pkt->len;
	int verdict;

	if (pkt->proto == IPPROTO_TCP)
		return reset_client(ctx, pkt, STAT_REJECT_TCP);
	verdict = xdp_reply_icmp_unreachable(ctx, pkt, ICMP_PORT_UNREACH, 0);
	if (verdict == XDP_TX)
		count(STAT_REJECT_ICMP, bytes);
	return verdict;
}

/*
 * Translate a packet of a tracked flow and send it to its next hop: the
 * one cached in *hop, or a fresh route lookup, whose result is cached
 * there. A packet too big for its way on is answered untranslated (DF
 * set) or left to the stack to fragment.
 */
static __always_inline int translate_and_send(struct xdp_md *ctx, struct packet *pkt,
					      struct next_hop *hop, __be32 saddr, __be16 sport,
					      __be32 daddr, __be16 dport)
{
	struct bpf_fib_lookup fib;
	__u32 mtu;
	int fib_rc;

	if (hop->ifindex) {
		mtu = hop_mtu_exceeded(ctx, pkt, hop);
		if (mtu && dont_fragment(pkt))
			return xdp_reply_too_big(ctx, pkt, mtu);
		if (xdp_rewrite_tuple(pkt, saddr, sport, daddr, dport))
			return drop(STAT_DROP_ADJUST, pkt->len);
		if (mtu)
			return pass_to_fragment(pkt);
		return xdp_send(ctx, pkt, hop);
	}
	fib_rc = fib_lookup_translated(ctx, ctx->ingress_ifindex, pkt, saddr, sport, daddr, dport,
				       &fib);
	if (fib_rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && dont_fragment(pkt))
		return xdp_reply_too_big(ctx, pkt, fib.mtu_result);
	if (xdp_rewrite_tuple(pkt, saddr, sport, daddr, dport))
		return drop(STAT_DROP_ADJUST, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc, hop);
}

/* Translate a packet for a backend at this node's address and hand it to
 * the stack, which delivers it locally: there is no route to follow. */
static __always_inline int deliver_to_host(struct packet *pkt, __be32 saddr, __be16 sport,
					   __be32 daddr, __be16 dport)
{
	if (xdp_rewrite_tuple(pkt, saddr, sport, daddr, dport))
		return drop(STAT_DROP_ADJUST, pkt->len);
	return pass(STAT_PASS_TO_HOST, pkt->len);
}

/* Answer a SYN with the SYN cookie flow_start made for it. */
static __always_inline int answer_with_cookie(struct xdp_md *ctx, struct packet *pkt,
					      const struct flow_result *res)
{
	struct tcphdr *tcp = pkt->l4;
	__u32 bytes = pkt->len;
	struct tcp_frame f;

	if ((void *)(tcp + 1) > pkt->data_end)
		return drop(STAT_DROP_ADJUST, bytes);
	tcp_frame_answer(&f, pkt, pkt->eth);
	f.seq = res->cookie;
	f.ack = bpf_ntohl(tcp->seq) + 1;
	f.flags = TCP_FLAG_SYN | TCP_FLAG_ACK;
	f.window = SYNPROXY_WINDOW;
	f.mss = res->cookie_mss;
	if (tcp_frame_write(ctx, bytes, &f))
		return XDP_DROP;
	count(STAT_SYNCOOKIE_SENT, bytes);
	return XDP_TX;
}

/*
 * Turn a client's packet into the SYN the SYN proxy opens its backend's
 * side with (sp: its client's ISN and MSS), parsed again into pkt. The
 * packet's payload goes: its client sends it again once the backend has
 * answered. Returns 0, or -1 to drop the packet (counted).
 */
static __always_inline int syn_for_backend(struct xdp_md *ctx, struct packet *pkt,
					   const struct synproxy_seq *sp)
{
	struct tcphdr *tcp = pkt->l4;
	__u32 bytes = pkt->len;
	struct tcp_frame f;

	if ((void *)(tcp + 1) > pkt->data_end) {
		count(STAT_DROP_ADJUST, bytes);
		return -1;
	}
	__builtin_memset(&f, 0, sizeof(f));
	__builtin_memcpy(f.dmac, pkt->eth->h_dest, ETH_ALEN);
	__builtin_memcpy(f.smac, pkt->eth->h_source, ETH_ALEN);
	f.saddr = pkt->saddr;
	f.daddr = pkt->daddr;
	f.sport = pkt->sport;
	f.dport = pkt->dport;
	f.seq = sp->client_isn;
	f.flags = TCP_FLAG_SYN;
	f.window = bpf_ntohs(tcp->window);
	f.mss = sp->mss;
	f.ttl = pkt->ip->ttl;
	if (tcp_frame_write(ctx, bytes, &f))
		return -1;
	if (parse_packet((void *)(long)ctx->data, (void *)(long)ctx->data_end, pkt) != PARSE_OK) {
		count(STAT_DROP_ADJUST, bytes);
		return -1;
	}
	return 0;
}

/*
 * A client's packet of a flow the SYN proxy opened (CT_F_SYNPROXY): the
 * ACK that answered its cookie (opened) and anything its client sends
 * before the backend answered become the proxy's SYN (sent again until
 * the backend answers); after that, its acknowledgement is translated to
 * the backend's sequence numbers. A flow whose offset was lost ends, and
 * its client is told. Returns 0 to translate pkt and send it on, or the
 * verdict.
 */
static __always_inline int synproxy_client(struct xdp_md *ctx, struct packet *pkt,
					   const struct flow_result *res, struct ct_entry *ct, int opened)
{
	struct synproxy_seq *sp, fresh;
	struct tcphdr *tcp;

	if (opened) {
		__builtin_memset(&fresh, 0, sizeof(fresh));
		fresh.cookie = res->cookie;
		fresh.client_isn = res->client_isn;
		fresh.mss = res->cookie_mss;
		if (bpf_map_update_elem(&synproxy_flows, &res->key, &fresh, BPF_ANY))
			return drop(STAT_DROP_CT_FULL, pkt->len);
		return syn_for_backend(ctx, pkt, &fresh) ? XDP_DROP : 0;
	}
	sp = bpf_map_lookup_elem(&synproxy_flows, &res->key);
	if (!sp) {
		/* Its sequence numbers cannot be translated: the flow ends
		 * (reset: it times out as a closed connection). */
		ct_add_tcp_state(ct, CT_TCP_RST);
		return reset_client(ctx, pkt, STAT_RST_SYNPROXY_LOST);
	}
	if (!sp->answered) {
		/* A RST goes as it is: the backend's half-open side ends. */
		if (pkt->tcp_flags & TCP_FLAG_RST)
			return 0;
		return syn_for_backend(ctx, pkt, sp) ? XDP_DROP : 0;
	}
	tcp = pkt->l4;
	if ((void *)(tcp + 1) > pkt->data_end)
		return drop(STAT_DROP_ADJUST, pkt->len);
	if (pkt->tcp_flags & TCP_FLAG_ACK)
		tcp_seq_shift(tcp, &tcp->ack_seq, sp->seq_offset);
	return 0;
}

/* Traffic from a client to a port some frontend uses. */
static __always_inline int serve_frontend_port(struct xdp_md *ctx, struct packet *pkt,
					       const struct datapath_config *cfg)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct flow_result *res = flow_result_get();
	struct ct_entry *ct = NULL;
	int opened = 0, verdict;
	__be32 saddr;
	__be16 sport;

	if (!res)
		return pass(STAT_PASS_NOT_SERVICE, pkt->len);
	switch (flow_classify(ctx, ctx->ingress_ifindex, pkt, ORIGIN_EXTERNAL, HOOK_SYN_PROXY, cfg,
			      now, res, &ct)) {
	case FLOW_PASS:
		return pass(res->reason, pkt->len);
	case FLOW_DROP:
		return drop(res->reason, pkt->len);
	case FLOW_REFUSE:
		return refuse(ctx, pkt);
	case FLOW_RESET:
		return reset_client(ctx, pkt, res->reason);
	case FLOW_COOKIE:
		return answer_with_cookie(ctx, pkt, res);
	case FLOW_NEW:
		/* Of the SYN proxy, a new flow is opened by an ACK. */
		opened = !(pkt->tcp_flags & TCP_FLAG_SYN);
		/* fall through */
	case FLOW_PENDING:
		/* ct is the new entry, with the next hop flow_start found, or
		 * a copy of an unconfirmed flow's entry. */
		if (!ct)
			return drop(STAT_DROP_CT_FULL, pkt->len);
		break;
	case FLOW_TRACKED:
		/* The established fast path: one conntrack lookup, a backend
		 * check, the rewrite and a cached next hop. */
		if (!ct)
			return drop(STAT_DROP_CT_FULL, pkt->len);
		switch (flow_touch(ctx, res, ct, pkt, cfg, now)) {
		case FLOW_TRACKED:
			break;
		case FLOW_RESET:
			return reset_client(ctx, pkt, res->reason);
		default:
			return drop(res->reason, pkt->len);
		}
		count_service(ct->svc_id, pkt->len, 0);
		break;
	}
	if (ct->flags & CT_F_SYNPROXY) {
		verdict = synproxy_client(ctx, pkt, res, ct, opened);
		if (verdict)
			return verdict;
	}
	flow_source(ct, pkt, &saddr, &sport);
	if (ct->flags & CT_F_HOST)
		return deliver_to_host(pkt, saddr, sport, ct->backend_addr, ct->backend_port);
	return translate_and_send(ctx, pkt, &ct->hop, saddr, sport, ct->backend_addr,
				  ct->backend_port);
}

/*
 * A backend's reply in a flow the SYN proxy opened (CT_F_SYNPROXY), as
 * synproxy_reply_plan says: its first SYN-ACK also confirms the flow
 * (flow_confirm_proxied). Returns -1 to translate pkt and send it on, or
 * the verdict.
 */
static __always_inline int synproxy_backend(struct xdp_md *ctx, struct packet *pkt,
					    const struct nat_key *key, struct nat_entry *rev)
{
	struct tcphdr *tcp = pkt->l4;
	struct synproxy_seq *sp;
	__u32 bytes = pkt->len;
	struct tcp_frame f;
	struct ct_key flow;
	__u32 delta = 0;

	if (key->proto != IPPROTO_TCP)
		return -1;
	ct_key_of_nat(key, rev, &flow);
	sp = bpf_map_lookup_elem(&synproxy_flows, &flow);
	if (!sp)
		return drop(STAT_DROP_SYNPROXY_LOST, bytes);
	if ((void *)(tcp + 1) > pkt->data_end)
		return drop(STAT_DROP_ADJUST, bytes);
	switch (synproxy_reply_plan(sp, pkt->tcp_flags, pkt->tcp_seq, bpf_ntohl(tcp->ack_seq),
				    &delta)) {
	case SYNPROXY_REPLY_FIRST_ANSWER:
		flow_confirm_proxied(&flow, rev, bpf_ktime_get_coarse_ns());
		/* fall through */
	case SYNPROXY_REPLY_ANSWER:
		synproxy_ack_frame(&f, pkt, pkt->eth, sp);
		if (tcp_frame_write(ctx, bytes, &f))
			return XDP_DROP;
		count(STAT_SYNPROXY_ACK, bytes);
		return XDP_TX;
	case SYNPROXY_REPLY_SHIFT:
		tcp_seq_shift(tcp, &tcp->seq, delta);
		return -1;
	default:
		return drop(STAT_DROP_SYNPROXY_PENDING, bytes);
	}
}

/* A reply from a remote backend to a SNAT port of this node. */
static __always_inline int serve_reply(struct xdp_md *ctx, struct packet *pkt,
				       const struct nat_key *key, struct nat_entry *rev)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	enum stat reason;
	int verdict;

	if (reverse_touch(key, rev, pkt, now, &reason))
		return drop(reason, pkt->len);
	if (rev->flags & CT_F_SYNPROXY) {
		verdict = synproxy_backend(ctx, pkt, key, rev);
		if (verdict >= 0)
			return verdict;
	}
	count(STAT_REVERSE_NAT, 0);
	count_service(rev->svc_id, pkt->len, 0);
	return translate_and_send(ctx, pkt, &rev->hop, rev->frontend_addr, rev->frontend_port,
				  rev->client_addr, rev->client_port);
}

/* An ICMP error about a translated flow (see icmp.h). */
static __always_inline int serve_icmp(struct xdp_md *ctx, struct packet *pkt)
{
	struct bpf_fib_lookup fib;
	struct icmp_rewrite rw;
	struct icmp_quote *quote;
	int fib_rc;

	quote = icmp_error_quote(pkt);
	if (!quote || icmp_error_lookup(pkt, quote, &rw, 0))
		return pass(STAT_PASS_ICMP, pkt->len);
	/* Routed as it arrived (the lookup reads the packet's own fields);
	 * an error for this node's own backend is delivered, not routed. */
	if (!rw.to_host)
		fib_rc = fib_lookup_ipv4(ctx, ctx->ingress_ifindex, pkt, rw.daddr, &fib);
	icmp_error_rewrite(pkt, quote, &rw);
	count(STAT_ICMP_TRANSLATED, pkt->len);
	if (rw.to_host)
		return pass(STAT_PASS_TO_HOST, pkt->len);
	return xdp_forward(ctx, pkt, &fib, fib_rc, NULL);
}

SEC("xdp")
int xdplb_nic(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct datapath_config *cfg;
	struct packet pkt;

	switch (parse_packet(data, data_end, &pkt)) {
	case PARSE_OK:
		break;
	case PARSE_NOT_IPV4:
		return pass(STAT_PASS_NOT_IPV4, pkt.len);
	case PARSE_IP_OPTIONS:
		return pass(STAT_PASS_IP_OPTIONS, pkt.len);
	case PARSE_FRAGMENT:
		return pass(STAT_PASS_FRAGMENT, pkt.len);
	case PARSE_OTHER_L4:
		return pass(STAT_PASS_NOT_SERVICE, pkt.len);
	default:
		return pass(STAT_PASS_MALFORMED, pkt.len);
	}

	if (pkt.proto == IPPROTO_ICMP)
		return serve_icmp(ctx, &pkt);

	cfg = config_get();
	if (!cfg)
		return pass(STAT_PASS_NOT_SERVICE, pkt.len);
	/* Replies first: a SNAT port may also be the port of some frontend
	 * (a ClusterIP's, or an externalIP's on the node address), and a
	 * reply must not be taken for a new flow or passed to the stack. */
	if (snat_port_in_range(cfg, pkt.dport)) {
		struct nat_entry *rev;
		struct nat_key key;

		nat_key_set(&key, pkt.saddr, pkt.daddr, pkt.sport, pkt.dport, pkt.proto);
		rev = snat_reply_lookup(&key, cfg);
		if (rev)
			return serve_reply(ctx, &pkt, &key, rev);
	}
	if (port_has_frontend(pkt.dport))
		return serve_frontend_port(ctx, &pkt, cfg);
	return pass(STAT_PASS_NOT_SERVICE, pkt.len);
}
