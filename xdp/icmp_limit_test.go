package xdp_test

import (
	"strings"
	"testing"
	"time"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

// withICMPRate loads the datapath with this ICMP error rate limit.
func withICMPRate(rate uint32) fixtureOption {
	return func(o *loader.Options) { o.ICMPRate = rate }
}

// ICMP port unreachables the datapath builds come out of one budget per
// CPU, shared by XDP and TC: a burst of 50, then one per 1/rate seconds. A
// refusal over it is dropped unanswered and counted; with no limit every
// one is answered. Fragmentation needed does not draw on it.
func TestICMPErrorsAreRateLimited(t *testing.T) {
	type burst struct {
		after    time.Duration // pause before the burst
		sent     int
		answered int
	}
	cases := []struct {
		name   string
		rate   uint32
		bursts []burst
	}{
		{"one a second", 1, []burst{
			{0, 50, 50},                     // the burst allowance
			{30 * time.Millisecond, 5, 0},   // the clock moved, less than an interval
			{1100 * time.Millisecond, 5, 1}, // one interval later: one more
		}},
		{"no limit", 0, []burst{{0, 60, 60}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, withICMPRate(tc.rate))
			f.program(service{
				svcID: 2, tableID: 2,
				frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30053, Proto: packet.UDP}},
				flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
			})
			f.program(clusterService(packet.UDP, 53))
			f.program(webService())
			f.ns.IP("link", "set", "nic1", "mtu", "1280")

			var sent, answered uint64
			for _, b := range tc.bursts {
				sent += uint64(b.sent)
				answered += uint64(b.answered)
			}
			f.expectCounters(map[string]uint64{"reject_icmp": answered, "drop_icmp_rate_limit": sent - answered}, func() {
				f.onOneCPU(func() error {
					port := uint16(5000)
					for n, b := range tc.bursts {
						time.Sleep(b.after)
						tx := 0
						for range b.sent {
							port++
							in := udpFrame(clientAddr, port, nodeAddr, 30053, "query")
							r, err := runXDP(f.prog, in.Bytes(), f.nic0)
							if err != nil {
								return err
							}
							switch r.verdict {
							case xdpTX:
								if out := decode(t, r.out); out.Proto != packet.ICMP || out.ICMPType != 3 || out.ICMPCode != 3 {
									t.Errorf("answer is proto %d type %d code %d, want ICMP port unreachable",
										out.Proto, out.ICMPType, out.ICMPCode)
								}
								tx++
							case xdpDrop:
							default:
								t.Errorf("refusal: verdict %d", r.verdict)
							}
						}
						if tx != b.answered {
							t.Errorf("burst %d: %d of %d answered, want %d", n, tx, b.sent, b.answered)
						}
					}
					return nil
				})
			})

			// The TC programs draw on the same budget.
			wantTC := map[string]uint64{"reject_icmp": 1}
			wantVerdict := uint32(tcActRedirect)
			if tc.rate != 0 {
				wantTC = map[string]uint64{"drop_icmp_rate_limit": 1}
				wantVerdict = tcActShot
			}
			// Path MTU discovery is never starved by a spent budget.
			f.expectCounters(map[string]uint64{"new_flow": 1, "reject_too_big": 1}, func() {
				f.onOneCPU(func() error {
					in := tcpFrame(clientAddr, 0, nodeAddr, nodePort, packet.SYN, strings.Repeat("x", 1280))
					in.SrcPort = findClientPort(t, webService(), in, 1)
					r, err := runXDP(f.prog, in.Bytes(), f.nic0)
					if err != nil {
						return err
					}
					if tooBig, mtu := answeredTooBig(t, r.out); r.verdict != xdpTX || !tooBig || mtu != 1280 {
						t.Errorf("too-big packet after the refusals: verdict %d, fragmentation needed %v (MTU %d), want one with MTU 1280",
							r.verdict, tooBig, mtu)
					}
					return nil
				})
			})

			f.expectCounters(wantTC, func() {
				f.onOneCPU(func() error {
					in := udpFrame(podAddr, 34569, clusterIP, 53, "query")
					in.SrcMAC = localPodMAC
					verdict, _, err := runTC(f.dp.PodProgram(), in.Bytes(), f.pod0)
					if err == nil && verdict != wantVerdict {
						t.Errorf("TC refusal after the XDP ones: verdict %d, want %d", int32(verdict), int32(wantVerdict))
					}
					return err
				})
			})
		})
	}
}

// The budget is pinned, so an agent restarted with a higher rate finds
// what the lower rate left (its virtual clock up to a burst of the old
// intervals ahead): that counts as one spent burst at the new rate, not as
// a minute of silence.
func TestICMPBudgetLeftByALowerRate(t *testing.T) {
	f := newFixture(t, withICMPRate(1))
	f.program(service{
		svcID: 2, tableID: 2,
		frontends: []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30053, Proto: packet.UDP}},
		flags:     dataplane.FrontendExternal | dataplane.FrontendSNATRemote,
	})
	refuse := func(port uint16) uint32 {
		r, err := runXDP(f.prog, udpFrame(clientAddr, port, nodeAddr, 30053, "query").Bytes(), f.nic0)
		if err != nil {
			t.Fatal(err)
		}
		return r.verdict
	}
	f.onOneCPU(func() error {
		for i := range 60 { // the burst and beyond: the clock is ~50 s ahead
			refuse(uint16(6000 + i))
		}
		// What a restart with --icmp-rate 1000 writes.
		var cfg xdp.DatapathConfig
		if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
			return err
		}
		cfg.IcmpIntervalNs = uint32(time.Millisecond)
		if err := f.dp.Maps.Config.Put(uint32(0), cfg); err != nil {
			return err
		}
		if v := refuse(7000); v != xdpDrop {
			t.Errorf("right after the change: verdict %d, want the burst counted as spent (drop)", v)
		}
		time.Sleep(20 * time.Millisecond)
		if v := refuse(7001); v != xdpTX {
			t.Errorf("intervals of the new rate later: verdict %d, want an answer (TX)", v)
		}
		return nil
	})
}
