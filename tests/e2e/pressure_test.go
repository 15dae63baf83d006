package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/tests/netns"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/tests/topology"
)

// floodConntrackMax is the agent's --conntrack-max in the flood tests,
// the smallest it takes: a flood of ten times it overflows every table.
const floodConntrackMax = 1024

// flood sends count flows' packets into the sandbox from the client's
// namespace to dst, each from a random source in 198.18.0.0/15 (a
// benchmarking range that no node routes, so the backends' answers die at
// the edge node): TCP SYNs or UDP datagrams, two of each. It returns how
// many packets the client's kernel took.
func flood(ns *netns.NS, proto uint8, dst netip.AddrPort, count int, seed uint64) (int, error) {
	sent := 0
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		to := &unix.SockaddrInet4{Addr: dst.Addr().As4()}
		rng := rand.New(rand.NewPCG(seed, uint64(proto)))
		for range count {
			fr := packet.Frame{
				Src: netip.AddrFrom4([4]byte{198, 18 + byte(rng.IntN(2)), byte(rng.IntN(256)), byte(rng.IntN(256))}),
				Dst: dst.Addr(), Proto: proto, TTL: 64, SrcPort: uint16(1024 + rng.IntN(64000)), DstPort: dst.Port(),
				Flags: packet.SYN, Seq: rng.Uint32(), Window: 64240,
			}
			if proto == packet.UDP {
				fr.Payload = []byte("flood")
			}
			// The IPv4 packet, without the Ethernet header Bytes adds,
			// twice: the second copy (a retransmission, as real clients
			// and flood tools send) marks the flow recently used in an
			// LRU map, where a copy sent once would be evicted first.
			for range 2 {
				if err := unix.Sendto(fd, fr.Bytes()[14:], 0, to); err == nil {
					sent++
				} else if err != unix.ENOBUFS && err != unix.EAGAIN {
					return fmt.Errorf("send: %w", err)
				}
			}
			if sent%256 == 0 {
				time.Sleep(time.Millisecond) // let the backlog drain
			}
		}
		return nil
	})
	return sent, err
}

// floods are the spoofed floods the tests send at a service: SYNs to its
// line port, datagrams to its UDP port.
var floods = []struct {
	name  string
	proto uint8
	port  uint16
}{
	{"SYN flood", packet.TCP, 9000},
	{"UDP flood", packet.UDP, 53},
}

// newFlowAttempts counts what the edge node's datapath did with packets
// that started flows: tracked, or refused for want of a SNAT port.
func (s *sandbox) newFlowAttempts() uint64 {
	s.t.Helper()
	c := s.counters()
	return c["new_flow"] + c["drop_nat_exhausted"]
}

// Established connections through a LoadBalancer IP, to remote backends
// (SNAT) and to a backend on the edge node (DNAT), survive a spoofed SYN
// flood and a spoofed UDP flood at the same service, each ten times
// --conntrack-max, and new connections from a real client succeed while
// the SYN flood goes on, with SYN cookies off.
func TestEstablishedConnectionsSurviveFloods(t *testing.T) {
	s := newSandbox(t, 2, 1)
	s.write(shop(append(append([]*topology.Pod{}, s.pods...), s.local...)...))
	// Without SYN cookies: the table of unconfirmed flows alone keeps
	// the established ones (TestSYNFloodIsAnsweredWithCookies has them).
	s.startAgent("--conntrack-max", fmt.Sprint(floodConntrackMax), "--syn-cookies", "off")

	held := holdLines(t, 60, func() (*topology.LineConn, error) { return s.topo.OpenLine(addr(lbIP, 9000)) })
	backends := map[string]int{}
	for _, name := range held.names {
		backends[name]++
	}
	if len(backends) != 3 {
		t.Fatalf("60 connections reached %d of 3 backends: %v", len(backends), backends)
	}

	for _, fl := range floods {
		before := s.newFlowAttempts()
		var (
			wg      sync.WaitGroup
			sent    int
			sendErr error
		)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sent, sendErr = flood(s.topo.Client, fl.proto, netip.AddrPortFrom(lbIP, fl.port), 10*floodConntrackMax, uint64(fl.proto))
		}()
		if fl.proto == packet.TCP {
			// Real clients connect while the flood goes on.
			for i := range 10 {
				l, err := s.topo.OpenLine(addr(lbIP, 9000))
				if err != nil {
					t.Fatalf("%s: new connection %d: %v", fl.name, i, err)
				}
				if _, err := l.Ask(); err != nil {
					t.Fatalf("%s: new connection %d: %v", fl.name, i, err)
				}
				l.Close()
			}
		}
		wg.Wait()
		if sendErr != nil {
			t.Fatalf("%s: %v", fl.name, sendErr)
		}
		if got := s.newFlowAttempts() - before; got < 9*floodConntrackMax {
			t.Fatalf("%s: the datapath saw %d new flows of %d packets sent, want nearly %d", fl.name, got, sent, 10*floodConntrackMax)
		}
		if fl.proto == packet.TCP {
			// `xdplb status` says so, and names the port.
			var st struct {
				Flood *struct {
					Ports []struct {
						Service string `json:"service"`
					} `json:"servicePorts"`
				} `json:"flood"`
			}
			if err := json.Unmarshal([]byte(s.cli("status", "-o", "json")), &st); err != nil {
				t.Fatal(err)
			}
			if st.Flood == nil || len(st.Flood.Ports) == 0 || st.Flood.Ports[0].Service != "default/shop:lines/TCP" {
				t.Errorf("%s: status reports the flood as %+v, want it on default/shop:lines/TCP\n%s", fl.name, st.Flood,
					s.cli("status"))
			}
		}
		held.expectKept(t, "the "+fl.name)
	}
}

