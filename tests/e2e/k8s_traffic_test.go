package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/topology"
)

// answer is what a pod's server answered: the pod's name and the client
// address (host only) it saw.
type answer struct {
	Pod  string
	From string
}

func (a answer) String() string { return a.Pod + " (saw " + a.From + ")" }

// parseAnswer reads "podname host:port" (the line server) or
// "podname host:port size" (the UDP server).
func parseAnswer(s string) (answer, error) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return answer{}, fmt.Errorf("odd answer %q", s)
	}
	host, _, err := net.SplitHostPort(f[1])
	if err != nil {
		return answer{}, fmt.Errorf("odd answer %q", s)
	}
	return answer{Pod: f[0], From: host}, nil
}

// hello opens a TCP connection from ns to dst (from src if it is valid; a
// zero port: any port), exchanges one line with the pod's line server and
// resets the connection (so a fixed source port can be used again at
// once). It returns who answered.
func hello(ns *netns.NS, src netip.AddrPort, dst string) (answer, error) {
	d := net.Dialer{Timeout: 2 * time.Second}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	c, err := ns.Dial("tcp4", dst, d)
	if err != nil {
		return answer{}, err
	}
	defer func() {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintln(c, "ping"); err != nil {
		return answer{}, err
	}
	l, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return answer{}, err
	}
	return parseAnswer(l)
}

// askUDP sends a UDP datagram from a new socket in ns to dst (again, up to
// three times, while no answer comes) and returns who answered. An ICMP
// error ends it at once.
func askUDP(ns *netns.NS, dst string) (answer, error) {
	c, err := ns.Dial("udp4", dst, net.Dialer{})
	if err != nil {
		return answer{}, err
	}
	defer c.Close()
	u := &udpSocket{c: c}
	for attempt := 0; ; attempt++ {
		a, err := u.ask(time.Second)
		if outcome(err) != "timeout" || attempt == 2 {
			return a, err
		}
	}
}

// udpSocket is one connected UDP socket: its queries are one flow, and an
// ICMP port unreachable shows as "connection refused".
type udpSocket struct{ c net.Conn }

func dialUDP(t *testing.T, ns *netns.NS, src netip.AddrPort, dst string) *udpSocket {
	t.Helper()
	var d net.Dialer
	if src.IsValid() {
		d.LocalAddr = net.UDPAddrFromAddrPort(src)
	}
	c, err := ns.Dial("udp4", dst, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &udpSocket{c: c}
}

// ask sends one datagram and waits up to wait for the answer.
func (u *udpSocket) ask(wait time.Duration) (answer, error) {
	if _, err := u.c.Write([]byte("who")); err != nil {
		return answer{}, err
	}
	u.c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1500)
	n, err := u.c.Read(buf)
	if err != nil {
		return answer{}, err
	}
	return parseAnswer(string(buf[:n]))
}

// liveConn is a long-lived connection to a pod's line server.
type liveConn struct {
	*topology.LineConn
	first answer
}

// openLine connects from ns to dst (from src if it is valid) and returns
// the connection with its first answer.
func openLine(t *testing.T, ns *netns.NS, src netip.AddrPort, dst string) *liveConn {
	t.Helper()
	d := net.Dialer{Timeout: 3 * time.Second}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	conn, err := ns.Dial("tcp4", dst, d)
	if err != nil {
		t.Fatalf("connect to %s: %v", dst, err)
	}
	c := topology.WrapLine(conn)
	t.Cleanup(func() { c.Close() })
	name, from, err := c.AskFrom()
	if err != nil {
		t.Fatalf("first exchange with %s: %v", dst, err)
	}
	a, err := parseAnswer(name + " " + from)
	if err != nil {
		t.Fatal(err)
	}
	return &liveConn{LineConn: c, first: a}
}

// openLineTo opens a long-lived connection from the client to dst (an
// external frontend of the edge) from a client port that xdplb lookup says
// Maglev sends to want.
func openLineTo(t *testing.T, c *k8sCluster, dst string, want *topology.Pod) *liveConn {
	t.Helper()
	for port := uint16(42000); port < 42100; port++ {
		src := netip.AddrPortFrom(topology.ClientAddr, port)
		host, _, _ := net.SplitHostPort(c.edge.lookup(t, protoTCP, src, dst).Backend)
		if host != want.Addr.String() {
			continue
		}
		l := openLine(t, c.topo.Client, src, dst)
		if l.first.Pod != want.Name {
			t.Fatalf("the connection from port %d reached %s; xdplb lookup said %s", port, l.first, want.Name)
		}
		return l
	}
	t.Fatalf("no client port in 42000-42099 is sent to %s", want.Name)
	return nil
}

