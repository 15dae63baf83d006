//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc_nic.c - the TC ingress program on the node's NIC.
 *
 * It finishes what the XDP program on the same device leaves:
 *   - a packet XDP translated but could not send (next hop unresolved, or
 *     an egress device XDP cannot redirect to) carries a struct
 *     xdp_handoff in its metadata: it is sent on with neighbour resolution;
 *   - packets XDP does not translate: with IP options, fragments (the
 *     first one's translation is remembered for the rest of the datagram),
 *     and everything when XDP is off;
 *   - replies from remote backends to flows started by this node's pods
 *     and host (their ports are outside the SNAT range XDP watches);
 *   - ICMP errors about translated flows that XDP did not translate (see
 *     icmp.h).
 * Everything else continues to the next program or the stack.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/counters.h"
#include "include/handoff.h"
#include "include/tc_service.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int xdplb_nic_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	struct xdp_handoff *meta = (void *)(long)skb->data_meta;
	struct datapath_config *cfg;
	struct packet pkt;
	int ret;

	if ((void *)(meta + 1) <= data && meta->magic == XDP_HANDOFF_MAGIC) {
		count(STAT_TC_NEIGH_REDIRECT, skb->len);
		return bpf_redirect_neigh(meta->ifindex, NULL, 0, 0);
	}

	switch (skb_parse(skb, &pkt, PARSE_F_OPTIONS | PARSE_F_FRAGMENTS)) {
	case PARSE_OK:
		break;
	case PARSE_FRAGMENT:
		return tc_later_fragment(skb, &pkt);
	default:
		return TC_ACT_UNSPEC;
	}
	frag_forget_first(&pkt);
	if (pkt.proto == IPPROTO_ICMP)
		return tc_icmp_error(skb, &pkt);
	if (pkt.proto != IPPROTO_TCP && pkt.proto != IPPROTO_UDP)
		return TC_ACT_UNSPEC;
	cfg = config_get();
	if (!cfg)
		return TC_ACT_UNSPEC;
	/* A reply to a SNAT port that is also some frontend's port is a
	 * reply all the same (see xdp_nic.c). */
	if (port_has_frontend(pkt.dport) && !is_snat_reply(cfg, &pkt)) {
		ret = tc_serve(skb, &pkt, ORIGIN_EXTERNAL, cfg);
		if (ret != TC_ACT_UNSPEC)
			return ret;
	}
	ret = tc_try_reply(skb, &pkt);
	return ret < 0 ? TC_ACT_UNSPEC : ret;
}
