/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat.h - address translation: header rewrites with incremental checksums,
 * SNAT port allocation, and the reverse-NAT half of a tracked flow.
 *
 * Every translated flow has two halves: the forward conntrack entry (client
 * tuple -> backend, NAT source) and a reverse entry (reply tuple -> client
 * and frontend). Each holds enough to rebuild the other. SNAT flows mostly
 * keep their reverse half in the slot of their SNAT port (struct
 * snat_slot), which lives exactly as long as the forward entry points at
 * it; flows without SNAT (DNAT to a local backend), and SNAT flows whose
 * port's slot another backend's flow holds, keep it in the nat LRU hash,
 * and the two halves check each other once a second, so an LRU eviction of
 * one is repaired instead of leaving the other dangling.
 */
#ifndef XDPLB_NAT_H
#define XDPLB_NAT_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"
#include "conntrack.h"
#include "maglev.h"

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
 *    whose ports would otherwise go to the nat map (with 1024, perf's
 *    ct-full ran 5% faster than with 256 and BenchmarkDatapath's new flows
 *    ~20% slower than with 64).
 * 3. SNAT_RANDOM_ATTEMPTS ports at random, taken only when no flow of the
 *    backend holds them (a free slot, or another backend's, with no entry
 *    of this backend's in the nat map).
 *
 * Whether a port's holder still lives takes a conntrack lookup, and every
 * lookup of a live entry marks it recently used, so the LRU keeps it. A
 * claim therefore looks up only the holders its bucket's hand offers (the
 * oldest, mostly gone) and the nat map entries of its backend's own hand.
 * When random tries looked up the backend's own holders, a backend that
 * once found its oldest flows alive (the LRU evicts only roughly in order)
 * probed its live flows at random, the LRU kept them, and that backend took
 * ever more of conntrack until its range ran out while others lost their
 * flows (5 backends over 4096 flows and 1000 ports each, 82% in use: one
 * backend with 65 flows, the others with all 1000, 5-40% of new flows
 * refused). Busy buckets whose hands probed on every claim did the same.
 */
#define SNAT_BUCKET_ATTEMPTS 16
#define SNAT_BUCKET_BUSY_SLOTS 2
#define SNAT_BUCKET_REST_CLAIMS 256
#define SNAT_ASSIGN_CANDIDATES 8
#define SNAT_BACKEND_ATTEMPTS 4
#define SNAT_RANDOM_ATTEMPTS 32

/* The reply tuple a backend sends for a forward entry. */
static __always_inline void nat_key_of(const struct ct_key *flow, const struct ct_entry *ct,
				       struct nat_key *key)
{
	if (ct->flags & CT_F_SNAT)
		nat_key_set(key, ct->backend_addr, ct->nat_addr, ct->backend_port, ct->nat_port,
			    flow->proto);
	else
		nat_key_set(key, ct->backend_addr, flow->saddr, ct->backend_port, flow->sport,
			    flow->proto);
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
	entry->reply_seq_known = 0;
	entry->reply_seq_mark = 0;
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
	ct_key_set(flow, entry->client_addr, entry->frontend_addr, entry->client_port,
		   entry->frontend_port, key->proto);
}

/*
 * The forward key and entry a reverse entry stands for, rebuilt when a
 * reply finds the forward half evicted. A confirmed flow is past its
 * handshake. An unconfirmed one has just been answered by its backend,
 * and stays unconfirmed (see ct_confirmed_by).
 */
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
	if (!(entry->flags & CT_F_UNCONFIRMED))
		ct->tcp_state = CT_TCP_SYN | CT_TCP_ESTABLISHED;
	else if (key->proto == IPPROTO_TCP)
		ct->tcp_state = CT_TCP_SYN | CT_TCP_REPLY;
	else
		ct->tcp_state = CT_TCP_REPLY;
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
 * while there are buckets to spare: backends hashed to one bucket
 * shared its hand, which then came round to slots whose flows still lived,
 * and the lookups of those holders kept the sharing backends' flows in the
 * LRU at the others' expense until their ranges ran out (with 16 backends
 * over 25 buckets, 78% of every range in use and conntrack full: 25% of new
 * flows refused, each 4-5x slower). The hash takes no seed: changing
 * --maglev-hash-seed must not move the slots of live flows.
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

