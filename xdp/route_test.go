package xdp_test

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
)

// While the node routes by destination alone, a new flow takes the next
// hop a new flow to the same backend found less than a second ago, on the
// same interface with the same TOS; anything else, and every new flow
// while the switch is off, is routed by a FIB lookup of its own. The test
// tells the two apart by changing the gateway's MAC between two flows: a
// reused route still has the old one.
func TestNewFlowsReuseTheirBackendsRoute(t *testing.T) {
	newGwMAC := net.HardwareAddr{0x02, 0x6a, 0, 0, 0, 0x99}
	cases := []struct {
		name   string
		on     bool
		second func(f *fixture, fr *packet.Frame) int // changes the second flow, returns its interface
		reused bool
	}{
		{"same backend, interface and TOS", true, func(f *fixture, _ *packet.Frame) int { return f.nic0 }, true},
		{"switch off", false, func(f *fixture, _ *packet.Frame) int { return f.nic0 }, false},
		{"other TOS", true, func(f *fixture, fr *packet.Frame) int { fr.TOS = 0x10; return f.nic0 }, false},
		{"other interface", true, func(f *fixture, _ *packet.Frame) int { return f.nic1 }, false},
		{"packet above 1280 bytes", true, func(f *fixture, fr *packet.Frame) int {
			fr.Payload = []byte(strings.Repeat("x", 1300))
			return f.nic0
		}, false},
		{"route older than a second", true, func(f *fixture, _ *packet.Frame) int {
			time.Sleep(1100 * time.Millisecond)
			return f.nic0
		}, false},
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
			if _, err := f.maps.SetRouteByDestination(tc.on); err != nil {
				t.Fatal(err)
			}

			// The routes are per CPU: both flows run on one.
			var first, second result
			var ifindex int
			fr := tcpFrame(clientAddr, 20002, nodeAddr, nodePort, packet.SYN, "")
			before := f.counters()["new_flow"]
			err := f.ns.Do(func() error {
				var all, one unix.CPUSet
				if err := unix.SchedGetaffinity(0, &all); err != nil {
					return err
				}
				one.Set(0)
				if err := unix.SchedSetaffinity(0, &one); err != nil {
					return err
				}
				defer unix.SchedSetaffinity(0, &all)
				var err error
				first, err = runXDP(f.prog, tcpFrame(clientAddr, 20001, nodeAddr, nodePort, packet.SYN, "").Bytes(), f.nic0)
				if err != nil {
					return err
				}
				if _, err := f.ns.NS.IP("neigh", "replace", "10.1.0.2", "lladdr", newGwMAC.String(), "dev", "nic1", "nud", "permanent"); err != nil {
					return err
				}
				ifindex = tc.second(f, &fr)
				second, err = runXDP(f.prog, fr.Bytes(), ifindex)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
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
			if out.Dst != remotePod2 || out.Src != nic1Addr {
				t.Errorf("second flow translated to %s -> %s, want %s -> %s", out.Src, out.Dst, nic1Addr, remotePod2)
			}
		})
	}
}
