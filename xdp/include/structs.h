/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * structs.h - the datapath's schema: the structs and enums that are the
 * maps' keys and values (maps.h), shared with Go through bpf2go (-type),
 * which never copies them by hand (xdp/schema.go names them there).
 *
 * All addresses and ports are stored in network byte order, exactly as they
 * appear on the wire, so the datapath never converts them.
 */
#ifndef XDPLB_STRUCTS_H
#define XDPLB_STRUCTS_H

#include "common.h"

/* ---- configuration ---------------------------------------------------- */

/* Datapath settings written by the loader (one entry, index 0). */
struct datapath_config {
	__u64 tcp_established_timeout_ns; /* idle timeout of an established TCP flow */
	__u64 tcp_transient_timeout_ns;   /* idle timeout while opening or closing */
	__u64 udp_timeout_ns;             /* idle timeout of a UDP flow */
	__u32 hash_seed;                  /* flow hash seed, the same on every node */
	/* SNAT source ports, host byte order, inclusive: a first range, and
	 * a second one (snat_port2_*, at the end); their ports are numbered
	 * one after the other (see snat_port_offset in snat.h). */
	__u16 snat_port_min;
	__u16 snat_port_max;
	/* Source address of hairpin flows (a pod reaching itself through a
	 * service): replies to it come back through the pod's interface. */
	__be32 hairpin_addr;
	__u32 snat_buckets; /* SNAT port ranges in snat_slots (see snat_slot) */
	/* The node's network namespace: the socket programs, attached to a
	 * cgroup shared by every namespace, act only on sockets of this one. */
	__u64 netns_cookie;
	/* Non-zero once the agent found that every reply tuple the nat map
	 * holds for a SNAT slot is marked there (SNAT_SLOT_SPILLED); until
	 * then claims look every port up in the nat map. */
	__u32 snat_spills_marked;
	/* ICMP port unreachables the datapath builds are spaced at least
	 * this far apart per CPU, after a burst of ICMP_ERROR_BURST; 0: no
	 * limit. See icmp_limit.h. */
	__u32 icmp_interval_ns;
	/* When the XDP program answers SYNs to an external frontend with
	 * SYN cookies (enum syn_cookie_mode; see synproxy.h), and, in
	 * SYN_COOKIES_AUTO, from how many handshakes a service port left
	 * incomplete within a second. */
	__u32 syn_cookies;
	__u32 syn_flood_threshold;
	/* The second range of SNAT ports: snat_port2_len ports from
	 * snat_port2_min (0: none). */
	__u16 snat_port2_min;
	__u16 snat_port2_len;
	/* SNAT ports below this are looked up among the host's sockets
	 * before a flow takes one (snat_host_socket): the host's servers
	 * listen there; above it lie ip_local_port_range and beyond. */
	__u16 snat_socket_check_below;
	__u16 pad;
};

enum syn_cookie_mode {
	SYN_COOKIES_OFF = 0,    /* never */
	SYN_COOKIES_AUTO = 1,   /* while a service port is flooded (syn_flood_threshold) */
	SYN_COOKIES_ALWAYS = 2, /* every SYN to an external frontend with remote backends */
};

/* How many more SNAT source addresses an interface may have (the agent's
 * --snat-extra-addresses); a power of two, for the index mask. */
#define IFACE_EXTRA_ADDRS 8

/* Per-interface facts: the address used as SNAT source for packets that
 * leave through this interface, and more of its addresses for that
 * (extra_count of extra_addrs), each with SNAT ports of its own. */
struct iface {
	__be32 addr;
	__u32 flags;
	__be32 extra_addrs[IFACE_EXTRA_ADDRS];
	__u32 extra_count;
};

/* ---- services ---------------------------------------------------------- */

/* A frontend: one address, port and protocol that reaches a service port. */
struct frontend_key {
	__be32 addr;
	__be16 port;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 pad;
};

