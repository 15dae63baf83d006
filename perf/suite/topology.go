package suite

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// The perf topology: four namespaces joined by veth pairs, no bridge, so
// every frame the generator sends crosses exactly the edge node.
//
//	gen                   edge                      node2
//	eth0 198.18.0.2 ──── eth0 198.18.0.1   eth1 198.18.1.1 ──── eth0 198.18.1.2
//	(generator, sink      (the datapath under test)              (sink: remote
//	 for replies)          vethpod0 ──── pod eth0 10.244.1.10     backends 10.244.2.0/24)
//	                                     (sink: local backend)
//
// Clients are 100.64.0.0/10 behind gen; remote backends are 10.244.2.0/24
// behind node2. Neighbours are static: the sinks drop ARP like everything
// else. Nothing is configured in the caller's namespace.
var (
	GenAddr      = netip.MustParseAddr("198.18.0.2")
	EdgeAddr     = netip.MustParseAddr("198.18.0.1")
	EdgeNodeAddr = netip.MustParseAddr("198.18.1.1")
	Node2Addr    = netip.MustParseAddr("198.18.1.2")
	LocalPodAddr = netip.MustParseAddr("10.244.1.10")

	ClientPrefix  = netip.MustParsePrefix("100.64.0.0/10")
	RemotePodCIDR = netip.MustParsePrefix("10.244.2.0/24")
)

// Topology is the perf sandbox.
type Topology struct {
	Gen, Edge, Node2, Pod *netns.NS
	// BPFFS is a private bpffs for the edge node's pins.
	BPFFS string

	GenMAC, Eth0MAC, Eth1MAC, Node2MAC, VethPodMAC, PodMAC net.HardwareAddr
	Eth0, Eth1, VethPod                                    int // ifindexes in the edge node

	// Sinks: replies arriving at the client side, forwarded frames
	// arriving at node2 (remote backends) and at the local pod.
	ClientSink, Node2Sink, PodSink *traffic.Sink

	all []*netns.NS
}

// NewTopology builds the sandbox; on error everything is removed again.
func NewTopology(ctx context.Context) (*Topology, error) {
	return newTopology(ctx, nsPrefix, bpffsPrefix)
}

