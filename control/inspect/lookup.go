package inspect

import (
	"fmt"
	"net/netip"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// Lookup is the answer of `xdplb lookup`: what the datapath does with a
// packet of a new or existing flow.
type Lookup struct {
	Frontend  string `json:"frontend"`
	Service   string `json:"service,omitempty"`
	Verdict   string `json:"verdict"` // forward, reject, drop, pass
	Reason    string `json:"reason"`
	Backend   string `json:"backend,omitempty"`
	BackendID uint32 `json:"backendId,omitempty"`
	Hash      uint32 `json:"hash,omitempty"`
	Slot      uint32 `json:"slot,omitempty"`
	TableSize int    `json:"tableSize,omitempty"`
	SNAT      bool   `json:"snat"`
	Tracked   *Flow  `json:"tracked,omitempty"`
}

// LookupFlow predicts the datapath's decision for a packet from src to
// dst, the way the XDP program takes it (see xdp/xdp_nic.c).
func LookupFlow(dp *dataplane.Dataplane, proto uint8, src, dst netip.AddrPort) (Lookup, error) {
	out := Lookup{Frontend: fmt.Sprintf("%s/%s", dst, dataplane.ProtoName(proto))}
	names, err := dp.ServiceNames()
	if err != nil {
		return out, err
	}
	bes, err := dp.Backends()
	if err != nil {
		return out, err
	}
	key := dataplane.FlowKey{Client: src, Frontend: dst, Proto: proto}
	if fl, ok, err := dp.Flow(key); err != nil {
		return out, err
	} else if ok {
		row := Flow{Proto: dataplane.ProtoName(proto), Client: src.String(), Frontend: dst.String(),
			Backend: fl.Backend.String(), Service: names[fl.SvcID], State: flowState(fl)}
		if fl.NAT.IsValid() {
			row.NAT = fl.NAT.String()
		}
		out.Tracked = &row
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
		out.Reason = "ClusterIP frontend: handled by the TC programs for traffic from pods and the host"
	}
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
	if out.Tracked != nil {
		out.Verdict = "forward"
		out.Backend = out.Tracked.Backend
		out.Reason = "tracked flow: follows its conntrack entry while the backend exists"
		return out, nil
	}
	if fe.TableID == 0 {
		if fe.Flags&dataplane.FrontendDropIfEmpty != 0 {
			out.Verdict, out.Reason = "drop", "externalTrafficPolicy Local and no endpoint on this node"
		} else {
			out.Verdict, out.Reason = "reject", "no usable endpoint: TCP RST / ICMP port unreachable"
		}
		return out, nil
	}
	slots, err := dp.Table(fe.TableID)
	if err != nil {
		return out, err
	}
	seed, err := hashSeed(dp)
	if err != nil {
		return out, err
	}
	if fe.AffinityTimeout > 0 {
		out.Hash = xdp.ClientHash(src.Addr(), seed)
		out.Reason = fmt.Sprintf("ClientIP affinity (%ds): Maglev slot of the client address, unless the client has a live affinity entry", fe.AffinityTimeout)
	} else {
		out.Hash = xdp.FlowHash(src, dst, proto, seed)
		out.Reason = "new flow: Maglev slot of the 5-tuple hash"
	}
	out.TableSize = len(slots)
	out.Slot = out.Hash % uint32(len(slots))
	out.BackendID = slots[out.Slot]
	b := bes[out.BackendID]
	out.Backend = b.String()
	out.SNAT = fe.Flags&dataplane.FrontendSNATRemote != 0 && !b.Local
	out.Verdict = "forward"
	return out, nil
}

func hashSeed(dp *dataplane.Dataplane) (uint32, error) {
	var cfg xdp.NicDatapathConfig
	if err := dp.Maps().Config.Lookup(uint32(0), &cfg); err != nil {
		return 0, fmt.Errorf("read datapath config: %w", err)
	}
	return cfg.HashSeed, nil
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
		if f.Service != name && !hasPrefixKey(f.Service, name) {
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

func hasPrefixKey(key, prefix string) bool {
	return len(key) > len(prefix) && key[:len(prefix)] == prefix && (key[len(prefix)] == ':' || key[len(prefix)] == '/')
}
