/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat.h - address translation: header rewrites with incremental checksums,
 * SNAT port allocation, and the reverse-NAT half of a tracked flow.
 *
 * Every translated flow has two halves: the forward conntrack entry (client
 * tuple -> backend, NAT source) and a reverse entry (reply tuple -> client
 * and frontend). Each holds enough to rebuild the other. SNAT flows keep
 * their reverse half in the slot of their SNAT port (struct snat_slot),
 * which lives exactly as long as the forward entry points at it; flows
 * without SNAT (DNAT to a local backend) keep it in the nat LRU hash, and
 * the two halves check each other once a second, so an LRU eviction of one
 * is repaired instead of leaving the other dangling.
 */
#ifndef XDPLB_NAT_H
#define XDPLB_NAT_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"
#include "conntrack.h"

/*
 * A SNAT flow claims its port in two ways. First its bucket's slots, oldest
 * first (SNAT_SLOT_ATTEMPTS of them): the port held longest has almost
 * always lost its flow already. Checking whether a taken slot's flow still
 * lives means looking up its conntrack entry, which marks an LRU entry as
 * recently used; random probing hit live flows on most tries, and with
 * conntrack at capacity those marks made the LRU scan long lists on every
 * insert (new flows slowed from under 1 us to 80-150 us in
 * BenchmarkDatapath), so the slot path gives up after a few tries. Then,
 * when the bucket is busy (long-lived flows, or several busy backends
 * hashed to it), the nat map, as flows without SNAT: ports of the
 * backend's own range at random (SNAT_PORT_ATTEMPTS of them), skipping
 * those a slot holds for the same backend. So every backend keeps a whole
 * range per node address; with 78% of it in use, 0.03% of new flows find
 * no port (16 tries: 1.9%), a counted drop.
 */
#define SNAT_SLOT_ATTEMPTS 4
#define SNAT_PORT_ATTEMPTS 32

/* The reply tuple a backend sends for a forward entry. */
static __always_inline void nat_key_of(const struct ct_key *flow, const struct ct_entry *ct,
				       struct nat_key *key)
{
	key->saddr = ct->backend_addr;
	key->sport = ct->backend_port;
	if (ct->flags & CT_F_SNAT) {
		key->daddr = ct->nat_addr;
		key->dport = ct->nat_port;
	} else {
		key->daddr = flow->saddr;
		key->dport = flow->sport;
	}
	key->proto = flow->proto;
	key->pad[0] = key->pad[1] = key->pad[2] = 0;
}

static __always_inline void nat_entry_of(const struct ct_key *flow, const struct ct_entry *ct,
					 struct nat_entry *entry)
{
	entry->client_addr = flow->saddr;
	entry->client_port = flow->sport;
	entry->frontend_addr = flow->daddr;
	entry->frontend_port = flow->dport;
	entry->backend_id = ct->backend_id;
	entry->svc_id = ct->svc_id;
	entry->flags = ct->flags;
	entry->pad[0] = entry->pad[1] = entry->pad[2] = 0;
	entry->last_seen_ns = ct->last_seen_ns;
	__builtin_memset(&entry->hop, 0, sizeof(entry->hop));
}

/* Does a reverse entry belong to this forward flow? */
static __always_inline int nat_entry_matches(const struct nat_entry *entry,
					     const struct ct_key *flow)
{
	return entry->client_addr == flow->saddr && entry->client_port == flow->sport &&
	       entry->frontend_addr == flow->daddr && entry->frontend_port == flow->dport;
}

static __always_inline int nat_keys_equal(const struct nat_key *a, const struct nat_key *b)
{
	return a->saddr == b->saddr && a->daddr == b->daddr && a->sport == b->sport &&
	       a->dport == b->dport && a->proto == b->proto;
}

/* The forward key a reverse entry stands for. */
static __always_inline void ct_key_of_nat(const struct nat_key *key, const struct nat_entry *entry,
					  struct ct_key *flow)
{
	flow->saddr = entry->client_addr;
	flow->daddr = entry->frontend_addr;
	flow->sport = entry->client_port;
	flow->dport = entry->frontend_port;
	flow->proto = key->proto;
	flow->pad[0] = flow->pad[1] = flow->pad[2] = 0;
}

