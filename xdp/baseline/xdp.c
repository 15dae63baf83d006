//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * xdp.c - reference XDP programs that benchmarks and the perf suite
 * measure xdplb against in the same run, and test helpers.
 *
 *   xdp_pass     returns XDP_PASS: the cost of running any XDP program.
 *   xdp_macswap  parses Ethernet/IPv4/TCP, swaps MACs, returns XDP_TX: the
 *                cheapest program that forwards.
 *   xdp_lru_insert
 *                xdp_macswap plus one insert of the packet's 5-tuple into
 *                an LRU hash shaped like conntrack (same key and value
 *                sizes): run against a full map, it is the floor under the
 *                cost of any new flow that is tracked in a BPF LRU map.
 *   xdp_restore  copies a template frame over the packet (optionally with
 *                a new source address each run) and tail-calls
 *                bench_progs[0]: benchmarks of translating programs use it
 *                so every iteration sees the original input (the kernel
 *                reuses one buffer across repetitions).
 *   xdp_restore_alongside
 *                the same with its own template and program: set to the same
 *                frame and xdp_pass, it measures xdp_restore's own cost in
 *                turn with the program behind it.
 *   xdp_sink     counts and drops: the receiving end of the perf suite.
 *                Frames to the address in sink_passes go to the stack
 *                instead (real connections of the flood scenario), unless
 *                they carry its marker DSCP (the generated flood itself).
 *   xdp_fwd      the perf suite's forwarding baseline: rewrites the MACs
 *                for the egress port configured for the ingress device and
 *                redirects through a devmap, touching nothing else.
 *   xdp_gen      the perf suite's packet generator, run with
 *                BPF_PROG_TEST_RUN in live-frames mode: writes a whole
 *                header template into every frame, gives it the 5-tuple of
 *                the next flow and fixes the checksums, then XDP_TX.
 */
#include "../include/common.h"
#include "../include/parse.h"
#include "../include/csum.h"

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

struct frame_templates {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct frame_template);
};

struct bench_prog_slots {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
};

struct frame_templates bench_template SEC(".maps");
struct bench_prog_slots bench_progs SEC(".maps");
/* The same for xdp_restore_alongside. */
struct frame_templates bench_template_alongside SEC(".maps");
struct bench_prog_slots bench_progs_alongside SEC(".maps");

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

/* Frames xdp_sink hands to the stack: IPv4 to addr, unless their TOS
 * byte is drop_tos. addr 0: none. */
struct sink_pass {
	__be32 addr;
	__u8 drop_tos;
	__u8 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sink_pass);
} sink_passes SEC(".maps");

SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

/* The Ethernet, IPv4 and TCP headers of a plain TCP frame, or NULL. */
static __always_inline struct tcphdr *plain_tcp(struct xdp_md *ctx, struct ethhdr **eth,
						struct iphdr **ip)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct tcphdr *tcp;

	*eth = data;
	*ip = (void *)(*eth + 1);
	tcp = (void *)(*ip + 1);
	if ((void *)(tcp + 1) > data_end || (*eth)->h_proto != bpf_htons(ETH_P_IP) ||
	    (*ip)->protocol != IPPROTO_TCP)
		return NULL;
	return tcp;
}

static __always_inline void swap_macs(struct ethhdr *eth)
{
	__u8 tmp[ETH_ALEN];

	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
}

SEC("xdp")
int xdp_macswap(struct xdp_md *ctx)
{
	struct ethhdr *eth;
	struct iphdr *ip;

	if (!plain_tcp(ctx, &eth, &ip))
		return XDP_PASS;
	swap_macs(eth);
	return XDP_TX;
}

/* Key and value sizes of struct ct_key (16 bytes) and struct ct_entry
 * (56 bytes). The benchmark sizes the map like conntrack before loading. */
struct lru_floor_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 proto;
};

struct lru_floor_value {
	__u64 words[7];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 64);
	__type(key, struct lru_floor_key);
	__type(value, struct lru_floor_value);
} lru_floor SEC(".maps");

