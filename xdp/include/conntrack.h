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

static __always_inline __u64 ct_timeout(const struct ct_entry *ct, __u8 proto,
					const struct datapath_config *cfg)
{
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
 * added in place; flags and pad, the word's other bytes, are not written
 * in place).
 */
static __always_inline void ct_add_tcp_state(struct ct_entry *ct, __u8 bits)
{
	if ((ct->tcp_state & bits) != bits)
		__sync_fetch_and_or((__u32 *)&ct->tcp_state, (__u32)bits);
}

/* A SYN on a tuple whose previous connection closed starts a new flow. */
static __always_inline int ct_reused_tuple(const struct ct_entry *ct, __u8 tcp_flags)
{
	return (tcp_flags & TCP_FLAG_SYN) && !(tcp_flags & TCP_FLAG_ACK) &&
	       (ct->tcp_state & CT_TCP_CLOSING);
}

#endif /* XDPLB_CONNTRACK_H */