/* The forward key and entry a reverse entry stands for. */
static __always_inline void ct_of_nat(const struct nat_key *key, const struct nat_entry *entry,
				      __u64 now, struct ct_key *flow, struct ct_entry *ct)
{
	ct_key_of_nat(key, entry, flow);
	__builtin_memset(ct, 0, sizeof(*ct));
	ct->created_ns = now;
	ct->last_seen_ns = now;
	ct->backend_id = entry->backend_id;
	ct->svc_id = entry->svc_id;
	ct->backend_addr = key->saddr;
	ct->backend_port = key->sport;
	ct->flags = entry->flags;
	if (entry->flags & CT_F_SNAT) {
		ct->nat_addr = key->daddr;
		ct->nat_port = key->dport;
	}
	/* A flow with replies is past its handshake. */
	ct->tcp_state = CT_TCP_SYN | CT_TCP_ESTABLISHED;
}

/* Does a live forward entry translate to exactly this reply tuple? */
static __always_inline int ct_answers_to(const struct ct_entry *ct, const struct nat_key *key)
{
	return ct->backend_addr == key->saddr && ct->backend_port == key->sport &&
	       (!(ct->flags & CT_F_SNAT) ||
		(ct->nat_addr == key->daddr && ct->nat_port == key->dport));
}

/* Do two forward entries of one client tuple have the same reverse half? */
static __always_inline int ct_same_reverse(const struct ct_entry *a, const struct ct_entry *b)
{
	return a->backend_addr == b->backend_addr && a->backend_port == b->backend_port &&
	       (a->flags & CT_F_SNAT) == (b->flags & CT_F_SNAT) &&
	       (!(a->flags & CT_F_SNAT) || (a->nat_addr == b->nat_addr && a->nat_port == b->nat_port));
}

/* ---- SNAT slots -------------------------------------------------------- */

static __always_inline int snat_port_in_range(const struct datapath_config *cfg, __be16 port)
{
	__u16 p = bpf_ntohs(port);

	return p >= cfg->snat_port_min && p <= cfg->snat_port_max;
}

static __always_inline __u32 snat_range(const struct datapath_config *cfg)
{
	return (__u32)cfg->snat_port_max - cfg->snat_port_min + 1;
}

/*
 * The index in snat_slots of a reply tuple whose destination port is a SNAT
 * port: its bucket (a hash of backend, node address and protocol, not the
 * port) times the range, plus the port's offset. The bucket is node-local,
 * so the hash takes no seed: changing --maglev-hash-seed must not move the
 * slots of live flows.
 */
static __always_inline __u32 snat_bucket(const struct nat_key *key, __u32 buckets)
{
	if (buckets <= 1)
		return 0;
	return flow_hash(key->saddr, key->daddr, key->sport, 0, key->proto, 0) % buckets;
}

static __always_inline __u32 snat_slot_index(const struct nat_key *key, __u32 port_min,
					     __u32 range, __u32 buckets)
{
	return snat_bucket(key, buckets) * range + (bpf_ntohs(key->dport) - port_min);
}

/* The slot of a reply tuple whose destination port is a SNAT port. */
static __always_inline struct snat_slot *snat_slot_of(const struct nat_key *key,
						      const struct datapath_config *cfg)
{
	__u32 index = snat_slot_index(key, cfg->snat_port_min, snat_range(cfg), cfg->snat_buckets);

	return bpf_map_lookup_elem(&snat_slots, &index);
}

/*
 * May a claimed slot be taken for the flow `flow`? Yes when it is free,
 * already this flow's (its forward entry was evicted and is coming back),
 * or its forward entry is gone, expired, or translates elsewhere now.
 */
static __always_inline int snat_slot_reclaimable(const struct snat_slot *slot,
						 const struct ct_key *flow,
						 const struct datapath_config *cfg, __u64 now)
{
	struct ct_key owner;
	struct ct_entry *ct;

	if (!slot->key.proto)
		return 1;
	if (nat_entry_matches(&slot->rev, flow) && slot->key.proto == flow->proto)
		return 1;
	ct_key_of_nat(&slot->key, &slot->rev, &owner);
	ct = bpf_map_lookup_elem(&conntrack, &owner);
	return !ct || !(ct->flags & CT_F_SNAT) || !ct_answers_to(ct, &slot->key) ||
	       ct_expired(ct, owner.proto, cfg, now);
}

/* Take a slot last seen at `generation`; fails if another CPU was first. */
static __always_inline int snat_slot_take(struct snat_slot *slot, __u32 generation,
					  const struct nat_key *key, const struct nat_entry *entry)
{
	if (__sync_val_compare_and_swap(&slot->generation, generation, generation + 1) !=
	    generation)
		return -1;
	/* Invalid while it is rewritten, for a late reply of the old flow. */
	slot->key.proto = 0;
	barrier();
	slot->rev = *entry;
	slot->key.saddr = key->saddr;
	slot->key.daddr = key->daddr;
	slot->key.sport = key->sport;
	slot->key.dport = key->dport;
	barrier();
	slot->key.proto = key->proto;
	return 0;
}

