/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * csum.h - Internet checksum arithmetic (RFC 1071, incremental per RFC 1624).
 *
 * Values are taken exactly as they sit in the packet (network byte order);
 * one's complement sums do not depend on byte order as long as every word
 * is treated the same way.
 */
#ifndef XDPLB_CSUM_H
#define XDPLB_CSUM_H

#include "common.h"

/* Fold a 32-bit one's complement accumulator to 16 bits (not inverted). */
static __always_inline __u16 csum_fold32(__u32 sum)
{
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Add the change of one 16-bit word to an accumulator of changes. */
static __always_inline __u32 csum_delta16(__u32 acc, __u16 from, __u16 to)
{
	return acc + (__u16)~from + to;
}

/* Add the change of one 32-bit field (two words) to an accumulator. */
static __always_inline __u32 csum_delta32(__u32 acc, __u32 from, __u32 to)
{
	acc = csum_delta16(acc, from >> 16, to >> 16);
	return csum_delta16(acc, from & 0xffff, to & 0xffff);
}

/* Apply accumulated changes to a stored checksum field. */
static __always_inline __u16 csum_apply(__u16 check, __u32 delta)
{
	__u32 sum = (__u16)~check;

	sum += csum_fold32(delta);
	return (__u16)~csum_fold32(sum);
}

/* UDP: a zero checksum means "none" and stays zero; a computed zero is
 * sent as 0xffff. */
static __always_inline __u16 csum_apply_udp(__u16 check, __u32 delta)
{
	__u16 out;

	if (check == 0)
		return 0;
	out = csum_apply(check, delta);
	return out ? out : 0xffff;
}

/* Full checksum of a fixed-size region of 16-bit words (n_words must be a
 * compile-time constant so the loop is bounded). */
static __always_inline __u32 csum_words(const __u16 *words, int n_words, __u32 acc)
{
#pragma unroll
	for (int i = 0; i < n_words; i++)
		acc += words[i];
	return acc;
}

#endif /* XDPLB_CSUM_H */