enum frontend_flags {
	/* NodePort, LoadBalancer ingress or externalIP: handled in XDP on the
	 * NIC. Frontends without it (ClusterIP) are for the TC programs. */
	FE_EXTERNAL = 1 << 0,
	/* SNAT to the node address when the chosen backend is on another node
	 * (traffic policy Cluster). */
	FE_SNAT_REMOTE = 1 << 1,
	/* Check the client address against source_ranges first. */
	FE_SOURCE_RANGES = 1 << 2,
	/* With no usable backend, drop silently (policy Local with endpoints
	 * only on other nodes) instead of refusing the client. */
	FE_DROP_IF_EMPTY = 1 << 3,
	/* The same for traffic from this node (internalTrafficPolicy Local). */
	FE_INTERNAL_DROP_IF_EMPTY = 1 << 4,
	/* table_id is the node-local set (a traffic policy Local that
	 * applies to traffic from outside: externalTrafficPolicy for
	 * external frontends, internalTrafficPolicy for a ClusterIP). */
	FE_LOCAL_SET = 1 << 5,
	/* internal_table_id is the node-local set (a ClusterIP with
	 * internalTrafficPolicy Local). */
	FE_INTERNAL_LOCAL_SET = 1 << 6,
};

struct frontend {
	__u32 svc_id;   /* service port id: counters, affinity, source ranges */
	/* Maglev tables (keys into maglev_tables; 0: no usable backend) for
	 * traffic from outside the node, which follows externalTrafficPolicy,
	 * and for traffic from this node's pods and host, which uses the
	 * cluster-wide set (ClusterIPs: internalTrafficPolicy). */
	__u32 table_id;
	__u32 internal_table_id;
	__u32 affinity_timeout; /* ClientIP affinity timeout in seconds, 0: none */
	__u16 flags;            /* enum frontend_flags */
	__u16 pad;
};

enum backend_flags {
	BE_LOCAL = 1 << 0,       /* runs on this node */
	BE_TERMINATING = 1 << 1, /* keeps its flows, takes no new ones */
	/* At an address of this node (a hostNetwork pod here): its packets
	 * are delivered to the node's stack, whose replies the host_reply
	 * program translates on their way out. Always with BE_LOCAL. */
	BE_HOST = 1 << 2,
};

/* A backend: index into the backends array. An all-zero entry is unused. */
struct backend {
	__be32 addr;
	__be16 port;
	__u8 flags; /* enum backend_flags */
	__u8 pad;
};

/* loadBalancerSourceRanges: prefixlen counts the 32 bits of svc_id plus the
 * prefix length of the allowed client range. */
struct source_range_key {
	__u32 prefixlen;
	__be32 svc_id; /* network byte order so the trie matches it bit by bit */
	__be32 addr;
};

/* ---- flows ------------------------------------------------------------- */

/* The client-side 5-tuple, as the client sent it (client -> frontend). */
struct ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

enum ct_tcp_state {
	CT_TCP_SYN = 1 << 0,         /* client SYN seen */
	CT_TCP_ESTABLISHED = 1 << 1, /* client ACK without SYN seen */
	CT_TCP_FIN = 1 << 2,         /* client FIN seen (a FIN either way, before the reply bit) */
	CT_TCP_RST = 1 << 3,         /* RST seen in either direction */
	CT_TCP_REPLY_FIN = 1 << 4,   /* backend FIN seen */
	CT_TCP_REPLY = 1 << 5,       /* unconfirmed, backend answered (its SYN-ACK); UDP flows too */
	CT_TCP_SEQ_KNOWN = 1 << 6,   /* seq_mark holds the client's sequence (see seq_in_window) */
};

