package agent

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// An agent restarted with other interfaces runs the datapath on those and
// no others: an interface dropped from --iface is detached (links, redirect
// target, SNAT address), whether or not it was renamed meanwhile; an
// interface deleted and created again, or renamed, while its links stayed
// pinned is attached again (the first would fail to update the defunct
// link, the second to attach XDP next to the program it still runs).
func TestRestartAttachesToTheListedInterfacesOnly(t *testing.T) {
	cases := []struct {
		name    string
		first   []string
		between func(ns *testenv.Netns, links string)
		second  []string
		// detached: interfaces that must run nothing of ours afterwards.
		detached []string
		// logged: interfaces the second start logs it detached.
		logged []string
	}{
		{name: "interface dropped", first: []string{"edge0", "edge2"}, second: []string{"edge0"},
			detached: []string{"edge2"}, logged: []string{"edge2"}},
		{name: "all kept", first: []string{"edge0", "edge2"}, second: []string{"edge2", "edge0"}},
		{name: "interface deleted and created again", first: []string{"edge0", "edge2"},
			between: func(ns *testenv.Netns, _ string) {
				ns.IP("link", "del", "edge2")
				vethUp(ns, "edge2", "edge3", "192.0.2.2/24")
			},
			second: []string{"edge0", "edge2"}},
		{name: "interface deleted and dropped", first: []string{"edge0", "edge2"},
			between: func(ns *testenv.Netns, _ string) { ns.IP("link", "del", "edge2") },
			// Its programs went with it: nothing to detach (its pins
			// are dropped first, logged as such).
			second: []string{"edge0"}},
		{name: "interface renamed", first: []string{"edge0", "edge2"},
			between: func(ns *testenv.Netns, _ string) { rename(ns, "edge2", "edge5") },
			second:  []string{"edge0", "edge5"}},
		{name: "interface renamed and dropped", first: []string{"edge0", "edge2"},
			between: func(ns *testenv.Netns, _ string) { rename(ns, "edge2", "edge5") },
			second:  []string{"edge0"}, detached: []string{"edge5"}, logged: []string{"edge5"}},
		{name: "a rename of pins interrupted", first: []string{"edge0", "edge2"},
			between: func(_ *testenv.Netns, links string) {
				if err := os.Rename(filepath.Join(links, "xdp-native-edge2"),
					filepath.Join(links, "renaming-xdp-native-edge2")); err != nil {
					t.Fatal(err)
				}
			},
			second: []string{"edge0", "edge2"}},
		{name: "interfaces swap names", first: []string{"edge0", "edge2"},
			between: func(ns *testenv.Netns, _ string) {
				rename(ns, "edge2", "edge9")
				rename(ns, "edge0", "edge2")
				rename(ns, "edge9", "edge0")
			},
			second: []string{"edge0", "edge2"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := testenv.NewNetns(t, "ifaces")
			ns.IP("link", "set", "lo", "up")
			vethUp(ns, "edge0", "edge1", "192.0.2.1/24")
			vethUp(ns, "edge2", "edge3", "198.51.100.1/24")
			cfg := fileConfig(t)

			var logged bytes.Buffer
			start := func(ifaces []string, check func(a *Agent) error) {
				t.Helper()
				cfg.Interfaces = ifaces
				logged.Reset()
				if err := ns.Do(func() error {
					a, err := Start(context.Background(), cfg, slog.New(slog.NewTextHandler(&logged, nil)))
					if err != nil {
						return fmt.Errorf("start with %v: %w", ifaces, err)
					}
					defer a.Close()
					defer a.hcNodes.Close()
					return check(a)
				}); err != nil {
					t.Fatal(err)
				}
			}
			start(c.first, func(*Agent) error { return nil })
			if c.between != nil {
				c.between(ns, filepath.Join(loader.Dir(cfg.Datapath.PinRoot), "links"))
			}
			start(c.second, func(a *Agent) error {
				var want []uint32
				for _, name := range c.second {
					dev, err := netlink.LinkByName(name)
					if err != nil {
						return err
					}
					if x := dev.Attrs().Xdp; x == nil || !x.Attached {
						t.Errorf("%s (listed) runs no XDP program", name)
					}
					want = append(want, uint32(dev.Attrs().Index))
				}
				for _, name := range c.detached {
					dev, err := netlink.LinkByName(name)
					if err != nil {
						return err
					}
					if x := dev.Attrs().Xdp; x != nil && x.Attached {
						t.Errorf("%s (no longer listed) still runs XDP program %d", name, x.ProgId)
					}
				}
				for _, m := range []struct {
					name string
					keys func() ([]uint32, error)
				}{
					{"tx_ports", func() ([]uint32, error) { return mapKeys[uint32](a.dp.Maps.TxPorts.Iterate()) }},
					{"ifaces", func() ([]uint32, error) { return mapKeys[xdp.Iface](a.dp.Maps.Ifaces.Iterate()) }},
				} {
					got, err := m.keys()
					if err != nil {
						return err
					}
					slices.Sort(got)
					slices.Sort(want)
					if !slices.Equal(got, want) {
						t.Errorf("%s holds interfaces %v, want those listed: %v", m.name, got, want)
					}
				}
				return nil
			})
			var detachedLogged []string
			for _, line := range strings.Split(logged.String(), "\n") {
				if strings.Contains(line, "level=INFO") && strings.Contains(line, "datapath detached") {
					_, name, _ := strings.Cut(line, " interface=")
					detachedLogged = append(detachedLogged, name)
				}
			}
			if !slices.Equal(detachedLogged, c.logged) {
				t.Errorf("logged detaching %v, want %v", detachedLogged, c.logged)
			}
			pinned, err := os.ReadDir(filepath.Join(loader.Dir(cfg.Datapath.PinRoot), "links"))
			if err != nil {
				t.Fatal(err)
			}
			var got, want []string
			for _, e := range pinned {
				got = append(got, e.Name())
			}
			for _, name := range c.second {
				want = append(want, "tc-egress-"+name, "tc-ingress-"+name, "xdp-native-"+name)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("pinned links %v, want %v", got, want)
			}
		})
	}
}

// mapKeys returns the keys of a map with uint32 keys and V values.
func mapKeys[V any](iter interface {
	Next(key, value any) bool
	Err() error
}) ([]uint32, error) {
	var out []uint32
	var key uint32
	var value V
	for iter.Next(&key, &value) {
		out = append(out, key)
	}
	return out, iter.Err()
}

// vethUp creates a veth pair in ns, both ends up, with addr on the first.
// fileConfig is an agent's configuration for a test: native XDP on ifaces,
// small maps pinned on a private bpffs, Services from an empty file.
func fileConfig(t *testing.T, ifaces ...string) Config {
	t.Helper()
	services := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(services, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	opts := loader.DefaultOptions()
	opts.PinRoot = testenv.BPFFS(t)
	opts.ConntrackMax, opts.NATMax, opts.AffinityMax = 1024, 1024, 256
	return Config{Interfaces: ifaces, XDPMode: loader.XDPNative, Datapath: opts, ServicesFile: services}
}

func vethUp(ns *testenv.Netns, name, peer, addr string) {
	ns.IP("link", "add", name, "type", "veth", "peer", "name", peer)
	ns.IP("link", "set", name, "up")
	ns.IP("link", "set", peer, "up")
	ns.IP("addr", "add", addr, "dev", name)
}

// rename renames an interface of ns (which takes it down and up again).
func rename(ns *testenv.Netns, from, to string) {
	ns.IP("link", "set", from, "down")
	ns.IP("link", "set", from, "name", to)
	ns.IP("link", "set", to, "up")
}
