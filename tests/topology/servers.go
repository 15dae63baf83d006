package topology

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/xdplb/xdplb/tests/netns"
)

// Server is a pod's tiny application: an HTTP server answering every
// request with the pod's name (and for GET /bytes/N, N more bytes after
// it, for bulk transfers), a TCP line server answering every line with
// the pod's name (for long-lived connections), and a UDP server answering
// every datagram with the pod's name and the client address it saw.
type Server struct {
	Name      string
	listeners []io.Closer
	wg        sync.WaitGroup
}

// Ports the pod servers listen on.
const (
	HTTPPort = 8080
	LinePort = 9000
	UDPPort  = 5353
)

// StartServer starts the servers in a pod.
func (p *Pod) StartServer() (*Server, error) {
	s := &Server{Name: p.Name}
	httpL, err := p.Listen("tcp4", fmt.Sprintf(":%d", HTTPPort))
	if err != nil {
		return nil, err
	}
	s.listeners = append(s.listeners, httpL)
	lineL, err := p.Listen("tcp4", fmt.Sprintf(":%d", LinePort))
	if err != nil {
		s.Close()
		return nil, err
	}
	s.listeners = append(s.listeners, lineL)
	udp, err := p.ListenPacket("udp4", fmt.Sprintf(":%d", UDPPort))
	if err != nil {
		s.Close()
		return nil, err
	}
	s.listeners = append(s.listeners, udp)

	s.wg.Add(3)
	go s.serveHTTP(httpL)
	go s.serveLines(lineL)
	go s.serveUDP(udp)
	return s, nil
}

func (s *Server) serveHTTP(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			r := bufio.NewReader(c)
			var extra int
			for first := true; ; first = false {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if first {
					fmt.Sscanf(line, "GET /bytes/%d ", &extra)
				}
				if strings.TrimSpace(line) == "" {
					break
				}
			}
			body := s.Name + "\n" + strings.Repeat("x", max(extra, 0))
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\nX-Client: %s\r\n\r\n%s",
				len(body), c.RemoteAddr(), body)
		}()
	}
}

func (s *Server) serveLines(l net.Listener) {
	defer s.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				if _, err := fmt.Fprintf(c, "%s %s\n", s.Name, c.RemoteAddr()); err != nil {
					return
				}
			}
		}()
	}
}

func (s *Server) serveUDP(c net.PacketConn) {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		c.WriteTo([]byte(fmt.Sprintf("%s %s %d", s.Name, from, n)), from)
	}
}

// Close stops the servers.
func (s *Server) Close() {
	for _, l := range s.listeners {
		l.Close()
	}
	s.wg.Wait()
}

// HTTPGet sends one HTTP request from the client namespace and returns the
// name of the pod that answered.
func (t *Topology) HTTPGet(ctx context.Context, addr string) (string, error) {
	return t.HTTPGetFrom(ctx, addr, 0)
}

// HTTPGetFrom is HTTPGet from a given client port (0: any).
func (t *Topology) HTTPGetFrom(ctx context.Context, addr string, port int) (string, error) {
	body, err := httpGetPaused(t.Client, addr, port, "/", 0)
	return strings.TrimSpace(body), err
}

// HTTPDownload asks the pod behind addr for size bytes after its name, from
// namespace ns, and returns the pod's name once all of them arrived. It
// stops reading for pause after the first 64 KiB, so the transfer goes on
// after the flow's state was last refreshed (once a second).
func HTTPDownload(ns *netns.NS, addr string, size int, pause time.Duration) (string, error) {
	body, err := httpGetPaused(ns, addr, 0, fmt.Sprintf("/bytes/%d", size), pause)
	if err != nil {
		return "", err
	}
	name, rest, _ := strings.Cut(body, "\n")
	if len(rest) != size || strings.Trim(rest, "x") != "" {
		return name, fmt.Errorf("%s sent %d bytes, want %d", name, len(rest), size)
	}
	return name, nil
}

