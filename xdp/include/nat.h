/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * nat.h - address translation: header rewrites with incremental checksums,
 * SNAT port allocation, and the reverse-NAT half of a tracked flow.
 *
 * Every translated flow has two entries: the forward conntrack entry (client
 * tuple -> backend, NAT source) and a reverse entry (reply tuple -> client and
 * frontend). Each holds enough to rebuild the other, and every packet in
 * either direction checks its partner, so an LRU eviction of one half is
 * repaired on the next packet instead of leaving the other dangling.
 */
#ifndef XDPLB_NAT_H
#define XDPLB_NAT_H

#include "maps.h"
#include "parse.h"
#include "csum.h"
#include "hash.h"

/*
 * Attempts to find a free SNAT port before giving up (counted drop). Ports
 * are taken at random, so with a fraction f of a backend's range in use a
 * new flow fails with probability f^32: 0.03% at 78% (16 tries: 1.9%).
 */
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

/* The forward key and entry a reverse entry stands for. */
static __always_inline void ct_of_nat(const struct nat_key *key, const struct nat_entry *entry,
				      __u64 now, struct ct_key *flow, struct ct_entry *ct)
{
	flow->saddr = entry->client_addr;
	flow->daddr = entry->frontend_addr;
	flow->sport = entry->client_port;
	flow->dport = entry->frontend_port;
	flow->proto = key->proto;
	flow->pad[0] = flow->pad[1] = flow->pad[2] = 0;

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

/*
 * Claim a reverse entry for a new flow. Without SNAT the reply tuple is
 * fixed. With SNAT, ports from the configured range are tried in a
 * tuple-dependent order; a port is ours once the NOEXIST insert succeeds.
 * Returns 0 on success, -1 when no port (or no room) was found.
 */
static __always_inline int nat_claim(const struct ct_key *flow, struct ct_entry *ct,
				     const struct datapath_config *cfg)
{
	struct nat_key key;
	struct nat_entry entry;
	__u32 range, base;
	long err;

	nat_entry_of(flow, ct, &entry);
	if (!(ct->flags & CT_F_SNAT)) {
		nat_key_of(flow, ct, &key);
		return bpf_map_update_elem(&nat, &key, &entry, BPF_ANY) ? -2 : 0;
	}

	if (cfg->snat_port_max < cfg->snat_port_min)
		return -1;
	range = (__u32)cfg->snat_port_max - cfg->snat_port_min + 1;
	base = flow_hash(flow->saddr, flow->daddr, flow->sport, flow->dport, flow->proto,
			 cfg->hash_seed ^ 0x5a5a5a5a);
	for (__u32 i = 0; i < SNAT_PORT_ATTEMPTS; i++) {
		/* Probe independent pseudo-random ports: a fixed stride
		 * would cluster like linear probing and fail early. */
		__u32 port = cfg->snat_port_min + hash_3words(base, i, 0, 0) % range;

		ct->nat_port = bpf_htons((__u16)port);
		nat_key_of(flow, ct, &key);
		/* The first port is usually free: insert straight away. After
		 * a collision, look before inserting: a failed LRU insert may
		 * evict a live entry to make room it then does not use. */
		if (i > 0 && bpf_map_lookup_elem(&nat, &key))
			continue;
		err = bpf_map_update_elem(&nat, &key, &entry, BPF_NOEXIST);
		if (err == 0)
			return 0;
		if (err != -17 /* EEXIST */)
			return -2;
	}
	return -1;
}

/* Forget the reverse entry of a forward entry, if it is still ours. */
static __always_inline void nat_release(const struct ct_key *flow, const struct ct_entry *ct)
{
	struct nat_key key;
	struct nat_entry *entry;

	nat_key_of(flow, ct, &key);
	entry = bpf_map_lookup_elem(&nat, &key);
	if (entry && nat_entry_matches(entry, flow))
		bpf_map_delete_elem(&nat, &key);
}

enum nat_check {
	NAT_OK = 0,
	NAT_REPAIRED,   /* reverse entry was missing and is back */
	NAT_PORT_MOVED, /* lost to another flow; a new SNAT port was claimed */
	NAT_FAILED,     /* could not be restored */
};

/* Make sure a live forward entry still has its reverse entry. */
static __always_inline enum nat_check nat_ensure(const struct ct_key *flow, struct ct_entry *ct,
						 const struct datapath_config *cfg)
{
	struct nat_key key;
	struct nat_entry *found, entry;

	nat_key_of(flow, ct, &key);
	found = bpf_map_lookup_elem(&nat, &key);
	if (found && nat_entry_matches(found, flow))
		return NAT_OK;
	if (!found || !(ct->flags & CT_F_SNAT)) {
		nat_entry_of(flow, ct, &entry);
		if (bpf_map_update_elem(&nat, &key, &entry, found ? BPF_ANY : BPF_NOEXIST) == 0)
			return NAT_REPAIRED;
		if (!(ct->flags & CT_F_SNAT))
			return NAT_FAILED;
	}
	/* The SNAT port now belongs to another flow. */
	return nat_claim(flow, ct, cfg) == 0 ? NAT_PORT_MOVED : NAT_FAILED;
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
