package reconcile_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/control/model"
	"github.com/xdplb/xdplb/control/reconcile"
	"github.com/xdplb/xdplb/loader"
)

// scalePorts are n single-endpoint ClusterIP service ports.
func scalePorts(n int) []model.Service {
	svcs := make([]model.Service, n)
	for i := range svcs {
		e := model.Endpoint{Addr: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: 8080,
			Ready: true, Serving: true, Weight: 1}
		svcs[i] = model.Service{Namespace: "scale", Name: fmt.Sprintf("s%d", i), Protocol: model.TCP, Port: 80,
			Frontends: []model.Frontend{{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}),
				Port: 80, Protocol: model.TCP, Kind: model.ClusterIP}},
			Endpoints: []model.Endpoint{e}, ClusterSet: []model.Endpoint{e}}
	}
	return svcs
}

// BenchmarkRemovePorts measures removing half of 2n service ports (every
// other one) at once, through ApplyChanges (each removed port given as
// gone) and through a full Apply of the ports that stay. Both should take
// time linear in the ports: the incremental path must not scan every port
// for each frontend or table it deletes.
func BenchmarkRemovePorts(b *testing.B) {
	for _, n := range []int{4096, 16384} {
		for _, mode := range []string{"incremental", "full"} {
			b.Run(fmt.Sprintf("removed=%d/%s", n, mode), func(b *testing.B) {
				total := uint32(2*n + 1)
				dp := newDatapath(b, func(o *loader.Options) {
					o.ServicesMax, o.FrontendsMax, o.BackendsMax = total, total, total
				})
				svcs := scalePorts(2 * n)
				var stay []model.Service
				gone := make(map[string]*model.Service, n)
				for i := range svcs {
					if i%2 == 0 {
						gone[svcs[i].Key()] = nil
					} else {
						stay = append(stay, svcs[i])
					}
				}
				var cpu time.Duration
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					r, err := reconcile.New(dp, reconcile.Config{MaglevMaxSize: 251, MaglevSeed: 42,
						ServicesMax: total, BackendsMax: total}, nil)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := r.Apply(context.Background(), model.State{Services: svcs}); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					cpu0 := processCPU(b)
					var res reconcile.Result
					if mode == "incremental" {
						res, err = r.ApplyChanges(context.Background(), gone)
					} else {
						res, err = r.Apply(context.Background(), model.State{Services: stay})
					}
					if err != nil {
						b.Fatal(err)
					}
					cpu += processCPU(b) - cpu0
					if res.FrontendsRemoved != n || res.TablesRemoved != n {
						b.Fatalf("removed %d frontends and %d tables, want %d of each", res.FrontendsRemoved, res.TablesRemoved, n)
					}
				}
				b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
			})
		}
	}
}

// processCPU is the CPU time (user and system) this process has used:
// less noisy than wall time on a shared machine, where the kernel's
// deletion of Maglev tables also waits.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
