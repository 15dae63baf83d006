package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
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

// newFlowAttempts counts what the edge node's datapath did with packets
// that started flows: tracked, or refused for want of a SNAT port.
func (s *sandbox) newFlowAttempts() uint64 {
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
	var n uint64
	for _, c := range st.Counters {
		if c.Name == "new_flow" || c.Name == "drop_nat_exhausted" {
			n += c.Packets
		}
	}
	return n
}

// Established connections through a LoadBalancer IP, to remote backends
// (SNAT) and to a backend on the edge node (DNAT), survive a spoofed SYN
// flood and a spoofed UDP flood at the same service, each ten times
// --conntrack-max, and new connections from a real client succeed while
// the SYN flood goes on.
func TestEstablishedConnectionsSurviveFloods(t *testing.T) {
	s := newSandbox(t, 2, 1)
	s.write(shop(append(append([]*topology.Pod{}, s.pods...), s.local...)...))
	s.startAgent("--conntrack-max", fmt.Sprint(floodConntrackMax))

	type conn struct {
		line    *topology.LineConn
		backend string
	}
	var conns []conn
	for range 60 {
		l, err := s.topo.OpenLine(addr(lbIP, 9000))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		name, err := l.Ask()
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn{l, name})
	}
	backends := map[string]int{}
	for _, c := range conns {
		backends[c.backend]++
	}
	if len(backends) != 3 {
		t.Fatalf("60 connections reached %d of 3 backends: %v", len(backends), backends)
	}

	for _, fl := range []struct {
		name  string
		proto uint8
		port  uint16
	}{
		{"SYN flood", packet.TCP, 9000},
		{"UDP flood", packet.UDP, 53},
	} {
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
		for i, c := range conns {
			name, err := c.line.Ask()
			if err != nil {
				t.Fatalf("after the %s: established connection %d (to %s) broke: %v", fl.name, i, c.backend, err)
			}
			if name != c.backend {
				t.Fatalf("after the %s: established connection %d moved from %s to %s", fl.name, i, c.backend, name)
			}
		}
	}
}
