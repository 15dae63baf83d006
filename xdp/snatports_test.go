package xdp_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/xdp"
)

// Two SNAT port ranges are one port space: flows take ports of both, each
// once, and replies to a port of either range find their flow.
func TestSNATPortsOfTwoRanges(t *testing.T) {
	ports := xdp.SNATPorts{{Min: snatMin, Max: snatMin + 3}, {Min: snatMin + 100, Max: snatMin + 103}}
	f := newFixture(t, withSNATPorts(ports))
	f.program(oneRemoteBackend())
	const flows = 8              // every port of both ranges
	taken := map[uint16]uint16{} // SNAT port -> client port
	for c := uint16(0); c < flows; c++ {
		in := tcpFrame(clientAddr, 7000+c, nodeAddr, 30100, packet.SYN, "")
		r := f.run(in.Bytes(), f.nic0)
		if r.verdict != xdpRedirect {
			t.Fatalf("flow %d with %d of %d ports in use: verdict %v, want redirect", c, len(taken), ports.Len(), r.verdict)
		}
		port := decode(t, r.out).SrcPort
		if _, reused := taken[port]; reused || !ports.Contains(port) {
			t.Fatalf("flow %d got SNAT port %d: reused, or not one of %s", c, port, ports)
		}
		taken[port] = in.SrcPort
	}
	// Every port is taken: the next flow finds none.
	f.expectCounters(map[string]uint64{"drop_nat_exhausted": 1}, func() {
		f.run(tcpFrame(clientAddr, 7100, nodeAddr, 30100, packet.SYN, "").Bytes(), f.nic0)
	})
	for port, client := range taken {
		reply := tcpFrame(remotePod1, podPort, nic1Addr, port, packet.SYN|packet.ACK, "")
		r := f.run(reply.Bytes(), f.nic1)
		if r.verdict == xdpPass || len(r.out) == 0 {
			t.Fatalf("reply to SNAT port %d: verdict %v, not translated", port, r.verdict)
		}
		if out := decode(t, r.out); out.Dst != clientAddr || out.DstPort != client || out.SrcPort != 30100 {
			t.Errorf("reply to SNAT port %d went to %s:%d from port %d, want %s:%d from 30100",
				port, out.Dst, out.DstPort, out.SrcPort, clientAddr, client)
		}
	}
}

// A SNAT flow never takes a port below the host's ephemeral ports (where
// its servers listen) that the host has a socket on that its replies
// would reach: a listener on the port, or a connection on the reply tuple
// itself. The bucket's hand offers the first port first, so without the
// rule the flow would take it. Above, ip_local_reserved_ports keeps the
// host's own connections out, and no lookup is paid.
func TestSNATPassesOverPortsOfHostSockets(t *testing.T) {
	const low = 20000 // below 32768, where the check applies
	udpService := oneRemoteBackend()
	udpService.frontends = []dataplane.FrontendKey{{Addr: nodeAddr, Port: 30100, Proto: packet.UDP}}
	tcpSYN := tcpFrame(clientAddr, 7000, nodeAddr, 30100, packet.SYN, "")
	udpFirst := udpFrame(clientAddr, 7000, nodeAddr, 30100, "q")
	for _, tc := range []struct {
		name     string
		first    uint16 // the SNAT range: first and first+1
		svc      service
		in       packet.Frame
		socket   func(t *testing.T) (close func()) // opened in the node's namespace
		wantPort uint16
	}{
		{"no socket", low, oneRemoteBackend(), tcpSYN, nil, low},
		{"a TCP listener on the first port", low, oneRemoteBackend(), tcpSYN, listenerOn(low), low + 1},
		{"a UDP socket connected on the reply tuple", low, udpService, udpFirst,
			connectedUDP(netip.AddrPortFrom(nic1Addr, low), netip.AddrPortFrom(remotePod1, podPort)), low + 1},
		{"a UDP socket connected elsewhere", low, udpService, udpFirst,
			connectedUDP(netip.AddrPortFrom(nic1Addr, low), netip.AddrPortFrom(remotePod2, podPort)), low},
		{"a TCP listener on a port among the host's own", snatMin, oneRemoteBackend(), tcpSYN, listenerOn(snatMin), snatMin},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, withSNATRange(tc.first, tc.first+1))
			f.program(tc.svc)
			if tc.socket != nil {
				var closeSocket func()
				if err := f.ns.Do(func() error { closeSocket = tc.socket(t); return nil }); err != nil {
					t.Fatal(err)
				}
				defer closeSocket()
			}
			skipped := map[bool]uint64{true: 1}[tc.wantPort != tc.first]
			var r result
			f.expectCounters(map[string]uint64{"snat_host_socket": skipped, "new_flow": 1, "redirect": 1}, func() {
				r = f.run(tc.in.Bytes(), f.nic0)
			})
			if got := decode(t, r.out).SrcPort; got != tc.wantPort {
				t.Errorf("SNAT port %d, want %d", got, tc.wantPort)
			}
		})
	}
}

// listenerOn opens a TCP listener on port of every address.
func listenerOn(port uint16) func(t *testing.T) (close func()) {
	return func(t *testing.T) func() {
		l, err := net.Listen("tcp4", netip.AddrPortFrom(netip.IPv4Unspecified(), port).String())
		if err != nil {
			t.Fatal(err)
		}
		return func() { l.Close() }
	}
}