// heldLines are open line connections, each with the backend that first
// answered it.
type heldLines struct {
	conns []*topology.LineConn
	names []string
}

// holdLines opens n line connections with open and asks each once; they
// are closed when the test ends.
func holdLines(t *testing.T, n int, open func() (*topology.LineConn, error)) *heldLines {
	t.Helper()
	h := &heldLines{}
	for i := range n {
		l, err := open()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		t.Cleanup(func() { l.Close() })
		name, err := l.Ask()
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		h.conns, h.names = append(h.conns, l), append(h.names, name)
	}
	return h
}

// expectKept checks that every connection still answers, from the backend
// it first reached, after what happened (when).
func (h *heldLines) expectKept(t *testing.T, when string) {
	t.Helper()
	for i, l := range h.conns {
		name, err := l.Ask()
		if err != nil {
			t.Fatalf("after %s: connection %d (to %s) broke: %v", when, i, h.names[i], err)
		}
		if name != h.names[i] {
			t.Fatalf("after %s: connection %d moved from %s to %s", when, i, h.names[i], name)
		}
	}
}

// counters reads the edge node's datapath counters by name.
func (s *sandbox) counters() map[string]uint64 {
	s.t.Helper()
	var st struct {
		Counters []struct {
			Name    string `json:"name"`
			Packets uint64 `json:"packets"`
		} `json:"counters"`
	}
	if err := json.Unmarshal([]byte(s.cli("status", "-o", "json")), &st); err != nil {
		s.t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, c := range st.Counters {
		out[c.Name] = c.Packets
	}
	return out
}

// With --syn-cookies always, every connection opens through the SYN
// proxy: the client's kernel completes its handshake with the cookie, the
// backend's with the proxy, and data flows both ways with each side's own
// sequence numbers, across many exchanges; to pods on another node and,
// with externalTrafficPolicy Local, to a pod on the edge node.
func TestConnectionsOpenThroughTheSYNProxy(t *testing.T) {
	for _, tc := range []struct {
		name          string
		remote, local int
	}{
		{"remote backends", 2, 0},
		{"local backend", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, tc.remote, tc.local)
			svc := shop(append(append([]*topology.Pod{}, s.pods...), s.local...)...)
			svc.Local = tc.local > 0
			s.write(svc)
			s.startAgent("--syn-cookies", "always")

			for i := range 5 {
				l, err := s.topo.OpenLine(addr(lbIP, 9000))
				if err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
				first, err := l.Ask()
				if err != nil {
					t.Fatalf("connection %d: %v", i, err)
				}
				for j := range 20 {
					name, err := l.Ask()
					if err != nil || name != first {
						t.Fatalf("connection %d, exchange %d: %q, %v (first answered %q)", i, j, name, err, first)
					}
				}
				l.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := s.topo.HTTPGet(ctx, addr(lbIP, 80)); err != nil {
				t.Fatalf("HTTP through the SYN proxy: %v", err)
			}
			c := s.counters()
			if c["syncookie_sent"] < 6 || c["syncookie_valid"] < 6 || c["synproxy_ack"] < 6 {
				t.Errorf("counters %v: want every connection's SYN answered with a cookie, checked, and its backend's SYN-ACK answered",
					map[string]uint64{"syncookie_sent": c["syncookie_sent"], "syncookie_valid": c["syncookie_valid"], "synproxy_ack": c["synproxy_ack"]})
			}
		})
	}
}

