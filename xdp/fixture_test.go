package xdp_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/packet"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// The fixture node: a network namespace with three devices, like an edge
// node with a NIC towards clients, a NIC towards the other nodes and one
// local pod. Neighbours are static so FIB lookups give fixed MACs.
//
//	client 192.0.2.10 --- nic0 192.0.2.1        (node address, NodePorts)
//	gw 10.1.0.2       --- nic1 10.1.0.1         route 10.244.1.0/24 via 10.1.0.2
//	pod 10.244.0.5    --- pod0                  route 10.244.0.5/32
var (
	nodeAddr   = netip.MustParseAddr("192.0.2.1")
	clientAddr = netip.MustParseAddr("192.0.2.10")
	farClient  = netip.MustParseAddr("198.51.100.7") // via gateway 192.0.2.254
	nic1Addr   = netip.MustParseAddr("10.1.0.1")
	localPod   = netip.MustParseAddr("10.244.0.5")
	remotePod1 = netip.MustParseAddr("10.244.1.10")
	remotePod2 = netip.MustParseAddr("10.244.1.11")
	lbIP       = netip.MustParseAddr("203.0.113.10")
	clusterIP  = netip.MustParseAddr("10.96.0.10")

	clientMAC   = net.HardwareAddr{0x02, 0xc1, 0, 0, 0, 0x0a}
	gw0MAC      = net.HardwareAddr{0x02, 0xc1, 0, 0, 0, 0xfe}
	gwMAC       = net.HardwareAddr{0x02, 0x6a, 0, 0, 0, 0x02}
	localPodMAC = net.HardwareAddr{0x02, 0x0d, 0, 0, 0, 0x05}
)

const (
	snatMin = 40000
	snatMax = 40999
)

type fixture struct {
	t    testing.TB
	ns   *testenv.Netns
	peer *testenv.Netns
	dp   *loader.Datapath
	maps *dataplane.Dataplane
	prog *ebpf.Program

	nic0, nic1, pod0 int
	nic0MAC, nic1MAC net.HardwareAddr
	names            []string
}

// fixtureOption changes the loader options of a fixture.
type fixtureOption func(*loader.Options)

// withSNATRange loads the datapath with SNAT ports min-max. The range is a
// load-time option: the SNAT slot array is sized for it.
func withSNATRange(min, max uint16) fixtureOption {
	return withSNATPorts(xdp.SNATPorts{{Min: min, Max: max}})
}

// withSNATPorts loads the datapath with SNAT ports ports.
func withSNATPorts(ports xdp.SNATPorts) fixtureOption {
	return func(o *loader.Options) { o.SNATPorts = ports }
}

// withNATMax sizes the nat map, and with it the SNAT slots (twice as many).
func withNATMax(n uint32) fixtureOption {
	return func(o *loader.Options) { o.NATMax = n }
}

func newFixture(t *testing.T, opts ...fixtureOption) *fixture {
	t.Helper()
	return newFixtureSized(t, 4096, 256, opts...)
}

