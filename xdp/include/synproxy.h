/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * synproxy.h - SYN cookies for external frontends under a SYN flood.
 *
 * While a service port is flooded (syn_flood_due), the XDP program answers
 * a SYN to it itself, with a SYN-ACK whose sequence number is a SYN cookie
 * (the kernel's own: bpf_tcp_raw_gen_syncookie_ipv4), and keeps no state: a
 * spoofed SYN costs one XDP_TX, no entry and no SNAT port. An ACK whose
 * cookie checks out proves a client that answered: only then is a flow
 * opened. The ACK is turned into the SYN its client sent (the same initial
 * sequence number, the MSS its cookie carries) and goes to a backend like
 * any new flow, flagged CT_F_SYNPROXY. The backend's SYN-ACK is answered
 * here with the ACK the client already sent, which completes the
 * handshake both ways and confirms the flow; from then on the backend's
 * sequence numbers differ from those the client knows by a fixed offset
 * (synproxy_flows), and every packet of the flow is translated by it:
 * the backend's sequence numbers for the client, the client's
 * acknowledgements for the backend. This is what the kernel's SYNPROXY
 * target does with conntrack.
 *
 * The cookie SYN-ACK offers no window scaling, SACK or timestamps (a
 * cookie cannot carry them back), so connections opened during a flood
 * use neither, on either side. The proxy serves flows to pods, remote
 * (their replies come back through the XDP program) or on this node (the
 * TC program on their interface: tc_synproxy_backend); a SYN for the node
 * itself (a host-network backend) is admitted as before.
 */
#ifndef XDPLB_SYNPROXY_H
#define XDPLB_SYNPROXY_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "counters.h"

/* The length of the window syn_flood counts handshakes in. */
#define SYN_FLOOD_WINDOW_NS NSEC_PER_SEC
/* Without an MSS its cookie can be matched to (see syncookie_mss): the
 * IPv4 minimum every host accepts (RFC 9293, 3.7.1). */
#define SYNPROXY_DEFAULT_MSS 536
/* The receive window the proxy's SYN-ACK and ACK announce: unscaled, as
 * no window scaling is negotiated. */
#define SYNPROXY_WINDOW 65535

/* A TCP header with one option, an MSS: what a SYN or SYN-ACK the proxy
 * builds carries. */
struct tcp_mss_hdr {
	struct tcphdr tcp;
	__u8 kind; /* TCPOPT_MSS */
	__u8 len;  /* TCPOLEN_MSS */
	__be16 mss;
};

#define TCPOPT_MSS 2
#define TCPOLEN_MSS 4

/* ---- flood judgement ---------------------------------------------------- */

enum syn_flood_event {
	SYN_FLOOD_OPENED,    /* a SYN started a flow or got a cookie */
	SYN_FLOOD_COMPLETED, /* its client confirmed a flow, or answered a cookie */
};

static __always_inline struct syn_flood *syn_flood_of(__u32 svc_id, __u64 now)
{
	struct syn_flood *f = bpf_map_lookup_elem(&syn_floods, &svc_id);
	__u64 age;

	if (!f)
		return NULL;
	age = time_since(f->window_ns, now);
	if (age >= SYN_FLOOD_WINDOW_NS) {
		/* A new window; racing CPUs may each start it, which loses a
		 * few counts at most. */
		f->incomplete_before = age < 2 * SYN_FLOOD_WINDOW_NS && f->opened > f->completed
					       ? f->opened - f->completed
					       : 0;
		f->window_ns = now;
		f->opened = 0;
		f->completed = 0;
	}
	return f;
}

/* Count a handshake event of a service port (see struct syn_flood); only
 * SYN_COOKIES_AUTO judges by the counts. */
static __always_inline void syn_flood_count(const struct datapath_config *cfg, __u32 svc_id,
					    enum syn_flood_event event, __u64 now)
{
	struct syn_flood *f;

	if (cfg->syn_cookies != SYN_COOKIES_AUTO)
		return;
	f = syn_flood_of(svc_id, now);
	if (!f)
		return;
	if (event == SYN_FLOOD_OPENED)
		__sync_fetch_and_add(&f->opened, 1);
	else
		__sync_fetch_and_add(&f->completed, 1);
}

/*
 * Are a service port's SYNs answered with cookies now? In SYN_COOKIES_AUTO,
 * while the handshakes it left incomplete in this second or the last reach
 * the threshold: a busy port completes nearly all of its handshakes within
 * a round trip, a flooded one almost none. Cookies sent count as opened
 * handshakes, so a flood keeps them on until it stops.
 */
static __always_inline int syn_flood_due(const struct datapath_config *cfg, __u32 svc_id, __u64 now)
{
	struct syn_flood *f;

	if (cfg->syn_cookies == SYN_COOKIES_ALWAYS)
		return 1;
	if (cfg->syn_cookies != SYN_COOKIES_AUTO)
		return 0;
	f = syn_flood_of(svc_id, now);
	if (!f)
		return 0;
	return f->incomplete_before >= cfg->syn_flood_threshold ||
	       (f->opened > f->completed && f->opened - f->completed >= cfg->syn_flood_threshold);
}

/* ---- cookies ------------------------------------------------------------ */

/*
 * The SYN cookie that answers a SYN, and the MSS it encodes (the largest of
 * the kernel's cookie MSS values the client's fits), into *cookie and
 * *mss. Returns 0, or -1 when no cookie can be made (the kernel was built
 * without SYN cookies, or the header is malformed).
 */
static __always_inline int syncookie_make(const struct packet *pkt, __u32 *cookie, __u16 *mss)
{
	/* The helper reads the header's options: it gets a copy, whose
	 * variable length the verifier can bound (a TCP header has at most
	 * 15 words). */
	__u32 th[15], th_words;
	__u32 *words = pkt->l4;
	__s64 value;

	if ((void *)(words + 5) > pkt->data_end)
		return -1;
	th_words = ((struct tcphdr *)words)->doff;
	__builtin_memset(th, 0, sizeof(th));
	for (int i = 0; i < 15; i++) {
		if (i >= th_words)
			break;
		if ((void *)(words + i + 1) > pkt->data_end)
			return -1;
		th[i] = words[i];
	}
	if (th_words < 5 || th_words > 15)
		return -1;
	value = bpf_tcp_raw_gen_syncookie_ipv4(pkt->ip, (struct tcphdr *)th, th_words * 4);
	if (value < 0)
		return -1;
	*cookie = (__u32)value;
	*mss = (__u16)(value >> 32);
	return 0;
}

/* Does an ACK (without SYN, RST or FIN) answer a SYN cookie of ours? If
 * so, the cookie and the client's ISN are in *cookie and *client_isn. */
static __always_inline int syncookie_answered(const struct packet *pkt, __u32 *cookie,
					      __u32 *client_isn)
{
	struct tcphdr *tcp = pkt->l4;

	if ((pkt->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_RST | TCP_FLAG_FIN | TCP_FLAG_ACK)) !=
	    TCP_FLAG_ACK)
		return 0;
	if ((void *)(tcp + 1) > pkt->data_end)
		return 0;
	if (bpf_tcp_raw_check_syncookie_ipv4(pkt->ip, tcp))
		return 0;
	*cookie = bpf_ntohl(tcp->ack_seq) - 1;
	*client_isn = bpf_ntohl(tcp->seq) - 1;
	return 1;
}

