/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * common.h - includes, compiler helpers and constants shared by every
 * xdplb BPF program.
 */
#ifndef XDPLB_COMMON_H
#define XDPLB_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* ICMP for IPv4 (RFC 792). linux/icmp.h drags in libc headers, so the few
 * definitions needed are here. */
struct icmphdr {
	__u8 type;
	__u8 code;
	__sum16 checksum;
	union {
		struct {
			__be16 id;
			__be16 sequence;
		} echo;
		__be32 gateway;
		struct {
			__be16 unused;
			__be16 mtu;
		} frag;
	} un;
};

#define ICMP_DEST_UNREACH 3
#define ICMP_TIME_EXCEEDED 11
#define ICMP_PORT_UNREACH 3
#define ICMP_FRAG_NEEDED 4

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

#ifndef __noinline
#define __noinline __attribute__((noinline))
#endif

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

/* Keep the compiler from reordering or merging memory accesses across it
 * (state another CPU reads while it is rewritten). */
#define barrier() asm volatile("" ::: "memory")
#define READ_ONCE(x) (*(const volatile __typeof__(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile __typeof__(x) *)&(x) = (v))

#define NSEC_PER_SEC 1000000000ULL

/* Nanoseconds from then to now; 0 when then is later. A program reads the
 * clock once, when it starts, and another CPU may stamp an entry after
 * that: unsigned, now - then would be some 584 years. */
static __always_inline __u64 time_since(__u64 then, __u64 now)
{
	return (__s64)(now - then) > 0 ? now - then : 0;
}

/* IPv4 fragment bits in iphdr.frag_off (host order after bpf_ntohs). */
#define IP_MF 0x2000
#define IP_DF 0x4000
#define IP_OFFSET 0x1fff

/* Default TTL of packets xdplb builds itself (RST, ICMP). */
#define XDPLB_DEFAULT_TTL 64

#endif /* XDPLB_COMMON_H */
