package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// Lookup is the answer of `xdplb lookup`: what the XDP program on the NIC
// does with the first packet of a connection from src to dst (a TCP SYN, or
// a UDP datagram), and what it does with the flow's packets if the tuple is
// tracked now.
type Lookup struct {
	Frontend  string `json:"frontend"`
	Service   string `json:"service,omitempty"`
	Verdict   string `json:"verdict"` // forward, reject, drop, pass
	Reason    string `json:"reason"`
	Backend   string `json:"backend,omitempty"`
	BackendID uint32 `json:"backendId,omitempty"`
	// Hash, Slot and TableSize are set when the backend comes from the
	// Maglev table (not from a tracked flow or an affinity entry).
	Hash      uint32 `json:"hash,omitempty"`
	Slot      uint32 `json:"slot,omitempty"`
	TableSize int    `json:"tableSize,omitempty"`
	SNAT      bool   `json:"snat"`
	// Host: the backend is at an address of this node (a hostNetwork
	// pod here); the packets are handed to the node's stack.
	Host bool `json:"host,omitempty"`
	// Tracked is the conntrack entry of this tuple, if there is one.
	Tracked *TrackedFlow `json:"tracked,omitempty"`
}

// TrackedFlow is a conntrack entry as lookup sees it: Usable tells whether
// the datapath still follows it for a new connection on the same tuple, and
// Stale why not.
type TrackedFlow struct {
	Flow
	Usable bool   `json:"usable"`
	Stale  string `json:"stale,omitempty"`
}

