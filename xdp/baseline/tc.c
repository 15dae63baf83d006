//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc.c - reference TC programs for benchmarks, measured in the
 * same run as the TC datapath.
 *
 *   tc_pass     returns TC_ACT_UNSPEC: the cost of running any TC program.
 *   tc_restore  copies a template frame over the packet and tail-calls
 *               tc_bench_progs[0], so a program that rewrites the packet
 *               sees the original input on every repetition; its own cost
 *               is measured by tail-calling tc_pass.
 */
#include "../include/common.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TC_TEMPLATE_MAX 128

struct tc_frame_template {
	__u32 len;
	__u8 data[TC_TEMPLATE_MAX];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tc_frame_template);
} tc_bench_template SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} tc_bench_progs SEC(".maps");

SEC("tc")
int tc_pass(struct __sk_buff *skb)
{
	return TC_ACT_UNSPEC;
}

SEC("tc")
int tc_restore(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct tc_frame_template *tmpl = bpf_map_lookup_elem(&tc_bench_template, &zero);
	__u32 len;

	if (!tmpl)
		return TC_ACT_SHOT;
	len = tmpl->len;
	if (len == 0 || len > TC_TEMPLATE_MAX || len > skb->len)
		return TC_ACT_SHOT;
	if (bpf_skb_store_bytes(skb, 0, tmpl->data, len, 0))
		return TC_ACT_SHOT;
	bpf_tail_call(skb, &tc_bench_progs, 0);
	return TC_ACT_SHOT;
}
