//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * sock.c - services for the node's own processes (host network).
 *
 * A host socket that connects (or sends a UDP datagram) to a ClusterIP,
 * NodePort, LoadBalancer IP or externalIP is pointed at a backend chosen
 * from the same tables, before a packet exists: no NAT, no conntrack, and
 * it works for the node's own addresses too, whose packets never leave
 * through a device. The socket keeps seeing the frontend as its peer
 * (getpeername, recvmsg). The programs are attached to the root cgroup,
 * which every network namespace shares, and act only on sockets of the
 * node's namespace.
 *
 * A dual-stack socket (AF_INET6, the default of Java and many other
 * runtimes) names an IPv4 peer by its IPv4-mapped address, ::ffff:a.b.c.d,
 * and runs the inet6 hooks: they translate the IPv4 address inside such an
 * address as the inet4 hooks translate theirs, and leave every other IPv6
 * address alone. There is no sendmsg6 program: the kernel hands a datagram
 * to a v4-mapped address to the IPv4 code before that hook, where it runs
 * sendmsg4.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/counters.h"
#include "include/conntrack.h"
#include "include/maglev.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#ifndef ECONNREFUSED
#define ECONNREFUSED 111
#endif

/* cgroup sock_addr programs: 1 lets the call go on, 0 fails it. */
#define SOCK_ALLOW 1
#define SOCK_DENY 0

static __always_inline int ours(struct bpf_sock_addr *ctx, const struct datapath_config *cfg)
{
	return cfg->netns_cookie && bpf_get_netns_cookie(ctx) == cfg->netns_cookie;
}

/* Point addr:port, the frontend a socket names, at one of its backends;
 * addr:port are left as they are if they name no frontend. SOCK_DENY
 * refuses the call: the frontend has no backend. */
static __always_inline int translate_addr(struct bpf_sock_addr *ctx, __u8 proto, __be32 *addr,
					  __be16 *port)
{
	struct datapath_config *cfg = config_get();
	struct frontend_key fkey = {};
	struct sock_frontend orig;
	struct sock_key skey = {};
	struct frontend *fe;
	struct ct_key flow = {};
	struct pick pick;
	struct sock_frontend *known;
	__u64 cookie;

	if (!cfg || !ours(ctx, cfg))
		return SOCK_ALLOW;
	fkey.addr = *addr;
	fkey.port = *port;
	fkey.proto = proto;
	fe = bpf_map_lookup_elem(&frontends, &fkey);
	if (!fe)
		return SOCK_ALLOW;

	/* The host is one client: with ClientIP affinity every socket keys
	 * on address 0; otherwise the Maglev hash covers the socket, so its
	 * datagrams stay together. */
	cookie = bpf_get_socket_cookie(ctx);
	flow.daddr = fkey.addr;
	flow.dport = fkey.port;
	flow.proto = proto;
	if (!fe->affinity_timeout) {
		flow.saddr = (__be32)cookie;
		flow.sport = (__be16)(cookie >> 32);
	}
	switch (pick_backend(fe, fe->internal_table_id, fe->flags & FE_INTERNAL_LOCAL_SET, &flow,
			     cfg->hash_seed, bpf_ktime_get_coarse_ns(), &pick)) {
	case PICK_OK:
		break;
	default:
		count(STAT_SOCK_REFUSED, 0);
		bpf_set_retval(-ECONNREFUSED);
		return SOCK_DENY;
	}

	orig.addr = fkey.addr;
	orig.port = fkey.port;
	orig.pad = 0;
	skey.cookie = cookie;
	skey.backend_addr = pick.backend.addr;
	skey.backend_port = pick.backend.port;
	/* An unconnected UDP socket comes here for every datagram: only its
	 * first one to this backend is a new flow. */
	known = bpf_map_lookup_elem(&sock_frontends, &skey);
	if (!known || known->addr != orig.addr || known->port != orig.port)
		bpf_map_update_elem(&sock_frontends, &skey, &orig, BPF_ANY);

	*addr = pick.backend.addr;
	*port = pick.backend.port;
	count(STAT_SOCK_CONNECT, 0);
	count_service(fe->svc_id, 0, !known);
	return SOCK_ALLOW;
}

