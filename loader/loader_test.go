package loader_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

func smallOptions(root string) loader.Options {
	opts := loader.DefaultOptions()
	opts.PinRoot = root
	opts.ConntrackMax, opts.NATMax, opts.AffinityMax = 1024, 1024, 1024
	opts.ServicesMax, opts.FrontendsMax, opts.BackendsMax, opts.SourceRangesMax = 64, 256, 256, 64
	return opts
}

func TestRestartAdoptsMapsAndResizeKeepsFlows(t *testing.T) {
	root := testenv.BPFFS(t)
	opts := smallOptions(root)
	dp, err := loader.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	key := xdp.NicCtKey{Saddr: 1, Daddr: 2, Sport: 3, Dport: 4, Proto: 6}
	if err := dp.Maps.Conntrack.Put(key, xdp.NicCtEntry{BackendId: 7}); err != nil {
		t.Fatal(err)
	}
	if err := dp.Maps.Backends.Put(uint32(5), xdp.NicBackend{Addr: 9, Port: 80}); err != nil {
		t.Fatal(err)
	}
	dp.Close()

	// Same sizes: everything is adopted as it was.
	dp, err = loader.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	var e xdp.NicCtEntry
	if err := dp.Maps.Conntrack.Lookup(key, &e); err != nil || e.BackendId != 7 {
		t.Fatalf("flow lost on restart: %+v %v", e, err)
	}
	var b xdp.NicBackend
	if err := dp.Maps.Backends.Lookup(uint32(5), &b); err != nil || b.Addr != 9 {
		t.Fatalf("backend lost on restart: %+v %v", b, err)
	}
	dp.Close()

	// A larger conntrack: flows are copied into the new map; the
	// resized backends array starts over (the control plane refills it).
	opts.ConntrackMax, opts.BackendsMax = 4096, 512
	dp, err = loader.Load(opts, nil)
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

func TestInvalidOptionsAreRejected(t *testing.T) {
	cases := []struct {
		name string
		edit func(*loader.Options)
		want string
	}{
		{"no conntrack", func(o *loader.Options) { o.ConntrackMax = 0 }, "conntrack max"},
		{"empty SNAT range", func(o *loader.Options) { o.SNATPortMin, o.SNATPortMax = 5000, 4000 }, "SNAT port range"},
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
		dp, err := loader.Load(smallOptions(root), nil)
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
		dp2, err := loader.Load(dp.Options(), nil)
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
