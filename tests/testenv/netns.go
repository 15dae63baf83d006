package testenv

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/vishvananda/netns"
)

// Netns is a network namespace created for one test and removed after it.
type Netns struct {
	Name string
	t    testing.TB
}

// NewNetns creates a named network namespace (visible to `ip netns`), with
// loopback up. It is deleted when the test ends, together with every
// interface in it.
func NewNetns(t testing.TB, prefix string) *Netns {
	t.Helper()
	RequirePrivileged(t)
	RequireCommand(t, "ip")
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("xlb-%s-%s", prefix, hex.EncodeToString(b[:]))
	Run(t, "ip", "netns", "add", name)
	n := &Netns{Name: name, t: t}
	t.Cleanup(func() {
		// Kill what still runs in it, then remove it.
		if out, err := exec.Command("ip", "netns", "pids", name).Output(); err == nil {
			for _, pid := range strings.Fields(string(out)) {
				exec.Command("kill", "-9", pid).Run()
			}
		}
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	n.IP("link", "set", "lo", "up")
	return n
}

// IP runs `ip -n <ns> args...`.
func (n *Netns) IP(args ...string) string {
	n.t.Helper()
	return Run(n.t, "ip", append([]string{"-n", n.Name}, args...)...)
}

// Exec runs a command inside the namespace and returns its output.
func (n *Netns) Exec(name string, args ...string) string {
	n.t.Helper()
	return Run(n.t, "ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Command prepares (without starting) a command inside the namespace.
func (n *Netns) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Sysctl sets a sysctl inside the namespace.
func (n *Netns) Sysctl(key, value string) {
	n.t.Helper()
	n.Exec("sysctl", "-qw", key+"="+value)
}

// Do runs fn on an OS thread that has entered the namespace. Syscalls fn
// makes (BPF_PROG_TEST_RUN, netlink, sockets) act inside it.
func (n *Netns) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// The thread is left locked on purpose when switching back
		// fails: the runtime then discards it instead of reusing a
		// thread stuck in the wrong namespace.
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := netns.GetFromName(n.Name)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to the original namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Veth creates a veth pair between two namespaces (either may be nil for
// the test's own namespace, which tests should not use) and brings both
// ends up.
func Veth(t testing.TB, a *Netns, aName string, b *Netns, bName string) {
	t.Helper()
	Run(t, "ip", "link", "add", aName, "netns", a.Name, "type", "veth", "peer", "name", bName, "netns", b.Name)
	a.IP("link", "set", aName, "up")
	b.IP("link", "set", bName, "up")
}