/* Does the slot hold this reply tuple (for whichever flow)? */
static __always_inline int snat_slot_holds(const struct snat_slot *slot, const struct nat_key *key)
{
	return slot->key.proto && nat_keys_equal(&slot->key, key);
}

/* Free a slot if it holds `key` for `flow`; returns whether it did. */
static __always_inline int snat_slot_release(const struct nat_key *key, const struct ct_key *flow,
					     const struct datapath_config *cfg)
{
	struct snat_slot *slot = snat_slot_of(key, cfg);
	__u32 generation;

	if (!slot)
		return 0;
	generation = READ_ONCE(slot->generation);
	if (!snat_slot_holds(slot, key) || !nat_entry_matches(&slot->rev, flow))
		return 0;
	if (__sync_val_compare_and_swap(&slot->generation, generation, generation + 1) ==
	    generation)
		slot->key.proto = 0;
	return 1;
}

/* ---- the reverse half of a flow ---------------------------------------- */

/*
 * The reverse entry a reply tuple belongs to: the slot of its SNAT port if
 * that slot holds exactly this tuple, else the nat map's entry (flows
 * without SNAT, and SNAT flows whose bucket was busy). NULL when there is
 * none.
 */
static __always_inline struct nat_entry *reverse_lookup(const struct nat_key *key)
{
	struct datapath_config *cfg = config_get();

	if (cfg && snat_port_in_range(cfg, key->dport)) {
		struct snat_slot *slot = snat_slot_of(key, cfg);

		if (slot && snat_slot_holds(slot, key))
			return &slot->rev;
	}
	return bpf_map_lookup_elem(&nat, key);
}

/* Claim a slot of the flow's bucket, oldest first. 0 on success. */
static __always_inline int snat_claim_slot(const struct ct_key *flow, struct ct_entry *ct,
					   const struct datapath_config *cfg, __u64 now,
					   struct nat_key *key, const struct nat_entry *entry)
{
	__u32 range = snat_range(cfg), bucket = snat_bucket(key, cfg->snat_buckets), *hand;

	hand = bpf_map_lookup_elem(&snat_hands, &bucket);
	if (!hand)
		return -1;
	for (__u32 i = 0; i < SNAT_SLOT_ATTEMPTS; i++) {
		__u32 offset = __sync_fetch_and_add(hand, 1) % range;
		__u32 index = bucket * range + offset;
		struct snat_slot *slot = bpf_map_lookup_elem(&snat_slots, &index);
		__u32 generation;

		if (!slot)
			return -1;
		ct->nat_port = bpf_htons((__u16)(cfg->snat_port_min + offset));
		key->dport = ct->nat_port;
		generation = READ_ONCE(slot->generation);
		if (!snat_slot_reclaimable(slot, flow, cfg, now))
			continue;
		/* A flow of the same backend that went to the nat map may use
		 * this port. */
		if (bpf_map_lookup_elem(&nat, key))
			continue;
		if (snat_slot_take(slot, generation, key, entry) == 0)
			return 0;
	}
	return -1;
}

/* State of the random port search in the nat map (a bpf_loop callback's). */
struct snat_search {
	struct nat_key key;
	struct nat_entry entry;
	__u32 base;      /* hash the ports are drawn from */
	__u32 port_min;
	__u32 range;
	__u32 buckets;
	long result;     /* 0: claimed key.dport; -1: none free; -2: no room */
};

/* The slot a SNAT search's key would use. */
static __always_inline struct snat_slot *snat_search_slot(const struct snat_search *s)
{
	__u32 index = snat_slot_index(&s->key, s->port_min, s->range, s->buckets);

	return bpf_map_lookup_elem(&snat_slots, &index);
}

