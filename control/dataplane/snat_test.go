package dataplane_test

import (
	"net/netip"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/xdp"
)

// BenchmarkReleaseSNATHints: one sweep of the hints with 50k backends
// (10k Services x 10 endpoints over a pool of pods) in default-sized maps;
// the agent runs it in its sync loop.
func BenchmarkReleaseSNATHints(b *testing.B) {
	_, plane := loadSmall(b, func(o *loader.Options) { o.BackendsMax = loader.DefaultOptions().BackendsMax })
	if err := plane.Maps().Ifaces.Put(uint32(1), xdp.Iface{Addr: xdp.AddrToNet(netip.MustParseAddr("192.0.2.1"))}); err != nil {
		b.Fatal(err)
	}
	backends := map[uint32]dataplane.Backend{}
	for i := 1; i <= 50000; i++ {
		backends[uint32(i)] = dataplane.Backend{Addr: netip.AddrFrom4([4]byte{10, 128 + byte(i>>16), byte(i >> 8), byte(i)}), Port: 8080}
	}
	if err := plane.PutBackends(backends); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := plane.ReleaseSNATHints(backends, nil); err != nil {
			b.Fatal(err)
		}
	}
}
