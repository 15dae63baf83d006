package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

// The agent clears the SNAT bucket hints no backend can use: at its first
// sync (hints left from before a restart) and after backends leave.
func TestAgentReleasesSNATHintsOfDepartedBackends(t *testing.T) {
	opts, dp := loadSmallDatapath(t)
	nodeAddr := netip.MustParseAddr("192.0.2.1")
	if err := dp.Maps.Ifaces.Put(uint32(1), xdp.Iface{Addr: xdp.AddrToNet(nodeAddr)}); err != nil {
		t.Fatal(err)
	}
	staying, leaving, gone := "10.244.1.10", "10.244.1.11", "10.244.9.9"
	hintOf := func(addr string) uint32 {
		return xdp.SNATHint(netip.AddrPortFrom(netip.MustParseAddr(addr), 8080), nodeAddr, dataplane.TCP)
	}
	// As if the datapath had given each a bucket; `gone` left while no
	// agent ran.
	hints := map[string]uint32{staying: 1, leaving: 2, gone: 3}
	seen := map[uint32]bool{}
	for addr, bucket := range hints {
		if seen[hintOf(addr)] {
			t.Fatalf("test backends share hint %d", hintOf(addr))
		}
		seen[hintOf(addr)] = true
		if err := dp.Maps.SNATBucketHints.Put(hintOf(addr), bucket); err != nil {
			t.Fatal(err)
		}
	}
	// hintsDiffer describes how the hints differ from want ("" if not).
	hintsDiffer := func(want map[string]uint32) string {
		t.Helper()
		for addr, w := range want {
			var got uint32
			if err := dp.Maps.SNATBucketHints.Lookup(hintOf(addr), &got); err != nil {
				t.Fatal(err)
			}
			if got != w {
				return fmt.Sprintf("backend %s has hint %d, want %d", addr, got, w)
			}
		}
		return ""
	}

	src := newMemorySource()
	src.put(hintsService(staying, leaving))
	cfg := smallAgentConfig(opts)
	a, err := assemble(cfg, discard(), src, dp)
	if err != nil {
		t.Fatal(err)
	}
	a.hintSweep = newHintSweep(0) // every sync that removed backends
	synced := make(chan struct{}, 16)
	a.synced = func(map[string]bool) { synced <- struct{}{} }
	done := runAgent(t, a)
	waitSync := func() {
		t.Helper()
		select {
		case <-synced:
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatal("no sync in 30 s")
		}
	}
	// Syncs that apply nothing new may come between (the agent syncs at
	// the end of its first pass over pod interfaces): the hints must be
	// as wanted after a few syncs.
	expectHints := func(when string, want map[string]uint32) {
		t.Helper()
		for syncs := 0; ; syncs++ {
			waitSync()
			diff := hintsDiffer(want)
			if diff == "" {
				return
			}
			if syncs == 3 {
				t.Fatalf("%s: %s", when, diff)
			}
		}
	}

	expectHints("first sync", map[string]uint32{staying: 1, leaving: 2, gone: 0})
	src.put(hintsService(staying))
	expectHints("after a backend left", map[string]uint32{staying: 1, leaving: 0})
}

// loadSmallDatapath loads a datapath with small maps for the tests here.
func loadSmallDatapath(t *testing.T) (loader.Options, *loader.Datapath) {
	t.Helper()
	testenv.RequirePrivileged(t)
	opts := loadertest.SmallOptions(testenv.BPFFS(t))
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	return opts, dp
}

// runAgent runs a until the test ends; done reports how Run returned.
func runAgent(t *testing.T, a *Agent) (done <-chan error) {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-errc
	})
	return errc
}

// smallAgentConfig is an agent configuration for the tests here, over a
// datapath loaded with opts.
func smallAgentConfig(opts loader.Options) Config {
	return Config{Datapath: opts, MaglevTableSize: 251, MaglevSeed: 1, NodeName: "node-0",
		NodePortMin: 30000, NodePortMax: 32767, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Hour,
		HealthTimeout: time.Minute}
}

