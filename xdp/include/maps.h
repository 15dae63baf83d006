/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * maps.h - the datapath's state: every map, keyed and valued by the types
 * in structs.h.
 *
 * max_entries below are placeholders: the loader sets every size from its
 * options before the maps are created. Maps are pinned by name under one
 * versioned bpffs directory, so an agent restart adopts them.
 */
#ifndef XDPLB_MAPS_H
#define XDPLB_MAPS_H

#include "common.h"
#include "structs.h"

/* ---- maps -------------------------------------------------------------- */

#define PIN LIBBPF_PIN_BY_NAME

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct datapath_config);
	__uint(pinning, PIN);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* ifindex */
	__type(value, struct iface);
	__uint(pinning, PIN);
} ifaces SEC(".maps");

/* Interfaces XDP may redirect to (they run an XDP program or support
 * ndo_xdp_xmit). Anything else goes through the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, PIN);
} tx_ports SEC(".maps");

/* One bit per destination port that any frontend uses: the cheap first
 * test that lets all other traffic pass after a single array lookup. */
#define PORT_BITMAP_WORDS (65536 / 64)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORT_BITMAP_WORDS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, PIN);
} frontend_ports SEC(".maps");

/* One bit per port that a backend at an address of this node (BE_HOST)
 * listens on: the cheap first test of the host's outgoing packets. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORT_BITMAP_WORDS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, PIN);
} host_backend_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct frontend_key);
	__type(value, struct frontend);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, PIN);
} frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, struct backend);
	__uint(pinning, PIN);
} backends SEC(".maps");

/* One Maglev table: slot 0 holds the table size M, slots 1..M backend ids.
 * Tables differ in size, hence BPF_F_INNER_MAP; they are filled through a
 * memory mapping (BPF_F_MMAPABLE), one copy instead of M updates. */
struct maglev_table {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(map_flags, BPF_F_INNER_MAP | BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, __u32);
};

/* Tables by id: a cluster-wide and a node-local one per service port id
 * (2 * svc_id - 1 and 2 * svc_id), so the loader sizes it 2 x
 * --services-max. An array, not a hash: the verifier inlines its lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1024);
	__type(key, __u32); /* table id */
	__uint(pinning, PIN);
	__array(values, struct maglev_table);
} maglev_tables SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1024);
	__type(key, struct source_range_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, PIN);
} source_ranges SEC(".maps");

/*
 * conntrack and nat use the common LRU, not BPF_F_NO_COMMON_LRU. Measured
 * with BenchmarkDatapath (new_flow_ct_full, maps at capacity), the per-CPU
 * LRU made a new flow about twice as slow: it rotates its lists on every
 * insert, touching a few cold entries each time, where the common LRU
 * refills a per-CPU free list 128 entries at a time. It would also split
 * max_entries evenly over the possible CPUs, each CPU evicting only the
 * entries it created. One insert into a full LRU hash is the largest part
 * of a new flow's cost (lru_insert_floor in the benchmark), which is why a
 * SNAT flow's reverse half lives in snat_slots instead of a second LRU map.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, PIN);
} conntrack SEC(".maps");

/*
 * Flows not confirmed yet: a TCP flow until its handshake completed both
 * ways (the backend answered, then the client acknowledged), a UDP flow
 * until its backend answered. Every new flow starts here and moves to
 * conntrack when confirmed (ct_confirm), so a flood of new flows, spoofed
 * or not, only ever evicts other unconfirmed flows: a confirmed flow is
 * only displaced by another confirmed one, in conntrack.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, PIN);
} ct_unconfirmed SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct nat_key);
	__type(value, struct nat_entry);
	__uint(pinning, PIN);
} nat SEC(".maps");

/* The reverse halves of unconfirmed flows without SNAT (the reverse half
 * of a SNAT flow lives in its port's slot): as ct_unconfirmed for the
 * forward halves, so a flood of new flows to a backend on this node, or
 * from a pod to a ClusterIP, evicts only other unconfirmed flows' reverse
 * halves. A flow's reverse half moves to nat when it is confirmed
 * (nat_confirm_entry). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct nat_key);
	__type(value, struct nat_entry);
	__uint(pinning, PIN);
} nat_unconfirmed SEC(".maps");

/* snat_buckets SNAT port ranges: see struct snat_slot. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct snat_slot);
	__uint(pinning, PIN);
} snat_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SNAT_BUCKET_HINTS + 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, PIN);
} snat_bucket_hints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, struct snat_bucket_hand);
	__uint(pinning, PIN);
} snat_bucket_hands SEC(".maps");

/* Per backend id: how many SNAT ports its flows were offered (from where
 * the backend starts in the range, mod the range: the next port offered). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, PIN);
} snat_backend_hands SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key);
	__type(value, struct affinity_entry);
	__uint(pinning, PIN);
} affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, enum stat);
	__type(value, struct counter);
	__uint(pinning, PIN);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32); /* svc_id */
	__type(value, struct svc_counter);
	__uint(pinning, PIN);
} svc_stats SEC(".maps");

/* Flows opened by the SYN proxy: their sequence offsets (see
 * struct synproxy_seq). Sized like conntrack, deleted with the flow; only
 * a client that answered a cookie gets an entry. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct synproxy_seq);
	__uint(pinning, PIN);
} synproxy_flows SEC(".maps");

/* Handshake counts by service port id: see struct syn_flood. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1024);
	__type(key, __u32); /* svc_id */
	__type(value, struct syn_flood);
	__uint(pinning, PIN);
} syn_floods SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct icmp_budget);
	__uint(pinning, PIN);
} icmp_budget SEC(".maps");

/* ---- sockets of the node's own processes ----------------------------- */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, struct sock_frontend);
	__uint(pinning, PIN);
} sock_frontends SEC(".maps");

/* ---- fragments --------------------------------------------------------- */

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, struct frag_key);
	__type(value, struct frag_entry);
	__uint(pinning, PIN);
} fragments SEC(".maps");

/* ---- for operators ----------------------------------------------------- */

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32); /* svc_id */
	__type(value, struct svc_name);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, PIN);
} svc_names SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct agent_state);
	__uint(pinning, PIN);
} agent SEC(".maps");

#endif /* XDPLB_MAPS_H */
