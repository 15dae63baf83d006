/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * snat.h - SNAT port allocation: the ports (one or two ranges), the slot
 * array that holds SNAT flows' reverse halves by port (struct snat_slot,
 * in buckets shared out among backends), the slot lock, and the claim of a
 * port for a new flow. A reverse half that cannot have its port's slot
 * spills into the nat map.
 */
#ifndef XDPLB_SNAT_H
#define XDPLB_SNAT_H

#include "halves.h"

/*
 * A SNAT flow claims its port by trying ports in three ways, in turn:
 *
 * 1. Up to SNAT_BUCKET_ATTEMPTS slots from its bucket's hand
 *    (snat_bucket_hands), which offers the bucket's slots in turn, so the
 *    slot offered is the one held longest and its flow is almost always
 *    gone: the reverse half then lives in the slot and the flow costs one
 *    LRU insert. This is the common case. The backend's own live flows
 *    (long-lived ones) are passed over.
 * 2. When the hand offers SNAT_BUCKET_BUSY_SLOTS slots of other backends'
 *    live flows, the bucket is busy (more backends than buckets share it):
 *    it rests for the next SNAT_BUCKET_REST_CLAIMS claims, which try
 *    SNAT_BACKEND_ATTEMPTS ports from their backend's own hand
 *    (snat_backend_hands) instead. A free slot is taken; a port whose slot
 *    another backend's flow holds is still free for this backend, in the
 *    nat map; a port whose slot this backend's flow holds is skipped. A
 *    longer rest suits a few busy backends, a shorter one many backends,
 *    whose ports would otherwise go to the nat map (measured:
 *    docs/performance-history.md, "SNAT claims").
 * 3. SNAT_RANDOM_ATTEMPTS ports at random, taken only when no flow of the
 *    backend holds them (a free slot, or another backend's, with no entry
 *    of this backend's in the nat map).
 *
 * Whether a port's holder still lives takes a conntrack lookup, and every
 * lookup of a live entry marks it recently used, so the LRU keeps it. A
 * claim therefore looks up only the holders its bucket's hand offers (the
 * oldest, mostly gone) and the nat map entries of its backend's own hand.
 * Random tries that looked up a backend's own holders kept that backend's
 * live flows in the LRU at the others' expense (docs/performance-history.md,
 * "SNAT claims").
 */
#define SNAT_BUCKET_ATTEMPTS 16     /* tries from the bucket's hand */
#define SNAT_BUCKET_BUSY_SLOTS 2    /* other backends' live slots that make a bucket busy */
#define SNAT_BUCKET_REST_CLAIMS 256 /* claims a busy bucket's hand then sits out */
#define SNAT_ASSIGN_CANDIDATES 8    /* buckets compared when a triple gets one */
#define SNAT_BACKEND_ATTEMPTS 4     /* tries from the backend's own hand */
#define SNAT_RANDOM_ATTEMPTS 32     /* tries at random, the last resort */

/* ---- SNAT slots -------------------------------------------------------- */

/* Is port (network byte order) one of the SNAT ports? One unsigned
 * comparison a range. */
static __always_inline int snat_port_in_range(const struct datapath_config *cfg, __be16 port)
{
	__u32 p = bpf_ntohs(port);

	return p - cfg->snat_port_min <= (__u32)cfg->snat_port_max - cfg->snat_port_min ||
	       p - cfg->snat_port2_min < cfg->snat_port2_len;
}

/* The first range's length. */
static __always_inline __u32 snat_range1(const struct datapath_config *cfg)
{
	return (__u32)cfg->snat_port_max - cfg->snat_port_min + 1;
}

/* How many SNAT ports there are: the length of a bucket in snat_slots. */
static __always_inline __u32 snat_range(const struct datapath_config *cfg)
{
	return snat_range1(cfg) + cfg->snat_port2_len;
}

/* The number of SNAT port p (host byte order, one of the SNAT ports):
 * the first range's ports come first, the second's (above the first)
 * after them. Without a branch, for the verifier (see snat_port_in_range):
 * above is 1 for a port above the first range, whose number is smaller by
 * the gap between the two ranges. */
