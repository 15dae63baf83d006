package xdp_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// A host process reaches a ClusterIP through the socket programs whether
// its socket is AF_INET or a dual-stack AF_INET6 one (Java's and many
// other runtimes' default) naming the ClusterIP by its IPv4-mapped address
// ::ffff:10.96.0.10: connect and sendto reach the backend, and
// getpeername and recvfrom show the ClusterIP, in the socket's own form;
// a ClusterIP without endpoints refuses the connection. An IPv6 address
// that merely ends in the ClusterIP's bits is not a v4-mapped one and is
// left alone. The backend (a hostNetwork one, at the node's address) and
// a server at that IPv6 address each answer with the address they were
// reached at.
func TestDualStackHostSocketsReachIPv4Services(t *testing.T) {
	f := newFixture(t)
	backend := dataplane.Backend{Addr: nodeAddr, Port: 8081, Local: true}
	f.program(service{
		svcID: 9, tableID: 9,
		frontends: []dataplane.FrontendKey{
			{Addr: clusterIP, Port: 80, Proto: packet.TCP},
			{Addr: clusterIP, Port: 53, Proto: packet.UDP},
		},
		backends: map[uint32]dataplane.Backend{51: backend},
		table:    []uint32{51},
	})
	f.program(service{ // no endpoints
		svcID:     10,
		frontends: []dataplane.FrontendKey{{Addr: clusterIP, Port: 81, Proto: packet.TCP}},
	})
	// fd00::a60:a ends in 10.96.0.10.
	plain6 := netip.MustParseAddr("fd00::a60:a")
	f.ns.IP("addr", "add", plain6.String()+"/128", "dev", "lo", "nodad")
	for _, at := range []netip.AddrPort{
		netip.AddrPortFrom(backend.Addr, backend.Port),
		netip.AddrPortFrom(plain6, 80),
		netip.AddrPortFrom(plain6, 53),
	} {
		f.serveOwnAddress(at)
	}
	cgroup := f.hostSocketsCgroup()

	mapped := netip.AddrFrom16(clusterIP.As16())
	reached := netip.AddrPortFrom(backend.Addr, backend.Port).String()
	for _, tc := range []struct {
		op, to string
		reply  string // what answered: the address it was reached at
		peer   string // getpeername, or where recvfrom says the reply is from
		err    string
	}{
		{op: "tcp", to: "10.96.0.10:80", reply: reached, peer: "10.96.0.10:80"},
		{op: "udp", to: "10.96.0.10:53", reply: reached, peer: "10.96.0.10:53"},
		{op: "tcp", to: netip.AddrPortFrom(mapped, 80).String(), reply: reached, peer: "[::ffff:10.96.0.10]:80"},
		{op: "udp", to: netip.AddrPortFrom(mapped, 53).String(), reply: reached, peer: "[::ffff:10.96.0.10]:53"},
		{op: "udp-connected", to: netip.AddrPortFrom(mapped, 53).String(), reply: reached, peer: "[::ffff:10.96.0.10]:53"},
		{op: "tcp", to: netip.AddrPortFrom(mapped, 81).String(), err: "connect: connection refused"},
		{op: "tcp", to: "[fd00::a60:a]:80", reply: "[fd00::a60:a]:80", peer: "[fd00::a60:a]:80"},
		{op: "udp", to: "[fd00::a60:a]:53", reply: "[fd00::a60:a]:53", peer: "[fd00::a60:a]:53"},
		{op: "udp-connected", to: "[fd00::a60:a]:53", reply: "[fd00::a60:a]:53", peer: "[fd00::a60:a]:53"},
	} {
		t.Run(tc.op+" "+tc.to, func(t *testing.T) {
			f.t = t
			got := f.runHostClient(cgroup, tc.op, tc.to)
			if got.Err != tc.err {
				t.Fatalf("%s to %s: error %q, want %q", tc.op, tc.to, got.Err, tc.err)
			}
			if got.Reply != tc.reply || got.Peer != tc.peer {
				t.Errorf("%s to %s: answered by %s, peer %s; want %s, peer %s", tc.op, tc.to, got.Reply, got.Peer, tc.reply, tc.peer)
			}
		})
	}
}

// serveOwnAddress runs a TCP and a UDP server at an address of the
// fixture node that answer each connection or datagram with that address.
func (f *fixture) serveOwnAddress(at netip.AddrPort) {
	f.t.Helper()
	ln, err := f.ns.Listen("tcp", at.String())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(at.String()))
			c.Close()
		}
	}()
	pc, err := f.ns.ListenPacket("udp", at.String())
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo([]byte(at.String()), from)
		}
	}()
}

