/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * hash.h - the flow hash (Bob Jenkins' lookup3 final mix over three words).
 *
 * The Go side (xdp.FlowHash) implements the same function so that the
 * control plane and the CLI can predict which backend a flow gets. Inputs
 * are host-order integers; see flow_hash() for how a tuple is folded.
 */
#ifndef XDPLB_HASH_H
#define XDPLB_HASH_H

#include "common.h"

static __always_inline __u32 rol32(__u32 word, unsigned int shift)
{
	return (word << shift) | (word >> ((-shift) & 31));
}

/* lookup3 final(): mixes a, b and c into c. */
static __always_inline __u32 hash_3words(__u32 a, __u32 b, __u32 c, __u32 seed)
{
	a += 0xdeadbeef + seed;
	b += 0xdeadbeef + seed;
	c += 0xdeadbeef + seed;
	c ^= b; c -= rol32(b, 14);
	a ^= c; a -= rol32(c, 11);
	b ^= a; b -= rol32(a, 25);
	c ^= b; c -= rol32(b, 16);
	a ^= c; a -= rol32(c, 4);
	b ^= a; b -= rol32(a, 14);
	c ^= b; c -= rol32(b, 24);
	return c;
}

/* Hash of a 5-tuple: addresses and ports in network byte order. */
static __always_inline __u32 flow_hash(__be32 saddr, __be32 daddr, __be16 sport,
				       __be16 dport, __u8 proto, __u32 seed)
{
	return hash_3words(bpf_ntohl(saddr), bpf_ntohl(daddr),
			   ((__u32)bpf_ntohs(sport) << 16) | bpf_ntohs(dport),
			   seed + proto);
}

/* Hash of a client address alone (ClientIP session affinity). */
static __always_inline __u32 client_hash(__be32 saddr, __u32 seed)
{
	return hash_3words(bpf_ntohl(saddr), 0, 0, seed);
}

#endif /* XDPLB_HASH_H */
