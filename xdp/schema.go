package xdp

// The datapath's schema: the map keys and values and the enums every
// program shares (include/structs.h), under the names code should use. bpf2go
// generates them once, from xdp_nic.c, and prefixes them with that
// program's name (Nic...); the TC and socket programs share them (their
// own generated files have no types).

type (
	AffinityEntry   = NicAffinityEntry
	AffinityKey     = NicAffinityKey
	AgentState      = NicAgentState
	Backend         = NicBackend
	BackendFlags    = NicBackendFlags
	BpfSockTuple    = NicBpfSockTuple
	Counter         = NicCounter
	CtEntry         = NicCtEntry
	CtFlags         = NicCtFlags
	CtKey           = NicCtKey
	CtTcpState      = NicCtTcpState
	DatapathConfig  = NicDatapathConfig
	FlowScratchBuf  = NicFlowScratchBuf
	FragEntry       = NicFragEntry
	FragKey         = NicFragKey
	Frontend        = NicFrontend
	FrontendFlags   = NicFrontendFlags
	FrontendKey     = NicFrontendKey
	IcmpBudget      = NicIcmpBudget
	Iface           = NicIface
	NatEntry        = NicNatEntry
	NatKey          = NicNatKey
	NewFlowRoute    = NicNewFlowRoute
	RouteReuseLease = NicRouteReuseLease
	SnatBucketHand  = NicSnatBucketHand
	SnatHints       = NicSnatHints
	SnatSlot        = NicSnatSlot
	SnatSlotFlags   = NicSnatSlotFlags
	SockFrontend    = NicSockFrontend
	SockKey         = NicSockKey
	SourceRangeKey  = NicSourceRangeKey
	Stat            = NicStat
	SvcCounter      = NicSvcCounter
	SvcName         = NicSvcName
	SynCookieMode   = NicSynCookieMode
	SynFlood        = NicSynFlood
	SynproxySeq     = NicSynproxySeq
)

