/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * frag.h - fragmented datagrams. Only the first fragment carries the ports
 * a flow is chosen by; the TC programs remember how it was translated,
 * keyed by the datagram's identity, and translate the later fragments of
 * the same datagram alike, so the whole datagram reaches one backend.
 * A later fragment that arrives before its first cannot be told from the
 * host's own traffic and goes to the stack (counted as pass_fragment by
 * XDP); its datagram is lost, as it would be to a reordering network.
 * Every first fragment clears what an earlier datagram with the same
 * identity left (IP ids come round), so a datagram whose first fragment
 * is not translated goes to the stack whole.
 */
#ifndef XDPLB_FRAG_H
#define XDPLB_FRAG_H

#include "maps.h"
#include "parse.h"

static __always_inline void frag_key_of(const struct packet *pkt, struct frag_key *key)
{
	key->saddr = pkt->saddr;
	key->daddr = pkt->daddr;
	key->id = pkt->ip_id;
	key->proto = pkt->proto;
	key->pad = 0;
}

/* Remember a first fragment's translation (orig: the tuple before it;
 * flags: enum frag_flags). */
static __always_inline void frag_remember(const struct packet *orig, const struct packet *now,
					  __u32 svc_id, __u32 flags)
{
	struct frag_key key;
	struct frag_entry entry = {
		.saddr = now->saddr,
		.daddr = now->daddr,
		.svc_id = svc_id,
		.flags = flags,
	};

	if (!(orig->frag_off & IP_MF))
		return;
	frag_key_of(orig, &key);
	bpf_map_update_elem(&fragments, &key, &entry, BPF_ANY);
}

/* A first fragment: forget what an earlier datagram with the same key
 * left, so its later fragments are translated only if it is (a first
 * fragment that is translated is remembered anew after this). */
static __always_inline void frag_forget_first(const struct packet *pkt)
{
	struct frag_key key;

	if (!(pkt->frag_off & IP_MF))
		return;
	frag_key_of(pkt, &key);
	bpf_map_delete_elem(&fragments, &key);
}

#endif /* XDPLB_FRAG_H */
