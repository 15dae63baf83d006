package loader_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// loadEarlier loads a datapath with opts, commits its pins and closes it:
// the state an earlier agent leaves for the load under test.
func loadEarlier(t *testing.T, opts loader.Options) {
	t.Helper()
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
}

func smallOptions(root string) loader.Options {
	opts := loadertest.SmallOptions(root)
	opts.AffinityMax, opts.BackendsMax = 1024, 256
	return opts
}

func TestRestartAdoptsMapsAndResizeKeepsFlows(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4, Proto: 6}
	if err := dp.Maps.Conntrack.Put(key, xdp.CtEntry{BackendId: 7}); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.Backends.Put(uint32(5), xdp.Backend{Addr: 9, Port: 80}); err != nil {
		t.Fatal(err)
	}
	// As an agent that trusted the SNAT spill marks leaves it.
	if err := dp.Maps.Config.Put(uint32(0), xdp.DatapathConfig{SnatSpillsMarked: 1}); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	// Same sizes: everything is adopted as it was, except that the
	// datapath starts without trusting the spill marks (programs of the
	// earlier one may still run).
	dp, err = loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	var cfg xdp.DatapathConfig
	if err := dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil || cfg.SnatSpillsMarked != 0 {
		t.Errorf("config after a restart: %+v, %v; want spill marks untrusted", cfg, err)
	}
	var e xdp.CtEntry
	if err := dp.Maps.Conntrack.Lookup(key, &e); err != nil || e.BackendId != 7 {
		t.Fatalf("flow lost on restart: %+v %v", e, err)
	}
	var b xdp.Backend
	if err := dp.Maps.Backends.Lookup(uint32(5), &b); err != nil || b.Addr != 9 {
		t.Fatalf("backend lost on restart: %+v %v", b, err)
	}
	dp.Close()

	// A larger conntrack: flows are copied into the new map (the
	// backends array, resized too, by TestResizeKeepsWhatTheControlPlaneWrote).
	opts.ConntrackMax, opts.BackendsMax = 4096, 512
	dp, err = loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if dp.Maps.Conntrack.MaxEntries() != 4096 {
		t.Fatalf("conntrack has %d entries, want 4096", dp.Maps.Conntrack.MaxEntries())
	}
	if err := dp.Maps.Conntrack.Lookup(key, &e); err != nil || e.BackendId != 7 {
		t.Fatalf("flow not carried into the resized conntrack: %+v %v", e, err)
	}
}

// A map pinned by an earlier version that this one no longer has is
// unpinned at load; the maps it has are adopted as usual.
func TestLoadUnpinsRetiredMaps(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	loadEarlier(t, opts)
	retired, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer retired.Close()
	path := filepath.Join(loader.Dir(root), "maps", "snat_hands")
	if err := retired.Pin(path); err != nil {
		t.Fatal(err)
	}

	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("retired map still pinned at %s (%v)", path, err)
	}
	if _, err := os.Stat(filepath.Join(loader.Dir(root), "maps", "conntrack")); err != nil {
		t.Fatalf("conntrack no longer pinned: %v", err)
	}
}

// The route cache of new flows starts empty at every load, even when an
// earlier version pinned one of the same size with another layout.
func TestLoadStartsTheRouteCacheAfresh(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	path := filepath.Join(loader.Dir(root), "maps", "new_flow_routes")
	pinnedID := func() ebpf.MapID {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		return id
	}
	for range 2 {
		loadEarlier(t, opts)
	}
	first := pinnedID()
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if pinnedID() == first {
		t.Fatal("the route cache pinned before the load was adopted")
	}
}

// The CLI opens a datapath pinned by a version without route reuse: the
// lease map is optional, and reuse reads as off.
func TestOpenPinnedWithoutRouteReuse(t *testing.T) {
	root := testenv.BPFFS(t)
	dp, err := loadertest.Load(smallOptions(root), nil)
	if err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if err := os.Remove(filepath.Join(loader.Dir(root), "maps", "route_reuse")); err != nil {
		t.Fatal(err)
	}
	maps, err := loader.OpenPinned(root)
	if err != nil {
		t.Fatalf("open the pins of a datapath without route_reuse: %v", err)
	}
	defer maps.Close()
	if maps.RouteReuse != nil || maps.Conntrack == nil {
		t.Fatalf("maps opened: route_reuse %v, conntrack %v", maps.RouteReuse, maps.Conntrack)
	}
	on, err := dataplane.New(maps).RouteReuseAllowed()
	if err != nil || on {
		t.Fatalf("RouteReuseAllowed = %v, %v; want false, nil", on, err)
	}
}