/* Is the backend a reply comes from still the one its entry names? */
static __always_inline int reverse_backend_alive(const struct nat_key *key,
						 const struct nat_entry *rev)
{
	struct backend be;

	return backend_get(rev->backend_id, &be) && be.addr == key->saddr &&
	       be.port == key->sport;
}

/* How long an unconfirmed flow evicted from its table keeps its reply
 * tuple (its SNAT port) after its last reply or start: the window of a
 * SYN-ACK's first retransmission. Evicted unconfirmed flows are what a
 * flood of spoofed new flows leaves, and each would otherwise hold a port
 * for its whole timeout, so a few hundred spoofed SYNs a second would use
 * up a backend's ports; this way they hold at most rate x 2 s. */
#define CT_UNCONFIRMED_HOLD_NS (2 * NSEC_PER_SEC)

/*
 * Does a flow whose forward half was evicted go on? While its backend
 * exists, and within its timeout by its reverse half's date: its last
 * reply, or its client's last packets (nat_keep_dated). The timeout is
 * the one its forward half would have had (a confirmed TCP flow's is the
 * established one: it may be closing, but the agent's view of it is gone
 * with its forward half); an unconfirmed flow's at most
 * CT_UNCONFIRMED_HOLD_NS.
 * Losing a forward half therefore never frees a confirmed flow's reply
 * tuple (its SNAT port) before the flow could be over.
 */
static __always_inline int evicted_flow_alive(const struct nat_key *key,
					      const struct nat_entry *rev, __u64 now)
{
	const struct datapath_config *cfg = config_get();
	__u64 timeout;

	if (!reverse_backend_alive(key, rev))
		return 0;
	if (!cfg)
		return 1;
	if (key->proto != IPPROTO_TCP)
		timeout = cfg->udp_timeout_ns;
	else if (rev->flags & CT_F_UNCONFIRMED)
		timeout = cfg->tcp_transient_timeout_ns;
	else
		timeout = cfg->tcp_established_timeout_ns;
	if ((rev->flags & CT_F_UNCONFIRMED) && timeout > CT_UNCONFIRMED_HOLD_NS)
		timeout = CT_UNCONFIRMED_HOLD_NS;
	return time_since(READ_ONCE(rev->last_seen_ns), now) <= timeout;
}

/*
 * Is the flow holding reverse half `rev` of reply tuple `key` gone: its
 * forward entry expired or translating elsewhere now, or evicted and past
 * its timeout by the reverse half's own date (evicted_flow_alive)? snat
 * is CT_F_SNAT for a SNAT flow's tuple, 0 for one without SNAT. A flow
 * whose forward entry was evicted keeps its tuple: its backend may still
 * hold the connection, and a new flow on the same tuple would share it.
 * opening is set when the flow asking opens a TCP connection (a SYN): a
 * holder that is closed (ct_tcp_closed: reset, or a FIN each way) counts
 * as gone then, as for a SYN on a closed connection's own tuple
 * (ct_reused_tuple): to the backend the two are one connection, its
 * tuple reused. A half-closed holder is not: its backend may still send.
 */
static __always_inline int reverse_holder_gone(const struct nat_key *key,
					       const struct nat_entry *rev, __u8 snat,
					       int opening,
					       const struct datapath_config *cfg, __u64 now)
{
	struct ct_key owner;
	struct ct_entry *ct;

	ct_key_of_nat(key, rev, &owner);
	/* One lookup, in the table the reverse half names: a flow confirmed
	 * a moment ago, found in neither, is judged alive by its date. */
	if (rev->flags & CT_F_UNCONFIRMED)
		ct = bpf_map_lookup_elem(&ct_unconfirmed, &owner);
	else
		ct = bpf_map_lookup_elem(&conntrack, &owner);
	if (!ct)
		return !evicted_flow_alive(key, rev, now);
	return (ct->flags & CT_F_SNAT) != snat || !ct_answers_to(ct, key) ||
	       ct_expired(ct, owner.proto, cfg, now) ||
	       (opening && ct_tcp_closed(ct));
}