/* One try of the search: port number i of the backend's random order. */
static long snat_search_try(__u32 i, void *ctx)
{
	struct snat_search *s = ctx;
	struct nat_entry *found;
	struct snat_slot *slot;
	long err;

	/* Independent pseudo-random ports: a fixed stride would cluster like
	 * linear probing and fail early. */
	s->key.dport = bpf_htons((__u16)(s->port_min + hash_3words(s->base, i, 0, 0) % s->range));
	slot = snat_search_slot(s);
	if (!slot)
		return 0;
	if (snat_slot_holds(slot, &s->key)) {
		/* A slot holds this port for the backend: free only if its
		 * flow's conntrack entry is gone or translates elsewhere now,
		 * and then it is taken as a slot (the nat map must not hold
		 * the same tuple). */
		struct ct_key owner;
		struct ct_entry *ct;
		__u32 generation = READ_ONCE(slot->generation);

		ct_key_of_nat(&slot->key, &slot->rev, &owner);
		ct = bpf_map_lookup_elem(&conntrack, &owner);
		if (ct && (ct->flags & CT_F_SNAT) && ct_answers_to(ct, &slot->key))
			return 0;
		if (snat_slot_take(slot, generation, &s->key, &s->entry))
			return 0;
		s->result = 0;
		return 1;
	}
	/* Look before inserting: a failed LRU insert may evict a live entry
	 * to make room it then does not use. An entry whose flow is gone
	 * (evicted from conntrack while its reverse half stayed) is stale:
	 * the port is free and the entry is replaced. */
	found = bpf_map_lookup_elem(&nat, &s->key);
	if (found) {
		struct ct_key owner;
		struct ct_entry *ct;

		ct_key_of_nat(&s->key, found, &owner);
		ct = bpf_map_lookup_elem(&conntrack, &owner);
		if (ct && (ct->flags & CT_F_SNAT) && ct_answers_to(ct, &s->key))
			return 0;
		err = bpf_map_update_elem(&nat, &s->key, &s->entry, BPF_EXIST);
	} else {
		err = bpf_map_update_elem(&nat, &s->key, &s->entry, BPF_NOEXIST);
	}
	if (err == -17 /* EEXIST */ || err == -2 /* ENOENT: evicted meanwhile */)
		return 0;
	s->result = err ? -2 : 0;
	return 1;
}

/* Claim a port of the backend's range in the nat map, at random (through
 * bpf_loop, so the verifier checks one try, not SNAT_PORT_ATTEMPTS). 0 on
 * success, -1 when no port was free, -2 when there was no room. */
static __always_inline int snat_claim_nat(const struct ct_key *flow, struct ct_entry *ct,
					  const struct datapath_config *cfg, struct nat_key *key,
					  const struct nat_entry *entry)
{
	struct snat_search s = {
		.key = *key,
		.entry = *entry,
		.base = flow_hash(flow->saddr, flow->daddr, flow->sport, flow->dport, flow->proto,
				  cfg->hash_seed ^ 0x5a5a5a5a),
		.port_min = cfg->snat_port_min,
		.range = snat_range(cfg),
		.buckets = cfg->snat_buckets,
		.result = -1,
	};

	bpf_loop(SNAT_PORT_ATTEMPTS, snat_search_try, &s, 0);
	if (s.result == 0)
		ct->nat_port = s.key.dport;
	return s.result;
}

/*
 * Claim the reverse half for a new flow. Without SNAT the reply tuple is
 * fixed and gets a nat map entry. With SNAT, a port is claimed as the
 * comment on SNAT_SLOT_ATTEMPTS says.
 * Returns 0 on success, -1 when no port was free, -2 when there was no room.
 */
static __always_inline int nat_claim(const struct ct_key *flow, struct ct_entry *ct,
				     const struct datapath_config *cfg, __u64 now)
{
	struct nat_key key;
	struct nat_entry entry;

	nat_entry_of(flow, ct, &entry);
	nat_key_of(flow, ct, &key);
	if (!(ct->flags & CT_F_SNAT))
		return bpf_map_update_elem(&nat, &key, &entry, BPF_ANY) ? -2 : 0;
	if (cfg->snat_port_max < cfg->snat_port_min)
		return -1;
	if (snat_claim_slot(flow, ct, cfg, now, &key, &entry) == 0)
		return 0;
	return snat_claim_nat(flow, ct, cfg, &key, &entry);
}

/* Forget the reverse half of a forward entry, if it is still ours. */
static __always_inline void nat_release(const struct ct_key *flow, const struct ct_entry *ct)
{
	struct datapath_config *cfg;
	struct nat_entry *entry;
	struct nat_key key;

	nat_key_of(flow, ct, &key);
	if (ct->flags & CT_F_SNAT) {
		cfg = config_get();
		if (cfg && snat_port_in_range(cfg, key.dport) && snat_slot_release(&key, flow, cfg))
			return;
	}
	entry = bpf_map_lookup_elem(&nat, &key);
	if (entry && nat_entry_matches(entry, flow))
		bpf_map_delete_elem(&nat, &key);
}

