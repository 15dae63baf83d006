package inspect

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// FlowFilter selects flows; zero fields match everything.
type FlowFilter struct {
	Service string     // service port key, or a prefix such as "default/web"
	Client  netip.Addr // client address
	Backend netip.Addr // backend address
	Proto   uint8
}

// Flow is one row of `xdplb conntrack`.
type Flow struct {
	Proto    string `json:"proto"`
	Client   string `json:"client"`
	Frontend string `json:"frontend"`
	Backend  string `json:"backend"`
	NAT      string `json:"nat,omitempty"`
	Service  string `json:"service"`
	State    string `json:"state"`
	AgeSec   int64  `json:"ageSeconds"`
	IdleSec  int64  `json:"idleSeconds"`
}

// Conntrack lists the tracked flows that match f, and how many there are
// in all.
func Conntrack(dp *dataplane.Dataplane, f FlowFilter) ([]Flow, int, error) {
	names, err := dp.ServiceNames()
	if err != nil {
		return nil, 0, err
	}
	now := dataplane.Now()
	total := 0
	var out []Flow
	err = dp.Flows(func(fl dataplane.Flow) bool {
		total++
		name := names[fl.SvcID]
		if f.Service != "" && !MatchService(name, f.Service) {
			return true
		}
		if f.Client.IsValid() && fl.Client.Addr() != f.Client {
			return true
		}
		if f.Backend.IsValid() && fl.Backend.Addr() != f.Backend {
			return true
		}
		if f.Proto != 0 && fl.Proto != f.Proto {
			return true
		}
		out = append(out, flowRow(fl, name, now))
		return true
	})
	// Addresses sort by value, not as text: port 9 before port 10.
	key := func(s string) netip.AddrPort { ap, _ := netip.ParseAddrPort(s); return ap }
	slices.SortFunc(out, func(a, b Flow) int {
		return cmp.Or(cmp.Compare(a.Service, b.Service), key(a.Client).Compare(key(b.Client)),
			key(a.Frontend).Compare(key(b.Frontend)), cmp.Compare(a.Proto, b.Proto))
	})
	return out, total, err
}

// flowRow renders a tracked flow; now is the datapath clock (dataplane.Now).
func flowRow(fl dataplane.Flow, service string, now time.Duration) Flow {
	row := Flow{
		Proto: dataplane.ProtoName(fl.Proto), Client: fl.Client.String(), Frontend: fl.Frontend.String(),
		Backend: fl.Backend.String(), Service: service, State: flowState(fl),
		AgeSec:  seconds(now - fl.Created),
		IdleSec: seconds(now - fl.LastSeen),
	}
	if fl.Ended {
		row.IdleSec = row.AgeSec // dated far back when ended: not an idle time
	}
	if fl.NAT.IsValid() {
		row.NAT = fl.NAT.String()
	}
	return row
}

// seconds rounds down to whole seconds. The datapath stamps flows with a
// coarse clock that may run a tick ahead of ours: never report less than 0.
func seconds(d time.Duration) int64 {
	return max(int64(d/time.Second), 0)
}

func flowState(f dataplane.Flow) string {
	if f.Ended {
		return "ended"
	}
	if f.Proto != dataplane.TCP {
		switch {
		case f.Unconfirmed && f.TCPState&uint8(xdp.CtTcpStateCT_TCP_REPLY) != 0:
			return "replied" // not a stream yet
		case f.Unconfirmed:
			return "unreplied"
		}
		return "-"
	}
	s := f.TCPState
	switch {
	case f.Unconfirmed && s&uint8(xdp.CtTcpStateCT_TCP_RST) == 0 && !dataplane.TCPClosing(s):
		// Not confirmed yet: a handshake under way, or a spoofed SYN.
		return "unconfirmed"
	case s&uint8(xdp.CtTcpStateCT_TCP_RST) != 0:
		return "reset"
	case dataplane.TCPClosing(s):
		return "closing"
	case s&uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED) != 0:
		return "established"
	case s&uint8(xdp.CtTcpStateCT_TCP_SYN) != 0:
		return "syn"
	}
	return "-"
}