static __always_inline __u32 snat_port_offset(const struct datapath_config *cfg, __u32 p)
{
	__u32 above = ((__u32)cfg->snat_port_max - p) >> 31;
	__u32 gap = (__u32)cfg->snat_port2_min - cfg->snat_port_max - 1;

	return p - cfg->snat_port_min - above * gap;
}

/* SNAT port number offset (below snat_range), network byte order. */
static __always_inline __be16 snat_port_at(const struct datapath_config *cfg, __u32 offset)
{
	__u32 first = snat_range1(cfg);

	if (offset < first)
		return bpf_htons((__u16)(cfg->snat_port_min + offset));
	return bpf_htons((__u16)(cfg->snat_port2_min + (offset - first)));
}

/*
 * Which bucket holds the reply tuples of one (backend, node address,
 * protocol): its entry in snat_bucket_hints, found by a hash of the triple
 * (the port is not part of it). A triple gets a bucket on its first SNAT
 * claim (snat_bucket_assign), so busy backends do not share a bucket
 * while there are buckets to spare (why: docs/performance-history.md,
 * "SNAT claims"). The hash takes no seed: changing --maglev-hash-seed must
 * not move the slots of live flows.
 */
static __always_inline __u32 *snat_hint_of(const struct nat_key *key)
{
	__u32 index = flow_hash(key->saddr, key->daddr, key->sport, 0, key->proto, 0) %
		      SNAT_BUCKET_HINTS;

	return bpf_map_lookup_elem(&snat_bucket_hints, &index);
}

/* The bucket of a reply tuple; -1 when its triple has none yet (no slot
 * holds it: a nat map entry of an older datapath may). */
static __always_inline int snat_bucket_of(const struct nat_key *key, __u32 buckets)
{
	__u32 *hint = snat_hint_of(key);
	__u32 bucket;

	if (!hint)
		return -1;
	bucket = READ_ONCE(*hint);
	return bucket && bucket <= buckets ? (int)bucket - 1 : -1;
}

/*
 * The bucket a claim for this reply tuple uses. A triple without one gets
 * the idlest of the next SNAT_ASSIGN_CANDIDATES buckets in turn (the one
 * whose last claim is oldest): backends come and go, and a bucket given
 * only in turn would come round to one a busy backend still uses while
 * those of departed backends sit idle. -1 on a map failure.
 */
static __always_inline int snat_bucket_assign(const struct nat_key *key, __u32 buckets)
{
	__u32 next_index = SNAT_HINT_NEXT;
	__u32 *hint = snat_hint_of(key);
	__u32 seen, want, prev, first, best, i, *next;
	__u64 now, idle_ns, best_idle_ns = 0;

	if (!hint || !buckets)
		return -1;
	seen = READ_ONCE(*hint);
	if (seen && seen <= buckets)
		return seen - 1;
	next = bpf_map_lookup_elem(&snat_bucket_hints, &next_index);
	if (!next)
		return -1;
	now = bpf_ktime_get_coarse_ns();
	first = __sync_fetch_and_add(next, 1) % buckets;
	best = first;
	for (i = 0; i < SNAT_ASSIGN_CANDIDATES && i < buckets; i++) {
		__u32 bucket = (first + i) % buckets;
		struct snat_bucket_hand *hand = bpf_map_lookup_elem(&snat_bucket_hands, &bucket);

		if (!hand)
			continue;
		idle_ns = time_since(READ_ONCE(hand->last_claim_ns), now);
		if (idle_ns > best_idle_ns) {
			best = bucket;
			best_idle_ns = idle_ns;
		}
	}
	want = best + 1;
	/* Another CPU may give the triple a bucket at the same time: the
	 * first one wins. */
	prev = __sync_val_compare_and_swap(hint, seen, want);
	if (prev == seen)
		return want - 1;
	return prev && prev <= buckets ? (int)prev - 1 : -1;
}

/* The slot of a reply tuple whose destination port is a SNAT port: its
 * bucket times the range, plus the port's offset. NULL without a bucket. */