SEC("xdp")
int xdp_lru_insert(struct xdp_md *ctx)
{
	struct lru_floor_value value = {};
	struct lru_floor_key key;
	struct ethhdr *eth;
	struct tcphdr *tcp;
	struct iphdr *ip;

	tcp = plain_tcp(ctx, &eth, &ip);
	if (!tcp)
		return XDP_PASS;
	key.saddr = ip->saddr;
	key.daddr = ip->daddr;
	key.sport = tcp->source;
	key.dport = tcp->dest;
	key.proto = ip->protocol;
	value.words[0] = bpf_ktime_get_coarse_ns();
	if (bpf_map_update_elem(&lru_floor, &key, &value, BPF_ANY))
		return XDP_ABORTED;
	swap_macs(eth);
	return XDP_TX;
}

/* Copy the template over the packet and tail-call the program. */
static __always_inline int restore_and_call(struct xdp_md *ctx, void *templates, void *progs)
{
	__u32 zero = 0;
	struct frame_template *tmpl = bpf_map_lookup_elem(templates, &zero);
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
	bpf_tail_call(ctx, progs, 0);
	return XDP_ABORTED;
}

SEC("xdp")
int xdp_restore(struct xdp_md *ctx)
{
	return restore_and_call(ctx, &bench_template, &bench_progs);
}

SEC("xdp")
int xdp_restore_alongside(struct xdp_md *ctx)
{
	return restore_and_call(ctx, &bench_template_alongside, &bench_progs_alongside);
}

SEC("xdp")
int xdp_sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct sink_counter *c;
	struct sink_pass *pass;
	__u32 zero = 0;

	pass = bpf_map_lookup_elem(&sink_passes, &zero);
	if (pass && pass->addr && (void *)(ip + 1) <= data_end &&
	    eth->h_proto == bpf_htons(ETH_P_IP) && ip->daddr == pass->addr &&
	    ip->tos != pass->drop_tos)
		return XDP_PASS;
	c = bpf_map_lookup_elem(&sink_stats, &zero);
	if (c) {
		c->packets++;
		c->bytes += ctx->data_end - ctx->data;
	}
	return XDP_DROP;
}

/* ---- forwarding baseline ---------------------------------------------- */

/* Where xdp_fwd sends what arrives on a device (keyed by ingress ifindex). */
struct fwd_port {
	__u32 ifindex; /* egress device; must be in fwd_ports */
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, struct fwd_port);
} fwd_routes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u32);
} fwd_ports SEC(".maps");

SEC("xdp")
int xdp_fwd(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 in = ctx->ingress_ifindex;
	struct fwd_port *out;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	out = bpf_map_lookup_elem(&fwd_routes, &in);
	if (!out)
		return XDP_PASS;
	__builtin_memcpy(eth->h_dest, out->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, out->smac, ETH_ALEN);
	return bpf_redirect_map(&fwd_ports, out->ifindex, 0);
}

/* ---- live-frames generator --------------------------------------------- */

/*
 * Bytes of the template written into every frame. In live-frames mode the
 * kernel recycles a frame's page after the receiver is done with it, so the
 * next frame starts from whatever the forwarding path left there (rewritten
 * addresses, ports, MACs, TTL, checksums): everything up to here is written
 * again each time. Frames are at least this long.
 */
#define GEN_HDR_LEN 64
#define GEN_TUPLES_MAX 65536

/* Offsets in an untagged Ethernet + IPv4 (no options) frame. */
#define GEN_OFF_IP_CHECK (14 + 10)
#define GEN_OFF_SADDR (14 + 12)
#define GEN_OFF_DADDR (14 + 16)
#define GEN_OFF_SPORT (14 + 20)
#define GEN_OFF_DPORT (14 + 22)
#define GEN_OFF_TCP_CHECK (14 + 20 + 16)

struct gen_config {
	__u8 hdr[GEN_HDR_LEN]; /* the frame's first bytes, checksums valid as they are */
	__u32 flows;           /* distinct 5-tuples to cycle over; 0: a new one every frame */
	__u32 use_tuples;      /* non-zero: tuples come from gen_tuples[i % flows] */
	__be32 saddr;          /* computed tuples: first source address */
	__u32 saddr_count;     /* source addresses used (>= 1) */
	__u32 sport_min;       /* first source port, host order */
	__u32 sport_count;     /* source ports per address (>= 1) */
	__be32 daddr;          /* first destination address */
	__u32 daddr_count;     /* destination addresses used (>= 1) */
	__u32 daddr_stride;    /* step between destination addresses */
	__u32 slots;           /* >= the number of CPUs: interleaves per-CPU sequences */
	__u32 tcp;             /* non-zero: TCP, whose checksum is fixed too (UDP
				* templates carry none) */
	__u32 pad;
};

