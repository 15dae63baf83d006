package testenv

import (
	"testing"

	"github.com/xdplb/xdplb/tests/netns"
)

// Netns is a network namespace created for one test and removed after it.
type Netns struct {
	*netns.NS
	t testing.TB
}

// NewNetns creates a namespace (visible to `ip netns`), with loopback up.
// It is deleted when the test ends, together with every interface and
// process in it.
func NewNetns(t testing.TB, prefix string) *Netns {
	t.Helper()
	RequirePrivileged(t)
	RequireCommand(t, "ip")
	ns, err := netns.New("xlb-" + prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ns.Delete(); err != nil {
			t.Errorf("delete namespace: %v", err)
		}
	})
	return &Netns{NS: ns, t: t}
}

// IP runs `ip -n <ns> args...` and fails the test on error.
func (n *Netns) IP(args ...string) string {
	n.t.Helper()
	out, err := n.NS.IP(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// Exec runs a command inside the namespace and fails the test on error.
func (n *Netns) Exec(name string, args ...string) string {
	n.t.Helper()
	out, err := n.NS.Exec(name, args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return out
}

// Sysctl sets a sysctl inside the namespace and fails the test on error.
func (n *Netns) Sysctl(key, value string) {
	n.t.Helper()
	if err := n.NS.Sysctl(key, value); err != nil {
		n.t.Fatal(err)
	}
}

// Veth creates a veth pair between two namespaces, both ends up.
func Veth(t testing.TB, a *Netns, aName string, b *Netns, bName string) {
	t.Helper()
	if err := netns.Veth(a.NS, aName, b.NS, bName); err != nil {
		t.Fatal(err)
	}
}