// still checks that the connection works and is still served by the pod
// that answered first.
func (l *liveConn) still(t *testing.T, when string) {
	t.Helper()
	name, from, err := l.AskFrom()
	if err != nil {
		t.Fatalf("%s: the established connection broke: %v", when, err)
	}
	if got, err := parseAnswer(name + " " + from); err != nil || got != l.first {
		t.Fatalf("%s: the established connection is now answered by %s (%v), was %s", when, got, err, l.first)
	}
}

// outcome classifies the result of a connection attempt.
func outcome(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "connected"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "refused"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "unreachable"
	}
	return err.Error()
}

// podNames lists the names of pods.
func podNames(pods []*topology.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	return names
}

// findPod returns the pod named name, or nil.
func findPod(pods []*topology.Pod, name string) *topology.Pod {
	for _, p := range pods {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// wantAnswer checks who answered: one of pods, having seen the client as
// from.
func wantAnswer(t *testing.T, what string, got answer, err error, from string, pods ...*topology.Pod) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if names := podNames(pods); !slices.Contains(names, got.Pod) {
		t.Errorf("%s: answered by %s, want one of %v", what, got, names)
	} else if got.From != from {
		t.Errorf("%s: %s saw the client as %s, want %s", what, got.Pod, got.From, from)
	}
}

// wantRefused checks that a TCP connection from ns to dst is refused at
// once.
func wantRefused(t *testing.T, what string, ns *netns.NS, dst string) {
	t.Helper()
	start := time.Now()
	a, err := hello(ns, netip.AddrPort{}, dst)
	if o := outcome(err); o != "refused" {
		t.Errorf("%s: %s %v, want connection refused", what, o, a)
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("%s: refused only after %s", what, d)
	}
}

// wantDropped checks that a TCP connection from ns to dst gets no answer
// at all.
func wantDropped(t *testing.T, what string, ns *netns.NS, src netip.AddrPort, dst string) {
	t.Helper()
	d := net.Dialer{Timeout: time.Second}
	if src.IsValid() {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	c, err := ns.Dial("tcp4", dst, d)
	if err == nil {
		c.Close()
	}
	if o := outcome(err); o != "timeout" {
		t.Errorf("%s: %s, want no answer (dropped)", what, o)
	}
}

// spread makes n connections from ns (from address src, any port) to dst
// and counts the answers by pod; every answer must have seen from.
func spread(t *testing.T, ns *netns.NS, src netip.Addr, dst string, n int, from string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := 0; i < n; i++ {
		var s netip.AddrPort
		if src.IsValid() {
			s = netip.AddrPortFrom(src, 0)
		}
		a, err := hello(ns, s, dst)
		if err != nil {
			t.Fatalf("connection %d to %s: %v", i, dst, err)
		}
		if a.From != from {
			t.Fatalf("connection %d to %s: %s saw the client as %s, want %s", i, dst, a.Pod, a.From, from)
		}
		got[a.Pod]++
	}
	return got
}

// serveLines runs another line server in pod p on port, answering like the
// pod's own.
func serveLines(t *testing.T, p *topology.Pod, port int) {
	t.Helper()
	l, err := p.Listen("tcp4", hostPort("", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					if _, err := fmt.Fprintf(c, "%s %s\n", p.Name, c.RemoteAddr()); err != nil {
						return
					}
				}
			}()
		}
	}()
}

// httpGet sends one HTTP request from ns to dst and returns the body and
// the client address the pod saw (its X-Client header).
func httpGet(ns *netns.NS, dst string) (answer, error) {
	c, err := ns.Dial("tcp4", dst, net.Dialer{Timeout: 2 * time.Second})
	if err != nil {
		return answer{}, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: xdplb-e2e\r\nConnection: close\r\n\r\n", dst); err != nil {
		return answer{}, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return answer{}, err
	}
	return parseAnswer(strings.TrimSpace(string(body)) + " " + resp.Header.Get("X-Client"))
}