// With SYN cookies on their default (auto), a spoofed SYN flood at a
// service port turns them on: the flood's SYNs are answered, not tracked,
// established connections stay, and real clients connect through the SYN
// proxy while it lasts.
func TestSYNFloodIsAnsweredWithCookies(t *testing.T) {
	s := newSandbox(t, 2, 0)
	s.write(shop(s.pods...))
	s.startAgent("--conntrack-max", fmt.Sprint(floodConntrackMax), "--syn-flood-threshold", "100")

	held := holdLines(t, 40, func() (*topology.LineConn, error) { return s.topo.OpenLine(addr(lbIP, 9000)) })
	before := s.counters()

	// The flood goes on, 1024 flows at a time, until real clients have
	// connected while cookies were on.
	var (
		wg      sync.WaitGroup
		sendErr error
		sent    int
	)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for seed := uint64(7); ; seed++ {
			select {
			case <-stop:
				return
			default:
			}
			n, err := flood(s.topo.Client, packet.TCP, netip.AddrPortFrom(lbIP, 9000), floodConntrackMax, seed)
			sent += n
			if err != nil {
				sendErr = err
				return
			}
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for s.counters()["syncookie_sent"]-before["syncookie_sent"] < 1000 {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatalf("no SYN answered with a cookie 30 s into a flood (%d packets sent, send error %v)", sent, sendErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// `xdplb status` names the port.
	var st struct {
		Ports []string `json:"synCookiePorts"`
	}
	if err := json.Unmarshal([]byte(s.cli("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(st.Ports, "default/shop:lines/TCP") {
		t.Errorf("status names %v as answered with SYN cookies during the flood, want default/shop:lines/TCP", st.Ports)
	}
	for i := range 10 {
		l, err := s.topo.OpenLine(addr(lbIP, 9000))
		if err != nil {
			t.Fatalf("new connection %d during the flood: %v", i, err)
		}
		if _, err := l.Ask(); err != nil {
			t.Fatalf("new connection %d during the flood: %v", i, err)
		}
		l.Close()
	}
	for s.counters()["syncookie_sent"]-before["syncookie_sent"] < 10*floodConntrackMax && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if sendErr != nil {
		t.Fatal(sendErr)
	}
	after := s.counters()
	cookies := after["syncookie_sent"] - before["syncookie_sent"]
	tracked := after["new_flow"] - before["new_flow"]
	if cookies < 10*floodConntrackMax || tracked > uint64(sent)/10 {
		t.Errorf("%d SYNs answered with cookies and %d flows started during a flood of %d SYNs: want nearly all answered",
			cookies, tracked, sent)
	}
	if after["syncookie_valid"] == before["syncookie_valid"] {
		t.Errorf("no connection opened through the SYN proxy during the flood")
	}
	held.expectKept(t, "the flood")
}

// A pod flooding a ClusterIP with spoofed SYNs and UDP datagrams, ten
// times --conntrack-max each, costs another pod on the node none of its
// established connections through the same ClusterIP.
func TestPodFloodKeepsOtherPodsConnections(t *testing.T) {
	s := newSandbox(t, 2, 2)
	victim, flooder := s.local[0], s.local[1]
	const clusterIP = "10.96.1.9"
	s.write(lines("pressure", clusterIP, s.pods...))
	s.startAgent("--conntrack-max", fmt.Sprint(floodConntrackMax))

	held := holdLines(t, 40, func() (*topology.LineConn, error) {
		return topology.OpenLineFrom(victim.NS, clusterIP+":9000")
	})
	for _, fl := range floods {
		before := s.newFlowAttempts()
		sent, err := flood(flooder.NS, fl.proto, netip.AddrPortFrom(netip.MustParseAddr(clusterIP), fl.port),
			10*floodConntrackMax, uint64(fl.proto)+100)
		if err != nil {
			t.Fatalf("%s: %v", fl.name, err)
		}
		if got := s.newFlowAttempts() - before; got < 9*floodConntrackMax {
			t.Fatalf("%s: the datapath saw %d new flows of %d packets sent, want nearly %d", fl.name, got, sent, 10*floodConntrackMax)
		}
		held.expectKept(t, "the "+fl.name)
	}
}