static __always_inline struct snat_slot *snat_slot_in(int bucket, const struct nat_key *key,
						      const struct datapath_config *cfg)
{
	__u32 index;

	if (bucket < 0)
		return NULL;
	index = (__u32)bucket * snat_range(cfg) + snat_port_offset(cfg, bpf_ntohs(key->dport));
	return bpf_map_lookup_elem(&snat_slots, &index);
}

/* The slot that holds a reply tuple, if any does (for replies). */
static __always_inline struct snat_slot *snat_slot_of(const struct nat_key *key,
						      const struct datapath_config *cfg)
{
	return snat_slot_in(snat_bucket_of(key, cfg->snat_buckets), key, cfg);
}

/* The slot whose lock covers a reply tuple, for claims, releases and
 * repairs: a triple without a bucket gets one (its flows' reverse halves
 * can be in the nat map, put there by an older datapath, or by a claim
 * before a resize moved the buckets). */
static __always_inline struct snat_slot *snat_slot_for(const struct nat_key *key,
						       const struct datapath_config *cfg)
{
	return snat_slot_in(snat_bucket_assign(key, cfg->snat_buckets), key, cfg);
}

/*
 * A slot's lock covers every claim and release of its index: the reply
 * tuples of all backends given its bucket with its port, whether the
 * slot or the nat map holds them. Without it two CPUs could claim one
 * tuple at once, one in the slot and one in the nat map. The lock is the
 * top bit of the generation, which counts the slot's lockings; a program
 * always unlocks before it ends, so a locked slot only means another CPU
 * is at it now.
 */
#define SNAT_SLOT_LOCKED 0x80000000u

/* Lock a slot; 0 when another CPU holds it. */
static __always_inline int snat_slot_lock(struct snat_slot *slot, __u32 *generation)
{
	__u32 seen = READ_ONCE(slot->generation);

	if (seen & SNAT_SLOT_LOCKED)
		return 0;
	if (__sync_val_compare_and_swap(&slot->generation, seen, seen | SNAT_SLOT_LOCKED) != seen)
		return 0;
	*generation = seen;
	return 1;
}

static __always_inline void snat_slot_unlock(struct snat_slot *slot, __u32 generation)
{
	/* An atomic exchange: the slot's writes are visible before it. */
	__sync_lock_test_and_set(&slot->generation, (generation + 1) & ~SNAT_SLOT_LOCKED);
}

/* Write a locked slot. */
static __always_inline void snat_slot_write(struct snat_slot *slot, const struct nat_key *key,
					    const struct nat_entry *entry)
{
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
}

/* Does the slot hold this reply tuple (for whichever flow)? */
static __always_inline int snat_slot_holds(const struct snat_slot *slot, const struct nat_key *key)
{
	return slot->key.proto && nat_keys_equal(&slot->key, key);
}

/* May the nat map hold a spill of this slot (see struct snat_slot)? Until
 * the agent has found every spill marked (an older datapath did not mark
 * them), any slot may. */
static __always_inline int snat_slot_may_spill(const struct snat_slot *slot,
					       const struct datapath_config *cfg)
{
	return !cfg->snat_spills_marked || (slot->flags & SNAT_SLOT_SPILLED);
}

/* Mark a slot as spilled into, if it is not yet: for a spill an older
 * datapath made without marking (the agent trusts the marks only once
 * every spill is marked). The lock orders it with claims of the port. */
static __always_inline void snat_slot_mark(struct snat_slot *slot)
{
	__u32 generation;

	if (!(READ_ONCE(slot->flags) & SNAT_SLOT_SPILLED) && snat_slot_lock(slot, &generation)) {
		slot->flags |= SNAT_SLOT_SPILLED;
		snat_slot_unlock(slot, generation);
	}
}

/* Spill a reply tuple of a locked slot into the nat map, marking the slot
 * first. 0 on success, else the map update's error. */
static __always_inline long snat_spill(struct snat_slot *slot, const struct nat_key *key,
				       const struct nat_entry *entry, __u64 flags)
{
	if (!(slot->flags & SNAT_SLOT_SPILLED))
		slot->flags |= SNAT_SLOT_SPILLED;
	return bpf_map_update_elem(&nat, key, entry, flags);
}

