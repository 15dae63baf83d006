package xdp_test

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/packet"
)

// withICMPRate loads the datapath with this ICMP error rate limit.
func withICMPRate(rate uint32) fixtureOption {
	return func(o *loader.Options) { o.ICMPRate = rate }
}

// onOneCPU runs fn in the fixture's namespace on a thread bound to one
// CPU: the ICMP error budget is per CPU.
func (f *fixture) onOneCPU(fn func() error) {
	f.t.Helper()
	err := f.ns.Do(func() error {
		var saved, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &saved); err != nil {
			return err
		}
		one.Set(runtime.NumCPU() - 1)
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &saved) //nolint:errcheck // best effort: the thread goes back to the runtime
		return fn()
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// ICMP errors the datapath builds come out of one budget per CPU, shared by
// XDP and TC: a burst of 50, then one per 1/rate seconds. A refusal over it
// is dropped unanswered and counted; with no limit every one is answered.
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
