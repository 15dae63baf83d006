/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * icmp_limit.h - the rate limit on ICMP errors the datapath builds.
 *
 * The kernel limits the ICMP errors it sends (net.ipv4.icmp_msgs_per_sec,
 * 1000 a second after a burst of icmp_msgs_burst, 50), so a flood towards
 * a port nobody serves is not answered packet for packet. The datapath
 * answers such floods itself (port unreachable for a Service without
 * endpoints), so it keeps the same kind of budget, one per CPU: after a
 * burst of ICMP_ERROR_BURST errors, one every
 * datapath_config.icmp_interval_ns. An error over the budget is not sent
 * and its packet is dropped (drop_icmp_rate_limit), as the kernel drops
 * the packet it does not answer. Fragmentation needed is never limited,
 * as the kernel never limits it (path MTU discovery must not starve
 * because a flood spent the budget), and neither are TCP RSTs.
 *
 * The budget is kept as a virtual clock (the generic cell rate algorithm):
 * each error sent moves it one interval on from now or from where it
 * was, whichever is later, and an error is allowed while the clock is at
 * most a burst less one of intervals ahead of now. From idle, a burst of
 * errors goes out at once, then one per interval. The clock is the
 * precise one (bpf_ktime_get_ns), read only when an error is due: the
 * coarse clock moves once a tick and would cap the rate at a burst a
 * tick.
 */
#ifndef XDPLB_ICMP_LIMIT_H
#define XDPLB_ICMP_LIMIT_H

#include "maps.h"

/* The status output and the flag's help say it too: loader.ICMPErrorBurst. */
#define ICMP_ERROR_BURST 50

/*
 * May this CPU send an ICMP destination unreachable with this code now?
 * Takes it from the budget if so.
 */
static __always_inline int icmp_error_allowed(__u8 code)
{
	struct datapath_config *cfg;
	struct icmp_budget *budget;
	__u64 now, next, interval;
	__u32 zero = 0;

	if (code == ICMP_FRAG_NEEDED)
		return 1;
	cfg = bpf_map_lookup_elem(&config, &zero);
	if (!cfg || cfg->icmp_interval_ns == 0)
		return 1;
	budget = bpf_map_lookup_elem(&icmp_budget, &zero);
	if (!budget)
		return 1;
	interval = cfg->icmp_interval_ns;
	now = bpf_ktime_get_ns();
	next = budget->next_ns;
	if (next < now)
		next = now;
	else if (next - now > ICMP_ERROR_BURST * interval)
		/* Left by a lower rate (the budget is pinned): start from a
		 * spent burst at this rate. */
		next = now + ICMP_ERROR_BURST * interval;
	if (next - now > (ICMP_ERROR_BURST - 1) * interval) {
		budget->next_ns = next;
		return 0;
	}
	budget->next_ns = next + interval;
	return 1;
}

#endif /* XDPLB_ICMP_LIMIT_H */
