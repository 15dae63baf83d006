/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * route.h - FIB lookups, the same from XDP and TC (bpf_fib_lookup takes
 * either context).
 */
#ifndef XDPLB_ROUTE_H
#define XDPLB_ROUTE_H

#include "maps.h"
#include "parse.h"
#include "hash.h"

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

/* The device the FIB routes daddr through, asked without the packet's
 * length (a lookup that fails the MTU check returns before it names the
 * device); ifindex when it names none. In TC a lookup without a length
 * measures the packet itself, after naming the device. The lookup is
 * made in *fib, whose earlier result is lost: a struct of its own would
 * take the caller past the verifier's stack limit on kernels that round
 * frames to 32 bytes. */
static __always_inline __u32 fib_egress_ifindex(void *ctx, __u32 ifindex, const struct packet *pkt,
						__be32 daddr, struct bpf_fib_lookup *fib)
{
	fib_params_ipv4(ifindex, pkt, daddr, fib);
	fib->tot_len = 0;
	switch (bpf_fib_lookup(ctx, fib, sizeof(*fib), 0)) {
	case BPF_FIB_LKUP_RET_SUCCESS:
	case BPF_FIB_LKUP_RET_NO_NEIGH:
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		return fib->ifindex;
	default:
		return ifindex;
	}
}

/* May a packet too big for its way on be fragmented, or must its sender
 * be told (DF set: TCP always sets it)? */
static __always_inline int dont_fragment(const struct packet *pkt)
{
	return pkt->frag_off & IP_DF;
}

/* The next hop a successful FIB lookup found. */
static __always_inline void next_hop_from_fib(struct next_hop *hop, const struct bpf_fib_lookup *fib)
{
	hop->ifindex = fib->ifindex;
	__builtin_memcpy(hop->dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(hop->smac, fib->smac, ETH_ALEN);
}

/* ---- the route of a new flow ------------------------------------------
 *
 * A FIB lookup is the largest cost of a new flow after its conntrack
 * insert. While the node routes by destination alone, a new flow takes
 * the next hop that a new flow to the same backend address, arriving on
 * the same interface with the same DSCP, found less than a second ago on
 * this CPU, and looks up only when there is none. The flow's own entry
 * caches that hop as if it had looked it up, so a route or neighbour
 * change reaches every flow within two seconds. Packets above
 * MTU_CHECK_MIN are always looked up: the lookup checks them against the
 * route's MTU.
 *
 * The agent watches the node's routing and, while it depends on the
 * destination alone, renews a lease in route_reuse; an agent that dies
 * without ending it lets it run out.
 *
 * One entry per backend id modulo NEW_FLOW_ROUTES, per CPU: backends that
 * share an entry take turns, each turn a FIB lookup as before.
 */
#define NEW_FLOW_ROUTES 1024

/* The bits of the TOS byte a route lookup uses (the DSCP; not ECN). */
#define TOS_DSCP_MASK 0xfc

struct new_flow_route {
	__u64 routed_ns;      /* when the FIB lookup ran (coarse clock) */
	struct next_hop hop;  /* its result */
	__be32 backend_addr;  /* the destination looked up */
	__u32 ingress_ifindex;
	__u8 dscp;            /* TOS & TOS_DSCP_MASK */
	__u8 pad[7];
};

/* Until when new flows may reuse routes: the agent's lease. */
struct route_reuse_lease {
	__u64 until_ns; /* CLOCK_MONOTONIC; 0 or past: every new flow looks up */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct route_reuse_lease);
	__uint(pinning, PIN);
} route_reuse SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, NEW_FLOW_ROUTES);
	__type(key, __u32);
	__type(value, struct new_flow_route);
	__uint(pinning, PIN); /* one map for every hook */
} new_flow_routes SEC(".maps");

static __always_inline int new_flow_route_fits(const struct new_flow_route *route,
					       __u32 ifindex, const struct packet *pkt,
					       __be32 daddr, __u64 now)
{
	return route->hop.ifindex && route->backend_addr == daddr &&
	       route->ingress_ifindex == ifindex && route->dscp == (pkt->tos & TOS_DSCP_MASK) &&
	       time_since(route->routed_ns, now) < NSEC_PER_SEC;
}

/*
 * Route a new flow's first packet to its backend (fresh->backend_id at
 * fresh->backend_addr), as if it had arrived on ifindex: fresh->hop gets
 * the next hop, or stays empty when there is none to cache (the hook then
 * routes the packet itself and handles what the lookup said). fib is
 * scratch space for the lookups. Returns the egress device, as far as
 * known (the FIB lookup names it even when the neighbour is not resolved
 * yet), for the SNAT source address.
 *
 * A function of its own (not inlined): the verifier then checks its
 * branches once per call, not once for every path through what follows.
 */
static __noinline __u32 route_new_flow(void *ctx, const struct packet *pkt, __u32 ifindex,
				       struct ct_entry *fresh, struct bpf_fib_lookup *fib)
{
	struct new_flow_route *route = NULL;
	__u32 slot = fresh->backend_id % NEW_FLOW_ROUTES, zero = 0;
	__be32 daddr = fresh->backend_addr;
	__u64 now = fresh->created_ns;
	struct route_reuse_lease *reuse = bpf_map_lookup_elem(&route_reuse, &zero);

	if (reuse && now < reuse->until_ns && pkt->tot_len <= MTU_CHECK_MIN) {
		route = bpf_map_lookup_elem(&new_flow_routes, &slot);
		if (route && new_flow_route_fits(route, ifindex, pkt, daddr, now)) {
			fresh->hop = route->hop;
			return fresh->hop.ifindex;
		}
	}
	switch (fib_lookup_ipv4(ctx, ifindex, pkt, daddr, fib)) {
	case BPF_FIB_LKUP_RET_SUCCESS:
		break;
	case BPF_FIB_LKUP_RET_FRAG_NEEDED:
		/* The kernel names the egress device only past its MTU check. */
		return fib_egress_ifindex(ctx, ifindex, pkt, daddr, fib);
	default:
		return fib->ifindex;
	}
	next_hop_from_fib(&fresh->hop, fib);
	if (route) {
		route->routed_ns = now;
		route->hop = fresh->hop;
		route->backend_addr = daddr;
		route->ingress_ifindex = ifindex;
		route->dscp = pkt->tos & TOS_DSCP_MASK;
	}
	return fresh->hop.ifindex;
}

/* The SNAT source address of a flow leaving through interface ifindex
 * (0: none): its address, or one of its extra ones, picked by the
 * client's address and port, so that the flows spread evenly over them
 * and each adds a range of SNAT ports. */
static __always_inline __be32 iface_snat_addr(__u32 ifindex, __be32 client_addr, __be16 client_port)
{
	struct iface *dev = bpf_map_lookup_elem(&ifaces, &ifindex);
	__u32 pick;

	if (!dev)
		return 0;
	if (!dev->extra_count || !dev->addr)
		return dev->addr;
	pick = hash_3words(client_addr, client_port, 0, 0) % (dev->extra_count + 1);
	if (!pick)
		return dev->addr;
	return dev->extra_addrs[(pick - 1) & (IFACE_EXTRA_ADDRS - 1)];
}

#endif /* XDPLB_ROUTE_H */
