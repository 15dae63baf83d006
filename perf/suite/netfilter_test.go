package suite

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/tests/testenv"
)

func TestParseNftTables(t *testing.T) {
	got := parseNftTables("table ip filter\ntable ip6 nat\n\ntable inet kube-proxy\n")
	if want := []string{"ip filter", "ip6 nat", "inet kube-proxy"}; !slices.Equal(got, want) {
		t.Errorf("parseNftTables = %q, want %q", got, want)
	}
}

// cleanEdge is an edge node of its own for assertClean: a scratch
// namespace with the NICs it looks at and nothing else.
func cleanEdge(t *testing.T) *env {
	t.Helper()
	testenv.RequirePrivileged(t)
	for _, cmd := range []string{"ip", "tc", "nft", "iptables", "ip6tables"} {
		testenv.RequireCommand(t, cmd)
	}
	ns := testenv.NewNetns(t, "pclean")
	ns.IP("link", "add", "name", "eth0", "type", "veth", "peer", "name", "peer0")
	ns.IP("link", "add", "name", "eth1", "type", "veth", "peer", "name", "peer1")
	ns.IP("link", "add", "name", "vethpod0", "type", "veth", "peer", "name", "peer2")
	topo := &Topology{Edge: ns.NS}
	err := ns.Do(func() error {
		for _, d := range []struct {
			name string
			idx  *int
		}{{"eth0", &topo.Eth0}, {"eth1", &topo.Eth1}, {"vethpod0", &topo.VethPod}} {
			ifi, err := net.InterfaceByName(d.name)
			if err != nil {
				return err
			}
			*d.idx = ifi.Index
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// kube-proxy's own --cleanup has nothing to do here: true stands in.
	return &env{log: slog.Default(), topo: topo, kubeProxy: "true"}
}

// TestKubeProxyCleanupRestoresNetfilter leaves in a namespace what kube-proxy's
// iptables mode leaves after --cleanup (empty iptables-nft tables with their
// built-in chains, KUBE-FIREWALL, IPv6 too) and checks assertClean refuses
// it and the mode's cleanup brings netfilter back to nothing at all.
func TestKubeProxyCleanupRestoresNetfilter(t *testing.T) {
	e := cleanEdge(t)
	ctx := context.Background()
	if err := e.assertClean(); err != nil {
		t.Fatalf("a new namespace is not clean: %v", err)
	}
	edge := e.topo.Edge
	for _, args := range [][]string{
		{"iptables", "-t", "filter", "-N", "KUBE-FIREWALL"},
		{"iptables", "-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL"},
		{"iptables", "-t", "nat", "-N", "KUBE-SERVICES"},
		{"iptables", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT"},
		{"ip6tables", "-t", "nat", "-N", "KUBE-KUBELET-CANARY"},
		{"nft", "add", "table", "ip", "kube-proxy"},
		// What is left without a single KUBE- rule: empty tables alone
		// must not pass either.
		{"iptables", "-t", "filter", "-D", "INPUT", "-j", "KUBE-FIREWALL"},
		{"iptables", "-t", "filter", "-X"},
		{"iptables", "-t", "nat", "-X"},
		{"iptables", "-t", "mangle", "-X"},
		{"ip6tables", "-t", "nat", "-X"},
	} {
		if out, err := edge.Exec(args[0], args[1:]...); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	left, err := readNetfilter(edge)
	if err != nil {
		t.Fatal(err)
	}
	if len(left.tables) != 5 || strings.Contains(left.ruleset, "KUBE-") {
		t.Fatalf("the set-up should leave empty tables only:\n%s", left.ruleset)
	}
	err = e.assertClean()
	if err == nil || !strings.Contains(err.Error(), "ip filter, ip nat, ip mangle, ip6 nat, ip kube-proxy") {
		t.Fatalf("assertClean with empty iptables tables left = %v, want an error naming them", err)
	}
	if err := (&kubeProxyMode{proxyMode: "iptables"}).cleanup(ctx, e); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if err := e.assertClean(); err != nil {
		t.Errorf("after cleanup: %v", err)
	}
	if out, err := edge.Exec("nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("after cleanup the ruleset is %q (%v), want empty", out, err)
	}
}

// A table the edge node had before the first mode stays, and a change to it
// is not clean.
func TestNetfilterKeepsWhatWasThere(t *testing.T) {
	e := cleanEdge(t)
	edge := e.topo.Edge
	if out, err := edge.Exec("nft", "add", "table", "inet", "keep"); err != nil {
		t.Fatal(err, out)
	}
	var err error
	if e.netfilter, err = readNetfilter(edge); err != nil {
		t.Fatal(err)
	}
	if out, err := edge.Exec("iptables", "-t", "nat", "-N", "KUBE-SERVICES"); err != nil {
		t.Fatal(err, out)
	}
	if err := restoreNetfilter(edge, e.netfilter); err != nil {
		t.Fatal(err)
	}
	if err := e.assertClean(); err != nil {
		t.Errorf("after restore: %v", err)
	}
	if out, err := edge.Exec("nft", "add", "chain", "inet", "keep", "c"); err != nil {
		t.Fatal(err, out)
	}
	if err := e.assertClean(); err == nil || !strings.Contains(err.Error(), "changed") {
		t.Errorf("assertClean with a chain added to a table that was there = %v, want an error", err)
	}
}

// assertClean fails when it cannot look, instead of passing.
func TestAssertCleanFailsWhenItCannotCheck(t *testing.T) {
	e := cleanEdge(t)
	if out, err := e.topo.Edge.IP("link", "del", "vethpod0"); err != nil {
		t.Fatal(err, out)
	}
	if err := e.assertClean(); err == nil {
		t.Error("assertClean passed an edge node whose vethpod0 it could not inspect")
	}
}