enum ct_flags {
	CT_F_SNAT = 1 << 0,     /* source rewritten to nat_addr:nat_port */
	CT_F_EXTERNAL = 1 << 1, /* created by the XDP program for an external frontend */
	CT_F_AFFINITY = 1 << 2, /* the service port has ClientIP affinity */
	CT_F_HOST = 1 << 3,     /* the backend is this node (BE_HOST) */
	CT_F_ENDED = 1 << 4,    /* ended by the agent, which also dates it past every timeout */
	/* Not confirmed yet: in ct_unconfirmed, not conntrack (see there).
	 * Its reverse half carries the flag too until the flow is confirmed. */
	CT_F_UNCONFIRMED = 1 << 5,
	/* Opened by the SYN proxy (synproxy.h): its backend's sequence
	 * numbers differ from those its client knows by the offset kept in
	 * synproxy_flows. */
	CT_F_SYNPROXY = 1 << 6,
};

/* A cached FIB result: where to send the packets of a flow. Valid while
 * the entry holding it was refreshed less than a second ago, so route and
 * neighbour changes take effect within a second without an event feed. */
struct next_hop {
	__u32 ifindex; /* 0: nothing cached */
	__u8 dmac[6];
	__u8 smac[6];
};

/* Conntrack-lite: what a tracked flow is translated to. */
struct ct_entry {
	__u64 created_ns;   /* CLOCK_MONOTONIC_COARSE (bpf_ktime_get_coarse_ns) */
	__u64 last_seen_ns; /* refreshed at most once a second */
	struct next_hop hop; /* toward the backend */
	__u32 backend_id;
	__u32 svc_id;
	__be32 backend_addr; /* copy of the backend, to detect a removed backend */
	__be32 nat_addr;     /* SNAT source, 0 without SNAT */
	__be16 backend_port;
	__be16 nat_port;
	__u8 tcp_state; /* enum ct_tcp_state */
	__u8 flags;     /* enum ct_flags */
	/* The top 16 bits of the highest sequence number the client sent,
	 * once CT_TCP_SEQ_KNOWN (see seq_in_window in conntrack.h). */
	__u16 seq_mark;
};

/* The reply-side 5-tuple, as the backend sends it
 * (backend -> nat address, or backend -> client without SNAT). */
struct nat_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

/* Reverse NAT: what a reply is translated back to. Together with the
 * nat_key it holds everything needed to rebuild the forward entry, so the
 * two halves of a flow repair each other after an LRU eviction. */
struct nat_entry {
	__u64 last_seen_ns;  /* refreshed at most once a second, by replies */
	struct next_hop hop; /* toward the client */
	__be32 client_addr;
	__be32 frontend_addr;
	__be16 client_port;
	__be16 frontend_port;
	__u32 backend_id;
	__u32 svc_id;
	__u8 flags; /* enum ct_flags of the forward entry */
	/* The top 16 bits of the highest sequence number the backend sent,
	 * once reply_seq_known (see seq_in_window in conntrack.h). */
	__u8 reply_seq_known;
	__u16 reply_seq_mark;
};

/*
 * The reverse half of a SNAT flow, kept in the slot of its SNAT port rather
 * than in an LRU hash: a new SNAT flow then costs one LRU insert (its
 * conntrack entry), not two, and a reply finds its flow without hashing a
 * 5-tuple. snat_slots holds snat_buckets copies of the SNAT port range; the
 * reply tuples of one (backend, node address, protocol) use the copy
 * snat_bucket_hints gives that triple, which other triples share when
 * there are more of them than copies. A port whose slot holds another
 * backend's reply tuple can still be
 * this backend's: its reverse half then goes to the nat map (see
 * snat_try_port).
 *
 * A slot is the reverse half only while its forward conntrack entry exists
 * and points back at it: evicting the forward entry frees the slot (the
 * next claim that reaches it takes it), and a slot is never evicted alone.
 * key.proto == 0 marks a free slot. The top bit of generation locks the
 * slot's port while a program claims or releases it (compare-and-swap), so
 * two CPUs never claim one reply tuple; the other bits count lockings.
 *
 * A reply tuple kept in the nat map although it has a slot (its slot held
 * another backend's tuple) is a spill. Spills happen only where backends
 * share a bucket. Each one marks its slot first (SNAT_SLOT_SPILLED, under
 * the lock; the datapath never clears it), so a claim of a port whose slot
 * has no mark need not look for a spill of it in the nat map, once the
 * agent trusts the marks (datapath_config.snat_spills_marked).
 */
