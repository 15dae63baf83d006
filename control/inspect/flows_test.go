package inspect

import (
	"net/netip"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// A flow the agent ended is dated far back (see dataplane.DeleteFlow):
// `xdplb conntrack` shows it as ended, with no idle time of 146 years, and
// `xdplb lookup` says why it no longer answers.
func TestEndedFlowRow(t *testing.T) {
	now := 10 * time.Hour
	established := uint8(xdp.CtTcpStateCT_TCP_ESTABLISHED)
	base := dataplane.Flow{
		Client: netip.MustParseAddrPort("192.0.2.10:7001"), Frontend: netip.MustParseAddrPort("192.0.2.1:30080"),
		Proto: dataplane.TCP, Backend: netip.MustParseAddrPort("10.244.1.10:8080"), BackendID: 1,
		TCPState: established, External: true, Created: now - time.Minute, LastSeen: now - time.Second,
	}
	// A client's ACK without its backend's answer (spoofed) sets the bit,
	// but the flow is not confirmed: it keeps an unconfirmed flow's
	// timeout, at most dataplane.UnconfirmedTCPTimeout.
	unconfirmed := base
	unconfirmed.Unconfirmed = true
	unconfirmed.LastSeen = now - 6*time.Second
	ended := base
	ended.Ended = true
	ended.LastSeen = time.Duration(uint64(now) - uint64(1)<<62)
	bes := map[uint32]dataplane.Backend{1: {Addr: base.Backend.Addr(), Port: base.Backend.Port()}}
	cfg := xdp.DatapathConfig{TcpEstablishedTimeoutNs: uint64(time.Hour), TcpTransientTimeoutNs: uint64(time.Minute),
		UdpTimeoutNs: uint64(time.Minute)}

	tests := []struct {
		name      string
		flow      dataplane.Flow
		state     string
		idle      int64
		staleness string
	}{
		{"live", base, "established", 1, ""},
		{"unconfirmed", unconfirmed, "unconfirmed", 6, "expired (idle 6s, timeout 5s)"},
		{"ended", ended, "ended", 60, "ended by the agent (its backend left the service port)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			row := flowRow(tc.flow, "default/web:http", now)
			if row.State != tc.state || row.IdleSec != tc.idle {
				t.Errorf("state %q, idle %ds; want %q, %ds", row.State, row.IdleSec, tc.state, tc.idle)
			}
			if got := staleReason(tc.flow, bes, cfg, now); got != tc.staleness {
				t.Errorf("stale reason %q, want %q", got, tc.staleness)
			}
		})
	}
}