// A datapath pinned by a version without the table of unconfirmed flows:
// the CLI opens it and lists its flows, and an agent of this version loads
// over it, keeping the flows it pinned and adding the table.
func TestPinsWithoutUnconfirmedFlowsAreAdopted(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	flow := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4, Proto: 6}
	if err := dp.Maps.Conntrack.Put(flow, xdp.CtEntry{BackendId: 7}); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if err := os.Remove(filepath.Join(loader.Dir(root), "maps", "ct_unconfirmed")); err != nil {
		t.Fatal(err)
	}

	maps, err := loader.OpenPinned(root)
	if err != nil {
		t.Fatalf("open the pins of a datapath without ct_unconfirmed: %v", err)
	}
	if maps.CtUnconfirmed != nil {
		t.Fatal("ct_unconfirmed opened, but it was not pinned")
	}
	n, err := dataplane.New(maps).FlowEntries()
	maps.Close()
	if err != nil || n != 1 {
		t.Fatalf("FlowEntries = %d, %v; want the one pinned flow", n, err)
	}

	again, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatalf("load over pins without ct_unconfirmed: %v", err)
	}
	defer again.Close()
	var e xdp.CtEntry
	if err := again.Maps.Conntrack.Lookup(flow, &e); err != nil || e.BackendId != 7 {
		t.Fatalf("the pinned flow after the load: %+v, %v", e, err)
	}
	if again.Maps.CtUnconfirmed == nil || again.Maps.CtUnconfirmed.MaxEntries() != opts.UnconfirmedFlows() {
		t.Fatalf("ct_unconfirmed after the load: %v", again.Maps.CtUnconfirmed)
	}
}

// A larger --conntrack-max resizes the table of unconfirmed flows too,
// and the flows waiting there for confirmation are copied over.
func TestResizeKeepsUnconfirmedFlows(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	flow := xdp.CtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4, Proto: 6}
	waiting := xdp.CtEntry{BackendId: 7, LastSeenNs: uint64(dataplane.Now()), Flags: uint8(xdp.CtFlagsCT_F_UNCONFIRMED)}
	if err := dp.Maps.CtUnconfirmed.Put(flow, waiting); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	bigger := opts
	bigger.ConntrackMax, bigger.NATMax = 8*opts.ConntrackMax, 8*opts.NATMax
	again, err := loadertest.Load(bigger, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if got, want := again.Maps.CtUnconfirmed.MaxEntries(), bigger.UnconfirmedFlows(); got != want || want == opts.UnconfirmedFlows() {
		t.Fatalf("ct_unconfirmed holds %d flows, want %d (was %d)", got, want, opts.UnconfirmedFlows())
	}
	var e xdp.CtEntry
	if err := again.Maps.CtUnconfirmed.Lookup(flow, &e); err != nil || e != waiting {
		t.Fatalf("the unconfirmed flow after the resize: %+v, %v; want %+v", e, err, waiting)
	}
}

// A new SNAT range moves the claimed SNAT slots to where the new layout
// puts them, so replies of live SNAT flows keep finding their flow.
func TestResizeMovesSNATSlots(t *testing.T) {
	root := testenv.BPFFS(t)
	opts, dp, backend, node, slot := loadWithSNATSlot(t, root)
	// The backend's flows use the last bucket, which the new layout no
	// longer has: the move gives the backend another.
	_, buckets := putSlotInLastBucket(t, dp, backend, node, slot)
	dp.Close()

	opts.SNATPorts = xdp.SNATPorts{{Min: 40000, Max: 49999}}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if want := opts.SNATSlots(); dp.Maps.SNATSlots.MaxEntries() != want {
		t.Fatalf("SNAT slots sized %d, want %d", dp.Maps.SNATSlots.MaxEntries(), want)
	}
	if opts.SNATBuckets() >= buckets {
		t.Fatalf("the new layout has %d buckets, want fewer than %d", opts.SNATBuckets(), buckets)
	}
	expectSlotAtHint(t, dp, backend, node, slot)
}