// LookupFlow predicts the datapath's decision for a connection from src to
// dst arriving on the NIC, the way the XDP program takes it (see
// xdp/include/flow.h and maglev.h).
func LookupFlow(dp *dataplane.Dataplane, proto uint8, src, dst netip.AddrPort) (out Lookup, err error) {
	out = Lookup{Frontend: fmt.Sprintf("%s/%s", dst, dataplane.ProtoName(proto))}
	names, err := dp.ServiceNames()
	if err != nil {
		return out, err
	}
	bes, err := dp.Backends()
	if err != nil {
		return out, err
	}
	cfg, err := datapathConfig(dp)
	if err != nil {
		return out, err
	}
	now := dataplane.Now()
	key := dataplane.FlowKey{Client: src, Frontend: dst, Proto: proto}
	fl, tracked, err := dp.Flow(key)
	if err != nil {
		return out, err
	}
	if tracked {
		out.Tracked = &TrackedFlow{Flow: flowRow(fl, names[fl.SvcID], now)}
		out.Tracked.Stale = staleReason(fl, bes, cfg, now)
		out.Tracked.Usable = out.Tracked.Stale == ""
	}

	fes, err := dp.Frontends()
	if err != nil {
		return out, err
	}
	fe, ok := fes[dataplane.FrontendKey{Addr: dst.Addr(), Port: dst.Port(), Proto: proto}]
	if !ok {
		out.Verdict, out.Reason = "pass", "no frontend: not service traffic, left to the stack"
		return out, nil
	}
	out.Service = names[fe.SvcID]
	if fe.Flags&dataplane.FrontendExternal == 0 {
		out.Verdict = "pass"
		out.Reason = "ClusterIP frontend: not reachable from outside the node, the NIC's XDP program leaves it to the stack"
		return out, nil
	}
	if out.Tracked != nil && out.Tracked.Usable {
		out.Verdict = "forward"
		out.Backend = out.Tracked.Backend
		out.BackendID = fl.BackendID
		out.SNAT = out.Tracked.NAT != ""
		out.Host = bes[fl.BackendID].Host
		out.Reason = "tracked flow: its packets follow the conntrack entry while the backend exists"
		return out, nil
	}
	// Every reason below is for a new flow; say why the entry is ignored.
	var suffix string
	if out.Tracked != nil {
		suffix = ", as the tracked entry is " + out.Tracked.Stale
	}
	defer func() { out.Reason += suffix }()
	if fe.Flags&dataplane.FrontendSourceRanges != 0 {
		allowed := false
		ranges, err := dp.SourceRanges()
		if err != nil {
			return out, err
		}
		for _, r := range ranges {
			if r.SvcID == fe.SvcID && r.Prefix.Contains(src.Addr()) {
				allowed = true
			}
		}
		if !allowed {
			out.Verdict, out.Reason = "drop", "client outside loadBalancerSourceRanges"
			return out, nil
		}
	}
	if fe.TableID == 0 {
		if fe.Flags&dataplane.FrontendDropIfEmpty != 0 {
			out.Verdict, out.Reason = "drop", "externalTrafficPolicy Local and no endpoint on this node"
		} else {
			out.Verdict, out.Reason = "reject", "no usable endpoint: TCP RST / ICMP port unreachable"
		}
		return out, nil
	}
	out.Verdict = "forward"
	if fe.AffinityTimeout > 0 {
		if id, idle, ok, err := liveAffinity(dp, fe, src.Addr(), bes, now); err != nil {
			return out, err
		} else if ok {
			b := bes[id]
			out.BackendID, out.Backend = id, b.String()
			out.SNAT = fe.Flags&dataplane.FrontendSNATRemote != 0 && !b.Local
			out.Host = b.Host
			out.Reason = fmt.Sprintf("ClientIP affinity (%ds): the client's affinity entry, idle %ds, names this backend",
				fe.AffinityTimeout, seconds(idle))
			return out, nil
		}
	}
	slots, err := dp.Table(fe.TableID)
	if err != nil {
		return out, err
	}
	if len(slots) == 0 {
		out.Verdict, out.Reason = "drop", fmt.Sprintf("Maglev table %d is missing or empty", fe.TableID)
		return out, nil
	}
	if fe.AffinityTimeout > 0 {
		out.Hash = xdp.ClientHash(src.Addr(), cfg.HashSeed)
		out.Reason = fmt.Sprintf("ClientIP affinity (%ds), no live affinity entry: Maglev slot of the client address", fe.AffinityTimeout)
	} else {
		out.Hash = xdp.FlowHash(src, dst, proto, cfg.HashSeed)
		out.Reason = "new flow: Maglev slot of the 5-tuple hash"
	}
	out.TableSize = len(slots)
	out.Slot = out.Hash % uint32(len(slots))
	out.BackendID = slots[out.Slot]
	b, ok := bes[out.BackendID]
	if !ok {
		out.Verdict, out.Reason = "drop", fmt.Sprintf("Maglev slot %d names backend id %d, which is free", out.Slot, out.BackendID)
		return out, nil
	}
	out.Backend = b.String()
	out.SNAT = fe.Flags&dataplane.FrontendSNATRemote != 0 && !b.Local
	out.Host = b.Host
	return out, nil
}

// staleReason tells why the datapath would not follow a tracked entry for
// a new connection on its tuple ("" if it would), like ct_usable in
// xdp/include/flow.h does for a TCP SYN or a UDP datagram.
func staleReason(fl dataplane.Flow, bes map[uint32]dataplane.Backend, cfg xdp.DatapathConfig, now time.Duration) string {
	if !fl.External {
		return "for traffic from inside the node"
	}
	if fl.Ended {
		return "ended by the agent (its backend left the service port)"
	}
	timeout := time.Duration(cfg.UdpTimeoutNs)
	if fl.Proto == dataplane.TCP {
		timeout = time.Duration(cfg.TcpTransientTimeoutNs)
		if fl.Unconfirmed {
			timeout = min(timeout, dataplane.UnconfirmedTCPTimeout)
		} else if dataplane.TCPEstablished(fl.TCPState) {
			timeout = time.Duration(cfg.TcpEstablishedTimeoutNs)
		}
	}
	if now-fl.LastSeen > timeout {
		return fmt.Sprintf("expired (idle %ds, timeout %s)", seconds(now-fl.LastSeen), timeout)
	}
	if fl.Proto == dataplane.TCP && dataplane.TCPClosed(fl.TCPState) {
		return "closed (RST, or FIN both ways)"
	}
	if b, ok := bes[fl.BackendID]; !ok || b.Addr != fl.Backend.Addr() || b.Port != fl.Backend.Port() {
		return "for a backend that is gone"
	}
	return ""
}

