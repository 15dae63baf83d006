// Package topology builds the sandbox that xdplb's end-to-end tests and
// demo run in: hosts as network namespaces on one L2 segment, like an edge
// node, a second node and an external client behind a switch, with pods as
// namespaces on a bridge in each node.
//
//	             switch (bridge br0)
//	      ┌───────────┼────────────────┐
//	   client        edge             node2
//	198.51.100.10  198.51.100.1     198.51.100.2
//	               eth0 (XDP)       pods 10.244.2.0/24 on cni0
//	               pods 10.244.1.0/24 on cni0
//
// The client's default route and the LoadBalancer range 203.0.113.0/24
// point at the edge node. Nothing is configured in the caller's own
// namespace, and no route leads out of the sandbox.
package topology

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/xdp/baseline"
)

// Addresses of the sandbox.
var (
	ClientAddr = netip.MustParseAddr("198.51.100.10")
	EdgeAddr   = netip.MustParseAddr("198.51.100.1")
	Node2Addr  = netip.MustParseAddr("198.51.100.2")
	LBPrefix   = netip.MustParsePrefix("203.0.113.0/24")
)

// Node is a host of the sandbox that can run pods.
type Node struct {
	*netns.NS
	Name    string
	Addr    netip.Addr
	PodCIDR netip.Prefix
	gateway netip.Addr // the bridge address pods route through
	nextPod int
}

// Pod is a pod: a namespace with one address on its node's bridge.
type Pod struct {
	*netns.NS
	Name string
	Addr netip.Addr
	Node *Node
	veth string // host-side interface in the node
}

// Topology is the whole sandbox.
type Topology struct {
	Switch *netns.NS
	Client *netns.NS
	Edge   *Node
	Node2  *Node
	Pods   []*Pod
	// BPFFS is a private bpffs mount for the edge node's pins.
	BPFFS string
	// Cgroup is a mount of the cgroup v2 hierarchy outside /sys (which
	// `ip netns exec` hides) for the agent's socket programs.
	Cgroup string

	all      []*netns.NS
	baseline *baseline.XDPObjects
	links    []link.Link
}

// attachPeerXDP attaches an XDP_PASS program to every switch port. A veth
// delivers frames that its peer sends with XDP_TX or XDP_REDIRECT only if
// the receiving end runs XDP itself (GRO instead also works, but holds
// frames back for seconds on these kernels).
func (t *Topology) attachPeerXDP() error {
	var objs baseline.XDPObjects
	if err := baseline.LoadXDPObjects(&objs, nil); err != nil {
		return fmt.Errorf("load XDP_PASS program: %w", err)
	}
	t.baseline = &objs
	return t.Switch.Do(func() error {
		for _, port := range []string{"sw-client", "sw-edge", "sw-node2"} {
			dev, err := net.InterfaceByName(port)
			if err != nil {
				return err
			}
			l, err := link.AttachXDP(link.XDPOptions{Program: objs.XdpPass, Interface: dev.Index})
			if err != nil {
				return fmt.Errorf("attach XDP_PASS to %s: %w", port, err)
			}
			t.links = append(t.links, l)
		}
		return nil
	})
}