/*
 * The MSS a checked cookie carries. The kernel's check does not return it,
 * so the cookie is made again for the client's SYN with each MSS the
 * kernel encodes, largest first, until one matches. A cookie from the
 * previous minute matches none (the kernel's cookies embed a minute
 * counter): the minimum MSS then.
 */
static __always_inline __u16 syncookie_mss(const struct packet *pkt, __u32 cookie, __u32 client_isn)
{
	/* The kernel's IPv4 cookie MSS values (msstab in syncookies.c). */
	const __u16 candidates[4] = {1460, 1440, 1300, 536};
	struct {
		struct iphdr ip;
		struct tcp_mss_hdr th;
	} syn;
	__s64 value;

	__builtin_memset(&syn, 0, sizeof(syn));
	syn.ip.saddr = pkt->saddr;
	syn.ip.daddr = pkt->daddr;
	syn.th.tcp.source = pkt->sport;
	syn.th.tcp.dest = pkt->dport;
	syn.th.tcp.seq = bpf_htonl(client_isn);
	syn.th.tcp.doff = sizeof(syn.th) / 4;
	syn.th.tcp.syn = 1;
	syn.th.kind = TCPOPT_MSS;
	syn.th.len = TCPOLEN_MSS;
#pragma unroll
	for (int i = 0; i < 4; i++) {
		syn.th.mss = bpf_htons(candidates[i]);
		value = bpf_tcp_raw_gen_syncookie_ipv4(&syn.ip, &syn.th.tcp, sizeof(syn.th));
		if (value >= 0 && (__u32)value == cookie)
			return (__u16)(value >> 32);
	}
	return SYNPROXY_DEFAULT_MSS;
}