// liveAffinity returns the backend of the client's affinity entry for the
// frontend's service port, if the datapath would still use it (see
// pick_backend in xdp/include/maglev.h).
func liveAffinity(dp *dataplane.Dataplane, fe dataplane.Frontend, client netip.Addr,
	bes map[uint32]dataplane.Backend, now time.Duration) (id uint32, idle time.Duration, ok bool, err error) {
	var v xdp.AffinityEntry
	k := xdp.AffinityKey{SvcId: fe.SvcID, ClientAddr: xdp.AddrToNet(client)}
	if err := dp.Maps().Affinity.Lookup(k, &v); errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, 0, false, nil
	} else if err != nil {
		return 0, 0, false, fmt.Errorf("affinity lookup: %w", err)
	}
	idle = now - time.Duration(v.LastSeenNs)
	if idle >= time.Duration(fe.AffinityTimeout)*time.Second {
		return 0, idle, false, nil
	}
	b, found := bes[v.BackendId]
	if !found || xdp.AddrToNet(b.Addr) != v.BackendAddr || xdp.PortToNet(b.Port) != v.BackendPort || b.Terminating ||
		(fe.Flags&dataplane.FrontendLocalSet != 0 && !b.Local) {
		return 0, idle, false, nil
	}
	return v.BackendId, idle, true, nil
}

func datapathConfig(dp *dataplane.Dataplane) (xdp.DatapathConfig, error) {
	var cfg xdp.DatapathConfig
	if err := dp.Maps().Config.Lookup(uint32(0), &cfg); err != nil {
		return cfg, fmt.Errorf("read datapath config: %w", err)
	}
	return cfg, nil
}

// TableReport is the answer of `xdplb maglev`.
type TableReport struct {
	Service  string       `json:"service"`
	TableID  uint32       `json:"tableId"`
	Size     int          `json:"size"`
	Backends []BackendUse `json:"backends"`
	// Balance is the largest share over the mean share (1.0 is perfect).
	Balance   float64  `json:"balance"`
	Frontends []string `json:"frontends"`
}

// Tables reports the Maglev tables of the service ports matching name (a
// key, or a prefix such as "default/web").
func Tables(dp *dataplane.Dataplane, name string) ([]TableReport, error) {
	items, err := Services(dp)
	if err != nil {
		return nil, err
	}
	byTable := map[uint32]*TableReport{}
	var order []uint32
	for _, f := range items {
		if !MatchService(f.Service, name) {
			continue
		}
		if f.TableID == 0 {
			continue
		}
		r, ok := byTable[f.TableID]
		if !ok {
			r = &TableReport{Service: f.Service, TableID: f.TableID, Size: f.TableSize, Backends: f.Backends}
			maxSlots := 0
			for _, b := range f.Backends {
				maxSlots = max(maxSlots, b.Slots)
			}
			if len(f.Backends) > 0 {
				r.Balance = float64(maxSlots) / (float64(f.TableSize) / float64(len(f.Backends)))
			}
			byTable[f.TableID] = r
			order = append(order, f.TableID)
		}
		r.Frontends = append(r.Frontends, f.Frontend)
	}
	out := make([]TableReport, 0, len(order))
	for _, id := range order {
		out = append(out, *byTable[id])
	}
	return out, nil
}

// MatchService reports whether a service port key matches name: the key
// itself, or a prefix of it ending before a ':' or '/' (namespace/name,
// or a namespace).
func MatchService(key, name string) bool {
	return key == name || hasPrefixKey(key, name)
}

func hasPrefixKey(key, prefix string) bool {
	return len(key) > len(prefix) && key[:len(prefix)] == prefix && (key[len(prefix)] == ':' || key[len(prefix)] == '/')
}