// New builds the sandbox. On error everything created is removed again.
func New(ctx context.Context) (t *Topology, err error) {
	t = &Topology{}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	ns := func(prefix string) (*netns.NS, error) {
		n, err := netns.New(prefix)
		if err == nil {
			t.all = append(t.all, n)
		}
		return n, err
	}
	if t.Switch, err = ns("xlb-sw"); err != nil {
		return nil, err
	}
	if t.Client, err = ns("xlb-client"); err != nil {
		return nil, err
	}
	edge, err := ns("xlb-edge")
	if err != nil {
		return nil, err
	}
	node2, err := ns("xlb-node2")
	if err != nil {
		return nil, err
	}
	t.Edge = &Node{NS: edge, Name: "edge", Addr: EdgeAddr, PodCIDR: netip.MustParsePrefix("10.244.1.0/24"),
		gateway: netip.MustParseAddr("10.244.1.1")}
	t.Node2 = &Node{NS: node2, Name: "node2", Addr: Node2Addr, PodCIDR: netip.MustParsePrefix("10.244.2.0/24"),
		gateway: netip.MustParseAddr("10.244.2.1")}

	steps := [][]string{
		{"sw", "link add br0 type bridge"},
		{"sw", "link set br0 up"},
	}
	if err := t.run(steps); err != nil {
		return nil, err
	}
	for _, h := range []struct {
		ns   *netns.NS
		port string
		addr string
	}{
		{t.Client, "sw-client", ClientAddr.String() + "/24"},
		{t.Edge.NS, "sw-edge", EdgeAddr.String() + "/24"},
		{t.Node2.NS, "sw-node2", Node2Addr.String() + "/24"},
	} {
		if err := netns.Veth(t.Switch, h.port, h.ns, "eth0"); err != nil {
			return nil, err
		}
		if _, err := t.Switch.IP("link", "set", h.port, "master", "br0"); err != nil {
			return nil, err
		}
		if _, err := h.ns.IP("addr", "add", h.addr, "dev", "eth0"); err != nil {
			return nil, err
		}
		// XDP sees what the sender put on the wire: make senders fill
		// in checksums instead of leaving them to an offload.
		if err := h.ns.Ethtool("-K", "eth0", "tx", "off"); err != nil {
			return nil, err
		}
	}
	if err := t.attachPeerXDP(); err != nil {
		return nil, err
	}
	if _, err := t.Client.IP("route", "add", "default", "via", EdgeAddr.String()); err != nil {
		return nil, err
	}
	for _, n := range []*Node{t.Edge, t.Node2} {
		if err := n.NS.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
			return nil, err
		}
		for _, c := range [][]string{
			{"link", "add", "cni0", "type", "bridge"},
			{"link", "set", "cni0", "up"},
			{"addr", "add", n.gateway.String() + "/24", "dev", "cni0"},
		} {
			if _, err := n.IP(c...); err != nil {
				return nil, err
			}
		}
	}
	// Each node routes the other's pod network through it.
	if _, err := t.Edge.IP("route", "add", t.Node2.PodCIDR.String(), "via", Node2Addr.String()); err != nil {
		return nil, err
	}
	if _, err := t.Node2.IP("route", "add", t.Edge.PodCIDR.String(), "via", EdgeAddr.String()); err != nil {
		return nil, err
	}
	if t.BPFFS, err = os.MkdirTemp("", "xlb-bpffs-"); err != nil {
		return nil, err
	}
	if err := unix.Mount("bpf", t.BPFFS, "bpf", 0, "mode=0700"); err != nil {
		os.Remove(t.BPFFS)
		t.BPFFS = ""
		return nil, fmt.Errorf("mount bpffs: %w", err)
	}
	if t.Cgroup, err = os.MkdirTemp("", "xlb-cgroup-"); err != nil {
		return nil, err
	}
	if err := unix.Mount("none", t.Cgroup, "cgroup2", 0, ""); err != nil {
		os.Remove(t.Cgroup)
		t.Cgroup = ""
		return nil, fmt.Errorf("mount cgroup2: %w", err)
	}
	return t, ctx.Err()
}

func (t *Topology) run(steps [][]string) error {
	for _, s := range steps {
		var ns *netns.NS
		switch s[0] {
		case "sw":
			ns = t.Switch
		}
		if _, err := ns.IP(strings.Fields(s[1])...); err != nil {
			return err
		}
	}
	return nil
}

// AddPod creates a pod on node n with the next free address.
func (t *Topology) AddPod(n *Node, name string) (*Pod, error) {
	n.nextPod++
	addr := n.PodCIDR.Addr().As4()
	addr[3] = byte(9 + n.nextPod)
	p := &Pod{Name: name, Addr: netip.AddrFrom4(addr), Node: n}
	ns, err := netns.New("xlb-pod")
	if err != nil {
		return nil, err
	}
	t.all = append(t.all, ns)
	p.NS = ns
	p.veth = fmt.Sprintf("veth%s%d", n.Name[:1], n.nextPod)
	if err := netns.Veth(n.NS, p.veth, ns, "eth0"); err != nil {
		return nil, err
	}
	for _, c := range [][]string{
		{"link", "set", p.veth, "master", "cni0"},
	} {
		if _, err := n.IP(c...); err != nil {
			return nil, err
		}
	}
	for _, c := range [][]string{
		{"addr", "add", p.Addr.String() + "/24", "dev", "eth0"},
		{"route", "add", "default", "via", n.gateway.String()},
	} {
		if _, err := ns.IP(c...); err != nil {
			return nil, err
		}
	}
	// Pods keep the veth offloads a CNI leaves on: their TCP sends GSO
	// packets far larger than the MTU with partial checksums, which the
	// TC program on the host side must translate and forward as they are.
	t.Pods = append(t.Pods, p)
	return p, nil
}

// Close removes the whole sandbox.
func (t *Topology) Close() error {
	var errs []error
	for i := len(t.all) - 1; i >= 0; i-- {
		if err := t.all[i].Delete(); err != nil {
			errs = append(errs, err)
		}
	}
	t.all = nil
	for _, l := range t.links {
		l.Close()
	}
	t.links = nil
	if t.baseline != nil {
		t.baseline.Close()
		t.baseline = nil
	}
	if t.Cgroup != "" {
		if err := unix.Unmount(t.Cgroup, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t.Cgroup, err))
		}
		os.Remove(t.Cgroup)
		t.Cgroup = ""
	}
	if t.BPFFS != "" {
		if err := unix.Unmount(t.BPFFS, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmount %s: %w", t.BPFFS, err))
		}
		os.Remove(t.BPFFS)
		t.BPFFS = ""
	}
	return errors.Join(errs...)
}