struct snat_slot {
	struct nat_entry rev;
	struct nat_key key; /* the reply tuple this slot answers */
	__u32 generation;
	__u32 flags; /* enum snat_slot_flags */
};

enum snat_slot_flags {
	/* The nat map may hold a reply tuple whose slot this is. */
	SNAT_SLOT_SPILLED = 1 << 0,
};

/* ClientIP session affinity. */
struct affinity_key {
	__u32 svc_id;
	__be32 client_addr;
};

struct affinity_entry {
	__u64 last_seen_ns;
	__u32 backend_id;
	__be32 backend_addr;
	__be16 backend_port;
	__u16 pad[3];
};

/* The sequence state of a flow opened by the SYN proxy (synproxy.h), kept
 * by its client tuple. Host byte order. */
struct synproxy_seq {
	__u32 cookie;     /* the proxy's ISN toward the client: its SYN cookie */
	__u32 client_isn; /* the client's ISN, sent on in the proxy's SYN */
	__u32 seq_offset; /* backend ISN - cookie, once the backend answered */
	__u16 mss;        /* the MSS the cookie carries, sent on in the SYN */
	__u8 answered;    /* the backend's SYN-ACK came: seq_offset is set */
	__u8 pad;
};

/* Handshakes of one service port at its external frontends in the
 * current second (opened: SYNs that started a flow or got a cookie;
 * completed: flows their client confirmed, cookies that checked out),
 * and how many the previous second left incomplete: see syn_flood_due. */
struct syn_flood {
	__u64 window_ns;
	__u32 opened;
	__u32 completed;
	__u32 incomplete_before;
	__u32 pad;
};

/* ---- counters ---------------------------------------------------------- */

/* Every verdict the datapath reaches has a reason; each is counted. Every
 * packet ends in exactly one STAT_PASS_*, STAT_TX, STAT_REDIRECT,
 * STAT_REJECT_*, STAT_RST_* or STAT_DROP_* counter; the others count events
 * on the way (a new flow, a repair). New reasons go at the end: the loader
 * copies pinned counters by index into a larger array. */
