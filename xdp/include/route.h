/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * route.h - FIB lookups, the same from XDP and TC (bpf_fib_lookup takes
 * either context).
 */
#ifndef XDPLB_ROUTE_H
#define XDPLB_ROUTE_H

#include "parse.h"

/* Packets up to this size are not checked against the egress device's MTU
 * on the cached-hop paths: no link a node forwards IPv4 over is smaller. */
#define MTU_CHECK_MIN 1280

#ifndef AF_INET
#define AF_INET 2
#endif

/* The parameters of a FIB lookup of the packet as if its destination were
 * daddr (its final one), as if it had arrived on ifindex. tot_len makes the
 * kernel check the packet's length against the route's MTU. */
static __always_inline void fib_params_ipv4(__u32 ifindex, const struct packet *pkt, __be32 daddr,
					    struct bpf_fib_lookup *fib)
{
	__builtin_memset(fib, 0, sizeof(*fib));
	fib->family = AF_INET;
	fib->tos = pkt->tos;
	fib->l4_protocol = pkt->proto;
	fib->sport = pkt->sport;
	fib->dport = pkt->dport;
	fib->tot_len = pkt->tot_len;
	fib->ipv4_src = pkt->saddr;
	fib->ipv4_dst = daddr;
	fib->ifindex = ifindex;
}

/* Route the packet as if its destination were daddr, as if it had arrived
 * on ifindex. */
static __always_inline int fib_lookup_ipv4(void *ctx, __u32 ifindex, const struct packet *pkt,
					   __be32 daddr, struct bpf_fib_lookup *fib)
{
	fib_params_ipv4(ifindex, pkt, daddr, fib);
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* The parameters of a FIB lookup of a packet as it will leave once
 * translated: from saddr:sport to daddr:dport, as if it had arrived on
 * ifindex. */
static __always_inline void fib_params_translated(__u32 ifindex, const struct packet *pkt,
						  __be32 saddr, __be16 sport, __be32 daddr,
						  __be16 dport, struct bpf_fib_lookup *fib)
{
	fib_params_ipv4(ifindex, pkt, daddr, fib);
	fib->ipv4_src = saddr;
	fib->sport = sport;
	fib->dport = dport;
}

/* Route a packet as it will leave once translated (fib_params_translated). */
static __always_inline int fib_lookup_translated(void *ctx, __u32 ifindex, const struct packet *pkt,
						 __be32 saddr, __be16 sport, __be32 daddr,
						 __be16 dport, struct bpf_fib_lookup *fib)
{
	fib_params_translated(ifindex, pkt, saddr, sport, daddr, dport, fib);
	return bpf_fib_lookup(ctx, fib, sizeof(*fib), 0);
}

/* May a packet too big for its way on be fragmented, or must its sender
 * be told (DF set: TCP always sets it)? */
static __always_inline int dont_fragment(const struct packet *pkt)
{
	return pkt->frag_off & IP_DF;
}

static __always_inline __be32 iface_addr(__u32 ifindex)
{
	struct iface *dev = bpf_map_lookup_elem(&ifaces, &ifindex);

	return dev ? dev->addr : 0;
}

#endif /* XDPLB_ROUTE_H */