/*
 * Forget the SNAT reverse half `key` of `flow`, in its slot or the nat map,
 * with the slot locked so no claim of the port runs meanwhile. When another
 * CPU holds the lock, it is claiming this port and finds the flow gone (the
 * caller forgets the forward entry too), so nothing is left to do here.
 */
static __always_inline void snat_release(const struct nat_key *key, const struct ct_key *flow,
					 const struct datapath_config *cfg)
{
	struct snat_slot *slot = snat_slot_for(key, cfg);
	struct nat_entry *entry;
	__u32 generation;

	if (!slot || !snat_slot_lock(slot, &generation))
		return;
	if (snat_slot_holds(slot, key)) {
		if (nat_entry_matches(&slot->rev, flow))
			slot->key.proto = 0;
	} else {
		entry = bpf_map_lookup_elem(&nat, key);
		if (entry && nat_entry_matches(entry, flow))
			bpf_map_delete_elem(&nat, key);
	}
	snat_slot_unlock(slot, generation);
}

enum snat_try {
	SNAT_CLAIMED = 0,
	SNAT_SLOT_LIVE,   /* the port's slot holds another backend's live flow */
	SNAT_BUSY,        /* the port is in use for this backend, or locked */
	SNAT_NO_ROOM,     /* the nat map refused the entry */
	SNAT_HOST_SOCKET, /* the host has a socket on the reply tuple */
};

/* Which hand offered a port (see SNAT_BUCKET_ATTEMPTS). */
enum snat_way {
	SNAT_BY_BUCKET,  /* the bucket's oldest slot: taken if its flow is gone */
	SNAT_BY_BACKEND, /* the backend's oldest port: its own slot is not looked at */
	SNAT_AT_RANDOM,  /* any port: taken only if no flow of the backend holds it */
};

/* The socket tuple snat_host_socket looks up, per CPU: the stack of a
 * claim's bpf_loop callback has no room for it under TC's frame. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct bpf_sock_tuple);
} snat_sock_tuple SEC(".maps");

/*
 * Does the host have a socket that a reply on tuple key would reach: a
 * connection on that very tuple, or one listening on (or bound to) the
 * port? A SNAT flow never takes such a port, so that no connection of the
 * node's own, in either direction, shares a 4-tuple with a translated
 * flow. (Ports the host could autobind later are kept out of its reach by
 * ip_local_reserved_ports: see docs/snat.md.) pkt_ctx is the program's
 * context, which names the network namespace to look in.
 */