/* ---- building the proxy's segments ------------------------------------- */

/* A TCP segment the proxy sends, built from scratch (see tcp_frame_write). */
struct tcp_frame {
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 seq; /* host order */
	__u32 ack; /* host order; sent with TCP_FLAG_ACK */
	__u16 window;
	__u16 mss; /* 0: no MSS option */
	__u8 flags;
	__u8 ttl;
};

#define TCP_FRAME_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr))
#define TCP_MSS_FRAME_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcp_mss_hdr))

/* Fill in a segment's TCP header (tcp_len bytes, a constant: 20, or 24 with
 * the MSS option) and its checksum, after its IPv4 header. */
static __always_inline void tcp_frame_fill(const struct tcp_frame *f, struct iphdr *ip,
					   struct tcp_mss_hdr *th, const int tcp_len)
{
	__u32 acc;

	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(*ip) + tcp_len);
	ip->id = 0;
	ip->frag_off = bpf_htons(IP_DF);
	ip->ttl = f->ttl;
	ip->protocol = IPPROTO_TCP;
	ip->check = 0;
	ip->saddr = f->saddr;
	ip->daddr = f->daddr;
	ip->check = ~csum_fold32(csum_words((__u16 *)ip, sizeof(*ip) / 2, 0));

	__builtin_memset(&th->tcp, 0, sizeof(th->tcp));
	th->tcp.source = f->sport;
	th->tcp.dest = f->dport;
	th->tcp.seq = bpf_htonl(f->seq);
	if (f->flags & TCP_FLAG_ACK)
		th->tcp.ack_seq = bpf_htonl(f->ack);
	th->tcp.doff = tcp_len / 4;
	((__u8 *)&th->tcp)[13] = f->flags;
	th->tcp.window = bpf_htons(f->window);
	if (tcp_len > (int)sizeof(th->tcp)) {
		th->kind = TCPOPT_MSS;
		th->len = TCPOLEN_MSS;
		th->mss = bpf_htons(f->mss);
	}
	acc = csum_words((__u16 *)&ip->saddr, 4, 0);
	acc += bpf_htons(IPPROTO_TCP) + bpf_htons(tcp_len);
	acc = csum_words((__u16 *)th, tcp_len / 2, acc);
	th->tcp.check = ~csum_fold32(acc);
}

/*
 * Make the packet in ctx exactly the segment f describes (Ethernet, IPv4
 * without options, TCP with the MSS option when f->mss is set). Returns 0,
 * or -1 when the frame could not be resized (counted STAT_DROP_ADJUST; the
 * packet is then to be dropped). Every pointer into the packet is stale
 * afterwards.
 */