/* Forget a reverse entry that turned out stale (its forward half moved on). */
static __always_inline void nat_forget(const struct nat_key *key, const struct nat_entry *rev)
{
	struct datapath_config *cfg;
	struct ct_key flow;

	if (rev->flags & CT_F_SNAT) {
		cfg = config_get();
		ct_key_of_nat(key, rev, &flow);
		if (cfg && snat_port_in_range(cfg, key->dport) && snat_slot_release(key, &flow, cfg))
			return;
	}
	bpf_map_delete_elem(&nat, key);
}

enum nat_check {
	NAT_OK = 0,
	NAT_REPAIRED,   /* reverse half was missing and is back */
	NAT_PORT_MOVED, /* lost to another flow; a new SNAT port was claimed */
	NAT_FAILED,     /* could not be restored */
};

/* Make sure a live forward entry still has its reverse half. */
static __always_inline enum nat_check nat_ensure(const struct ct_key *flow, struct ct_entry *ct,
						 const struct datapath_config *cfg, __u64 now)
{
	struct snat_slot *slot = NULL;
	struct nat_entry *found, entry;
	struct nat_key key;
	__u32 generation = 0;

	nat_key_of(flow, ct, &key);
	nat_entry_of(flow, ct, &entry);
	if (ct->flags & CT_F_SNAT) {
		if (!snat_port_in_range(cfg, key.dport))
			return NAT_FAILED;
		slot = snat_slot_of(&key, cfg);
		if (!slot)
			return NAT_FAILED;
		generation = READ_ONCE(slot->generation);
		if (snat_slot_holds(slot, &key)) {
			if (nat_entry_matches(&slot->rev, flow))
				return NAT_OK;
			goto lost; /* the SNAT port now belongs to another flow */
		}
	}

	found = bpf_map_lookup_elem(&nat, &key);
	if (found) {
		if (nat_entry_matches(found, flow))
			return NAT_OK;
		if (ct->flags & CT_F_SNAT)
			goto lost;
		/* Without SNAT the reply tuple is this flow's alone. */
		return bpf_map_update_elem(&nat, &key, &entry, BPF_ANY) == 0 ? NAT_REPAIRED
									    : NAT_FAILED;
	}
	/* Missing (released, or evicted from the nat map): take it back, in
	 * the slot if that is free. */
	if (slot && !slot->key.proto && snat_slot_take(slot, generation, &key, &entry) == 0)
		return NAT_REPAIRED;
	if (bpf_map_update_elem(&nat, &key, &entry, BPF_NOEXIST) == 0)
		return NAT_REPAIRED;
	return NAT_FAILED;
lost:
	return nat_claim(flow, ct, cfg, now) == 0 ? NAT_PORT_MOVED : NAT_FAILED;
}

/*
 * Rewrite the IPv4 and L4 addresses/ports of a parsed TCP or UDP packet and
 * update the IP, TCP or UDP checksums incrementally.
 */
static __always_inline int rewrite_tuple(struct packet *pkt, __be32 saddr, __be16 sport,
					 __be32 daddr, __be16 dport)
{
	struct iphdr *ip = pkt->ip;
	__u32 addr_delta = 0, l4_delta;

	addr_delta = csum_delta32(addr_delta, ip->saddr, saddr);
	addr_delta = csum_delta32(addr_delta, ip->daddr, daddr);
	ip->check = csum_apply(ip->check, addr_delta);
	ip->saddr = saddr;
	ip->daddr = daddr;

	l4_delta = csum_delta16(addr_delta, pkt->sport, sport);
	l4_delta = csum_delta16(l4_delta, pkt->dport, dport);

	if (pkt->proto == IPPROTO_TCP) {
		struct tcphdr *tcp = pkt->l4;

		if ((void *)(tcp + 1) > pkt->data_end)
			return -1;
		tcp->check = csum_apply(tcp->check, l4_delta);
		tcp->source = sport;
		tcp->dest = dport;
	} else {
		struct udphdr *udp = pkt->l4;

		if ((void *)(udp + 1) > pkt->data_end)
			return -1;
		udp->check = csum_apply_udp(udp->check, l4_delta);
		udp->source = sport;
		udp->dest = dport;
	}
	pkt->saddr = saddr;
	pkt->daddr = daddr;
	pkt->sport = sport;
	pkt->dport = dport;
	return 0;
}

#endif /* XDPLB_NAT_H */
