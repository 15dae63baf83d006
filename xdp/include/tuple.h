/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * tuple.h - writing 5-tuple map keys (struct ct_key, struct nat_key).
 *
 * Both keys are four 32-bit words: source address, destination address,
 * the two ports, the protocol followed by three zero bytes. A hash map
 * hashes its key a word at a time, so a key is written a word at a time
 * too: a word read back from narrower stores the CPU has not yet written
 * out cannot be forwarded from them and stalls the load (on the
 * established path a key built field by field cost ~5 ns per packet).
 */
#ifndef XDPLB_TUPLE_H
#define XDPLB_TUPLE_H

#include "maps.h"

struct tuple_words {
	__u32 word[4];
};

_Static_assert(sizeof(struct ct_key) == sizeof(struct tuple_words) &&
		       __builtin_offsetof(struct ct_key, sport) == 8 &&
		       __builtin_offsetof(struct ct_key, dport) == 10 &&
		       __builtin_offsetof(struct ct_key, proto) == 12,
	       "struct ct_key is not the 5-tuple layout");
_Static_assert(sizeof(struct nat_key) == sizeof(struct tuple_words) &&
		       __builtin_offsetof(struct nat_key, sport) == 8 &&
		       __builtin_offsetof(struct nat_key, dport) == 10 &&
		       __builtin_offsetof(struct nat_key, proto) == 12,
	       "struct nat_key is not the 5-tuple layout");

/* The words of a 5-tuple key, computed in registers. A word is built as
 * the big-endian value whose bytes are the fields in memory order, so the
 * layout comes out the same on either byte order. */
static __always_inline struct tuple_words tuple_words_of(__be32 saddr, __be32 daddr,
							 __be16 sport, __be16 dport, __u8 proto)
{
	struct tuple_words t = {
		.word = {
			saddr,
			daddr,
			bpf_htonl((__u32)bpf_ntohs(sport) << 16 | bpf_ntohs(dport)),
			bpf_htonl((__u32)proto << 24),
		},
	};

	return t;
}

static __always_inline void ct_key_set(struct ct_key *key, __be32 saddr, __be32 daddr,
				       __be16 sport, __be16 dport, __u8 proto)
{
	struct tuple_words t = tuple_words_of(saddr, daddr, sport, dport, proto);

	__builtin_memcpy(key, &t, sizeof(t));
}

static __always_inline void nat_key_set(struct nat_key *key, __be32 saddr, __be32 daddr,
					__be16 sport, __be16 dport, __u8 proto)
{
	struct tuple_words t = tuple_words_of(saddr, daddr, sport, dport, proto);

	__builtin_memcpy(key, &t, sizeof(t));
}

#endif /* XDPLB_TUPLE_H */