// A SNAT range shifted (or widened with fewer buckets) can keep the slots
// map's size: the slots are moved all the same, to where the new range
// puts their ports.
func TestShiftedSNATRangeMovesSlots(t *testing.T) {
	root := testenv.BPFFS(t)
	opts, dp, backend, node, slot := loadWithSNATSlot(t, root)
	putSlotInLastBucket(t, dp, backend, node, slot)
	size := dp.Maps.SNATSlots.MaxEntries()
	dp.Close()

	opts.SNATPorts = xdp.SNATPorts{{Min: 40400, Max: 41399}} // port 40500 stays in it
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	if got := dp.Maps.SNATSlots.MaxEntries(); got != size {
		t.Fatalf("SNAT slots sized %d, want %d as before: the case needs a map of the same size", got, size)
	}
	expectSlotAtHint(t, dp, backend, node, slot)
}

// An agent killed after its load wrote a new SNAT range into the pinned
// configuration, before its commit, leaves slots laid out for the old
// range under a configuration naming the new one: the next start finds
// them misplaced and moves them all the same.
func TestSlotsLeftByAKilledStartAreMoved(t *testing.T) {
	root := testenv.BPFFS(t)
	opts, dp, backend, node, slot := loadWithSNATSlot(t, root)
	putSlotInLastBucket(t, dp, backend, node, slot)
	dp.Close()

	opts.SNATPorts = xdp.SNATPorts{{Min: 40400, Max: 41399}}
	killed, err := loader.Load(opts, nil) // neither committed nor reverted
	if err != nil {
		t.Fatal(err)
	}
	killed.Close()
	running, err := loader.OpenPinned(root)
	if err != nil {
		t.Fatal(err)
	}
	var cfg xdp.DatapathConfig
	err = running.Config.Lookup(uint32(0), &cfg)
	running.Close()
	if err != nil || cfg.SnatPortMin != 40400 {
		t.Fatalf("pinned configuration %+v (%v): the case needs the new range written", cfg, err)
	}

	dp, err = loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	expectSlotAtHint(t, dp, backend, node, slot)
}

// SNAT slots pinned by a version that placed them by a hash of their
// backend, without bucket hints, are moved to a bucket given in turn.
func TestSlotsPinnedWithoutHintsAreMoved(t *testing.T) {
	root := testenv.BPFFS(t)
	opts, dp, backend, node, slot := loadWithSNATSlot(t, root)
	// Anywhere but the first bucket, which the move will hand out.
	if err := dp.Maps.SNATSlots.Put(xdp.SNATSlot(1, 40500, xdp.SNATPorts{{Min: 40000, Max: 40999}}), slot); err != nil {
		t.Fatal(err)
	}
	dp.Close()
	if err := os.Remove(filepath.Join(loader.Dir(root), "maps", "snat_bucket_hints")); err != nil {
		t.Fatal(err)
	}

	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	expectSlotAtHint(t, dp, backend, node, slot)
	var stale xdp.SnatSlot
	if err := dp.Maps.SNATSlots.Lookup(xdp.SNATSlot(1, 40500, xdp.SNATPorts{{Min: 40000, Max: 40999}}), &stale); err != nil || stale.Key.Proto != 0 {
		t.Fatalf("the slot's old place still holds %+v (%v)", stale, err)
	}
}

// loadWithSNATSlot loads a datapath with SNAT ports 40000-40999 (three
// buckets) and returns a claimed slot of port 40500 to place in it.
func loadWithSNATSlot(t *testing.T, root string) (loader.Options, *loader.Datapath, netip.AddrPort, netip.Addr, xdp.SnatSlot) {
	t.Helper()
	opts := smallOptions(root)
	opts.SNATPorts = xdp.SNATPorts{{Min: 40000, Max: 40999}}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	backend := netip.MustParseAddrPort("10.244.1.10:8080")
	node := netip.MustParseAddr("10.1.0.1")
	slot := xdp.SnatSlot{Key: xdp.NatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
		Daddr: xdp.AddrToNet(node), Dport: xdp.PortToNet(40500), Proto: 6}, Generation: 1}
	slot.Rev.ClientPort = xdp.PortToNet(5555)
	return opts, dp, backend, node, slot
}

