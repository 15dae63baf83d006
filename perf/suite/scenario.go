package suite

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/packet"
)

type targetKind int

const (
	targetRemote targetKind = iota // the perf-svc targets: remote backends, SNAT
	targetLocal                    // perf-local: a backend on the edge node, DNAT only
	targetOne                      // perf-one: a single remote backend
)

type trafficKind int

const (
	trafficEstablished trafficKind = iota // few flows, each already tracked
	trafficNew                            // every frame a new flow
	trafficReply                          // replies of tracked flows, backend to client
	trafficFlood                          // spoofed SYNs beside real connections (flood.go)
)

// scenario is one kind of traffic against one kind of Service.
type scenario struct {
	id, title string
	traffic   trafficKind
	target    targetKind
	proto     uint8         // of its frames; 0: the run's (TCP, or UDP with pktgen)
	flows     uint32        // established and reply: distinct flows
	prefill   float64       // fill conntrack to this fraction of conntrackMax first
	count     uint64        // frames per repetition (upper bound)
	duration  time.Duration // length of a repetition (upper bound)
}

// step is one number of Services with the scenarios and modes run at it.
type step struct {
	set       ServiceSet
	scenarios []scenario
	modes     []string // modes that run at this step
}

// Source ranges of the generated clients (all inside ClientPrefix).
var (
	newFlowSrc     = netip.MustParseAddr("100.64.0.0")  // 1M addresses
	establishedSrc = netip.MustParseAddr("100.100.0.1") // few flows
	prefillSrc     = netip.MustParseAddr("100.112.0.0") // 64k addresses
	probeSrc       = netip.MustParseAddr("100.127.0.0") // 256 addresses
)

// scenarios returns every scenario, quick or full sized.
func scenarios(quick bool) []scenario {
	// New flows start from an empty table and stop at 100k flows (40% of
	// conntrack, 6.25k NAT ports of each backend) in both sizes, so quick
	// and full figures compare; the rate falls as the tables fill (see
	// ct-full for a nearly full one).
	est, newCount, newDur := 2*time.Second, uint64(100000), 3*time.Second
	if quick {
		est, newDur = 500*time.Millisecond, time.Second
	}
	return []scenario{
		{id: "est-remote", title: "established flows, remote backends (SNAT)", traffic: trafficEstablished,
			target: targetRemote, flows: 16, count: 50_000_000, duration: est},
		{id: "est-local", title: "established flows, local backend", traffic: trafficEstablished,
			target: targetLocal, flows: 16, count: 50_000_000, duration: est},
		{id: "est-reply", title: "replies of established flows (reverse SNAT)", traffic: trafficReply,
			target: targetRemote, flows: 64, count: 50_000_000, duration: est},
		{id: "new-remote", title: "new flows, remote backends (SNAT)", traffic: trafficNew,
			target: targetRemote, count: newCount, duration: newDur},
		{id: "new-udp", title: "new UDP flows, remote backends (SNAT)", traffic: trafficNew,
			target: targetRemote, proto: traffic.UDP, count: newCount, duration: newDur},
		{id: "new-one", title: "new flows, one remote backend (SNAT)", traffic: trafficNew,
			target: targetOne, count: 50000, duration: newDur},
		{id: "new-local", title: "new flows, local backend", traffic: trafficNew,
			target: targetLocal, count: newCount, duration: newDur},
		{id: "ct-full", title: "new flows, conntrack 90% full", traffic: trafficNew,
			target: targetRemote, prefill: 0.9, count: 100000, duration: newDur},
		{id: "snat-exhaust", title: "new flows to one backend beyond 64.5k (NAT ports)", traffic: trafficNew,
			target: targetOne, count: 100000, duration: 4 * time.Second},
		// As many frames as the node takes in eight seconds at the
		// generator's full rate (it offers more than any mode takes).
		{id: "syn-flood", title: "spoofed SYN flood at one remote backend, real connections beside it", traffic: trafficFlood,
			target: targetOne, duration: 8 * time.Second},
	}
}

// appliesTo tells whether a mode runs the scenario: the flood's real
// connections need a Service, which the baseline's forwarding has not.
func (sc scenario) appliesTo(mode string) bool {
	return sc.traffic != trafficFlood || mode != summary.ModeBaseline
}

func pick(all []scenario, ids ...string) []scenario {
	var out []scenario
	for _, s := range all {
		if slices.Contains(ids, s.id) {
			out = append(out, s)
		}
	}
	return out
}

// targetsPerSet is how many Services carry traffic at scale.
const targetsPerSet = 16

