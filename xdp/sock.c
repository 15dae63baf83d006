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

/* Point the socket address at a backend of the frontend it names. */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 proto)
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
	fkey.addr = ctx->user_ip4;
	fkey.port = (__be16)ctx->user_port;
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

	ctx->user_ip4 = pick.backend.addr;
	ctx->user_port = pick.backend.port;
	count(STAT_SOCK_CONNECT, 0);
	count_service(fe->svc_id, 0, !known);
	return SOCK_ALLOW;
}

/* Show the frontend, not the backend, as the peer. */
static __always_inline int untranslate(struct bpf_sock_addr *ctx)
{
	struct sock_key skey = {
		.cookie = bpf_get_socket_cookie(ctx),
		.backend_addr = ctx->user_ip4,
		.backend_port = (__be16)ctx->user_port,
	};
	struct sock_frontend *orig = bpf_map_lookup_elem(&sock_frontends, &skey);

	if (orig) {
		ctx->user_ip4 = orig->addr;
		ctx->user_port = orig->port;
	}
	return SOCK_ALLOW;
}

SEC("cgroup/connect4")
int xdplb_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->protocol != IPPROTO_TCP && ctx->protocol != IPPROTO_UDP)
		return SOCK_ALLOW;
	return translate(ctx, ctx->protocol);
}

SEC("cgroup/sendmsg4")
int xdplb_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, IPPROTO_UDP);
}

SEC("cgroup/recvmsg4")
int xdplb_recvmsg4(struct bpf_sock_addr *ctx)
{
	return untranslate(ctx);
}

SEC("cgroup/getpeername4")
int xdplb_getpeername4(struct bpf_sock_addr *ctx)
{
	return untranslate(ctx);
}