// putSlotInLastBucket gives backend the last SNAT bucket of the loaded
// layout, as a running datapath does in turn, and puts the claimed slot
// of port 40500 there. It returns the backend's key in the hints and the
// number of buckets.
func putSlotInLastBucket(t *testing.T, dp *loader.Datapath, backend netip.AddrPort, node netip.Addr, slot xdp.SnatSlot) (hint, buckets uint32) {
	t.Helper()
	buckets = dp.Options().SNATBuckets()
	hint = xdp.SNATHint(backend, node, slot.Key.Proto)
	// A hint is its bucket plus one: 0 is no bucket.
	if err := dp.Maps.SNATBucketHints.Put(hint, buckets); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.SNATSlots.Put(xdp.SNATSlot(buckets-1, 40500, xdp.SNATPorts{{Min: 40000, Max: 40999}}), slot); err != nil {
		t.Fatal(err)
	}
	return hint, buckets
}

// expectSlotAtHint checks that the slot of want's port in the bucket the
// hints give backend holds want.
func expectSlotAtHint(t *testing.T, dp *loader.Datapath, backend netip.AddrPort, node netip.Addr, want xdp.SnatSlot) {
	t.Helper()
	opts := dp.Options()
	var hint uint32
	if err := dp.Maps.SNATBucketHints.Lookup(xdp.SNATHint(backend, node, want.Key.Proto), &hint); err != nil {
		t.Fatal(err)
	}
	bucket, ok := xdp.SNATHintBucket(hint, opts.SNATBuckets())
	if !ok {
		t.Fatalf("backend %s has no SNAT bucket (hint %d of %d buckets)", backend, hint, opts.SNATBuckets())
	}
	var got xdp.SnatSlot
	at := xdp.SNATSlot(bucket, xdp.NetToPort(want.Key.Dport), opts.SNATPorts)
	if err := dp.Maps.SNATSlots.Lookup(at, &got); err != nil || got != want {
		t.Fatalf("slot %d (bucket %d): %+v (%v), want %+v", at, bucket, got, err, want)
	}
}

func TestSNATSlotsHoldTwiceTheNATEntries(t *testing.T) {
	cases := []struct {
		natMax, portMin, portMax uint16
		buckets                  uint32
	}{
		{natMax: 1024, portMin: 40000, portMax: 40999, buckets: 3}, // 2048 slots round up to 3 ranges
		{natMax: 1024, portMin: 40000, portMax: 60999, buckets: 1}, // one range is more than enough
		{natMax: 1000, portMin: 40000, portMax: 40999, buckets: 2},
	}
	for _, c := range cases {
		o := loader.DefaultOptions()
		o.NATMax, o.SNATPorts = uint32(c.natMax), xdp.SNATPorts{{Min: c.portMin, Max: c.portMax}}
		if got := o.SNATBuckets(); got != c.buckets {
			t.Errorf("NAT max %d, SNAT ports %d-%d: %d buckets, want %d", c.natMax, c.portMin, c.portMax, got, c.buckets)
		}
		if got, want := o.SNATSlots(), c.buckets*uint32(c.portMax-c.portMin+1); got != want {
			t.Errorf("NAT max %d, SNAT ports %d-%d: %d slots, want %d", c.natMax, c.portMin, c.portMax, got, want)
		}
		if o.SNATSlots() < 2*o.NATMax {
			t.Errorf("NAT max %d: only %d SNAT slots", o.NATMax, o.SNATSlots())
		}
	}
}

func TestInvalidOptionsAreRejected(t *testing.T) {
	cases := []struct {
		name string
		edit func(*loader.Options)
		want string
	}{
		{"no conntrack", func(o *loader.Options) { o.ConntrackMax = 0 }, "conntrack max"},
		{"empty SNAT range", func(o *loader.Options) { o.SNATPorts = xdp.SNATPorts{{Min: 5000, Max: 4000}} }, "SNAT port range"},
		{"no timeout", func(o *loader.Options) { o.UDPTimeout = 0 }, "UDP timeout"},
		{"no pin root", func(o *loader.Options) { o.PinRoot = "" }, "pin root"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := loader.DefaultOptions()
			c.edit(&o)
			err := o.Validate()
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate: %v, want an error about %q", err, c.want)
			}
		})
	}
}

