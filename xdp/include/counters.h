/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* counters.h - per-CPU counters for verdict reasons and service ports. */
#ifndef XDPLB_COUNTERS_H
#define XDPLB_COUNTERS_H

#include "maps.h"

static __always_inline void count(enum stat reason, __u64 bytes)
{
	__u32 key = reason;
	struct counter *c = bpf_map_lookup_elem(&stats, &key);

	if (c) {
		c->packets++;
		c->bytes += bytes;
	}
}

static __always_inline void count_service(__u32 svc_id, __u64 bytes, int new_flow)
{
	struct svc_counter *c = bpf_map_lookup_elem(&svc_stats, &svc_id);

	if (c) {
		c->packets++;
		c->bytes += bytes;
		if (new_flow)
			c->new_flows++;
	}
}

#endif /* XDPLB_COUNTERS_H */
