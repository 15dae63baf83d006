package suite

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/xdplb/xdplb/perf/summary"
	"github.com/xdplb/xdplb/perf/traffic"
	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/packet"
)

// The flood scenario: real TCP connections to perf-one, established before
// a flood of spoofed SYNs at the same service port and opened while it
// lasts, between a real client in gen and a real server on node2. The
// sinks hand their frames to the stack; the flood's frames carry a DSCP
// the sinks still count and drop, so node2's kernel never sees them.
var (
	// RealClientAddr is the real client's address in gen (inside
	// ClientPrefix, outside every generated range).
	RealClientAddr = netip.MustParseAddr("100.127.255.1")
)

const (
	// floodTOS marks the generated flood: DSCP CS1.
	floodTOS = 0x20
	// floodEstablished is how many connections are open before the flood.
	floodEstablished = 100
	// floodIOTimeout bounds one request and its answer, and one
	// connection attempt (time for the client's first SYN retransmit).
	floodIOTimeout = 2 * time.Second
)

// realEndpoints gives gen and node2 the addresses the real connections
// use, once per run.
func (e *env) realEndpoints() error {
	if e.realReady {
		return nil
	}
	steps := []struct {
		ns   *netns.NS
		args []string
	}{
		{e.topo.Node2, []string{"addr", "add", OneBackendAddr.String() + "/32", "dev", "lo"}},
		{e.topo.Gen, []string{"addr", "add", RealClientAddr.String() + "/32", "dev", "lo"}},
		{e.topo.Gen, []string{"route", "add", OneBackendIP.String() + "/32", "via", EdgeAddr.String(), "src", RealClientAddr.String()}},
	}
	for _, s := range steps {
		if _, err := s.ns.IP(s.args...); err != nil {
			return fmt.Errorf("real endpoints: %w", err)
		}
	}
	for _, ns := range []*netns.NS{e.topo.Gen, e.topo.Node2} {
		// XDP sees what the sender put on the wire: real sockets must
		// fill in their checksums rather than leave them to an offload.
		if err := ns.Ethtool("-K", "eth0", "tx", "off"); err != nil {
			return fmt.Errorf("real endpoints: %w", err)
		}
		for _, key := range []string{"net.ipv4.conf.all.rp_filter", "net.ipv4.conf.eth0.rp_filter", "net.ipv4.conf.lo.rp_filter"} {
			if err := ns.Sysctl(key, "0"); err != nil {
				return fmt.Errorf("real endpoints: sysctl %s in %s: %w", key, ns.Name, err)
			}
		}
	}
	e.realReady = true
	return nil
}

// echoServer answers every line with itself until closed.
type echoServer struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func (e *env) startEchoServer() (*echoServer, error) {
	ln, err := e.topo.Node2.Listen("tcp4", netip.AddrPortFrom(OneBackendAddr, uint16(backendPort)).String())
	if err != nil {
		return nil, fmt.Errorf("echo server: %w", err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return s, nil
}

func (s *echoServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// dialService opens a real connection from gen to perf-one.
func (e *env) dialService() (net.Conn, error) {
	d := net.Dialer{Timeout: floodIOTimeout, LocalAddr: &net.TCPAddr{IP: RealClientAddr.AsSlice()}}
	return e.topo.Gen.Dial("tcp4", netip.AddrPortFrom(OneBackendIP, uint16(servicePort)).String(), d)
}

// roundTrip sends one request on c and waits for its answer.
func roundTrip(c net.Conn) error {
	msg := []byte("ping\n")
	if err := c.SetDeadline(time.Now().Add(floodIOTimeout)); err != nil {
		return err
	}
	if _, err := c.Write(msg); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err
}

// edgeReceived is how many frames the edge node's eth0 has taken in.
func (e *env) edgeReceived() (uint64, error) {
	var n uint64
	err := e.topo.Edge.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if st := l.Attrs().Statistics; st != nil {
			n = st.RxPackets
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("edge eth0 statistics: %w", err)
	}
	return n, nil
}

// measureFlood runs one repetition of the flood scenario; the mode was
// reset. The repetition's rate is the flood's: the frames the edge node
// took in (forwarded, answered or dropped there) per second.
func (e *env) measureFlood(ctx context.Context, m mode, sc scenario, set ServiceSet) (rep, error) {
	if e.pktgen != nil {
		return rep{}, errors.New("needs the BPF generator: pktgen sends UDP only")
	}
	if err := e.realEndpoints(); err != nil {
		return rep{}, err
	}
	sinks := []*traffic.Sink{e.topo.ClientSink, e.topo.Node2Sink}
	for i, pass := range []netip.Addr{RealClientAddr, OneBackendAddr} {
		if err := sinks[i].PassTo(pass, floodTOS); err != nil {
			return rep{}, err
		}
	}
	defer func() {
		for _, s := range sinks {
			if err := s.PassTo(netip.Addr{}, 0); err != nil {
				e.log.Warn("sink still passes real connections", "sink", s.Dev, "err", err)
			}
		}
	}()
	srv, err := e.startEchoServer()
	if err != nil {
		return rep{}, err
	}
	defer srv.Close()

	var established []net.Conn
	defer func() {
		for _, c := range established {
			c.Close()
		}
	}()
	for range floodEstablished {
		c, err := e.dialService()
		if err == nil {
			err = roundTrip(c)
			established = append(established, c)
		}
		if err != nil {
			return rep{}, fmt.Errorf("open an established connection before the flood: %w", err)
		}
	}

	// New connections while the flood lasts, one after the other.
	var attempts, connected int
	var took time.Duration
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			attempts++
			t0 := time.Now()
			c, err := e.dialService()
			if err == nil {
				if roundTrip(c) == nil {
					connected++
					took += time.Since(t0)
				}
				c.Close()
			}
		}
	}()
	spec := newFlowSpec(e, sc, set, newFlowSrc, 1<<20)
	spec.Proto, spec.TCPFlags, spec.TOS = traffic.TCP, packet.SYN, floodTOS
	observe := func() (*observation, error) { return m.observe(ctx, e) }
	rx0, rxErr := e.edgeReceived()
	r, err := e.send(ctx, e.forwardSender(), spec, e.topo.Node2Sink, traffic.RunOptions{Count: sc.count, Duration: sc.duration}, observe)
	close(stop)
	wg.Wait()
	rx1, rxErr1 := e.edgeReceived()
	if err := errors.Join(err, rxErr, rxErr1); err != nil {
		return rep{}, err
	}

	kept := 0
	for _, c := range established {
		if roundTrip(c) == nil {
			kept++
		}
	}
	flood := &summary.Flood{Established: len(established), Kept: kept, Attempts: attempts, Connected: connected,
		ToBackend: r.arrived}
	if connected > 0 {
		flood.ConnectMillis = float64(took.Microseconds()) / 1000 / float64(connected)
	}
	// What the node took in: the generator sends faster than any mode
	// takes frames, and the veth drops the rest before the node sees them.
	r.arrived = min(rx1-rx0, r.sent)
	if r.pipelineCPU > 0 {
		flood.PerCPUSecond = float64(r.arrived) / r.pipelineCPU
	}
	r.flood = flood
	e.log.Info("flood", "mode", m.name(), "sent", r.sent, "kept", kept, "of", len(established),
		"connected", connected, "of", attempts, "to_backend", flood.ToBackend)
	return r, nil
}