// connectedUDP opens a UDP socket bound to local and connected to remote.
func connectedUDP(local, remote netip.AddrPort) func(t *testing.T) (close func()) {
	return func(t *testing.T) func() {
		c, err := net.DialUDP("udp4", net.UDPAddrFromAddrPort(local), net.UDPAddrFromAddrPort(remote))
		if err != nil {
			t.Fatal(err)
		}
		return func() { c.Close() }
	}
}

// The two ranges' ports are numbered one after the other, as the datapath
// numbers them (snat_port_offset): what the agent and the loader compute
// slot indexes with.
func TestSNATPortNumbers(t *testing.T) {
	for _, tc := range []struct {
		flag    string
		want    xdp.SNATPorts
		wantErr string
		ports   []uint16 // port -> offset, in order
		outside []uint16
	}{
		{flag: "40000-60999", want: xdp.SNATPorts{{Min: 40000, Max: 60999}},
			ports: []uint16{40000, 40001, 60999}, outside: []uint16{39999, 61000, 0}},
		{flag: "1024-29999,40000-65535", want: xdp.SNATPorts{{Min: 1024, Max: 29999}, {Min: 40000, Max: 65535}},
			ports: []uint16{1024, 29999, 40000, 65535}, outside: []uint16{1023, 30000, 39999, 0}},
		{flag: " 2000-2001 , 3000-3000", want: xdp.SNATPorts{{Min: 2000, Max: 2001}, {Min: 3000, Max: 3000}},
			ports: []uint16{2000, 2001, 3000}, outside: []uint16{2002, 2999, 3001}},
		{flag: "3000-4000,2000-2500", wantErr: "give the lower range first"},
		{flag: "3000-4000,4000-5000", wantErr: "overlap"},
		{flag: "1-2,3-4,5-6", wantErr: "at most 2"},
		{flag: "5-4", wantErr: "is empty"},
		{flag: "0-4", wantErr: "is empty"},
		{flag: "10-70000", wantErr: "high port"},
		{flag: "", wantErr: "not LOW-HIGH"},
	} {
		t.Run(tc.flag, func(t *testing.T) {
			got, err := xdp.ParseSNATPorts(tc.flag)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parsed %s (%v), want %s", got, err, tc.want)
			}
			if again, err := xdp.ParseSNATPorts(got.String()); err != nil || again != got {
				t.Errorf("%q parses as %s (%v)", got.String(), again, err)
			}
			for i, port := range tc.ports {
				offset, ok := got.Offset(port)
				if !ok || got.Port(offset) != port {
					t.Errorf("port %d: offset %d (%v), which is port %d", port, offset, ok, got.Port(offset))
				}
				if i > 0 {
					if before, _ := got.Offset(tc.ports[i-1]); offset <= before {
						t.Errorf("port %d numbered %d, not after port %d's %d", port, offset, tc.ports[i-1], before)
					}
				}
			}
			if last, _ := got.Offset(tc.ports[len(tc.ports)-1]); last != got.Len()-1 {
				t.Errorf("the highest port is number %d of %d", last, got.Len())
			}
			for _, port := range tc.outside {
				if _, ok := got.Offset(port); ok || got.Contains(port) {
					t.Errorf("port %d is taken for a SNAT port", port)
				}
			}
		})
	}
}

// An interface with extra SNAT addresses spreads its SNAT flows over its
// address and those (by client address and port: a flow keeps its
// address), and the replies to each are translated back.
func TestSNATFlowsSpreadOverExtraAddresses(t *testing.T) {
	f := newFixture(t)
	f.program(oneRemoteBackend())
	extra := []netip.Addr{netip.MustParseAddr("10.1.0.7"), netip.MustParseAddr("10.1.0.8")}
	iface := xdp.Iface{Addr: xdp.AddrToNet(nic1Addr), ExtraCount: uint32(len(extra))}
	for i, a := range extra {
		iface.ExtraAddrs[i] = xdp.AddrToNet(a)
	}
	if err := f.dp.Maps.Ifaces.Put(uint32(f.nic1), iface); err != nil {
		t.Fatal(err)
	}
	const flows = 60
	used := map[netip.Addr]int{}
	for c := uint16(0); c < flows; c++ {
		in := tcpFrame(clientAddr, 7000+c, nodeAddr, 30100, packet.SYN, "")
		sent := decode(t, f.run(in.Bytes(), f.nic0).out)
		if again := decode(t, f.run(in.Bytes(), f.nic0).out); again.Src != sent.Src || again.SrcPort != sent.SrcPort {
			t.Fatalf("client port %d: retransmitted SYN left as %s:%d, the first as %s:%d",
				in.SrcPort, again.Src, again.SrcPort, sent.Src, sent.SrcPort)
		}
		used[sent.Src]++
		reply := tcpFrame(remotePod1, podPort, sent.Src, sent.SrcPort, packet.SYN|packet.ACK, "")
		r := f.run(reply.Bytes(), f.nic1)
		if len(r.out) == 0 {
			t.Fatalf("reply to %s:%d: verdict %v, not translated", sent.Src, sent.SrcPort, r.verdict)
		}
		if out := decode(t, r.out); out.Dst != clientAddr || out.DstPort != in.SrcPort {
			t.Fatalf("reply to %s:%d went to %s:%d, want %s:%d", sent.Src, sent.SrcPort, out.Dst, out.DstPort, clientAddr, in.SrcPort)
		}
	}
	for _, a := range append([]netip.Addr{nic1Addr}, extra...) {
		if used[a] < flows/6 {
			t.Errorf("%d of %d flows left with %s (%v): not spread over the interface's addresses", used[a], flows, a, used)
		}
	}
	if len(used) != 1+len(extra) {
		t.Errorf("flows left with %v, want only the interface's addresses", used)
	}
}
