/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat.h - the reverse-NAT half of a tracked flow: finding it for a reply,
 * claiming it for a new flow (snat.h for SNAT ports), confirming,
 * releasing and checking it.
 *
 * Every translated flow has two halves (halves.h): the forward conntrack
 * entry (client tuple -> backend, NAT source) and a reverse entry (reply
 * tuple -> client and frontend). Each holds enough to rebuild the other.
 * SNAT flows mostly keep their reverse half in the slot of their SNAT port
 * (struct snat_slot), which lives exactly as long as the forward entry
 * points at it; flows without SNAT (DNAT to a local backend), and SNAT
 * flows whose port's slot another backend's flow holds, keep it in the nat
 * LRU hash, and the two halves check each other once a second, so an LRU
 * eviction of one is repaired instead of leaving the other dangling.
 */
#ifndef XDPLB_NAT_H
#define XDPLB_NAT_H

#include "halves.h"
#include "snat.h"
#include "rewrite.h"

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

#endif /* XDPLB_NAT_H */