static __always_inline int tcp_frame_write(struct xdp_md *ctx, __u32 old_len,
					   const struct tcp_frame *f)
{
	__u32 len = f->mss ? TCP_MSS_FRAME_LEN : TCP_FRAME_LEN;
	void *data, *data_end;
	struct ethhdr *eth;

	if (bpf_xdp_adjust_tail(ctx, (int)len - (int)old_len))
		goto fail;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	if (data + TCP_FRAME_LEN > data_end)
		goto fail;
	eth = data;
	__builtin_memcpy(eth->h_dest, f->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, f->smac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	if (!f->mss) {
		tcp_frame_fill(f, (void *)(eth + 1), (void *)(eth + 1) + sizeof(struct iphdr),
			       sizeof(struct tcphdr));
		return 0;
	}
	if (data + TCP_MSS_FRAME_LEN > data_end)
		goto fail;
	tcp_frame_fill(f, (void *)(eth + 1), (void *)(eth + 1) + sizeof(struct iphdr),
		       sizeof(struct tcp_mss_hdr));
	return 0;
fail:
	count(STAT_DROP_ADJUST, old_len);
	return -1;
}

/* The segment that answers pkt (eth: its Ethernet header) from where it
 * was sent to: the addresses, ports and MACs of pkt swapped. */
static __always_inline void tcp_frame_answer(struct tcp_frame *f, const struct packet *pkt,
					     const struct ethhdr *eth)
{
	__builtin_memset(f, 0, sizeof(*f));
	__builtin_memcpy(f->dmac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(f->smac, eth->h_dest, ETH_ALEN);
	f->saddr = pkt->daddr;
	f->daddr = pkt->saddr;
	f->sport = pkt->dport;
	f->dport = pkt->sport;
	f->ttl = XDPLB_DEFAULT_TTL;
}

/* ---- the backend's side ------------------------------------------------ */

enum synproxy_reply {
	SYNPROXY_REPLY_FIRST_ANSWER, /* its first SYN-ACK: the offset is fixed; confirm, answer */
	SYNPROXY_REPLY_ANSWER,       /* a retransmitted SYN-ACK: answer with the client's ACK again */
	SYNPROXY_REPLY_SHIFT,        /* add the delta to its sequence number, send it on */
	SYNPROXY_REPLY_PENDING,      /* drop: no answer to the proxy's SYN yet */
};

/*
 * What becomes of a backend's reply in a flow the SYN proxy opened (sp;
 * tcp_flags, and seq and ack_seq in host order). Its SYN-ACK to the
 * proxy's SYN fixes the flow's sequence offset and is answered with the
 * ACK its client sent the proxy (synproxy_ack_frame); a RST before it
 * refuses the client, at the sequence number the client expects (the
 * cookie's + 1); later replies are shifted to the client's sequence
 * numbers. *delta is set for SYNPROXY_REPLY_SHIFT.
 */
static __always_inline enum synproxy_reply synproxy_reply_plan(struct synproxy_seq *sp,
							       __u8 tcp_flags, __u32 seq,
							       __u32 ack_seq, __u32 *delta)
{
	if ((tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) ==
	    (TCP_FLAG_SYN | TCP_FLAG_ACK)) {
		if (ack_seq != sp->client_isn + 1)
			return SYNPROXY_REPLY_PENDING;
		if (sp->answered)
			return SYNPROXY_REPLY_ANSWER;
		sp->seq_offset = seq - sp->cookie;
		sp->answered = 1;
		return SYNPROXY_REPLY_FIRST_ANSWER;
	}
	if (sp->answered) {
		*delta = -sp->seq_offset;
		return SYNPROXY_REPLY_SHIFT;
	}
	if (!(tcp_flags & TCP_FLAG_RST))
		return SYNPROXY_REPLY_PENDING;
	*delta = sp->cookie + 1 - seq;
	return SYNPROXY_REPLY_SHIFT;
}

/* The proxy's answer to its backend's SYN-ACK pkt (eth: its Ethernet
 * header): the ACK its client sent the proxy, from the client's tuple as
 * the backend sees it. */
static __always_inline void synproxy_ack_frame(struct tcp_frame *f, const struct packet *pkt,
					       const struct ethhdr *eth,
					       const struct synproxy_seq *sp)
{
	tcp_frame_answer(f, pkt, eth);
	f->seq = sp->client_isn + 1;
	f->ack = pkt->tcp_seq + 1;
	f->flags = TCP_FLAG_ACK;
	f->window = SYNPROXY_WINDOW;
}

/* ---- sequence translation ---------------------------------------------- */

/* Add delta to a TCP sequence field of the packet, keeping its checksum. */
static __always_inline void tcp_seq_shift(struct tcphdr *tcp, __be32 *field, __u32 delta)
{
	__be32 to = bpf_htonl(bpf_ntohl(*field) + delta);

	tcp->check = csum_apply(tcp->check, csum_delta32(0, *field, to));
	*field = to;
}

#endif /* XDPLB_SYNPROXY_H */