func newFixtureSized(t testing.TB, conntrackMax, frontendsMax uint32, fopts ...fixtureOption) *fixture {
	t.Helper()
	testenv.RequirePrivileged(t)
	ns := testenv.NewNetns(t, "dp")
	peer := testenv.NewNetns(t, "peer")
	testenv.Veth(t, ns, "nic0", peer, "p-nic0")
	testenv.Veth(t, ns, "nic1", peer, "p-nic1")
	testenv.Veth(t, ns, "pod0", peer, "p-pod0")
	ns.IP("addr", "add", "192.0.2.1/24", "dev", "nic0")
	ns.IP("addr", "add", "10.1.0.1/24", "dev", "nic1")
	ns.IP("route", "add", "10.244.1.0/24", "via", "10.1.0.2")
	ns.IP("route", "add", "10.244.0.5/32", "dev", "pod0")
	ns.IP("route", "add", "198.51.100.0/24", "via", "192.0.2.254")
	ns.IP("route", "add", "10.244.2.0/24", "via", "10.1.0.99") // next hop never resolved
	ns.IP("neigh", "add", "192.0.2.10", "lladdr", clientMAC.String(), "dev", "nic0", "nud", "permanent")
	ns.IP("neigh", "add", "192.0.2.254", "lladdr", gw0MAC.String(), "dev", "nic0", "nud", "permanent")
	ns.IP("neigh", "add", "10.1.0.2", "lladdr", gwMAC.String(), "dev", "nic1", "nud", "permanent")
	ns.IP("neigh", "add", "10.244.0.5", "lladdr", localPodMAC.String(), "dev", "pod0", "nud", "permanent")
	ns.Sysctl("net.ipv4.ip_forward", "1")

	opts := loader.DefaultOptions()
	opts.PinRoot = testenv.BPFFS(t)
	opts.ConntrackMax = conntrackMax
	opts.NATMax = conntrackMax
	opts.AffinityMax = 1024
	opts.ServicesMax = 64
	opts.FrontendsMax = frontendsMax
	opts.BackendsMax = 256
	opts.SourceRangesMax = 64
	opts.SNATPorts = xdp.SNATPorts{{Min: snatMin, Max: snatMax}}
	// Flood tests fill ct_unconfirmed with SYNs: SYN cookies are the
	// SYN proxy tests' (setSYNCookies).
	opts.SYNCookies = loader.SYNCookiesOff
	for _, o := range fopts {
		o(&opts)
	}
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatalf("load datapath: %v", err)
	}
	t.Cleanup(func() { dp.Close() })

	f := &fixture{t: t, ns: ns, peer: peer, dp: dp, maps: dataplane.New(&dp.Maps), prog: dp.XDPProgram()}
	// Claims trust the SNAT spill marks, as under an agent past its first
	// check; TestUnmarkedSpillKeepsItsPort covers the datapath before it.
	if trusted, _, err := f.maps.TrustSNATSpillMarks(); err != nil || !trusted {
		t.Fatalf("trust SNAT spill marks of a fresh datapath: %v, %v", trusted, err)
	}
	f.names, err = xdp.StatNames()
	if err != nil {
		t.Fatal(err)
	}
	err = ns.Do(func() error {
		for _, dev := range []struct {
			name  string
			index *int
			mac   *net.HardwareAddr
			addr  netip.Addr
			tx    bool
		}{
			{"nic0", &f.nic0, &f.nic0MAC, nodeAddr, true},
			{"nic1", &f.nic1, &f.nic1MAC, nic1Addr, true},
			{"pod0", &f.pod0, nil, netip.Addr{}, false},
		} {
			l, err := netlink.LinkByName(dev.name)
			if err != nil {
				return err
			}
			*dev.index = l.Attrs().Index
			if dev.mac != nil {
				*dev.mac = l.Attrs().HardwareAddr
			}
			idx := uint32(l.Attrs().Index)
			if dev.tx {
				if err := dp.Maps.TxPorts.Put(idx, idx); err != nil {
					return err
				}
			}
			if dev.addr.IsValid() {
				if err := dp.Maps.Ifaces.Put(idx, xdp.Iface{Addr: xdp.AddrToNet(dev.addr)}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("register devices: %v", err)
	}
	return f
}

// setTimeouts rewrites the datapath's conntrack timeouts.
func (f *fixture) setTimeouts(tcpEst, tcpTransient, udp time.Duration) {
	f.t.Helper()
	var cfg xdp.DatapathConfig
	if err := f.dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
		f.t.Fatal(err)
	}
	cfg.TcpEstablishedTimeoutNs = uint64(tcpEst)
	cfg.TcpTransientTimeoutNs = uint64(tcpTransient)
	cfg.UdpTimeoutNs = uint64(udp)
	if err := f.dp.Maps.Config.Put(uint32(0), cfg); err != nil {
		f.t.Fatal(err)
	}
}

// service programs one service port: frontends, backends (ids from 1 on,
// offset by idBase) and a Maglev-like table that spreads slots evenly.
type service struct {
	svcID, tableID  uint32
	frontends       []dataplane.FrontendKey
	flags           uint16
	affinitySeconds uint32
	backends        map[uint32]dataplane.Backend
	table           []uint32 // slots (backend ids); nil = no usable backend
}

func (f *fixture) program(s service) {
	f.t.Helper()
	for id, b := range s.backends {
		if err := f.maps.PutBackend(id, b); err != nil {
			f.t.Fatal(err)
		}
	}
	tableID := uint32(0)
	if len(s.table) > 0 {
		tableID = s.tableID
		if err := f.maps.PutTable(tableID, s.table); err != nil {
			f.t.Fatal(err)
		}
	}
	for _, fk := range s.frontends {
		err := f.maps.PutFrontend(fk, dataplane.Frontend{
			SvcID: s.svcID, TableID: tableID, InternalTableID: tableID, AffinityTimeout: s.affinitySeconds, Flags: s.flags,
		})
		if err != nil {
			f.t.Fatal(err)
		}
	}
}

// result of one program run.
type result struct {
	verdict uint32
	out     []byte // the frame after the program, metadata excluded
	meta    []byte // XDP metadata the program left, if any
}

// xdpMD is struct xdp_md, the context of an XDP program run.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// run feeds one frame to the XDP program as if it arrived on ifindex.
func (f *fixture) run(frame []byte, ifindex int) result {
	f.t.Helper()
	var res result
	err := f.ns.Do(func() error {
		var err error
		res, err = runXDP(f.prog, frame, ifindex)
		return err
	})
	if err != nil {
		f.t.Fatalf("run XDP program: %v", err)
	}
	return res
}

// cpuSetSize is the number of CPUs a unix.CPUSet can name (CPU_SETSIZE).
const cpuSetSize = 1024

// onOneCPU runs fn in the fixture's namespace on a thread bound to the
// lowest CPU the test may use, for state the datapath keeps per CPU (the
// ICMP error budget, the route cache of new flows).
func (f *fixture) onOneCPU(fn func() error) {
	f.t.Helper()
	err := f.ns.Do(func() error {
		var saved, one unix.CPUSet
		if err := unix.SchedGetaffinity(0, &saved); err != nil {
			return err
		}
		for cpu := range cpuSetSize {
			if saved.IsSet(cpu) {
				one.Set(cpu)
				break
			}
		}
		if err := unix.SchedSetaffinity(0, &one); err != nil {
			return err
		}
		defer unix.SchedSetaffinity(0, &saved) //nolint:errcheck // best effort: the thread goes back to the runtime
		return fn()
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// runXDP runs an XDP program on one frame on the calling thread, which
// must be in the fixture's namespace.
func runXDP(prog *ebpf.Program, frame []byte, ifindex int) (result, error) {
	var res result
	out := make([]byte, len(frame)+256)
	ctxIn := xdpMD{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}
	var ctxOut xdpMD
	opts := &ebpf.RunOptions{
		Data:       frame,
		DataOut:    out,
		Context:    ctxIn,
		ContextOut: &ctxOut,
	}
	ret, err := prog.Run(opts)
	if err != nil {
		return res, err
	}
	out = opts.DataOut
	res.verdict = ret
	// DataOut is trimmed to the output size; the first ctxOut.Data
	// bytes are metadata.
	metaLen := ctxOut.Data
	res.meta = append([]byte(nil), out[:metaLen]...)
	res.out = append([]byte(nil), out[metaLen:]...)
	return res, nil
}

// counters reads the datapath counters by name.
func (f *fixture) counters() map[string]uint64 {
	f.t.Helper()
	cs, err := f.maps.Counters()
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]uint64{}
	for i, c := range cs {
		out[f.names[i]] = c.Packets
	}
	return out
}

// flow reads a tracked flow; a failed read fails the test (it would pass
// for a flow not tracked).
func (f *fixture) flow(k dataplane.FlowKey) (dataplane.Flow, bool) {
	f.t.Helper()
	fl, ok, err := f.maps.Flow(k)
	if err != nil {
		f.t.Fatalf("read flow %+v: %v", k, err)
	}
	return fl, ok
}

// reverseEntries counts the reverse halves; a failed read fails the test.
func (f *fixture) reverseEntries() int {
	f.t.Helper()
	n, err := f.maps.ReverseEntries()
	if err != nil {
		f.t.Fatalf("count reverse entries: %v", err)
	}
	return n
}

// reverseByTuple reads the reverse half of a flow without SNAT by its reply
// tuple, from nat or else nat_unconfirmed, as the TC programs find it.
func (f *fixture) reverseByTuple(k xdp.NatKey, rev *xdp.NatEntry) error {
	err := f.dp.Maps.NAT.Lookup(k, rev)
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		err = f.dp.Maps.NATUnconfirmed.Lookup(k, rev)
	}
	return err
}

// deleteReverseByTuple deletes the reverse half of a flow without SNAT as
// an eviction would, from nat and nat_unconfirmed; it fails when neither
// held it.
func (f *fixture) deleteReverseByTuple(k xdp.NatKey) error {
	errNAT, errUnconfirmed := f.dp.Maps.NAT.Delete(k), f.dp.Maps.NATUnconfirmed.Delete(k)
	if errNAT != nil && errUnconfirmed != nil {
		return errors.Join(errNAT, errUnconfirmed)
	}
	return nil
}

// expectCounters runs fn and checks that exactly the named counters moved
// by the given amounts ("rx" is implied and ignored).
func (f *fixture) expectCounters(want map[string]uint64, fn func()) {
	f.t.Helper()
	for name := range want {
		if !slices.Contains(f.names, name) {
			f.t.Fatalf("expected counter %q is none of the datapath's", name)
		}
	}
	before := f.counters()
	fn()
	after := f.counters()
	for name, a := range after {
		if name == "rx" {
			continue
		}
		if d := a - before[name]; d != want[name] {
			f.t.Errorf("counter %s moved by %d, want %d", name, d, want[name])
		}
	}
}

func decode(t testing.TB, b []byte) packet.Frame {
	t.Helper()
	if err := packet.Verify(b); err != nil {
		t.Fatalf("output frame: %v\n%x", err, b)
	}
	fr, err := packet.Decode(b)
	if err != nil {
		t.Fatalf("decode output: %v\n%x", err, b)
	}
	return fr
}

const (
	xdpAborted  = 0
	xdpDrop     = 1
	xdpPass     = 2
	xdpTX       = 3
	xdpRedirect = 4
)

var verdictNames = []string{"ABORTED", "DROP", "PASS", "TX", "REDIRECT"}

func verdictName(v uint32) string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "?"
}

func (f *fixture) expectVerdict(r result, want uint32) {
	f.t.Helper()
	if r.verdict != want {
		f.t.Fatalf("verdict %s, want %s", verdictName(r.verdict), verdictName(want))
	}
}

// handoffIfindex decodes the XDP-to-TC metadata (magic, ifindex).
func handoffIfindex(meta []byte) (int, error) {
	if len(meta) < 8 {
		return 0, errors.New("no metadata")
	}
	if binary.NativeEndian.Uint32(meta[0:4]) != 0x784c4246 {
		return 0, errors.New("metadata without handoff magic")
	}
	return int(binary.NativeEndian.Uint32(meta[4:8])), nil
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) }