// newServiceSet is the set of a step with n Services.
func newServiceSet(n, backends int) ServiceSet {
	return ServiceSet{Count: n, Targets: min(n, targetsPerSet), Backends: backends}
}

// plan lists the steps of a run. counts are the Service counts (the first
// runs every scenario, the others new flows only); 100k and more run only
// the xdplb modes.
func plan(quick bool, counts []int, backends int) []step {
	all := scenarios(quick)
	if len(counts) == 0 {
		counts = []int{1, 1000, 10000, 100000}
		if quick {
			counts = []int{1}
		}
	}
	var steps []step
	for i, n := range counts {
		st := step{set: newServiceSet(n, backends)}
		switch {
		case i == 0 && quick:
			st.scenarios = pick(all, "est-remote", "new-remote")
			st.modes = slices.Clone(summary.ModeOrder)
		case i == 0:
			st.scenarios = all
			st.modes = slices.Clone(summary.ModeOrder)
		case n >= 100000:
			st.scenarios = pick(all, "new-remote")
			st.modes = []string{summary.ModeXDPLB, summary.ModeXDPLBTC}
		default:
			st.scenarios = pick(all, "new-remote")
			st.modes = []string{summary.ModeXDPLB, summary.ModeXDPLBTC, summary.ModeKPIPTables, summary.ModeKPNFTables, summary.ModeKPIPVS}
		}
		steps = append(steps, st)
	}
	return steps
}

// destination returns where a scenario's traffic goes.
func destination(sc scenario, set ServiceSet) (first netip.Addr, count, stride uint32) {
	switch sc.target {
	case targetLocal:
		return LocalServiceIP, 1, 1
	case targetOne:
		return OneBackendIP, 1, 1
	}
	return set.Destinations()
}

// sinkOf returns the sink that counts a scenario's traffic.
func sinkOf(e *env, sc scenario) *traffic.Sink {
	switch {
	case sc.traffic == trafficReply:
		return e.topo.ClientSink
	case sc.target == targetLocal:
		return e.topo.PodSink
	}
	return e.topo.Node2Sink
}

func (e *env) baseSpec() traffic.Spec {
	return traffic.Spec{
		SrcMAC: e.topo.GenMAC, DstMAC: e.topo.Eth0MAC, Proto: e.proto, Size: e.frameSize,
		DstPort: uint16(servicePort),
	}
}

// establishedSpec: sc.flows flows, over and over.
func establishedSpec(e *env, sc scenario, set ServiceSet) traffic.Spec {
	s := e.baseSpec()
	s.TCPFlags = packet.ACK
	s.Src, s.SrcAddrs, s.SrcPortMin, s.SrcPorts = establishedSrc, 1, 10000, 50000
	s.Dst, s.DstAddrs, s.DstStride = destination(sc, set)
	s.Flows = max(sc.flows, 1)
	return s
}

// newFlowSpec: every frame a new flow (a TCP SYN, or a UDP datagram).
func newFlowSpec(e *env, sc scenario, set ServiceSet, src netip.Addr, addrs uint32) traffic.Spec {
	s := e.baseSpec()
	if sc.proto != 0 {
		s.Proto = sc.proto
	}
	if s.Proto == traffic.TCP {
		s.TCPFlags = packet.SYN
	}
	s.Src, s.SrcAddrs = src, addrs
	s.Dst, s.DstAddrs, s.DstStride = destination(sc, set)
	return s
}

// replySpec: the backends answer the tracked flows.
func replySpec(e *env, tuples []traffic.Tuple) traffic.Spec {
	return traffic.Spec{
		SrcMAC: e.topo.Node2MAC, DstMAC: e.topo.Eth1MAC, Proto: e.proto, TCPFlags: packet.ACK,
		Size: e.frameSize, Tuples: tuples,
	}
}

// CheckSelection rejects mode and scenario names a run would not know, so
// that a typo fails before anything is built instead of giving an empty
// report.
func CheckSelection(modes, scenarioIDs []string) error {
	for _, m := range modes {
		if !slices.Contains(summary.ModeOrder, m) {
			return fmt.Errorf("unknown mode %q (modes: %s)", m, strings.Join(summary.ModeOrder, ", "))
		}
	}
	var ids []string
	for _, sc := range scenarios(false) {
		ids = append(ids, sc.id)
	}
	for _, id := range scenarioIDs {
		if !slices.Contains(ids, id) {
			return fmt.Errorf("unknown scenario %q (scenarios: %s)", id, strings.Join(ids, ", "))
		}
	}
	return nil
}
