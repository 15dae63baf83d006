//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * tc_pod.c - the TC ingress program on the host side of every pod
 * interface: what pods on this node send.
 *
 *   - A reply of a backend on this node is translated back (the client
 *     never sees a pod address): for flows XDP or tc_nic started from
 *     outside, and for flows of other pods on this node.
 *   - A packet to a ClusterIP, NodePort, LoadBalancer IP or externalIP is
 *     given a backend like any flow (same tables, affinity, conntrack) and
 *     DNATed, keeping the pod's address; a pod reaching itself through its
 *     own service is SNATed to the hairpin address. A service without a
 *     usable backend refuses the pod at once.
 *   - An ICMP error a pod sends about a translated flow (a local backend's
 *     port unreachable to its client, a client pod's about a reply) is
 *     translated for the other end (see icmp.h).
 * Everything else continues to the next program or the stack.
 */
#include "include/common.h"
#include "include/maps.h"
#include "include/counters.h"
#include "include/tc_service.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int xdplb_pod(struct __sk_buff *skb)
{
	struct datapath_config *cfg;
	struct packet pkt;
	int ret;

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
	ret = tc_try_reply(skb, &pkt);
	if (ret >= 0)
		return ret;
	cfg = config_get();
	if (cfg && port_has_frontend(pkt.dport))
		return tc_serve(skb, &pkt, ORIGIN_INTERNAL, cfg);
	return TC_ACT_UNSPEC;
}