enum stat {
	STAT_PASS_NOT_IPV4 = 0,   /* not IPv4: to the stack untouched */
	STAT_PASS_NOT_SERVICE,    /* no frontend, no NAT state: untouched */
	STAT_PASS_IP_OPTIONS,     /* IPv4 with options: untouched */
	STAT_PASS_FRAGMENT,       /* IPv4 fragment: untouched */
	STAT_PASS_MALFORMED,      /* truncated or invalid headers: untouched */
	STAT_PASS_INTERNAL,       /* ClusterIP frontend seen on the NIC: untouched */
	STAT_PASS_ICMP,           /* ICMP not about a tracked flow: untouched */
	STAT_PASS_NO_NEIGH,       /* translated, next hop unresolved: stack/TC finishes */
	STAT_PASS_TO_STACK,       /* translated, egress is not an XDP target: stack forwards */
	STAT_PASS_FRAG_NEEDED,    /* translated, too big for egress MTU, DF clear: stack fragments */
	STAT_TX,                  /* XDP_TX */
	STAT_REDIRECT,            /* XDP_REDIRECT */
	STAT_NEW_FLOW,            /* conntrack entry created */
	STAT_REVERSE_NAT,         /* reply translated back to the client */
	STAT_ICMP_TRANSLATED,     /* ICMP error about a tracked flow translated */
	STAT_REJECT_TCP,          /* no usable backend: TCP RST sent */
	STAT_REJECT_ICMP,         /* no usable backend: ICMP port unreachable sent */
	STAT_RST_BACKEND_GONE,    /* tracked TCP flow lost its backend: RST sent */
	STAT_RESELECT_BACKEND_GONE, /* tracked flow lost its backend: new backend chosen */
	STAT_CT_EXPIRED,          /* expired or closed conntrack entry replaced */
	STAT_CT_REPAIRED,         /* forward entry rebuilt from its reverse entry */
	STAT_NAT_REPAIRED,        /* reverse entry rebuilt from its forward entry */
	STAT_NAT_PORT_MOVED,      /* reverse entry lost to another flow: new SNAT port */
	STAT_DROP_SOURCE_RANGE,   /* client outside loadBalancerSourceRanges */
	STAT_DROP_NO_LOCAL_BACKEND, /* policy Local and no backend on this node */
	STAT_DROP_NAT_EXHAUSTED,  /* no free SNAT port for this backend */
	STAT_DROP_CT_FULL,        /* conntrack or NAT insert failed */
	STAT_DROP_STALE_NAT,      /* reply whose flow was replaced */
	STAT_DROP_NO_ROUTE,       /* no route to the backend or client */
	STAT_DROP_NO_NODE_ADDR,   /* SNAT needed but the egress device has no address */
	STAT_DROP_FWD_DISABLED,   /* IP forwarding disabled on the ingress device */
	STAT_DROP_TTL,            /* TTL would expire in transit */
	STAT_DROP_BAD_TABLE,      /* Maglev table missing or malformed */
	STAT_DROP_ADJUST,         /* could not resize the packet for a reply */
	STAT_TC_NEIGH_REDIRECT,   /* TC finished an XDP translation with neighbour resolution */
	STAT_TC_REDIRECT,         /* TC translated a packet and sent it on */
	STAT_TC_FRAGMENT,         /* TC translated a later fragment like its first */
	STAT_SOCK_CONNECT,        /* a host socket's connect/sendmsg went to a backend */
	STAT_SOCK_REFUSED,        /* a host socket's connect/sendmsg was refused */
	STAT_REJECT_TOO_BIG,      /* too big for the egress MTU, DF set: ICMP fragmentation needed sent */
	STAT_DROP_ICMP_RATE_LIMIT, /* an ICMP error was due, over its rate limit: dropped unanswered */
	STAT_PASS_TO_HOST,        /* translated for a backend at this node's address: to the stack */
	STAT_HOST_REPLY,          /* the host's reply as such a backend translated on its way out */
	STAT_DROP_REPLY_TUPLE_TAKEN, /* no SNAT, and another live flow has the same reply tuple */
	STAT_RST_REPLY_TUPLE_TAKEN, /* the same, TCP mid-connection: RST sent */
	STAT_DROP_CLIENT_RST,     /* a client's RST where a RST would be sent (reject_tcp, rst_*): never answered */
	STAT_CT_CONFIRMED,        /* a flow confirmed: moved from ct_unconfirmed to conntrack */
	STAT_DROP_NO_FLOW,        /* TCP without SYN, untracked, to a SNAT frontend: claims no port */
	STAT_DROP_TUPLE_TAKEN,    /* the client tuple is a live flow of the other origin (spoofed) */
	STAT_SYNCOOKIE_SENT,      /* a SYN answered with a SYN cookie SYN-ACK (XDP_TX): no state kept */
	STAT_SYNCOOKIE_VALID,     /* an ACK's SYN cookie checked out: its flow opened to a backend */
	STAT_SYNPROXY_ACK,        /* a backend's SYN-ACK to the SYN proxy answered with the client's ACK */
	STAT_DROP_SYNPROXY_PENDING, /* to or from a SYN-proxied flow whose backend has not answered yet */
	STAT_DROP_SYNPROXY_LOST,  /* a backend's reply in a SYN-proxied flow that lost its offset (synproxy_flows) */
	STAT_DROP_RST_OUT_OF_WINDOW, /* a tracked flow's RST far from its sender's sequence: changes nothing */
	STAT_DROP_FIN_OUT_OF_WINDOW, /* the same for a FIN */
	STAT_RST_SYNPROXY_LOST,   /* a client's packet in a SYN-proxied flow that lost its offset: RST, the flow ends */
	STAT_DROP_SYNPROXY_IN_TC, /* a SYN-proxied flow's packet XDP left to TC (IP options, a fragment) */
	STAT_SNAT_HOST_SOCKET,    /* a SNAT port passed over: the host has a socket on its reply tuple */
	STAT_MAX,
};