static __always_inline int snat_holder_gone(const struct nat_key *key, const struct nat_entry *rev,
					    const struct datapath_config *cfg, __u64 now)
{
	return reverse_holder_gone(key, rev, CT_F_SNAT, 0, cfg, now);
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

/* ---- the reverse half of a flow ---------------------------------------- */

/*
 * The reverse entry a reply tuple belongs to: the slot of its SNAT port if
 * that slot holds exactly this tuple, else the nat map's entry (flows
 * without SNAT, and SNAT flows whose port's slot another backend's flow
 * held), else, with unconfirmed (a constant), nat_unconfirmed's. The XDP
 * program does not look there: a reply it does not find goes on to the
 * TC program behind it, which does. NULL when there is none.
 */
static __always_inline struct nat_entry *reverse_lookup(const struct nat_key *key,
							const int unconfirmed)
{
	struct datapath_config *cfg = config_get();
	struct nat_entry *rev;

	if (cfg && snat_port_in_range(cfg, key->dport)) {
		struct snat_slot *slot = snat_slot_of(key, cfg);

		if (slot && snat_slot_holds(slot, key))
			return &slot->rev;
	}
	rev = bpf_map_lookup_elem(&nat, key);
	if (rev || !unconfirmed)
		return rev;
	return bpf_map_lookup_elem(&nat_unconfirmed, key);
}

/*
 * The reverse half of a reply to a SNAT port (key->dport one of them), as
 * XDP looks for it: in the port's slot, or in the nat map only where the
 * slot says a spill may be there. Other traffic to ports in the SNAT range
 * (a host service, an overlay tunnel's UDP port) then costs a slot lookup,
 * not a hash lookup too; the TC program behind XDP looks everywhere.
 */
static __always_inline struct nat_entry *snat_reply_lookup(const struct nat_key *key,
							   const struct datapath_config *cfg)
{
	struct snat_slot *slot = snat_slot_of(key, cfg);

	if (!slot)
		return NULL;
	if (snat_slot_holds(slot, key))
		return &slot->rev;
	if (!snat_slot_may_spill(slot, cfg))
		return NULL;
	return bpf_map_lookup_elem(&nat, key);
}

/* The reverse half of a SNAT flow's forward entry, if it is still that
 * flow's; NULL otherwise. */
static __always_inline struct nat_entry *reverse_of_flow(const struct ct_key *flow,
							 const struct ct_entry *ct)
{
	struct nat_entry *rev;
	struct nat_key key;

	nat_key_of(flow, ct, &key);
	rev = reverse_lookup(&key, 0);
	return rev && nat_entry_matches(rev, flow) ? rev : NULL;
}

/* The map of flows without SNAT that holds a reverse half with these
 * flags (see nat_unconfirmed). */
static __always_inline void *dnat_table(__u8 flags)
{
	return (flags & CT_F_UNCONFIRMED) ? (void *)&nat_unconfirmed : (void *)&nat;
}

/* Confirm a reverse half (reply tuple key), once its flow is (see
 * ct_unconfirmed): in place in a SNAT slot or a spill; a flow without
 * SNAT's is copied from nat_unconfirmed to nat, where lookups find it
 * first. The copy left in nat_unconfirmed is marked confirmed too (its
 * holder is judged by its flow in conntrack) and stays until the flow
 * ends (nat_release) or it is evicted: a reply being translated on
 * another CPU may still read it, and a deleted LRU entry may be reused at
 * once. */
static __always_inline void nat_confirm_entry(const struct nat_key *key, struct nat_entry *rev)
{
	struct nat_entry confirmed;

	if (!(rev->flags & CT_F_UNCONFIRMED))
		return;
	if (!(rev->flags & CT_F_SNAT)) {
		confirmed = *rev;
		confirmed.flags &= ~CT_F_UNCONFIRMED;
		bpf_map_update_elem(&nat, key, &confirmed, BPF_ANY);
		/* The copy left behind stops following the backend's
		 * sequence: should it be found again, it learns it anew. */
		rev->reply_seq_known = 0;
	}
	rev->flags &= ~CT_F_UNCONFIRMED;
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

/* Does another live flow than `flow` hold reply tuple `key` in the nat
 * map (found: its entry there)? A closed TCP connection gives it up to a
 * SYN (opening; see reverse_holder_gone). */
static __always_inline int reply_tuple_taken(const struct ct_key *flow, const struct nat_key *key,
					     const struct nat_entry *found, int opening,
					     const struct datapath_config *cfg, __u64 now)
{
	return found && !nat_entry_matches(found, flow) &&
	       !reverse_holder_gone(key, found, found->flags & CT_F_SNAT, opening, cfg, now);
}

/*
 * Put the reverse half of a flow without SNAT (reply tuple backend -> the
 * client's own address and port) into the nat map, unless another live
 * flow holds the tuple: the same client address and port sent to two
 * frontends with the same backend, which would then see one connection
 * where there are two. Whoever holds the tuple keeps it, unless it is a
 * closed TCP connection and this flow opens one (opening: a client
 * reusing its port for another frontend after a connection to the same
 * backend closed); the other flow is refused (netfilter's conntrack would
 * remap its source port). Returns 0, -2 when there was no room, -3 when
 * the tuple is taken. Where there is no entry, an insert another CPU
 * makes first for the same tuple is not overwritten; two CPUs replacing a
 * dead (or closed) holder's entry at once both succeed, the later write
 * holding the tuple (the other flow ends at its first check, NAT_TAKEN).
 */
static __always_inline int dnat_put(const struct ct_key *flow, const struct nat_key *key,
				    const struct nat_entry *entry, int opening,
				    const struct datapath_config *cfg, __u64 now)
{
	void *table = dnat_table(entry->flags);
	struct nat_entry *found;
	long err;

	/* A confirmed flow's tuple is in nat, an unconfirmed one's in
	 * nat_unconfirmed: an unconfirmed flow takes the tuple if neither
	 * holds it for another live flow, a confirmed one (its reverse half
	 * repaired) if no other confirmed flow holds it. */
	found = bpf_map_lookup_elem(&nat, key);
	if (reply_tuple_taken(flow, key, found, opening, cfg, now))
		return -3;
	if (entry->flags & CT_F_UNCONFIRMED) {
		/* What nat holds is over (or this flow's own, stale): it would
		 * answer the new flow's replies first (reverse_lookup). */
		if (found)
			bpf_map_delete_elem(&nat, key);
		found = bpf_map_lookup_elem(&nat_unconfirmed, key);
		if (reply_tuple_taken(flow, key, found, opening, cfg, now))
			return -3;
	}
	err = bpf_map_update_elem(table, key, entry, found ? BPF_ANY : BPF_NOEXIST);
	if (err == -17 /* EEXIST */) {
		/* Another CPU was first: with this flow's own packet (a
		 * retransmission), or another flow's. */
		found = bpf_map_lookup_elem(table, key);
		return found && nat_entry_matches(found, flow) ? 0 : -3;
	}
	return err ? -2 : 0;
}

/*
 * Claim the reverse half for a new flow. Without SNAT the reply tuple is
 * fixed and gets a nat map entry; with SNAT a port is claimed as the
 * comment on SNAT_BUCKET_ATTEMPTS says.
 * Returns 0 on success, -1 when no port was free, -2 when there was no
 * room, -3 when another live flow holds the reply tuple (no SNAT).
 * opening: the flow's packet is a SYN (see dnat_put).
 */
static __always_inline int nat_claim(void *pkt_ctx, const struct ct_key *flow, struct ct_entry *ct,
				     int opening,
				     const struct datapath_config *cfg, __u64 now)
{
	struct nat_key key;
	struct nat_entry entry;

	nat_entry_of(flow, ct, &entry);
	nat_key_of(flow, ct, &key);
	if (!(ct->flags & CT_F_SNAT))
		return dnat_put(flow, &key, &entry, opening, cfg, now);
	if (cfg->snat_port_max < cfg->snat_port_min)
		return -1;
	return snat_claim(pkt_ctx, flow, ct, cfg, now, &key, &entry);
}

/* Forget the reverse half of a forward entry, if it is still ours. */
static __always_inline void nat_release(const struct ct_key *flow, const struct ct_entry *ct)
{
	struct datapath_config *cfg = config_get();
	struct nat_entry *entry;
	struct nat_key key;
	void *table;

	nat_key_of(flow, ct, &key);
	if (cfg && (ct->flags & CT_F_SNAT) && snat_port_in_range(cfg, key.dport)) {
		snat_release(&key, flow, cfg);
		return;
	}
	/* A SNAT flow's port out of the range is a spill in nat. */
	table = (ct->flags & CT_F_SNAT) ? (void *)&nat : dnat_table(ct->flags);
	entry = bpf_map_lookup_elem(table, &key);
	if (entry && nat_entry_matches(entry, flow))
		bpf_map_delete_elem(table, &key);
	/* A confirmed flow's reverse half may have left its unconfirmed
	 * copy (nat_confirm_entry); no other live flow holds the tuple there
	 * while this one held it in nat (dnat_put). */
	if (!(ct->flags & CT_F_UNCONFIRMED))
		bpf_map_delete_elem(&nat_unconfirmed, &key);
}

/* A reply found its reverse half in the nat map: if that is a spill, make
 * sure its slot is marked (replies alone keep a flow's forward entry
 * fresh, so its own check may not come for a long time). */
static __always_inline void nat_mark_spill(const struct nat_key *key, const struct nat_entry *rev)
{
	struct datapath_config *cfg = config_get();
	struct snat_slot *slot;

	/* Once the marks are trusted, every spill was marked when made. */
	if (!cfg || cfg->snat_spills_marked || !(rev->flags & CT_F_SNAT) ||
	    !snat_port_in_range(cfg, key->dport))
		return;
	slot = snat_slot_of(key, cfg);
	if (slot && !snat_slot_holds(slot, key))
		snat_slot_mark(slot);
}

/* Forget a reverse entry that turned out stale (its forward half moved on). */
static __always_inline void nat_forget(const struct nat_key *key, const struct nat_entry *rev)
{
	struct datapath_config *cfg = config_get();
	struct ct_key flow;

	if (cfg && (rev->flags & CT_F_SNAT) && snat_port_in_range(cfg, key->dport)) {
		ct_key_of_nat(key, rev, &flow);
		snat_release(key, &flow, cfg);
		return;
	}
	bpf_map_delete_elem(&nat, key);
	/* A flow without SNAT: its copy in nat_unconfirmed too, which may be
	 * the one found (see nat_confirm_entry). */
	if (!(rev->flags & CT_F_SNAT))
		bpf_map_delete_elem(&nat_unconfirmed, key);
}

enum nat_check {
	NAT_OK = 0,
	NAT_REPAIRED,   /* reverse half was missing and is back */
	NAT_PORT_MOVED, /* lost to another flow; a new SNAT port was claimed */
	NAT_FAILED,     /* could not be restored */
	NAT_TAKEN,      /* no SNAT, and another live flow holds the reply tuple */
};

/* Take back a missing SNAT reverse half, with its slot locked. */
static __always_inline enum nat_check snat_restore_locked(struct snat_slot *slot,
							  const struct ct_key *flow,
							  const struct nat_key *key,
							  const struct nat_entry *entry)
{
	struct nat_entry *found;

	if (snat_slot_holds(slot, key)) {
		if (nat_entry_matches(&slot->rev, flow))
			return NAT_OK;
		/* A spill of this flow that the slot shadows serves nothing. */
		found = bpf_map_lookup_elem(&nat, key);
		if (found && nat_entry_matches(found, flow))
			bpf_map_delete_elem(&nat, key);
		return NAT_PORT_MOVED;
	}
	found = bpf_map_lookup_elem(&nat, key);
	if (found)
		return nat_entry_matches(found, flow) ? NAT_OK : NAT_PORT_MOVED;
	if (!slot->key.proto) {
		snat_slot_write(slot, key, entry);
		return NAT_REPAIRED;
	}
	return snat_spill(slot, key, entry, BPF_NOEXIST) == 0 ? NAT_REPAIRED : NAT_FAILED;
}

/*
 * Date a live flow's reverse half from the client's side too, once it is
 * older than half the UDP timeout: replies date it once a second, but a
 * flow whose replies are rarer than its timeout (a one-way stream) would
 * look idle by it once its forward half is evicted, and its next reply
 * would end it (evicted_flow_alive). Seldom enough that replies keep their
 * own once-a-second checks.
 */
static __always_inline void nat_keep_dated(struct nat_entry *rev, const struct datapath_config *cfg,
					   __u64 now)
{
	if (time_since(READ_ONCE(rev->last_seen_ns), now) > cfg->udp_timeout_ns / 2)
		WRITE_ONCE(rev->last_seen_ns, now);
}

/*
 * Check a SNAT flow's port (in the configured range): NAT_OK while its
 * reverse half is there, NAT_REPAIRED when it was missing and is back,
 * NAT_PORT_MOVED when the port belongs to another flow now.
 */
static __always_inline enum nat_check snat_check_port(const struct ct_key *flow,
						      const struct nat_key *key,
						      const struct nat_entry *entry,
						      const struct datapath_config *cfg, __u64 now)
{
	struct snat_slot *slot = snat_slot_for(key, cfg);
	struct nat_entry *found;
	enum nat_check check;
	__u32 generation;

	if (!slot)
		return NAT_FAILED;
	/* Replies find the slot before the nat map: a spill of a tuple its
	 * slot holds for another flow gets none, and the port has moved. */
	if (snat_slot_holds(slot, key)) {
		if (nat_entry_matches(&slot->rev, flow)) {
			nat_keep_dated(&slot->rev, cfg, now);
			return NAT_OK;
		}
	} else {
		found = bpf_map_lookup_elem(&nat, key);
		if (found && nat_entry_matches(found, flow)) {
			snat_slot_mark(slot);
			nat_keep_dated(found, cfg, now);
			return NAT_OK;
		}
	}
	/* Missing (released, or evicted from the nat map), or the port now
	 * belongs to another flow: look again with the port's slot locked (a
	 * CPU claiming the port holds it: the next check, a second later,
	 * finds how that ended). */
	if (!snat_slot_lock(slot, &generation))
		return NAT_OK;
	check = snat_restore_locked(slot, flow, key, entry);
	snat_slot_unlock(slot, generation);
	return check;
}

/*
 * nat_ensure for a flow without SNAT. Its reply tuple is fixed: this
 * flow's, unless another flow took it while this one's reverse half was
 * gone (evicted), or took it over from this one, closed, with a SYN. That
 * flow keeps it (see dnat_put): NAT_TAKEN.
 */
static __always_inline enum nat_check dnat_ensure(const struct ct_key *flow,
						  const struct ct_entry *ct,
						  const struct datapath_config *cfg, __u64 now)
{
	struct nat_entry *found, entry;
	struct nat_key key;

	nat_key_of(flow, ct, &key);
	found = bpf_map_lookup_elem(dnat_table(ct->flags), &key);
	if (found && nat_entry_matches(found, flow)) {
		nat_keep_dated(found, cfg, now);
		return NAT_OK;
	}
	nat_entry_of(flow, ct, &entry);
	switch (dnat_put(flow, &key, &entry, 0, cfg, now)) {
	case 0:
		return NAT_REPAIRED;
	case -3:
		return NAT_TAKEN;
	default:
		return NAT_FAILED;
	}
}

/* Make sure a live forward entry still has its reverse half (dating it:
 * nat_keep_dated). */
static __always_inline enum nat_check nat_ensure(void *pkt_ctx, const struct ct_key *flow,
						 struct ct_entry *ct,
						 const struct datapath_config *cfg, __u64 now)
{
	struct nat_entry entry;
	enum nat_check check;
	struct nat_key key;

	if (!(ct->flags & CT_F_SNAT))
		return dnat_ensure(flow, ct, cfg, now);
	nat_key_of(flow, ct, &key);
	nat_entry_of(flow, ct, &entry);

	/* A port outside the range is one of an earlier range (a restart
	 * with another --snat-port-range): the flow moves, as it does when
	 * another flow holds its port now. */
	check = snat_port_in_range(cfg, key.dport) ? snat_check_port(flow, &key, &entry, cfg, now)
						   : NAT_PORT_MOVED;
	if (check != NAT_PORT_MOVED)
		return check;
	return nat_claim(pkt_ctx, flow, ct, 0, cfg, now) == 0 ? NAT_PORT_MOVED : NAT_FAILED;
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
