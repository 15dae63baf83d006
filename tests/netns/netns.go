// Package netns creates and drives the network namespaces that stand in
// for hosts in xdplb's end-to-end tests and demo: each namespace is a
// named `ip netns` namespace, so the agent and the CLI can be started in it
// with `ip netns exec`, and code can enter it for a moment to open sockets
// or make syscalls there.
package netns

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os/exec"
	"runtime"
	"strings"

	vnetns "github.com/vishvananda/netns"
)

// NS is one named network namespace.
type NS struct {
	Name string
}

// New creates a namespace named "<prefix>-<random>" with loopback up.
func New(prefix string) (*NS, error) {
	var b [3]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	n := &NS{Name: fmt.Sprintf("%s-%s", prefix, hex.EncodeToString(b[:]))}
	if _, err := Run("ip", "netns", "add", n.Name); err != nil {
		return nil, err
	}
	if _, err := n.IP("link", "set", "lo", "up"); err != nil {
		n.Delete()
		return nil, err
	}
	return n, nil
}

// Delete kills every process left in the namespace and removes it.
func (n *NS) Delete() error {
	if out, err := exec.Command("ip", "netns", "pids", n.Name).Output(); err == nil {
		for _, pid := range strings.Fields(string(out)) {
			exec.Command("kill", "-9", pid).Run()
		}
	}
	_, err := Run("ip", "netns", "del", n.Name)
	return err
}

// Run runs a command and returns its output, or an error with the output.
func Run(name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// IP runs `ip -n <ns> args...`.
func (n *NS) IP(args ...string) (string, error) {
	return Run("ip", append([]string{"-n", n.Name}, args...)...)
}

// Exec runs a command inside the namespace.
func (n *NS) Exec(name string, args ...string) (string, error) {
	return Run("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Command prepares a command inside the namespace without starting it.
func (n *NS) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// Sysctl sets a sysctl inside the namespace.
func (n *NS) Sysctl(key, value string) error {
	_, err := n.Exec("sysctl", "-qw", key+"="+value)
	return err
}

// Do runs fn on an OS thread that has entered the namespace. Sockets fn
// creates belong to the namespace and may be used from any goroutine after
// fn returns. A fn that ends its goroutine instead of returning (a
// t.Fatal inside it calls runtime.Goexit) makes Do return an error rather
// than wait for good, and the thread leaves the namespace first: a thread
// left in it could be the process's main thread, which `ip netns pids`
// (and so Delete) would then take for a process of the namespace.
func (n *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Left locked on purpose if switching back fails: the runtime
		// then retires the thread instead of reusing it.
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromName(n.Name)
		if err != nil {
			errc <- err
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			errc <- err
			return
		}
		returned := false
		defer func() {
			if returned {
				return
			}
			if vnetns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
			errc <- fmt.Errorf("netns %s: the function ended its goroutine before returning "+
				"(t.Fatal inside Do? return an error instead)", n.Name)
		}()
		ferr := fn()
		returned = true
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to the original namespace: %w", err)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// Dial opens a connection from inside the namespace.
func (n *NS) Dial(network, addr string, d net.Dialer) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		c, err = d.Dial(network, addr)
		return err
	})
	return c, err
}

// Listen opens a listener inside the namespace.
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket inside the namespace.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	var c net.PacketConn
	err := n.Do(func() error {
		var err error
		c, err = net.ListenPacket(network, addr)
		return err
	})
	return c, err
}

// Veth creates a veth pair with one end in each namespace, both up.
func Veth(a *NS, aName string, b *NS, bName string) error {
	if _, err := Run("ip", "link", "add", aName, "netns", a.Name, "type", "veth", "peer", "name", bName, "netns", b.Name); err != nil {
		return err
	}
	if _, err := a.IP("link", "set", aName, "up"); err != nil {
		return err
	}
	_, err := b.IP("link", "set", bName, "up")
	return err
}

// Ethtool runs ethtool inside the namespace.
func (n *NS) Ethtool(args ...string) error {
	_, err := n.Exec("ethtool", args...)
	return err
}