// hostSocketsCgroup attaches the socket programs to a new cgroup and makes
// them act on the fixture's namespace (as the agent's do on the node's).
func (f *fixture) hostSocketsCgroup() string {
	f.t.Helper()
	root := loader.FindCgroup2Root()
	if root == "" {
		testenv.Unavailable(f.t, "no cgroup v2 hierarchy")
	}
	var cookie uint64
	if err := f.ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	var cfg xdp.DatapathConfig
	if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		f.t.Fatal(err)
	}
	cfg.NetnsCookie = cookie
	if err := f.dp.Maps.Config.Put(uint32(0), cfg); err != nil {
		f.t.Fatal(err)
	}
	path := filepath.Join(root, fmt.Sprintf("xdplb-sock-test-%d", os.Getpid()))
	if err := os.Mkdir(path, 0o755); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { os.Remove(path) })
	if err := f.dp.AttachHostSockets(path); err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { f.dp.DetachHostSockets() })
	return path
}

// hostClientEnv makes the test binary a host client (see TestMain).
const hostClientEnv = "XDPLB_TEST_HOST_CLIENT"

// hostResult is what a host client saw.
type hostResult struct {
	Reply string // what the server answered
	Peer  string // getpeername of a connected socket, else recvfrom's source
	Err   string // what failed, if anything did
}

// runHostClient runs the test binary as a host client in the fixture's
// namespace and in cgroup, to do op (tcp, udp, udp-connected) to an
// address.
func (f *fixture) runHostClient(cgroup, op, to string) hostResult {
	f.t.Helper()
	exe, err := os.Executable()
	if err != nil {
		f.t.Fatal(err)
	}
	dir, err := os.Open(cgroup)
	if err != nil {
		f.t.Fatal(err)
	}
	defer dir.Close()
	cmd := f.ns.Command(exe, op, to)
	cmd.Env = append(os.Environ(), hostClientEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(dir.Fd())}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		f.t.Fatalf("host client %s %s: %v: %s", op, to, err, stderr.Bytes())
	}
	var r hostResult
	if err := json.Unmarshal(out, &r); err != nil {
		f.t.Fatalf("host client %s %s: %v: %q", op, to, err, out)
	}
	return r
}

// hostClient does one op (args: op, address) on a socket of the address's
// family, IPv4-mapped IPv6 addresses included, and prints a hostResult.
func hostClient(args []string) int {
	var r hostResult
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "want: op address")
		return 2
	}
	to, err := netip.ParseAddrPort(args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r.Reply, r.Peer, err = hostClientOp(args[0], to)
	if err != nil {
		r.Err = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

func hostClientOp(op string, to netip.AddrPort) (reply, peer string, err error) {
	family, sa := unix.AF_INET6, unix.Sockaddr(&unix.SockaddrInet6{Port: int(to.Port()), Addr: to.Addr().As16()})
	if to.Addr().Is4() {
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()}
	}
	typ := unix.SOCK_DGRAM
	if op == "tcp" {
		typ = unix.SOCK_STREAM
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return "", "", err
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		return "", "", err
	}
	buf := make([]byte, 64)
	switch op {
	case "tcp", "udp-connected":
		if err := unix.Connect(fd, sa); err != nil {
			return "", "", fmt.Errorf("connect: %w", err)
		}
		p, err := unix.Getpeername(fd)
		if err != nil {
			return "", "", fmt.Errorf("getpeername: %w", err)
		}
		peer = sockaddrString(p)
		if op == "udp-connected" {
			if _, err := unix.Write(fd, []byte("?")); err != nil {
				return "", peer, fmt.Errorf("send: %w", err)
			}
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return "", peer, fmt.Errorf("receive: %w", err)
		}
		if op == "udp-connected" && sockaddrString(from) != peer {
			return "", peer, fmt.Errorf("the answer came from %s, not the peer", sockaddrString(from))
		}
		return string(buf[:n]), peer, nil
	case "udp":
		if err := unix.Sendto(fd, []byte("?"), 0, sa); err != nil {
			return "", "", fmt.Errorf("sendto: %w", err)
		}
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return "", "", fmt.Errorf("recvfrom: %w", err)
		}
		return string(buf[:n]), sockaddrString(from), nil
	}
	return "", "", fmt.Errorf("unknown op %q", op)
}

func sockaddrString(sa unix.Sockaddr) string {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)).String()
	}
	return fmt.Sprint(sa)
}
