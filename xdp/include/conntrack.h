/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * conntrack.h - conntrack-lite: the forward half of a tracked flow.
 *
 * Entries live in an LRU hash keyed by the client-side 5-tuple. Timeouts are
 * enforced on lookup: an entry idle for longer than its timeout counts as a
 * miss and is replaced. last_seen is written at most once a second so busy
 * flows do not bounce the entry's cache line between CPUs.
 */
#ifndef XDPLB_CONNTRACK_H
#define XDPLB_CONNTRACK_H

#include "maps.h"
#include "parse.h"
#include "tuple.h"
#include "counters.h"

static __always_inline struct datapath_config *config_get(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&config, &zero);
}

static __always_inline void ct_key_from_packet(const struct packet *pkt, struct ct_key *key)
{
	ct_key_set(key, pkt->saddr, pkt->daddr, pkt->sport, pkt->dport, pkt->proto);
}

/* The state bits of a TCP connection that is closing: a FIN or a RST. */
#define CT_TCP_CLOSING (CT_TCP_FIN | CT_TCP_REPLY_FIN | CT_TCP_RST)

/* Is the TCP connection past its handshake and not closing? */
static __always_inline int ct_tcp_established(const struct ct_entry *ct)
{
	return (ct->tcp_state & CT_TCP_ESTABLISHED) && !(ct->tcp_state & CT_TCP_CLOSING);
}

/* Is the TCP connection closed: reset, or a FIN sent each way (a FIN one
 * way only is a half-close: the other side may still send)? */
static __always_inline int ct_tcp_closed(const struct ct_entry *ct)
{
	return (ct->tcp_state & CT_TCP_RST) ||
	       (ct->tcp_state & (CT_TCP_FIN | CT_TCP_REPLY_FIN)) == (CT_TCP_FIN | CT_TCP_REPLY_FIN);
}

/* The idle timeout of an unconfirmed TCP flow, at most: a real client
 * completes its handshake within a round trip, or retransmits its SYN
 * (after 1, 2, 4 s...), so a SNAT port a spoofed SYN claims (below the SYN
 * flood threshold) is held this long, not the transient timeout. */
#define CT_UNCONFIRMED_TCP_TIMEOUT_NS (5 * NSEC_PER_SEC)

/* An unconfirmed TCP flow has the transient timeout (at most
 * CT_UNCONFIRMED_TCP_TIMEOUT_NS), whatever its client sent: only the
 * handshake completed both ways makes a flow established. */
static __always_inline __u64 ct_timeout(const struct ct_entry *ct, __u8 proto,
					const struct datapath_config *cfg)
{
	if (proto == IPPROTO_TCP && (ct->flags & CT_F_UNCONFIRMED))
		return cfg->tcp_transient_timeout_ns < CT_UNCONFIRMED_TCP_TIMEOUT_NS
			       ? cfg->tcp_transient_timeout_ns
			       : CT_UNCONFIRMED_TCP_TIMEOUT_NS;
	if (proto == IPPROTO_TCP)
		return ct_tcp_established(ct) ? cfg->tcp_established_timeout_ns
					      : cfg->tcp_transient_timeout_ns;
	return cfg->udp_timeout_ns;
}

/* Is the flow over, idle past its timeout? (An entry the agent ends is
 * dated back past every timeout: see CT_F_ENDED.) */
static __always_inline int ct_expired(const struct ct_entry *ct, __u8 proto,
				      const struct datapath_config *cfg, __u64 now)
{
	return time_since(ct->last_seen_ns, now) > ct_timeout(ct, proto, cfg);
}

/* Fold the TCP flags of a client packet into the entry's state bits. */
static __always_inline __u8 ct_tcp_next_state(__u8 state, __u8 tcp_flags)
{
	if (tcp_flags & TCP_FLAG_RST)
		state |= CT_TCP_RST;
	if (tcp_flags & TCP_FLAG_FIN)
		state |= CT_TCP_FIN;
	if (tcp_flags & TCP_FLAG_SYN)
		state |= CT_TCP_SYN;
	else if (tcp_flags & TCP_FLAG_ACK)
		state |= CT_TCP_ESTABLISHED;
	return state;
}

_Static_assert(__builtin_offsetof(struct ct_entry, tcp_state) % 4 == 0,
	       "tcp_state must start a 32-bit word: ct_add_tcp_state ORs into it");
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "ct_add_tcp_state assumes tcp_state is the word's low byte"
#endif