// attachIn runs fn inside a fresh namespace holding a veth pair x0/x1.
func attachIn(t *testing.T, fn func(dp *loader.Datapath) error) {
	t.Helper()
	ns := testenv.NewNetns(t, "ld")
	peer := testenv.NewNetns(t, "ldp")
	testenv.Veth(t, ns, "x0", peer, "x1")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0")
	// A bridge has no native XDP support.
	ns.IP("link", "add", "d0", "type", "bridge")
	root := testenv.BPFFS(t)
	if err := ns.Do(func() error {
		dp, err := loadertest.Load(smallOptions(root), nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		return fn(dp)
	}); err != nil {
		t.Fatal(err)
	}
}

func TestAttachErrorsNameInterfaceAndCause(t *testing.T) {
	attachIn(t, func(dp *loader.Datapath) error {
		cases := []struct {
			iface string
			mode  loader.XDPMode
			want  string
		}{
			{"nosuch0", loader.XDPNative, "interface nosuch0: no such interface"},
			{"d0", loader.XDPNative, "interface d0: attach XDP (native): the driver does not support this XDP mode"},
		}
		for _, c := range cases {
			_, err := dp.AttachNIC(c.iface, c.mode)
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("AttachNIC(%s, %s): %v, want one line containing %q", c.iface, c.mode, err, c.want)
			}
		}
		// best-effort falls back to generic on the bridge.
		att, err := dp.AttachNIC("d0", loader.XDPBestEffort)
		if err != nil || att.Mode != loader.XDPGeneric {
			t.Errorf("best-effort on a device without native XDP: %+v, %v", att, err)
		}
		return nil
	})
}

// Attachments an earlier datapath left (its programs still run) are
// foreign to a new one until it attaches there itself.
func TestForeignAttachmentsAreThoseNotReplaced(t *testing.T) {
	attachIn(t, func(dp *loader.Datapath) error {
		if _, err := dp.AttachNIC("x0", loader.XDPNative); err != nil {
			return err
		}
		if foreign, err := dp.ForeignAttachments(); err != nil || len(foreign) != 0 {
			t.Errorf("own attachments listed as foreign: %v, %v", foreign, err)
		}
		dp2, err := loadertest.Load(dp.Options(), nil)
		if err != nil {
			return err
		}
		defer dp2.Close()
		foreign, err := dp2.ForeignAttachments()
		if err != nil {
			return err
		}
		if want := []string{"tc-egress-x0", "tc-ingress-x0", "xdp-native-x0"}; !slices.Equal(foreign, want) {
			t.Errorf("foreign attachments before the new datapath attaches: %v, want %v", foreign, want)
		}
		if _, err := dp2.AttachNIC("x0", loader.XDPNative); err != nil {
			return err
		}
		if foreign, err := dp2.ForeignAttachments(); err != nil || len(foreign) != 0 {
			t.Errorf("foreign attachments after the new datapath attached: %v, %v", foreign, err)
		}
		return nil
	})
}

func TestAttachPinsLinksAndReattachUpdatesInPlace(t *testing.T) {
	root := ""
	attachIn(t, func(dp *loader.Datapath) error {
		root = dp.Options().PinRoot
		att, err := dp.AttachNIC("x0", loader.XDPNative)
		if err != nil {
			return err
		}
		if att.Mode != loader.XDPNative || att.TCMode != "tcx" || att.XDPProgID == 0 {
			t.Errorf("attachment %+v", att)
		}
		pin := filepath.Join(loader.Dir(root), "links", "xdp-native-x0")
		before, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return err
		}
		beforeInfo, _ := before.Info()
		before.Close()

		// A second agent loads new programs and replaces them in place:
		// same link, new program.
		dp2, err := loadertest.Load(dp.Options(), nil)
		if err != nil {
			return err
		}
		defer dp2.Close()
		att2, err := dp2.AttachNIC("x0", loader.XDPNative)
		if err != nil {
			return err
		}
		after, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return err
		}
		afterInfo, _ := after.Info()
		after.Close()
		if afterInfo.ID != beforeInfo.ID {
			t.Errorf("link replaced (%d -> %d); it must be updated in place", beforeInfo.ID, afterInfo.ID)
		}
		if att2.XDPProgID == att.XDPProgID {
			t.Error("program not replaced")
		}
		dev, _ := netlink.LinkByName("x0")
		if dev.Attrs().Xdp == nil || !dev.Attrs().Xdp.Attached {
			t.Error("no XDP program on x0")
		}
		return nil
	})
	if err := loader.Detach(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(loader.Dir(root)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins left after detach: %v", err)
	}
}