// newTopology names the namespaces and the bpffs directory with the given
// prefixes (tests use their own, so a perf run's clean-up of a killed
// run's leftovers never touches them).
func newTopology(ctx context.Context, prefix, bpffs string) (_ *Topology, err error) {
	t := &Topology{}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	for _, n := range []struct {
		dst    **netns.NS
		prefix string
	}{{&t.Gen, prefix + "gen"}, {&t.Edge, prefix + "edge"}, {&t.Node2, prefix + "node2"}, {&t.Pod, prefix + "pod"}} {
		ns, err := netns.New(n.prefix)
		if err != nil {
			return nil, fmt.Errorf("create namespace: %w", err)
		}
		t.all = append(t.all, ns)
		*n.dst = ns
		// No IPv6 on the sandbox's links: its neighbour discovery would
		// reach the sinks and be counted.
		for _, key := range []string{"net.ipv6.conf.all.disable_ipv6", "net.ipv6.conf.default.disable_ipv6"} {
			if err := ns.Sysctl(key, "1"); err != nil {
				return nil, fmt.Errorf("sysctl %s in %s: %w", key, ns.Name, err)
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	for _, v := range []struct {
		a     *netns.NS
		aName string
		b     *netns.NS
		bName string
	}{
		{t.Edge, "eth0", t.Gen, "eth0"},
		{t.Edge, "eth1", t.Node2, "eth0"},
		{t.Edge, "vethpod0", t.Pod, "eth0"},
	} {
		if err := netns.Veth(v.a, v.aName, v.b, v.bName); err != nil {
			return nil, fmt.Errorf("veth %s/%s: %w", v.aName, v.bName, err)
		}
	}
	for _, m := range []struct {
		ns  *netns.NS
		dev string
		mac *net.HardwareAddr
		idx *int
	}{
		{t.Gen, "eth0", &t.GenMAC, nil},
		{t.Edge, "eth0", &t.Eth0MAC, &t.Eth0},
		{t.Edge, "eth1", &t.Eth1MAC, &t.Eth1},
		{t.Edge, "vethpod0", &t.VethPodMAC, &t.VethPod},
		{t.Node2, "eth0", &t.Node2MAC, nil},
		{t.Pod, "eth0", &t.PodMAC, nil},
	} {
		err := m.ns.Do(func() error {
			ifi, err := net.InterfaceByName(m.dev)
			if err != nil {
				return err
			}
			*m.mac = ifi.HardwareAddr
			if m.idx != nil {
				*m.idx = ifi.Index
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("interface %s in %s: %w", m.dev, m.ns.Name, err)
		}
	}
	steps := []struct {
		ns   *netns.NS
		args string
	}{
		{t.Gen, "addr add 198.18.0.2/24 dev eth0"},
		{t.Edge, "addr add 198.18.0.1/24 dev eth0"},
		{t.Edge, "addr add 198.18.1.1/24 dev eth1"},
		{t.Node2, "addr add 198.18.1.2/24 dev eth0"},
		{t.Pod, "addr add 10.244.1.10/24 dev eth0"},
		{t.Edge, "route add " + ClientPrefix.String() + " via 198.18.0.2"},
		{t.Edge, "route add " + RemotePodCIDR.String() + " via 198.18.1.2"},
		{t.Edge, "route add 10.244.1.10/32 dev vethpod0"},
		{t.Edge, "neigh replace 198.18.0.2 lladdr " + t.GenMAC.String() + " dev eth0 nud permanent"},
		{t.Edge, "neigh replace 198.18.1.2 lladdr " + t.Node2MAC.String() + " dev eth1 nud permanent"},
		{t.Edge, "neigh replace 10.244.1.10 lladdr " + t.PodMAC.String() + " dev vethpod0 nud permanent"},
		{t.Gen, "neigh replace 198.18.0.1 lladdr " + t.Eth0MAC.String() + " dev eth0 nud permanent"},
		{t.Node2, "neigh replace 198.18.1.1 lladdr " + t.Eth1MAC.String() + " dev eth0 nud permanent"},
	}
	for _, s := range steps {
		if _, err := s.ns.IP(splitArgs(s.args)...); err != nil {
			return nil, err
		}
	}
	for _, kv := range [][2]string{
		{"net.ipv4.ip_forward", "1"},
		{"net.ipv4.conf.all.rp_filter", "0"},
		{"net.ipv4.conf.default.rp_filter", "0"},
		{"net.ipv4.conf.eth0.rp_filter", "0"},
		{"net.ipv4.conf.eth1.rp_filter", "0"},
		{"net.ipv4.conf.vethpod0.rp_filter", "0"},
	} {
		if err := t.Edge.Sysctl(kv[0], kv[1]); err != nil {
			return nil, fmt.Errorf("sysctl %s in the edge node: %w", kv[0], err)
		}
	}
	if t.ClientSink, err = traffic.NewSink(t.Gen, "eth0"); err != nil {
		return nil, err
	}
	if t.Node2Sink, err = traffic.NewSink(t.Node2, "eth0"); err != nil {
		return nil, err
	}
	if t.PodSink, err = traffic.NewSink(t.Pod, "eth0"); err != nil {
		return nil, err
	}
	if t.BPFFS, err = os.MkdirTemp("", bpffs); err != nil {
		return nil, fmt.Errorf("bpffs directory: %w", err)
	}
	if err := unix.Mount("bpf", t.BPFFS, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(t.BPFFS)
		t.BPFFS = ""
		return nil, fmt.Errorf("mount bpffs: %w", err)
	}
	return t, ctx.Err()
}

func splitArgs(s string) []string {
	var out []string
	start := -1
	for i, r := range s + " " {
		if r == ' ' {
			if start >= 0 {
				out = append(out, s[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	return out
}

// PassXDP attaches XDP_PASS to the edge node's NICs, for the modes that
// run no XDP program of their own: a veth accepts frames its peer sends
// with XDP_TX or XDP_REDIRECT (the generator does) only when it runs an
// XDP program. A physical NIC needs no such thing. Closing the returned
// function detaches them.
func (t *Topology) PassXDP() (func() error, error) {
	var objs baseline.XDPObjects
	if err := baseline.LoadXDPObjects(&objs, nil); err != nil {
		return nil, fmt.Errorf("load XDP_PASS program: %w", err)
	}
	var links []link.Link
	undo := func() error {
		var errs []error
		for _, l := range links {
			errs = append(errs, l.Close())
		}
		errs = append(errs, objs.Close())
		return errors.Join(errs...)
	}
	for _, dev := range []string{"eth0", "eth1"} {
		l, err := traffic.AttachXDP(t.Edge, dev, objs.XdpPass)
		if err != nil {
			undo()
			return nil, err
		}
		links = append(links, l)
	}
	return undo, nil
}

// Close removes the whole sandbox.
func (t *Topology) Close() error {
	var errs []error
	for _, s := range []*traffic.Sink{t.ClientSink, t.Node2Sink, t.PodSink} {
		if s != nil {
			errs = append(errs, s.Close())
		}
	}
	for i := len(t.all) - 1; i >= 0; i-- {
		errs = append(errs, t.all[i].Delete())
	}
	t.all = nil
	if t.BPFFS != "" {
		if err := unix.Unmount(t.BPFFS, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t.BPFFS, err))
		}
		os.Remove(t.BPFFS)
		t.BPFFS = ""
	}
	return errors.Join(errs...)
}
