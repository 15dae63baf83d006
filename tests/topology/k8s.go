package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/xdplb/xdplb/tests/child"
	"github.com/xdplb/xdplb/tests/netns"
)

// StartNodeAgent is StartAgent for any node with its own pins: it runs
// `xdplb agent args...` in n's namespace with --bpffs-root bpffs, /healthz
// on 127.0.0.1:10256 and /metrics on 127.0.0.1:10249 of that namespace, and
// waits until /healthz answers 200 (the first sync is done) or ctx ends.
func StartNodeAgent(ctx context.Context, n *Node, binary, bpffs, logPath string, args ...string) (*Agent, error) {
	a := &Agent{node: n, LogPath: logPath, Healthz: "127.0.0.1:10256"}
	full := append([]string{"agent", "--bpffs-root", bpffs, "--healthz-bind-address", a.Healthz,
		"--metrics-bind-address", MetricsAddr}, args...)
	proc, err := child.Start("xdplb agent", n.Command(binary, full...), logPath)
	if err != nil {
		return nil, err
	}
	a.proc = proc
	if err := a.WaitHealthy(ctx, 30*time.Second); err != nil {
		a.Stop()
		return nil, fmt.Errorf("%w\n%s", err, a.Log())
	}
	return a, nil
}

// MetricsAddr is where StartNodeAgent's agents serve /metrics, inside
// their node.
const MetricsAddr = "127.0.0.1:10249"

// Exited reports whether the agent process has ended.
func (a *Agent) Exited() bool { return a.proc.Exited() }

// Forwarder accepts TCP connections on an address inside a namespace and
// relays each one to a target address dialled from the caller's own
// namespace. It gives a process in a node (an agent) a path to a server
// that listens on the test process's loopback (a test API server) without
// configuring anything outside the sandbox, and lets a test cut that path.
type Forwarder struct {
	ns     *netns.NS
	listen string
	target string

	mu     sync.Mutex
	l      net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// Forward starts relaying connections to listen (host:port) inside ns to
// target.
func Forward(ns *netns.NS, listen, target string) (*Forwarder, error) {
	f := &Forwarder{ns: ns, listen: listen, target: target, conns: map[net.Conn]struct{}{}}
	if err := f.Restore(); err != nil {
		return nil, err
	}
	return f, nil
}

// Restore listens again after Cut; it does nothing while listening.
func (f *Forwarder) Restore() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("forwarder closed")
	}
	if f.l != nil {
		return nil
	}
	l, err := f.ns.Listen("tcp4", f.listen)
	if err != nil {
		return fmt.Errorf("forwarder: listen on %s in %s: %w", f.listen, f.ns.Name, err)
	}
	f.l = l
	f.wg.Add(1)
	go f.accept(l)
	return nil
}

func (f *Forwarder) accept(l net.Listener) {
	defer f.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			continue
		}
		f.wg.Add(1)
		go f.relay(c)
	}
}

// track registers a relayed connection; false once the forwarder is cut.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.l == nil {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *Forwarder) untrack(c net.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
	c.Close()
}

func (f *Forwarder) relay(in net.Conn) {
	defer f.wg.Done()
	defer f.untrack(in)
	out, err := net.DialTimeout("tcp", f.target, 5*time.Second)
	if err != nil {
		return
	}
	if !f.track(out) {
		out.Close()
		return
	}
	defer f.untrack(out)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	// Either direction ending ends the relayed connection; the deferred
	// closes unblock the other copy.
	<-done
	in.Close()
	out.Close()
	<-done
}

// Cut closes the listener and every relayed connection: processes in the
// namespace get "connection refused" until Restore.
func (f *Forwarder) Cut() {
	f.mu.Lock()
	l := f.l
	f.l = nil
	conns := make([]net.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	if l != nil {
		l.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// Close cuts the path for good and waits for the relays to end.
func (f *Forwarder) Close() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.Cut()
	f.wg.Wait()
}

// WrapLine makes a long-lived line connection of an open connection to a
// pod's line server.
func WrapLine(c net.Conn) *LineConn { return &LineConn{c: c, r: bufio.NewReader(c)} }