/* A tuple as it goes on the wire (network byte order). */
struct gen_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
};

struct gen_state {
	__u64 seq;    /* frames this CPU generated */
	__u64 errors; /* frames left unsent: bad configuration or short frame */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_config);
} gen_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, GEN_TUPLES_MAX);
	__type(key, __u32);
	__type(value, struct gen_tuple);
} gen_tuples SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct gen_state);
} gen_counters SEC(".maps");

/*
 * The tuple of a computed flow: its source address and port come from the
 * flow number i, its destination from d. A fixed set of flows passes i for
 * both; new flows pass the sending CPU's own sequence for d (see xdp_gen).
 */
static __always_inline void gen_computed(const struct gen_config *cfg, __u64 i,
					 __u64 d, struct gen_tuple *t, __be16 dport)
{
	__u64 per_addr = cfg->sport_count ? cfg->sport_count : 1;
	__u64 saddrs = cfg->saddr_count ? cfg->saddr_count : 1;
	__u64 daddrs = cfg->daddr_count ? cfg->daddr_count : 1;
	__u32 src = (__u32)((i / per_addr) % saddrs);
	__u32 dst = (__u32)(d % daddrs);

	t->sport = bpf_htons((__u16)(cfg->sport_min + i % per_addr));
	t->saddr = bpf_htonl(bpf_ntohl(cfg->saddr) + src);
	t->daddr = bpf_htonl(bpf_ntohl(cfg->daddr) + dst * cfg->daddr_stride);
	t->dport = dport;
}

SEC("xdp")
int xdp_gen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct gen_config *cfg = bpf_map_lookup_elem(&gen_cfg, &zero);
	struct gen_state *st = bpf_map_lookup_elem(&gen_counters, &zero);
	struct gen_tuple t, *row;
	__u32 ip_delta, l4_delta;
	__be32 old_saddr, old_daddr;
	__be16 old_sport, old_dport;
	__u16 *check;
	__u64 i, d;

	if (!cfg || !st)
		return XDP_ABORTED;
	if (data + GEN_HDR_LEN > data_end) {
		st->errors++;
		return XDP_DROP;
	}
	__builtin_memcpy(data, cfg->hdr, GEN_HDR_LEN);

	/* A fixed set of flows is cycled through from every CPU. New flows
	 * interleave the CPUs' sequences in the flow number, so no two CPUs
	 * send the same source address and port, but take their destination
	 * from the CPU's own sequence: from the flow number, a CPU would only
	 * reach the destinations congruent to its slot (half of them with two
	 * slots and one sending thread). */
	d = st->seq++;
	if (cfg->flows) {
		i = (d + bpf_get_smp_processor_id()) % cfg->flows;
		d = i;
	} else {
		i = d * (cfg->slots ? cfg->slots : 1) + bpf_get_smp_processor_id();
	}

	old_saddr = *(__be32 *)(data + GEN_OFF_SADDR);
	old_daddr = *(__be32 *)(data + GEN_OFF_DADDR);
	old_sport = *(__be16 *)(data + GEN_OFF_SPORT);
	old_dport = *(__be16 *)(data + GEN_OFF_DPORT);
	if (cfg->use_tuples) {
		__u32 key = (__u32)i;

		row = bpf_map_lookup_elem(&gen_tuples, &key);
		if (!row) {
			st->errors++;
			return XDP_DROP;
		}
		t = *row;
	} else {
		gen_computed(cfg, i, d, &t, old_dport);
	}

	*(__be32 *)(data + GEN_OFF_SADDR) = t.saddr;
	*(__be32 *)(data + GEN_OFF_DADDR) = t.daddr;
	*(__be16 *)(data + GEN_OFF_SPORT) = t.sport;
	*(__be16 *)(data + GEN_OFF_DPORT) = t.dport;

	ip_delta = csum_delta32(0, old_saddr, t.saddr);
	ip_delta = csum_delta32(ip_delta, old_daddr, t.daddr);
	check = data + GEN_OFF_IP_CHECK;
	*check = csum_apply(*check, ip_delta);

	if (cfg->tcp) {
		l4_delta = csum_delta16(ip_delta, old_sport, t.sport);
		l4_delta = csum_delta16(l4_delta, old_dport, t.dport);
		check = data + GEN_OFF_TCP_CHECK;
		*check = csum_apply(*check, l4_delta);
	}
	return XDP_TX;
}