/* Show the frontend, not the backend addr:port, as the peer: 1 if
 * addr:port is a backend the socket was pointed at. */
static __always_inline int untranslate_addr(struct bpf_sock_addr *ctx, __be32 *addr, __be16 *port)
{
	struct sock_key skey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.backend_addr = *addr,
		.backend_port = *port,
	};
	struct sock_frontend *orig = bpf_map_lookup_elem(&sock_frontends, &skey);

	if (!orig)
		return 0;
	*addr = orig->addr;
	*port = orig->port;
	return 1;
}

/* The inet4 hooks: the address is user_ip4. */
static __always_inline int translate4(struct bpf_sock_addr *ctx, __u8 proto)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;
	int ret;

	ret = translate_addr(ctx, proto, &addr, &port);
	ctx->user_ip4 = addr;
	ctx->user_port = port;
	return ret;
}

static __always_inline int untranslate4(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip4;
	__be16 port = (__be16)ctx->user_port;

	if (untranslate_addr(ctx, &addr, &port)) {
		ctx->user_ip4 = addr;
		ctx->user_port = port;
	}
	return SOCK_ALLOW;
}

/* The inet6 hooks: the IPv4 address is the last word of a v4-mapped
 * user_ip6; any other IPv6 address is left alone. */
static __always_inline int v4_mapped(const struct bpf_sock_addr *ctx)
{
	return ctx->user_ip6[0] == 0 && ctx->user_ip6[1] == 0 &&
	       ctx->user_ip6[2] == bpf_htonl(0x0000ffff);
}

static __always_inline int translate6(struct bpf_sock_addr *ctx, __u8 proto)
{
	__be32 addr = ctx->user_ip6[3];
	__be16 port = (__be16)ctx->user_port;
	int ret;

	if (!v4_mapped(ctx))
		return SOCK_ALLOW;
	ret = translate_addr(ctx, proto, &addr, &port);
	ctx->user_ip6[3] = addr;
	ctx->user_port = port;
	return ret;
}

static __always_inline int untranslate6(struct bpf_sock_addr *ctx)
{
	__be32 addr = ctx->user_ip6[3];
	__be16 port = (__be16)ctx->user_port;

	if (v4_mapped(ctx) && untranslate_addr(ctx, &addr, &port)) {
		ctx->user_ip6[3] = addr;
		ctx->user_port = port;
	}
	return SOCK_ALLOW;
}

static __always_inline int tcp_or_udp(const struct bpf_sock_addr *ctx)
{
	return ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_UDP;
}

SEC("cgroup/connect4")
int xdplb_connect4(struct bpf_sock_addr *ctx)
{
	if (!tcp_or_udp(ctx))
		return SOCK_ALLOW;
	return translate4(ctx, ctx->protocol);
}

SEC("cgroup/sendmsg4")
int xdplb_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate4(ctx, IPPROTO_UDP);
}

SEC("cgroup/recvmsg4")
int xdplb_recvmsg4(struct bpf_sock_addr *ctx)
{
	return untranslate4(ctx);
}

SEC("cgroup/getpeername4")
int xdplb_getpeername4(struct bpf_sock_addr *ctx)
{
	return untranslate4(ctx);
}

SEC("cgroup/connect6")
int xdplb_connect6(struct bpf_sock_addr *ctx)
{
	if (!tcp_or_udp(ctx))
		return SOCK_ALLOW;
	return translate6(ctx, ctx->protocol);
}

SEC("cgroup/recvmsg6")
int xdplb_recvmsg6(struct bpf_sock_addr *ctx)
{
	return untranslate6(ctx);
}

SEC("cgroup/getpeername6")
int xdplb_getpeername6(struct bpf_sock_addr *ctx)
{
	return untranslate6(ctx);
}