/*
 * Add TCP state bits to a live entry, writing only when one is new. Both
 * directions add them, on any CPU (a client's packet, a reply's FIN or
 * RST): a plain store of the byte could undo a bit another CPU added a
 * moment before, and a lost RST leaves a closed connection the
 * established timeout. BPF has no atomic on a byte, so the bits are ORed
 * into the 32-bit word that starts with tcp_state (bits are only ever
 * added in place; flags, the word's second byte, is not written in place;
 * seq_mark, its upper half, is, with a plain store, which an atomic OR
 * of the word cannot undo).
 */
static __always_inline void ct_add_tcp_state(struct ct_entry *ct, __u8 bits)
{
	if ((ct->tcp_state & bits) != bits)
		__sync_fetch_and_or((__u32 *)&ct->tcp_state, (__u32)bits);
}

/*
 * RST and FIN count only in window. Each direction's entry keeps the top
 * 16 bits of the highest sequence number its sender was seen to send (a
 * mark, in 64 KiB units), written only when it moves on, so a bulk
 * transfer writes it once per 64 KiB. A RST or FIN is in window when its
 * sequence number lies from SEQ_WINDOW_BEHIND units behind the mark (data
 * of a large window still in flight) to SEQ_WINDOW_AHEAD units ahead of it
 * (past the largest GSO packet the mark may have been taken from): a
 * blind attacker hits it with one guess in about 1600. The mark moves
 * only by packets in that window too, never by a SYN, so a blind packet
 * far ahead cannot move it for a RST to follow. The kernel's conntrack
 * checks the window the receiver announced instead; xdplb keeps no
 * per-packet window state, so its check is coarser, with the entries'
 * layout unchanged.
 */
#define SEQ_WINDOW_BEHIND 32
#define SEQ_WINDOW_AHEAD 8

static __always_inline __u16 seq_mark_of(__u32 seq)
{
	return seq >> 16;
}

/* Does seq lie in the window of a sender whose mark is mark? */
static __always_inline int seq_in_window(__u16 mark, __u32 seq)
{
	__s16 d = (__s16)(seq_mark_of(seq) - mark);

	return d >= -SEQ_WINDOW_BEHIND && d <= SEQ_WINDOW_AHEAD;
}

/* Does a packet at seq move its sender's mark on: past the mark's unit,
 * within the window (a mark never moves back: an older sequence number is
 * a retransmission)? */
static __always_inline int seq_mark_advances(__u16 mark, __u32 seq)
{
	__s16 d = (__s16)(seq_mark_of(seq) - mark);

	return d > 0 && d <= SEQ_WINDOW_AHEAD;
}

/* Why a RST or FIN out of window is dropped: it changes nothing. */
static __always_inline enum stat out_of_window_reason(const struct packet *pkt)
{
	return (pkt->tcp_flags & TCP_FLAG_RST) ? STAT_DROP_RST_OUT_OF_WINDOW
					       : STAT_DROP_FIN_OUT_OF_WINDOW;
}

/* May a client's TCP packet go on: anything but a RST or FIN out of its
 * window (before the client's sequence is known, any)? */
static __always_inline int ct_seq_acceptable(const struct ct_entry *ct, const struct packet *pkt)
{
	return !(pkt->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN)) ||
	       !(ct->tcp_state & CT_TCP_SEQ_KNOWN) || seq_in_window(ct->seq_mark, pkt->tcp_seq);
}

/* Follow the client's sequence with a packet of its (not a SYN: a new
 * one on a live tuple is no part of its sequence). */
static __always_inline void ct_seq_track(struct ct_entry *ct, const struct packet *pkt)
{
	if (pkt->tcp_flags & TCP_FLAG_SYN)
		return;
	if (!(ct->tcp_state & CT_TCP_SEQ_KNOWN)) {
		ct->seq_mark = seq_mark_of(pkt->tcp_seq);
		ct_add_tcp_state(ct, CT_TCP_SEQ_KNOWN);
	} else if (seq_mark_advances(ct->seq_mark, pkt->tcp_seq)) {
		ct->seq_mark = seq_mark_of(pkt->tcp_seq);
	}
}

/* The same for a backend's reply, by the flow's reverse half. */
static __always_inline int nat_seq_acceptable(const struct nat_entry *rev, const struct packet *pkt)
{
	return !(pkt->tcp_flags & (TCP_FLAG_RST | TCP_FLAG_FIN)) || !rev->reply_seq_known ||
	       seq_in_window(rev->reply_seq_mark, pkt->tcp_seq);
}