struct counter {
	__u64 packets;
	__u64 bytes;
};

struct svc_counter {
	__u64 packets;
	__u64 bytes;
	__u64 new_flows;
};

/* ---- SNAT bookkeeping, the ICMP budget ---------------------------------- */

/* Which bucket a (backend, node address, protocol) triple's reply tuples
 * use: entries 0..SNAT_BUCKET_HINTS-1, found by a hash of the triple, hold
 * bucket + 1 (0: none yet); entry SNAT_HINT_NEXT counts the buckets handed
 * out: the next triple's bucket is the idlest of those that follow (see
 * snat_bucket_assign in snat.h). Triples whose hashes meet share a bucket.
 * The datapath never clears a hint (a backend's flows may outlive it); the
 * agent clears those of departed backends (dataplane.ReleaseSNATHints). */
enum snat_hints {
	SNAT_BUCKET_HINTS = 4096,
	SNAT_HINT_NEXT = SNAT_BUCKET_HINTS,
};

/* Where a SNAT bucket's hand is (see SNAT_BUCKET_ATTEMPTS in snat.h). */
struct snat_bucket_hand {
	__u32 next; /* slots offered so far; mod the range: the next */
	__s32 rest; /* claims left that skip this hand (it offered live slots) */
	__u64 last_claim_ns; /* when a port of this bucket was last claimed */
};

/* The ICMP error budget of each CPU, shared by every hook (icmp_limit.h):
 * its virtual clock, a CLOCK_MONOTONIC time. */
struct icmp_budget {
	__u64 next_ns;
};

/* ---- sockets of the node's own processes ----------------------------- */

/* Where a host socket's connection to a frontend really goes, so the
 * socket still reports the frontend as its peer. */
struct sock_key {
	__u64 cookie; /* bpf_get_socket_cookie */
	__be32 backend_addr;
	__be16 backend_port;
	__u16 pad;
};

struct sock_frontend {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

/* ---- fragments --------------------------------------------------------- */

/* Fragmented datagrams (see frag.h): a datagram, as the sender addressed
 * it, and what its fragments are translated to. */
struct frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 pad;
};

/* What its fragments are translated to. */
enum frag_flags {
	FRAG_F_HOST = 1 << 0, /* to a backend at this node's address: deliver, not route */
};

struct frag_entry {
	__be32 saddr;
	__be32 daddr;
	__u32 svc_id;
	__u32 flags; /* enum frag_flags */
};

/* ---- for operators ----------------------------------------------------- */

/* Not used by the programs: the agent records here what the introspection
 * commands need to name things, so they work from the pins alone, while an
 * agent runs or after it stopped. */
#define SVC_NAME_LEN 248

struct svc_name {
	char key[SVC_NAME_LEN]; /* "namespace/name:port/PROTOCOL", NUL-padded */
};

struct agent_state {
	__u64 last_sync_unix_ns;  /* end of the last successful sync */
	__u64 syncs;              /* successful syncs since the agent started */
	__u64 started_unix_ns;    /* when the agent started */
	__u32 pid;
	__u32 service_ports;      /* service ports programmed */
	__u32 problems;           /* service ports with problems in the last sync */
	__u32 pid_ns;             /* inode of the pid namespace pid is in (0: not recorded) */
};

/* Flag and constant enums are only used as values, so nothing would put them in BTF;
 * this pointer does, so bpf2go can export them to Go. */
struct datapath_flags {
	enum frontend_flags frontend;
	enum backend_flags backend;
	enum ct_tcp_state tcp_state;
	enum ct_flags ct;
	enum snat_hints snat_hints;
	enum snat_slot_flags snat_slot;
	enum syn_cookie_mode syn_cookies;
};
const struct datapath_flags *datapath_flags_btf __attribute__((unused));

#endif /* XDPLB_STRUCTS_H */