// A VLAN interface (eth0.100, bond0.42) is a common --iface on an edge
// node, and pod interface names may have a dot too. Link pins are named
// after the interface, and bpffs refuses names with a dot: the pins carry
// it as a ':', and what finds interfaces by their pins reads the name
// back. A restart adopts the links, and they follow a rename.
func TestDottedInterfaceNamesAttach(t *testing.T) {
	ns := testenv.NewNetns(t, "dot")
	peer := testenv.NewNetns(t, "dotp")
	// The names VLAN interfaces have (veth: the 8021q module may be
	// missing where the tests run).
	testenv.Veth(t, ns, "x0.100", peer, "x1")
	testenv.Veth(t, ns, "pod.7", peer, "p1")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "x0.100")
	root := testenv.BPFFS(t)
	links := filepath.Join(loader.Dir(root), "links")
	// Runs in the namespace's thread: failures are returned.
	pins := func() ([]string, error) {
		entries, err := os.ReadDir(links)
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names, err
	}
	linkIDs := func() (map[string]link.ID, error) {
		ids := map[string]link.ID{}
		names, err := pins()
		for _, name := range names {
			l, err := link.LoadPinnedLink(filepath.Join(links, name), nil)
			if err != nil {
				return nil, err
			}
			info, err := l.Info()
			l.Close()
			if err != nil {
				return nil, err
			}
			ids[name] = info.ID
		}
		return ids, err
	}
	if err := ns.Do(func() error {
		dp, err := loadertest.Load(smallOptions(root), nil)
		if err != nil {
			return err
		}
		defer dp.Close()
		if _, err := dp.AttachNIC("x0.100", loader.XDPNative); err != nil {
			return err
		}
		if err := dp.AttachPod("pod.7"); err != nil {
			return err
		}
		got, err := pins()
		if err != nil {
			return err
		}
		want := []string{"tc-egress-x0:100", "tc-ingress-x0:100", "tc-pod-pod:7", "tc-podreply-pod:7", "xdp-native-x0:100"}
		if !slices.Equal(got, want) {
			t.Errorf("pins %v, want %v", got, want)
		}
		if !loader.NICAttached(root, "x0.100") {
			t.Error("NICAttached(x0.100) = false")
		}
		if pods, err := loader.PodInterfaces(root); err != nil || !slices.Equal(pods, []string{"pod.7"}) {
			t.Errorf("PodInterfaces = %v, %v; want [pod.7]", pods, err)
		}
		before, err := linkIDs()
		if err != nil {
			return err
		}

		// A restart settles the pins and updates the links in place.
		dp2, err := loadertest.Load(dp.Options(), nil)
		if err != nil {
			return err
		}
		defer dp2.Close()
		if err := dp2.SettleNICPins(); err != nil {
			return err
		}
		if _, err := dp2.AttachNIC("x0.100", loader.XDPNative); err != nil {
			return fmt.Errorf("attach again: %w", err)
		}
		if err := dp2.AttachPod("pod.7"); err != nil {
			return fmt.Errorf("attach the pod interface again: %w", err)
		}
		after, err := linkIDs()
		if err != nil {
			return err
		}
		if !maps.Equal(after, before) {
			t.Errorf("links after a restart %v, want those updated in place %v", after, before)
		}
		if foreign, err := dp2.ForeignAttachments(); err != nil || len(foreign) != 0 {
			t.Errorf("foreign attachments after the restart attached: %v, %v", foreign, err)
		}

		// Renamed: the pins follow, under the new name's encoding.
		dev, err := netlink.LinkByName("x0.100")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetName(dev, "x0.200"); err != nil {
			return err
		}
		if err := dp2.SettleNICPins(); err != nil {
			return err
		}
		if got, err = pins(); err != nil {
			return err
		}
		want = []string{"tc-egress-x0:200", "tc-ingress-x0:200", "tc-pod-pod:7", "tc-podreply-pod:7", "xdp-native-x0:200"}
		if !slices.Equal(got, want) {
			t.Errorf("pins after the rename %v, want %v", got, want)
		}
		detached, err := dp2.DetachNICsExcept(nil)
		if err != nil || !slices.Equal(detached, []string{"x0.200"}) {
			t.Errorf("DetachNICsExcept = %v, %v; want [x0.200]", detached, err)
		}
		if err := dp2.ForgetPod("pod.7"); err != nil {
			return err
		}
		if got, err = pins(); err != nil || len(got) != 0 {
			t.Errorf("pins after detaching: %v (%v), want none", got, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// SettleNICPins drops the pins of links whose device is gone, and only
// those: a pin it cannot read as a link (here a map; or one it may not
// open) is not taken for one, but left as it is and named in the error.
func TestUnreadablePinIsNotTakenForAGoneInterface(t *testing.T) {
	attachIn(t, func(dp *loader.Datapath) error {
		m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
		if err != nil {
			return err
		}
		defer m.Close()
		pin := filepath.Join(loader.Dir(dp.Options().PinRoot), "links", "xdp-generic-x9")
		if err := m.Pin(pin); err != nil {
			return err
		}
		err = dp.SettleNICPins()
		if err == nil || !strings.Contains(err.Error(), "interface x9: ") {
			t.Errorf("SettleNICPins: %v, want an error naming x9", err)
		}
		if _, err := os.Stat(pin); err != nil {
			t.Errorf("the pin SettleNICPins could not read was removed: %v", err)
		}
		return nil
	})
}

// A restart that asks for an XDP mode the device does not have fails, and
// the device keeps XDP in the mode it had rather than losing it.
func TestFailedModeChangeKeepsXDP(t *testing.T) {
	attachIn(t, func(dp *loader.Datapath) error {
		if _, err := dp.AttachNIC("d0", loader.XDPGeneric); err != nil {
			return err
		}
		dp2, err := loadertest.Load(dp.Options(), nil)
		if err != nil {
			return err
		}
		defer dp2.Close()
		_, err = dp2.AttachNIC("d0", loader.XDPNative)
		if err == nil || !strings.Contains(err.Error(), "does not support this XDP mode") ||
			!strings.Contains(err.Error(), "stays attached in generic mode") {
			t.Errorf("native on a device without it: %v; want the cause and that generic stays", err)
		}
		dev, err := netlink.LinkByName("d0")
		if err != nil {
			return err
		}
		if dev.Attrs().Xdp == nil || !dev.Attrs().Xdp.Attached {
			t.Error("the device lost its XDP program")
		}
		pin := filepath.Join(loader.Dir(dp.Options().PinRoot), "links", "xdp-generic-d0")
		if _, err := os.Stat(pin); err != nil {
			t.Errorf("generic link not pinned again: %v", err)
		}
		return nil
	})
}

// xdpPass loads an XDP program that passes every packet, of the given
// attach type, until the test ends.
func xdpPass(t *testing.T, attach ebpf.AttachType) (*ebpf.Program, error) {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, AttachType: attach, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { prog.Close() })
	return prog, nil
}

// Best-effort falls back to generic XDP only where the device cannot run
// the program natively; any other failure of the native attach is
// reported as it is, and one that fails in both modes gives both causes
// in one line. (Inside the namespace the checks return errors: a fatal
// one would end the goroutine the namespace waits for.)
func TestBestEffortFallsBackOnlyWithoutNativeSupport(t *testing.T) {
	for _, tc := range []struct {
		name  string
		iface string
		setup func(t *testing.T, dp *loader.Datapath) error
		mode  loader.XDPMode // attached, or "" for an error
		want  []string       // in the error
	}{
		{name: "no native XDP in the driver", iface: "d0", mode: loader.XDPGeneric},
		{name: "native link cannot be pinned", iface: "x0",
			setup: func(_ *testing.T, dp *loader.Datapath) error {
				// A dangling symlink: no link to adopt, and no pin there.
				return os.Symlink("/nonexistent", filepath.Join(loader.Dir(dp.Options().PinRoot), "links", "xdp-native-x0"))
			},
			want: []string{"interface x0: pin XDP link"}},
		{name: "another program attached", iface: "x0",
			setup: func(t *testing.T, _ *loader.Datapath) error {
				dev, err := netlink.LinkByName("x0")
				if err != nil {
					return err
				}
				prog, err := xdpPass(t, ebpf.AttachNone)
				if err != nil {
					return err
				}
				l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: dev.Attrs().Index,
					Flags: link.XDPDriverMode})
				if err != nil {
					return err
				}
				t.Cleanup(func() { l.Close() })
				return nil
			},
			want: []string{"interface x0: attach XDP (native): another XDP program is already attached"}},
		{name: "both modes refused", iface: "x0",
			setup: func(t *testing.T, dp *loader.Datapath) error {
				// The kernel attaches a devmap program to no device.
				prog, err := xdpPass(t, ebpf.AttachXDPDevMap)
				dp.SetXDPProgram(prog)
				return err
			},
			want: []string{"interface x0: attach XDP (best-effort): native: ", "invalid argument; generic: "}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attachIn(t, func(dp *loader.Datapath) error {
				if tc.setup != nil {
					if err := tc.setup(t, dp); err != nil {
						return err
					}
				}
				att, err := dp.AttachNIC(tc.iface, loader.XDPBestEffort)
				if tc.mode != "" {
					if err != nil || att.Mode != tc.mode {
						t.Errorf("best-effort: %+v, %v; want %s", att, err, tc.mode)
					}
					return nil
				}
				if err == nil {
					t.Errorf("best-effort attached in %s mode", att.Mode)
					return nil
				}
				if strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q: want one line", err)
				}
				for _, want := range tc.want {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q, want %q in it", err, want)
					}
				}
				if len(tc.want) == 1 && strings.Contains(err.Error(), "generic") {
					t.Errorf("error %q: generic XDP was tried", err)
				}
				generic := filepath.Join(loader.Dir(dp.Options().PinRoot), "links", "xdp-generic-"+tc.iface)
				if _, err := os.Lstat(generic); err == nil {
					t.Error("generic XDP link pinned")
				}
				return nil
			})
		})
	}
}

