package dataplane_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// DeleteFlow deletes a flow's reverse half only while it is that flow's:
// the same client address and port through another frontend to the same
// backend has the same reply tuple, and the nat map may hold it for that
// other flow.
func TestDeleteFlowKeepsAnotherFlowsReverseHalf(t *testing.T) {
	dp, d := loadSmall(t, nil)
	client := netip.MustParseAddrPort("192.0.2.10:7001")
	backend := netip.MustParseAddrPort("10.244.0.5:8080")
	nodePort := netip.MustParseAddrPort("192.0.2.1:30080")
	lb := netip.MustParseAddrPort("203.0.113.10:80")
	replyTuple := xdp.NicNatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
		Daddr: xdp.AddrToNet(client.Addr()), Dport: xdp.PortToNet(client.Port()), Proto: 6}
	reverseOf := func(frontend netip.AddrPort) xdp.NicNatEntry {
		return xdp.NicNatEntry{ClientAddr: xdp.AddrToNet(client.Addr()), ClientPort: xdp.PortToNet(client.Port()),
			FrontendAddr: xdp.AddrToNet(frontend.Addr()), FrontendPort: xdp.PortToNet(frontend.Port()), BackendId: 3}
	}

	for _, tc := range []struct {
		name    string
		holder  netip.AddrPort // the frontend of the flow the nat map holds the tuple for
		deleted bool
	}{
		{"its own", nodePort, true},
		{"another frontend's", lb, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := dp.Maps.NAT.Put(replyTuple, reverseOf(tc.holder)); err != nil {
				t.Fatal(err)
			}
			purged := dataplane.Flow{Client: client, Frontend: nodePort, Backend: backend, BackendID: 3, Proto: 6}
			if _, err := d.DeleteFlow(purged); err != nil {
				t.Fatal(err)
			}
			var left xdp.NicNatEntry
			gone := dp.Maps.NAT.Lookup(replyTuple, &left) != nil
			if gone != tc.deleted {
				t.Errorf("reverse half held for %s: deleted %v, want %v", tc.holder, gone, tc.deleted)
			}
		})
	}
}