static __always_inline int snat_host_socket(void *pkt_ctx, const struct nat_key *key)
{
	struct bpf_sock_tuple *tuple;
	struct bpf_sock *sk;
	__u32 zero = 0;

	tuple = bpf_map_lookup_elem(&snat_sock_tuple, &zero);
	if (!tuple)
		return 0;
	tuple->ipv4.saddr = key->saddr;
	tuple->ipv4.daddr = key->daddr;
	tuple->ipv4.sport = key->sport;
	tuple->ipv4.dport = key->dport;
	if (key->proto == IPPROTO_TCP)
		sk = bpf_skc_lookup_tcp(pkt_ctx, tuple, sizeof(tuple->ipv4), BPF_F_CURRENT_NETNS, 0);
	else
		sk = bpf_sk_lookup_udp(pkt_ctx, tuple, sizeof(tuple->ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	bpf_sk_release(sk);
	return 1;
}

/* snat_try_port's work, with the slot locked. */
static __always_inline enum snat_try snat_try_locked(void *pkt_ctx, struct snat_slot *slot,
						     const struct nat_key *key,
						     const struct nat_entry *entry,
						     const struct datapath_config *cfg, __u64 now,
						     enum snat_way way)
{
	struct nat_entry *found;
	int in_slot;
	long err;

	if (!slot->key.proto) {
		in_slot = 1;
	} else if (snat_slot_holds(slot, key)) {
		/* This backend's own port. Only the bucket's hand, which
		 * offers the slot held longest, looks up its holder. */
		if (way != SNAT_BY_BUCKET)
			return SNAT_BUSY;
		if (!snat_holder_gone(&slot->key, &slot->rev, cfg, now))
			return SNAT_BUSY;
		in_slot = 1;
	} else if (way == SNAT_BY_BUCKET) {
		if (!snat_holder_gone(&slot->key, &slot->rev, cfg, now))
			return SNAT_SLOT_LIVE;
		in_slot = 1;
	} else {
		in_slot = 0;
	}

	/* This backend may hold the port in the nat map (its bucket is
	 * shared): a random try does not look that holder up either. */
	found = snat_slot_may_spill(slot, cfg) ? bpf_map_lookup_elem(&nat, key) : NULL;
	if (found && (way == SNAT_AT_RANDOM || !snat_holder_gone(key, found, cfg, now)))
		return SNAT_BUSY;
	/* Free for the datapath: is it for the host's sockets too? Asked
	 * last, of the one port about to be taken, and only below the host's
	 * ephemeral ports: the lookup is a good part of a new flow's cost. */
	if (bpf_ntohs(key->dport) < cfg->snat_socket_check_below && snat_host_socket(pkt_ctx, key))
		return SNAT_HOST_SOCKET;
	if (in_slot) {
		if (found)
			bpf_map_delete_elem(&nat, key);
		snat_slot_write(slot, key, entry);
		return SNAT_CLAIMED;
	}
	/* Look before inserting: a failed LRU insert may evict a live entry
	 * to make room it then does not use. */
	err = snat_spill(slot, key, entry, found ? BPF_EXIST : BPF_NOEXIST);
	if (err == -17 /* EEXIST */ || err == -2 /* ENOENT: evicted meanwhile */)
		return SNAT_BUSY;
	return err ? SNAT_NO_ROOM : SNAT_CLAIMED;
}

/*
 * Claim SNAT port key->dport for the flow whose reverse half is `entry`: in
 * its slot when the slot is free or its flow is gone, or, when the slot
 * holds another backend's reply tuple (a backend sharing the bucket), in
 * the nat map, where the port may still be free for this backend. Under
 * the slot's lock, so a reply tuple is never held twice.
 */
static __always_inline enum snat_try snat_try_port(void *pkt_ctx, int bucket,
						   const struct nat_key *key,
						   const struct nat_entry *entry,
						   const struct datapath_config *cfg, __u64 now,
						   enum snat_way way)
{
	struct snat_slot *slot = snat_slot_in(bucket, key, cfg);
	enum snat_try tried;
	__u32 generation;

	if (!slot || !snat_slot_lock(slot, &generation))
		return SNAT_BUSY;
	tried = snat_try_locked(pkt_ctx, slot, key, entry, cfg, now, way);
	snat_slot_unlock(slot, generation);
	return tried;
}

/* State of a SNAT port claim (a bpf_loop callback's). */
struct snat_claim {
	void *pkt_ctx;                  /* the program's context (snat_host_socket) */
	const struct datapath_config *cfg;
	__u64 now;
	struct nat_key *key;            /* its dport is the port tried */
	const struct nat_entry *entry;
	__u32 bucket;
	__u32 backend_id;
	__u32 start;     /* where this backend's hand starts in the range */
	__u32 random;    /* hash the random ports are drawn from */
	__u32 range;
	__u32 live_slots; /* bucket slots offered that held other backends' live flows */
	__u32 resting;    /* the bucket rests: its hand is not tried */
	int result;      /* 0: claimed key->dport; -1: none free; -2: no room */
};

/* Record a try's outcome; 1 (stop the loop) once the claim is decided. */
static __always_inline long snat_claim_done(struct snat_claim *c, enum snat_try tried)
{
	switch (tried) {
	case SNAT_CLAIMED:
		c->result = 0;
		return 1;
	case SNAT_NO_ROOM:
		c->result = -2;
		return 1;
	case SNAT_HOST_SOCKET:
		count(STAT_SNAT_HOST_SOCKET, 0);
		return 0;
	default:
		return 0;
	}
}

/* Try number i of a claim: see SNAT_BUCKET_ATTEMPTS. */
static long snat_claim_try(__u32 i, void *ctx)
{
	struct snat_claim *c = ctx;
	struct snat_bucket_hand *bucket;
	enum snat_try tried;
	enum snat_way way;
	__u32 offset, *hand;

	if (i < SNAT_BUCKET_ATTEMPTS) {
		if (c->resting)
			return 0;
		bucket = bpf_map_lookup_elem(&snat_bucket_hands, &c->bucket);
		if (!bucket)
			return 0;
		if (i == 0 && READ_ONCE(bucket->rest) > 0) {
			/* One claim, one less to rest; two CPUs may take the
			 * last one: -1 is not resting either. */
			__sync_fetch_and_sub(&bucket->rest, 1);
			c->resting = 1;
			return 0;
		}
		offset = __sync_fetch_and_add(&bucket->next, 1) % c->range;
		c->key->dport = snat_port_at(c->cfg, offset);
		tried = snat_try_port(c->pkt_ctx, c->bucket, c->key, c->entry, c->cfg, c->now, SNAT_BY_BUCKET);
		/* The bucket is busy when its hand comes round to other
		 * backends' live flows: they share it. The backend's own live
		 * flows (long-lived ones) are passed over, and so is a port
		 * this backend holds in the nat map. */
		if (tried == SNAT_SLOT_LIVE && ++c->live_slots == SNAT_BUCKET_BUSY_SLOTS) {
			WRITE_ONCE(bucket->rest, SNAT_BUCKET_REST_CLAIMS);
			c->resting = 1;
		}
		return snat_claim_done(c, tried);
	}
	if (i < SNAT_BUCKET_ATTEMPTS + SNAT_BACKEND_ATTEMPTS) {
		hand = bpf_map_lookup_elem(&snat_backend_hands, &c->backend_id);
		if (!hand)
			return 0;
		offset = (c->start + __sync_fetch_and_add(hand, 1)) % c->range;
		way = SNAT_BY_BACKEND;
	} else {
		/* Independent pseudo-random ports: a fixed stride would
		 * cluster like linear probing and fail early. */
		offset = hash_3words(c->random, i, 0, 0) % c->range;
		way = SNAT_AT_RANDOM;
	}
	c->key->dport = snat_port_at(c->cfg, offset);
	return snat_claim_done(c, snat_try_port(c->pkt_ctx, c->bucket, c->key, c->entry, c->cfg, c->now, way));
}

/*
 * Claim a SNAT port for a new flow (through bpf_loop, so the verifier checks
 * one try, not all of them). 0 on success, -1 when no port was free, -2
 * when there was no room.
 */
static __always_inline int snat_claim(void *pkt_ctx, const struct ct_key *flow, struct ct_entry *ct,
				      const struct datapath_config *cfg, __u64 now,
				      struct nat_key *key, const struct nat_entry *entry)
{
	struct snat_claim c = {
		.pkt_ctx = pkt_ctx,
		.cfg = cfg,
		.now = now,
		.key = key,
		.entry = entry,
		.backend_id = ct->backend_id,
		.range = snat_range(cfg),
		.result = -1,
	};
	int bucket;

	bucket = snat_bucket_assign(key, cfg->snat_buckets);
	if (bucket < 0)
		return -2;
	c.bucket = bucket;
	/* Backends sharing a bucket start their hands apart, so they do not
	 * chase each other through the same slots. */
	c.start = hash_3words(ct->backend_id, 0, 0, 0) % c.range;
	c.random = flow_hash(flow->saddr, flow->daddr, flow->sport, flow->dport, flow->proto,
			     cfg->hash_seed ^ 0x5a5a5a5a);
	bpf_loop(SNAT_BUCKET_ATTEMPTS + SNAT_BACKEND_ATTEMPTS + SNAT_RANDOM_ATTEMPTS, snat_claim_try,
		 &c, 0);
	if (c.result == 0) {
		struct snat_bucket_hand *hand = bpf_map_lookup_elem(&snat_bucket_hands, &c.bucket);

		/* The clock is coarse: written about once a tick. */
		if (hand && READ_ONCE(hand->last_claim_ns) != now)
			WRITE_ONCE(hand->last_claim_ns, now);
		ct->nat_port = key->dport;
	}
	return c.result;
}

#endif /* XDPLB_SNAT_H */
