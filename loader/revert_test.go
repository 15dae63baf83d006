package loader_test

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// A start that fails after the load, its datapath reverted and closed
// without committing its pins, leaves the datapath that ran before as it
// was: the pins name its maps, every hook runs its programs (a link
// updated in place, or moved to another XDP mode, gets the earlier program
// back; one created where none ran is removed), its configuration and
// flows are there, and the next start copies from its maps what it
// tracked meanwhile.
func TestFailedStartLeavesTheEarlierDatapath(t *testing.T) {
	testenv.RequirePrivileged(t)
	errInjected := errors.New("injected")
	for _, tc := range []struct {
		name string
		// earlier attaches the running datapath besides x0 (native XDP).
		earlier func(dp *loader.Datapath) error
		// failing is the failed start's: it attaches, and returns the
		// error of the step that fails.
		failing func(dp *loader.Datapath) error
		// faulty, if set, gives the failed start's options faults.
		faulty  func(loader.Options) loader.Options
		wantErr string
	}{
		{name: "an interface that does not exist",
			failing: func(dp *loader.Datapath) error {
				if _, err := dp.AttachNIC("x0", loader.XDPNative); err != nil {
					return fmt.Errorf("unexpected: %w", err)
				}
				_, err := dp.AttachNIC("nosuch0", loader.XDPNative)
				return err
			},
			wantErr: "interface nosuch0: no such interface"},
		{name: "XDP mode changed",
			failing: func(dp *loader.Datapath) error {
				if _, err := dp.AttachNIC("x0", loader.XDPGeneric); err != nil {
					return fmt.Errorf("unexpected: %w", err)
				}
				_, err := dp.AttachNIC("nosuch0", loader.XDPNative)
				return err
			},
			wantErr: "interface nosuch0: no such interface"},
		{name: "interface attached afresh, pod interface updated",
			earlier: func(dp *loader.Datapath) error { return dp.AttachPod("x4") },
			failing: func(dp *loader.Datapath) error {
				for _, name := range []string{"x0", "x2"} {
					if _, err := dp.AttachNIC(name, loader.XDPNative); err != nil {
						return fmt.Errorf("unexpected: %w", err)
					}
				}
				if err := dp.AttachPod("x4"); err != nil {
					return fmt.Errorf("unexpected: %w", err)
				}
				_, err := dp.AttachNIC("nosuch0", loader.XDPNative)
				return err
			},
			wantErr: "interface nosuch0: no such interface"},
		{name: "XDP taken off",
			failing: func(dp *loader.Datapath) error {
				if _, err := dp.AttachNIC("x0", loader.XDPOff); err != nil {
					return fmt.Errorf("unexpected: %w", err)
				}
				_, err := dp.AttachNIC("nosuch0", loader.XDPNative)
				return err
			},
			wantErr: "interface nosuch0: no such interface"},
		{name: "the pins cannot be moved into place",
			faulty: func(o loader.Options) loader.Options {
				return loader.WithPinRenames(o, func(from, to string) error {
					if filepath.Base(from) == "nat" {
						return errInjected
					}
					return os.Rename(from, to)
				})
			},
			failing: func(dp *loader.Datapath) error {
				if _, err := dp.AttachNIC("x0", loader.XDPNative); err != nil {
					return fmt.Errorf("unexpected: %w", err)
				}
				return dp.CommitPins()
			},
			wantErr: "injected"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "rv")
			peer := testenv.NewNetns(t, "rvp")
			testenv.Veth(t, ns, "x0", peer, "x1")
			testenv.Veth(t, ns, "x2", peer, "x3")
			testenv.Veth(t, ns, "x4", peer, "x5")
			ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0")
			root := testenv.BPFFS(t)
			opts := smallOptions(root)
			// Larger maps, as the failed start and the next are given.
			bigger := opts
			bigger.ConntrackMax, bigger.NATMax = 2*opts.ConntrackMax, 2*opts.NATMax
			bigger.UDPTimeout = 2 * opts.UDPTimeout
			flow := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 80, Proto: 6}
			meanwhile := xdp.CtKey{Saddr: 5, Daddr: 2, Sport: 6, Dport: 80, Proto: 6}

			// Runs in the namespace's thread: failures are returned.
			var running *loader.Datapath
			if err := ns.Do(func() error {
				var err error
				if running, err = loadertest.Load(opts, nil); err != nil {
					return err
				}
				if _, err := running.AttachNIC("x0", loader.XDPNative); err != nil {
					return err
				}
				if tc.earlier != nil {
					if err := tc.earlier(running); err != nil {
						return err
					}
				}
				return running.Maps.Conntrack.Put(flow, xdp.CtEntry{BackendId: 7})
			}); err != nil {
				t.Fatal(err)
			}
			defer running.Close()
			var config xdp.DatapathConfig
			if err := running.Maps.Config.Lookup(uint32(0), &config); err != nil {
				t.Fatal(err)
			}
			pinned := loadertest.PinnedMapIDs(t, root)
			progs := loadertest.LinkPrograms(t, root)

			failingOpts := bigger
			if tc.faulty != nil {
				failingOpts = tc.faulty(bigger)
			}
			var startErr error
			if err := ns.Do(func() error {
				dp, err := loader.Load(failingOpts, nil)
				if err != nil {
					return err
				}
				startErr = tc.failing(dp)
				revertErr := dp.Revert()
				dp.Close()
				return revertErr
			}); err != nil {
				t.Fatal(err)
			}
			if startErr == nil || !strings.Contains(startErr.Error(), tc.wantErr) {
				t.Fatalf("failed start: %v, want an error with %q", startErr, tc.wantErr)
			}

			expectPins(t, root, pinned)
			if got := loadertest.LinkPrograms(t, root); !maps.Equal(got, progs) {
				t.Errorf("after the failed start, the pinned links run %v; want those before: %v", got, progs)
			}
			var after xdp.DatapathConfig
			if err := running.Maps.Config.Lookup(uint32(0), &after); err != nil || after != config {
				t.Errorf("config after the failed start %+v (%v), want the earlier one %+v", after, err, config)
			}
			var e xdp.CtEntry
			if err := running.Maps.Conntrack.Lookup(flow, &e); err != nil || e.BackendId != 7 {
				t.Errorf("the earlier conntrack after the failed start: %+v (%v), want backend 7", e, err)
			}
			if err := running.Maps.Conntrack.Put(meanwhile, xdp.CtEntry{BackendId: 8}); err != nil {
				t.Fatal(err)
			}

			if err := ns.Do(func() error {
				// The interfaces run what they ran before, as the
				// kernel sees them.
				for name, want := range map[string]ebpf.ProgramID{"x0": progs["xdp-native-x0"], "x2": 0} {
					dev, err := netlink.LinkByName(name)
					if err != nil {
						return err
					}
					var got ebpf.ProgramID
					if x := dev.Attrs().Xdp; x != nil && x.Attached {
						got = ebpf.ProgramID(x.ProgId)
					}
					if got != want {
						t.Errorf("%s runs XDP program %d, want %d", name, got, want)
					}
				}

				// The next start copies from the earlier maps.
				dp, err := loader.Load(bigger, nil)
				if err != nil {
					return err
				}
				defer dp.Close()
				if _, err := dp.AttachNIC("x0", loader.XDPNative); err != nil {
					return err
				}
				if err := dp.CommitPins(); err != nil {
					return err
				}
				if got := dp.Maps.Conntrack.MaxEntries(); got != bigger.ConntrackMax {
					t.Errorf("conntrack of %d entries, want %d", got, bigger.ConntrackMax)
				}
				for key, backend := range map[xdp.CtKey]uint32{flow: 7, meanwhile: 8} {
					var e xdp.CtEntry
					if err := dp.Maps.Conntrack.Lookup(key, &e); err != nil || e.BackendId != backend {
						t.Errorf("flow %+v in the resized conntrack: %+v (%v), want backend %d", key, e, err, backend)
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if now := loadertest.PinnedMapIDs(t, root); now["conntrack"] == pinned["conntrack"] {
				t.Error("the start that succeeded left the earlier conntrack pinned")
			}
		})
	}
}