// A restart under best-effort keeps a generic attachment an earlier start
// fell back to, and warns that native XDP is not tried again and how to
// move to it; a native attachment gets no such warning.
func TestBestEffortRestartWarnsOfGenericXDP(t *testing.T) {
	for _, tc := range []struct {
		iface    string
		mode     loader.XDPMode
		wantWarn bool
	}{
		{"d0", loader.XDPGeneric, true},
		{"x0", loader.XDPNative, false},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			attachIn(t, func(dp *loader.Datapath) error {
				if att, err := dp.AttachNIC(tc.iface, loader.XDPBestEffort); err != nil || att.Mode != tc.mode {
					return fmt.Errorf("first start: %+v, %v; want %s", att, err, tc.mode)
				}
				var logged bytes.Buffer
				dp2, err := loadertest.Load(dp.Options(), slog.New(slog.NewTextHandler(&logged, nil)))
				if err != nil {
					return err
				}
				defer dp2.Close()
				if att, err := dp2.AttachNIC(tc.iface, loader.XDPBestEffort); err != nil || att.Mode != tc.mode {
					return fmt.Errorf("restart: %+v, %v; want %s", att, err, tc.mode)
				}
				warned := false
				for _, line := range strings.Split(logged.String(), "\n") {
					if strings.Contains(line, "level=WARN") && strings.Contains(line, "runs generic XDP") &&
						strings.Contains(line, "--xdp-mode native") && strings.Contains(line, "xdplb detach") &&
						strings.Contains(line, "interface="+tc.iface) {
						warned = true
					}
				}
				if warned != tc.wantWarn {
					t.Errorf("log:\n%s\nwant a warning that %s runs generic XDP: %v", logged.String(), tc.iface, tc.wantWarn)
				}
				return nil
			})
		})
	}
}