// hintsService is a NodePort service whose endpoints are on another node.
func hintsService(endpoints ...string) (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hints", Name: "web", ResourceVersion: "1"},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeNodePort, ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10"},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080), NodePort: 30080}},
		},
	}
	pname, port, proto, node := "http", int32(8080), corev1.ProtocolTCP, "node-1"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "hints", Name: "web-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for _, addr := range endpoints {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{addr}, NodeName: &node})
	}
	return svc, slice
}

// The agent lets the datapath trust its SNAT spill marks (the loader
// starts every datapath untrusting), but not while a live flow's spill
// lacks a mark; it deletes that spill once the flow has ended.
func TestAgentTrustsSNATSpillMarks(t *testing.T) {
	opts, dp := loadSmallDatapath(t)
	marked := func() bool {
		t.Helper()
		var cfg xdp.DatapathConfig
		if err := dp.Maps.Config.Lookup(uint32(0), &cfg); err != nil {
			t.Fatal(err)
		}
		return cfg.SnatSpillsMarked != 0
	}
	if marked() {
		t.Fatal("a datapath just loaded trusts its spill marks")
	}

	// A live flow whose reverse half an older datapath spilled unmarked,
	// of the Service the agent programs (service port id 1, the first it
	// gives): the first sync's sweep keeps it.
	client := netip.MustParseAddrPort("198.51.100.7:40000")
	frontend := netip.MustParseAddrPort("192.0.2.1:30080")
	backend := netip.MustParseAddrPort("10.244.1.10:8080")
	snat := netip.AddrPortFrom(frontend.Addr(), opts.SNATPorts[0].Min)
	owner := xdp.CtKey{Saddr: xdp.AddrToNet(client.Addr()), Sport: xdp.PortToNet(client.Port()),
		Daddr: xdp.AddrToNet(frontend.Addr()), Dport: xdp.PortToNet(frontend.Port()), Proto: dataplane.TCP}
	flags := uint8(xdp.CtFlagsCT_F_SNAT | xdp.CtFlagsCT_F_EXTERNAL)
	if err := dp.Maps.Conntrack.Put(owner, xdp.CtEntry{LastSeenNs: uint64(dataplane.Now()), SvcId: 1,
		BackendAddr: xdp.AddrToNet(backend.Addr()), BackendPort: xdp.PortToNet(backend.Port()),
		NatAddr: xdp.AddrToNet(snat.Addr()), NatPort: xdp.PortToNet(snat.Port()), Flags: flags,
		TcpState: uint8(xdp.CtTcpStateCT_TCP_SYN | xdp.CtTcpStateCT_TCP_ESTABLISHED)}); err != nil {
		t.Fatal(err)
	}
	spill := xdp.NatKey{Saddr: xdp.AddrToNet(backend.Addr()), Sport: xdp.PortToNet(backend.Port()),
		Daddr: xdp.AddrToNet(snat.Addr()), Dport: xdp.PortToNet(snat.Port()), Proto: dataplane.TCP}
	if err := dp.Maps.NAT.Put(spill, xdp.NatEntry{ClientAddr: owner.Saddr, ClientPort: owner.Sport,
		FrontendAddr: owner.Daddr, FrontendPort: owner.Dport, Flags: flags}); err != nil {
		t.Fatal(err)
	}

	src := newMemorySource()
	src.put(hintsService(backend.Addr().String()))
	a, err := assemble(smallAgentConfig(opts), discard(), src, dp)
	if err != nil {
		t.Fatal(err)
	}
	a.spillCheckEvery = 10 * time.Millisecond
	runAgent(t, a)
	for deadline := time.Now().Add(30 * time.Second); a.spillChecks.Load() < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("fewer than 3 spill mark checks in 30 s")
		}
	}
	if marked() {
		t.Fatal("marks trusted while a live flow's spill has no mark")
	}

	// The flow ends (evicted); its spill goes and the marks are trusted.
	if err := dp.Maps.Conntrack.Delete(owner); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !marked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("spill marks not trusted 30 s after the flow ended")
		}
	}
	var rev xdp.NatEntry
	if err := dp.Maps.NAT.Lookup(spill, &rev); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("the ended flow's spill is still in the NAT map (%v)", err)
	}
}