// The schema's enum values, under the same names without the prefix.
const (
	BackendFlagsBE_LOCAL                   = NicBackendFlagsBE_LOCAL
	BackendFlagsBE_TERMINATING             = NicBackendFlagsBE_TERMINATING
	BackendFlagsBE_HOST                    = NicBackendFlagsBE_HOST
	CtFlagsCT_F_SNAT                       = NicCtFlagsCT_F_SNAT
	CtFlagsCT_F_EXTERNAL                   = NicCtFlagsCT_F_EXTERNAL
	CtFlagsCT_F_AFFINITY                   = NicCtFlagsCT_F_AFFINITY
	CtFlagsCT_F_HOST                       = NicCtFlagsCT_F_HOST
	CtFlagsCT_F_ENDED                      = NicCtFlagsCT_F_ENDED
	CtFlagsCT_F_UNCONFIRMED                = NicCtFlagsCT_F_UNCONFIRMED
	CtFlagsCT_F_SYNPROXY                   = NicCtFlagsCT_F_SYNPROXY
	CtTcpStateCT_TCP_SYN                   = NicCtTcpStateCT_TCP_SYN
	CtTcpStateCT_TCP_ESTABLISHED           = NicCtTcpStateCT_TCP_ESTABLISHED
	CtTcpStateCT_TCP_FIN                   = NicCtTcpStateCT_TCP_FIN
	CtTcpStateCT_TCP_RST                   = NicCtTcpStateCT_TCP_RST
	CtTcpStateCT_TCP_REPLY_FIN             = NicCtTcpStateCT_TCP_REPLY_FIN
	CtTcpStateCT_TCP_REPLY                 = NicCtTcpStateCT_TCP_REPLY
	CtTcpStateCT_TCP_SEQ_KNOWN             = NicCtTcpStateCT_TCP_SEQ_KNOWN
	FrontendFlagsFE_EXTERNAL               = NicFrontendFlagsFE_EXTERNAL
	FrontendFlagsFE_SNAT_REMOTE            = NicFrontendFlagsFE_SNAT_REMOTE
	FrontendFlagsFE_SOURCE_RANGES          = NicFrontendFlagsFE_SOURCE_RANGES
	FrontendFlagsFE_DROP_IF_EMPTY          = NicFrontendFlagsFE_DROP_IF_EMPTY
	FrontendFlagsFE_INTERNAL_DROP_IF_EMPTY = NicFrontendFlagsFE_INTERNAL_DROP_IF_EMPTY
	FrontendFlagsFE_LOCAL_SET              = NicFrontendFlagsFE_LOCAL_SET
	FrontendFlagsFE_INTERNAL_LOCAL_SET     = NicFrontendFlagsFE_INTERNAL_LOCAL_SET
	SnatHintsSNAT_BUCKET_HINTS             = NicSnatHintsSNAT_BUCKET_HINTS
	SnatHintsSNAT_HINT_NEXT                = NicSnatHintsSNAT_HINT_NEXT
	SnatSlotFlagsSNAT_SLOT_SPILLED         = NicSnatSlotFlagsSNAT_SLOT_SPILLED
	StatSTAT_PASS_NOT_IPV4                 = NicStatSTAT_PASS_NOT_IPV4
	StatSTAT_PASS_NOT_SERVICE              = NicStatSTAT_PASS_NOT_SERVICE
	StatSTAT_PASS_IP_OPTIONS               = NicStatSTAT_PASS_IP_OPTIONS
	StatSTAT_PASS_FRAGMENT                 = NicStatSTAT_PASS_FRAGMENT
	StatSTAT_PASS_MALFORMED                = NicStatSTAT_PASS_MALFORMED
	StatSTAT_PASS_INTERNAL                 = NicStatSTAT_PASS_INTERNAL
	StatSTAT_PASS_ICMP                     = NicStatSTAT_PASS_ICMP
	StatSTAT_PASS_NO_NEIGH                 = NicStatSTAT_PASS_NO_NEIGH
	StatSTAT_PASS_TO_STACK                 = NicStatSTAT_PASS_TO_STACK
	StatSTAT_PASS_FRAG_NEEDED              = NicStatSTAT_PASS_FRAG_NEEDED
	StatSTAT_TX                            = NicStatSTAT_TX
	StatSTAT_REDIRECT                      = NicStatSTAT_REDIRECT
	StatSTAT_NEW_FLOW                      = NicStatSTAT_NEW_FLOW
	StatSTAT_REVERSE_NAT                   = NicStatSTAT_REVERSE_NAT
	StatSTAT_ICMP_TRANSLATED               = NicStatSTAT_ICMP_TRANSLATED
	StatSTAT_REJECT_TCP                    = NicStatSTAT_REJECT_TCP
	StatSTAT_REJECT_ICMP                   = NicStatSTAT_REJECT_ICMP
	StatSTAT_RST_BACKEND_GONE              = NicStatSTAT_RST_BACKEND_GONE
	StatSTAT_RESELECT_BACKEND_GONE         = NicStatSTAT_RESELECT_BACKEND_GONE
	StatSTAT_CT_EXPIRED                    = NicStatSTAT_CT_EXPIRED
	StatSTAT_CT_REPAIRED                   = NicStatSTAT_CT_REPAIRED
	StatSTAT_NAT_REPAIRED                  = NicStatSTAT_NAT_REPAIRED
	StatSTAT_NAT_PORT_MOVED                = NicStatSTAT_NAT_PORT_MOVED
	StatSTAT_DROP_SOURCE_RANGE             = NicStatSTAT_DROP_SOURCE_RANGE
	StatSTAT_DROP_NO_LOCAL_BACKEND         = NicStatSTAT_DROP_NO_LOCAL_BACKEND
	StatSTAT_DROP_NAT_EXHAUSTED            = NicStatSTAT_DROP_NAT_EXHAUSTED
	StatSTAT_DROP_CT_FULL                  = NicStatSTAT_DROP_CT_FULL
	StatSTAT_DROP_STALE_NAT                = NicStatSTAT_DROP_STALE_NAT
	StatSTAT_DROP_NO_ROUTE                 = NicStatSTAT_DROP_NO_ROUTE
	StatSTAT_DROP_NO_NODE_ADDR             = NicStatSTAT_DROP_NO_NODE_ADDR
	StatSTAT_DROP_FWD_DISABLED             = NicStatSTAT_DROP_FWD_DISABLED
	StatSTAT_DROP_TTL                      = NicStatSTAT_DROP_TTL
	StatSTAT_DROP_BAD_TABLE                = NicStatSTAT_DROP_BAD_TABLE
	StatSTAT_DROP_ADJUST                   = NicStatSTAT_DROP_ADJUST
	StatSTAT_TC_NEIGH_REDIRECT             = NicStatSTAT_TC_NEIGH_REDIRECT
	StatSTAT_TC_REDIRECT                   = NicStatSTAT_TC_REDIRECT
	StatSTAT_TC_FRAGMENT                   = NicStatSTAT_TC_FRAGMENT
	StatSTAT_SOCK_CONNECT                  = NicStatSTAT_SOCK_CONNECT
	StatSTAT_SOCK_REFUSED                  = NicStatSTAT_SOCK_REFUSED
	StatSTAT_REJECT_TOO_BIG                = NicStatSTAT_REJECT_TOO_BIG
	StatSTAT_DROP_ICMP_RATE_LIMIT          = NicStatSTAT_DROP_ICMP_RATE_LIMIT
	StatSTAT_PASS_TO_HOST                  = NicStatSTAT_PASS_TO_HOST
	StatSTAT_HOST_REPLY                    = NicStatSTAT_HOST_REPLY
	StatSTAT_DROP_REPLY_TUPLE_TAKEN        = NicStatSTAT_DROP_REPLY_TUPLE_TAKEN
	StatSTAT_RST_REPLY_TUPLE_TAKEN         = NicStatSTAT_RST_REPLY_TUPLE_TAKEN
	StatSTAT_DROP_CLIENT_RST               = NicStatSTAT_DROP_CLIENT_RST
	StatSTAT_CT_CONFIRMED                  = NicStatSTAT_CT_CONFIRMED
	StatSTAT_DROP_NO_FLOW                  = NicStatSTAT_DROP_NO_FLOW
	StatSTAT_DROP_TUPLE_TAKEN              = NicStatSTAT_DROP_TUPLE_TAKEN
	StatSTAT_SYNCOOKIE_SENT                = NicStatSTAT_SYNCOOKIE_SENT
	StatSTAT_SYNCOOKIE_VALID               = NicStatSTAT_SYNCOOKIE_VALID
	StatSTAT_SYNPROXY_ACK                  = NicStatSTAT_SYNPROXY_ACK
	StatSTAT_DROP_SYNPROXY_PENDING         = NicStatSTAT_DROP_SYNPROXY_PENDING
	StatSTAT_DROP_SYNPROXY_LOST            = NicStatSTAT_DROP_SYNPROXY_LOST
	StatSTAT_DROP_RST_OUT_OF_WINDOW        = NicStatSTAT_DROP_RST_OUT_OF_WINDOW
	StatSTAT_DROP_FIN_OUT_OF_WINDOW        = NicStatSTAT_DROP_FIN_OUT_OF_WINDOW
	StatSTAT_RST_SYNPROXY_LOST             = NicStatSTAT_RST_SYNPROXY_LOST
	StatSTAT_DROP_SYNPROXY_IN_TC           = NicStatSTAT_DROP_SYNPROXY_IN_TC
	StatSTAT_SNAT_HOST_SOCKET              = NicStatSTAT_SNAT_HOST_SOCKET
	StatSTAT_MAX                           = NicStatSTAT_MAX
	SynCookieModeSYN_COOKIES_OFF           = NicSynCookieModeSYN_COOKIES_OFF
	SynCookieModeSYN_COOKIES_AUTO          = NicSynCookieModeSYN_COOKIES_AUTO
	SynCookieModeSYN_COOKIES_ALWAYS        = NicSynCookieModeSYN_COOKIES_ALWAYS
)
