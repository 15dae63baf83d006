package dataplane_test

import (
	"net/netip"
	"testing"
	"time"

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
	replyTuple := xdp.NatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
		Daddr: xdp.AddrToNet(client.Addr()), Dport: xdp.PortToNet(client.Port()), Proto: 6}
	reverseOf := func(frontend netip.AddrPort) xdp.NatEntry {
		return xdp.NatEntry{ClientAddr: xdp.AddrToNet(client.Addr()), ClientPort: xdp.PortToNet(client.Port()),
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
			var left xdp.NatEntry
			gone := dp.Maps.NAT.Lookup(replyTuple, &left) != nil
			if gone != tc.deleted {
				t.Errorf("reverse half held for %s: deleted %v, want %v", tc.holder, gone, tc.deleted)
			}
		})
	}
}

// A spill whose flow's forward entry is gone (evicted) stays while the
// flow may be alive: its backend exists and the spill is within the flow's
// timeout by its own date. Deleting it would free the flow's SNAT port
// while the backend still holds the connection.
func TestSpillOfAnEvictedFlowStaysWhileTheFlowMayLive(t *testing.T) {
	dp, d := loadSmall(t, nil)
	backend := netip.MustParseAddrPort("10.244.1.10:8080")
	if err := d.PutBackend(3, dataplane.Backend{Addr: backend.Addr(), Port: backend.Port()}); err != nil {
		t.Fatal(err)
	}
	now := uint64(dataplane.Now())
	snat := uint8(xdp.CtFlagsCT_F_SNAT)
	unconfirmed := uint8(xdp.CtFlagsCT_F_UNCONFIRMED)
	spills := []struct {
		name      string
		backendID uint32
		flags     uint8
		idle      time.Duration
		kept      bool
	}{
		{"confirmed, idle a minute", 3, snat, time.Minute, true},
		{"confirmed, past the established timeout", 3, snat, 7 * time.Hour, false},
		{"unconfirmed, idle a second", 3, snat | unconfirmed, time.Second, true},
		{"unconfirmed, past its hold", 3, snat | unconfirmed, 3 * time.Second, false},
		{"its backend gone", 4, snat, time.Second, false},
	}
	keyOf := func(i int) xdp.NatKey {
		return xdp.NatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
			Daddr: xdp.AddrToNet(netip.MustParseAddr("192.0.2.1")), Dport: xdp.PortToNet(uint16(40000 + i)), Proto: 6}
	}
	for i, s := range spills {
		e := xdp.NatEntry{ClientAddr: xdp.AddrToNet(netip.MustParseAddr("198.51.100.7")), ClientPort: xdp.PortToNet(uint16(5000 + i)),
			FrontendAddr: xdp.AddrToNet(netip.MustParseAddr("192.0.2.1")), FrontendPort: xdp.PortToNet(30080),
			BackendId: s.backendID, Flags: s.flags, LastSeenNs: now - uint64(s.idle)}
		if err := dp.Maps.NAT.Put(keyOf(i), e); err != nil {
			t.Fatal(err)
		}
	}
	trusted, deleted, err := d.TrustSNATSpillMarks()
	if err != nil {
		t.Fatal(err)
	}
	if trusted || deleted != 3 {
		t.Errorf("trusted %v, %d spills deleted; want untrusted (live flows' spills are unmarked), 3 deleted", trusted, deleted)
	}
	for i, s := range spills {
		var e xdp.NatEntry
		if kept := dp.Maps.NAT.Lookup(keyOf(i), &e) == nil; kept != s.kept {
			t.Errorf("%s: kept %v, want %v", s.name, kept, s.kept)
		}
	}
}

// Flows and DeleteFlow see unconfirmed flows too: a purge of a departed
// backend's flows must reach those still opening.
func TestUnconfirmedFlowsAreListedAndDeleted(t *testing.T) {
	dp, d := loadSmall(t, nil)
	client := netip.MustParseAddrPort("192.0.2.10:7001")
	frontend := netip.MustParseAddrPort("192.0.2.1:30080")
	backend := netip.MustParseAddrPort("10.244.0.5:8080")
	key := xdp.CtKey{Saddr: xdp.AddrToNet(client.Addr()), Sport: xdp.PortToNet(client.Port()),
		Daddr: xdp.AddrToNet(frontend.Addr()), Dport: xdp.PortToNet(frontend.Port()), Proto: 6}
	entry := xdp.CtEntry{BackendId: 3, BackendAddr: xdp.AddrToNet(backend.Addr()), BackendPort: xdp.PortToNet(backend.Port()),
		Flags: uint8(xdp.CtFlagsCT_F_UNCONFIRMED | xdp.CtFlagsCT_F_EXTERNAL), CreatedNs: 1, LastSeenNs: 1}
	if err := dp.Maps.CtUnconfirmed.Put(key, entry); err != nil {
		t.Fatal(err)
	}
	var listed []dataplane.Flow
	if err := d.Flows(func(f dataplane.Flow) bool { listed = append(listed, f); return true }); err != nil {
		t.Fatal(err)
	}
	if len(listed) != 1 || !listed[0].Unconfirmed || listed[0].Client != client {
		t.Fatalf("flows listed: %+v; want the one unconfirmed flow", listed)
	}
	if n, err := d.FlowEntries(); err != nil || n != 1 {
		t.Fatalf("FlowEntries = %d, %v; want 1", n, err)
	}
	if deleted, err := d.DeleteFlow(listed[0]); err != nil || !deleted {
		t.Fatalf("DeleteFlow = %v, %v", deleted, err)
	}
	if _, ok, err := d.Flow(listed[0].Key()); err != nil || ok {
		t.Fatalf("after DeleteFlow the flow is still tracked (%v, %v)", ok, err)
	}
}