// httpGetPaused sends GET path from namespace ns and returns the response
// body; it pauses reading after the first 64 KiB if pause is not 0.
func httpGetPaused(ns *netns.NS, addr string, port int, path string, pause time.Duration) (string, error) {
	d := net.Dialer{Timeout: 3 * time.Second}
	if port != 0 {
		d.LocalAddr = &net.TCPAddr{Port: port}
	}
	c, err := ns.Dial("tcp4", addr, d)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5*time.Second + pause))
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, addr); err != nil {
		return "", err
	}
	var head []byte
	if pause > 0 {
		head = make([]byte, 64<<10)
		n, err := io.ReadFull(c, head)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) {
			return "", fmt.Errorf("after %d bytes: %w", n, err)
		}
		head = head[:n]
		time.Sleep(pause)
	}
	rest, err := io.ReadAll(c)
	raw := append(head, rest...)
	if err != nil {
		return "", fmt.Errorf("after %d bytes: %w", len(raw), err)
	}
	_, body, ok := strings.Cut(string(raw), "\r\n\r\n")
	if !ok || !strings.HasPrefix(string(raw), "HTTP/1.1 200") {
		return "", fmt.Errorf("bad HTTP response %.200q", raw)
	}
	return body, nil
}

// UDPQuery sends one datagram from the client namespace and returns the
// pod's name and the client address the pod saw.
func (t *Topology) UDPQuery(ctx context.Context, addr string) (name, seenFrom string, err error) {
	a, err := UDPAsk(t.Client, addr, []byte("who"))
	return a.Name, a.From, err
}

// UDPAnswer is what a pod's UDP server answers.
type UDPAnswer struct {
	Name string // the pod
	From string // the client address it saw
	Size int    // the size of the datagram it received
}

// UDPAsk sends payload from namespace ns and returns the answer.
func UDPAsk(ns *netns.NS, addr string, payload []byte) (UDPAnswer, error) {
	var c net.PacketConn
	if err := ns.Do(func() error {
		var err error
		c, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		return UDPAnswer{}, err
	}
	defer c.Close()
	return askOn(c, addr, payload)
}

func askOn(c net.PacketConn, addr string, payload []byte) (UDPAnswer, error) {
	dst, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return UDPAnswer{}, err
	}
	buf := make([]byte, 1500)
	for attempt := 0; attempt < 3; attempt++ {
		if _, err := c.WriteTo(payload, dst); err != nil {
			return UDPAnswer{}, err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return UDPAnswer{}, err
		}
		var a UDPAnswer
		fields := strings.Fields(string(buf[:n]))
		if len(fields) != 3 {
			return a, fmt.Errorf("odd UDP answer %q", buf[:n])
		}
		a.Name, a.From = fields[0], fields[1]
		fmt.Sscan(fields[2], &a.Size)
		return a, nil
	}
	return UDPAnswer{}, fmt.Errorf("no UDP answer from %s", addr)
}

// DialFrom opens a TCP connection from namespace ns.
func DialFrom(ns *netns.NS, addr string, timeout time.Duration) (net.Conn, error) {
	return ns.Dial("tcp4", addr, net.Dialer{Timeout: timeout})
}

// LineConn is a long-lived connection to a pod's line server.
type LineConn struct {
	c net.Conn
	r *bufio.Reader
}

// OpenLine opens a long-lived connection from the client namespace.
func (t *Topology) OpenLine(addr string) (*LineConn, error) {
	return OpenLineFrom(t.Client, addr)
}

// OpenLineFrom opens a long-lived connection from namespace ns.
func OpenLineFrom(ns *netns.NS, addr string) (*LineConn, error) {
	c, err := ns.Dial("tcp4", addr, net.Dialer{Timeout: 3 * time.Second})
	if err != nil {
		return nil, err
	}
	return &LineConn{c: c, r: bufio.NewReader(c)}, nil
}

// Ask sends a line and returns the pod's name from the answer.
func (l *LineConn) Ask() (string, error) {
	name, _, err := l.AskFrom()
	return name, err
}

// AskFrom sends a line and returns the pod's name and the client address
// the pod saw.
func (l *LineConn) AskFrom() (name, from string, err error) {
	l.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(l.c, "ping"); err != nil {
		return "", "", err
	}
	line, err := l.r.ReadString('\n')
	if err != nil {
		return "", "", err
	}
	name, from, _ = strings.Cut(strings.TrimSpace(line), " ")
	return name, from, nil
}

// RemoteAddr is the connection's peer as the client's socket reports it.
func (l *LineConn) RemoteAddr() string { return l.c.RemoteAddr().String() }

// Close closes the connection.
func (l *LineConn) Close() error { return l.c.Close() }