/* Follow the backend's sequence with a reply (its SYN-ACK starts it). */
static __always_inline void nat_seq_track(struct nat_entry *rev, const struct packet *pkt)
{
	if (!rev->reply_seq_known) {
		rev->reply_seq_mark = seq_mark_of(pkt->tcp_seq);
		rev->reply_seq_known = 1;
	} else if (!(pkt->tcp_flags & TCP_FLAG_SYN) &&
		   seq_mark_advances(rev->reply_seq_mark, pkt->tcp_seq)) {
		rev->reply_seq_mark = seq_mark_of(pkt->tcp_seq);
	}
}

/* A SYN on a tuple whose previous connection closed (reset, or a FIN each
 * way) starts a new flow. A half-closed connection keeps its tuple: its
 * backend may still send, and a SYN there is not a new connection. */
static __always_inline int ct_reused_tuple(const struct ct_entry *ct, __u8 tcp_flags)
{
	return (tcp_flags & TCP_FLAG_SYN) && !(tcp_flags & TCP_FLAG_ACK) && ct_tcp_closed(ct);
}

/* The tracked flow of a client tuple: a confirmed one, else an unconfirmed
 * one; NULL when there is none. */
static __always_inline struct ct_entry *ct_lookup(const struct ct_key *key)
{
	struct ct_entry *ct = bpf_map_lookup_elem(&conntrack, key);

	if (ct)
		return ct;
	return bpf_map_lookup_elem(&ct_unconfirmed, key);
}

/* Forget a tracked flow, from the table its entry is in. */
static __always_inline void ct_delete(const struct ct_key *key, const struct ct_entry *ct)
{
	if (ct->flags & CT_F_UNCONFIRMED)
		bpf_map_delete_elem(&ct_unconfirmed, key);
	else
		bpf_map_delete_elem(&conntrack, key);
}

/* Track a flow, new or rebuilt, in the table its flags name. */
static __always_inline long ct_insert(const struct ct_key *key, const struct ct_entry *ct,
				      __u64 flags)
{
	if (ct->flags & CT_F_UNCONFIRMED)
		return bpf_map_update_elem(&ct_unconfirmed, key, ct, flags);
	return bpf_map_update_elem(&conntrack, key, ct, flags);
}

/* A UDP flow that its backend answered and that is still active this
 * long after it began is a stream, and confirmed; a single query and its
 * answer are not (the kernel's conntrack assures UDP flows alike), so a
 * flood of datagrams that a backend answers stays unconfirmed. */
#define CT_UDP_STREAM_NS (2 * NSEC_PER_SEC)

/* Does this packet confirm an unconfirmed flow whose backend answered (see
 * CT_TCP_REPLY)? For TCP, the client's ACK without SYN, unless the flow is
 * closing; for UDP, any packet once the flow is a stream. */
static __always_inline int ct_confirmed_by(const struct ct_entry *ct, __u8 proto, __u8 tcp_flags,
					   __u64 now)
{
	if (!(ct->flags & CT_F_UNCONFIRMED) || !(ct->tcp_state & CT_TCP_REPLY))
		return 0;
	if (proto != IPPROTO_TCP)
		return time_since(ct->created_ns, now) >= CT_UDP_STREAM_NS;
	return !(ct->tcp_state & CT_TCP_CLOSING) &&
	       (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK | TCP_FLAG_RST)) == TCP_FLAG_ACK;
}

/*
 * Move an unconfirmed flow to conntrack. Returns the confirmed entry; NULL
 * when conntrack refused it, and the flow stays unconfirmed. The
 * unconfirmed entry is deleted, so ct must not be used after a success.
 * Two CPUs confirming one flow at once write the same entry twice.
 */
static __always_inline struct ct_entry *ct_confirm(const struct ct_key *key,
						   const struct ct_entry *ct, __u64 now)
{
	struct ct_entry *confirmed;

	if (bpf_map_update_elem(&conntrack, key, ct, BPF_ANY))
		return NULL;
	confirmed = bpf_map_lookup_elem(&conntrack, key);
	if (!confirmed)
		return NULL;
	confirmed->flags &= ~CT_F_UNCONFIRMED;
	confirmed->last_seen_ns = now;
	bpf_map_delete_elem(&ct_unconfirmed, key);
	count(STAT_CT_CONFIRMED, 0);
	return confirmed;
}

#endif /* XDPLB_CONNTRACK_H */
