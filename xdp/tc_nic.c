//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc_nic.c - the TC ingress program on the node's NIC.
 *
 * It finishes what the XDP program on the same device handed over: a packet
 * XDP already translated but could not send itself (next hop not resolved,
 * or an egress device XDP cannot redirect to) carries a struct xdp_handoff
 * in its metadata; it is sent to the chosen device with neighbour
 * resolution. Everything else continues to the next program or the stack.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/counters.h"
#include "include/forward.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int xdplb_nic_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	struct xdp_handoff *meta = (void *)(long)skb->data_meta;

	if ((void *)(meta + 1) > data || meta->magic != XDP_HANDOFF_MAGIC)
		return TC_ACT_UNSPEC;
	count(STAT_TC_NEIGH_REDIRECT, skb->len);
	return bpf_redirect_neigh(meta->ifindex, NULL, 0, 0);
}
