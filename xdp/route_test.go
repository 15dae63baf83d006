package xdp_test

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// While the agent's lease runs (the node routes by destination alone), a
// new flow takes the next hop a new flow to the same backend address found
// less than a second ago, on the same interface with the same DSCP;
// anything else, and every new flow without a lease, is routed by a FIB
// lookup of its own. The test tells the two apart by changing the
// gateway's MAC between two flows: a reused route still has the old one.
func TestNewFlowsReuseTheirBackendsRoute(t *testing.T) {
	newGwMAC := net.HardwareAddr{0x02, 0x6a, 0, 0, 0, 0x99}
	leased := dataplane.Now() + time.Hour
	same := func(f *fixture, _ *packet.Frame) int { return f.nic0 }
	cases := []struct {
		name   string
		lease  time.Duration
		second func(f *fixture, fr *packet.Frame) int // changes the second flow, returns its interface
		reused bool
		dst    netip.Addr // of the second flow; remotePod2 if not set
	}{
		{"same backend, interface and DSCP", leased, same, true, netip.Addr{}},
		{"ECN bits differ", leased, func(f *fixture, fr *packet.Frame) int { fr.TOS = 0x01; return f.nic0 }, true, netip.Addr{}},
		{"no lease", 0, same, false, netip.Addr{}},
		{"lease ran out", dataplane.Now() - time.Second, same, false, netip.Addr{}},
		{"other DSCP", leased, func(f *fixture, fr *packet.Frame) int { fr.TOS = 0x10; return f.nic0 }, false, netip.Addr{}},
		{"other interface", leased, func(f *fixture, _ *packet.Frame) int { return f.nic1 }, false, netip.Addr{}},
		{"packet above 1280 bytes", leased, func(f *fixture, fr *packet.Frame) int {
			fr.Payload = []byte(strings.Repeat("x", 1300))
			return f.nic0
		}, false, netip.Addr{}},
		{"route older than a second", leased, func(f *fixture, _ *packet.Frame) int {
			time.Sleep(1100 * time.Millisecond)
			return f.nic0
		}, false, netip.Addr{}},
		{"backend id now at another address", leased, func(f *fixture, _ *packet.Frame) int {
			if err := f.maps.PutBackend(2, backendRemote1); err != nil {
				f.t.Fatal(err)
			}
			return f.nic0
		}, false, remotePod1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.program(service{
				svcID: 1, tableID: 1,
				frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: nodePort, Proto: packet.TCP}},
				flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
				backends:  map[uint32]dataplane.Backend{2: backendRemote2},
				table:     []uint32{2},
			})
			if err := f.maps.AllowRouteReuse(tc.lease); err != nil {
				t.Fatal(err)
			}

			// The routes are per CPU: both flows run on one.
			before := f.counters()["new_flow"]
			first := f.runOnOneCPU(tcpFrame(clientAddr, 20001, nodeAddr, nodePort, packet.SYN, "").Bytes(), f.nic0)
			// In process (no command to start): the reuse cases need the
			// second flow within a second of the first.
			if err := f.ns.Do(func() error {
				return netlink.NeighSet(&netlink.Neigh{LinkIndex: f.nic1, Family: netlink.FAMILY_V4,
					State: netlink.NUD_PERMANENT, IP: net.ParseIP("10.1.0.2"), HardwareAddr: newGwMAC})
			}); err != nil {
				t.Fatal(err)
			}
			fr := tcpFrame(clientAddr, 20002, nodeAddr, nodePort, packet.SYN, "")
			ifindex := tc.second(f, &fr)
			second := f.runOnOneCPU(fr.Bytes(), ifindex)
			f.expectVerdict(first, xdpRedirect)
			if out := decode(t, first.out); !bytes.Equal(out.DstMAC, gwMAC) {
				t.Fatalf("first flow sent to %s, want the gateway %s", out.DstMAC, gwMAC)
			}
			if n := f.counters()["new_flow"] - before; n != 2 {
				t.Fatalf("the two frames counted as %d new flows, want 2", n)
			}
			out := decode(t, second.out)
			want := newGwMAC
			if tc.reused {
				want = gwMAC
			}
			if !bytes.Equal(out.DstMAC, want) {
				t.Errorf("second flow sent to %s, want %s (route reused: %v)", out.DstMAC, want, tc.reused)
			}
			dst := remotePod2
			if tc.dst.IsValid() {
				dst = tc.dst
			}
			if out.Dst != dst || out.Src != nic1Addr {
				t.Errorf("second flow translated to %s -> %s, want %s -> %s", out.Src, out.Dst, nic1Addr, dst)
			}
		})
	}
}

// runOnOneCPU is run on the lowest CPU the test may use, for state the
// datapath keeps per CPU.
func (f *fixture) runOnOneCPU(frame []byte, ifindex int) result {
	f.t.Helper()
	var res result
	f.onOneCPU(func() error {
		var err error
		res, err = runXDP(f.prog, frame, ifindex)
		return err
	})
	return res
}
