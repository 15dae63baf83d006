//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * baseline.c - reference programs that benchmarks and the perf suite
 * measure xdplb against in the same run, and test helpers.
 *
 *   xdp_pass     returns XDP_PASS: the cost of running any XDP program.
 *   xdp_macswap  parses Ethernet/IPv4/TCP, swaps MACs, returns XDP_TX: the
 *                cheapest program that forwards.
 *   xdp_restore  copies a template frame over the packet (optionally with
 *                a new source address each run) and tail-calls
 *                bench_progs[0]: benchmarks of translating programs use it
 *                so every iteration sees the original input (the kernel
 *                reuses one buffer across repetitions); its own cost is
 *                measured by tail-calling xdp_pass.
 *   xdp_sink     counts and drops: the receiving end of the perf suite.
 */
#include "include/common.h"
#include "include/parse.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TEMPLATE_MAX 256

struct frame_template {
	__u32 len;
	/* Non-zero: give every run a new IPv4 source address (a new flow),
	 * counting from the template's own source address. */
	__u32 vary_source;
	__u32 runs;
	__u32 pad;
	__u8 data[TEMPLATE_MAX];
};

#define SADDR_OFFSET (sizeof(struct ethhdr) + 12)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct frame_template);
} bench_template SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} bench_progs SEC(".maps");

struct sink_counter {
	__u64 packets;
	__u64 bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_counter);
} sink_stats SEC(".maps");

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

SEC("xdp")
int xdp_macswap(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *tcp = (void *)(ip + 1);
	__u8 tmp[ETH_ALEN];

	if ((void *)(tcp + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) ||
	    ip->protocol != IPPROTO_TCP)
		return XDP_PASS;
	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
	return XDP_TX;
}

SEC("xdp")
int xdp_restore(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct frame_template *tmpl = bpf_map_lookup_elem(&bench_template, &zero);
	__u32 len;

	if (!tmpl)
		return XDP_ABORTED;
	len = tmpl->len;
	if (len == 0 || len > TEMPLATE_MAX)
		return XDP_ABORTED;
	if (bpf_xdp_store_bytes(ctx, 0, tmpl->data, len))
		return XDP_ABORTED;
	if (tmpl->vary_source) {
		__be32 saddr;

		if (len < SADDR_OFFSET + sizeof(saddr))
			return XDP_ABORTED;
		__builtin_memcpy(&saddr, tmpl->data + SADDR_OFFSET, sizeof(saddr));
		saddr = bpf_htonl(bpf_ntohl(saddr) + tmpl->runs++);
		if (bpf_xdp_store_bytes(ctx, SADDR_OFFSET, &saddr, sizeof(saddr)))
			return XDP_ABORTED;
	}
	bpf_tail_call(ctx, &bench_progs, 0);
	return XDP_ABORTED;
}

SEC("xdp")
int xdp_sink(struct xdp_md *ctx)
{
	__u32 zero = 0;
	struct sink_counter *c = bpf_map_lookup_elem(&sink_stats, &zero);

	if (c) {
		c->packets++;
		c->bytes += ctx->data_end - ctx->data;
	}
	return XDP_DROP;
}
