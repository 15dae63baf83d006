package agent

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/source"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
)

// memorySource is an in-memory Source for driving the agent in tests.
type memorySource struct {
	mu      sync.Mutex
	svcs    map[string]*corev1.Service
	slices  map[string]*discoveryv1.EndpointSlice
	changed func()
	ready   chan struct{}
}

func newMemorySource() *memorySource {
	return &memorySource{svcs: map[string]*corev1.Service{}, slices: map[string]*discoveryv1.EndpointSlice{},
		ready: make(chan struct{})}
}

func (m *memorySource) Run(ctx context.Context, changed func()) error {
	m.mu.Lock()
	m.changed = changed
	m.mu.Unlock()
	close(m.ready)
	changed()
	<-ctx.Done()
	return nil
}

func (m *memorySource) Snapshot() source.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	var s source.Snapshot
	for _, v := range m.svcs {
		s.Services = append(s.Services, v)
	}
	for _, v := range m.slices {
		s.Slices = append(s.Slices, v)
	}
	return s
}

func (m *memorySource) Status() source.Status {
	return source.Status{Synced: true, LastChange: time.Now()}
}

// put stores a Service and its slice (a nil slice leaves the slices as
// they are) and tells the agent.
func (m *memorySource) put(svc *corev1.Service, slice *discoveryv1.EndpointSlice) {
	m.mu.Lock()
	m.svcs[svc.Namespace+"/"+svc.Name] = svc
	if slice != nil {
		m.slices[slice.Namespace+"/"+slice.Name] = slice
	}
	notify := m.changed
	m.mu.Unlock()
	if notify != nil {
		notify()
	}
}

// scaleService is service i: ClusterIP and NodePort, endpoints on 10 of a
// pool of pod addresses.
func scaleService(i, version int, rng *rand.Rand) (*corev1.Service, *discoveryv1.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	clusterIP := fmt.Sprintf("10.%d.%d.%d", 96+i/65536, i/256%256, i%256)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: name, ResourceVersion: "1", UID: types.UID("u-" + strconv.Itoa(i))},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080)}},
		},
	}
	pname, port, proto := "http", int32(8080), corev1.ProtocolTCP
	trigger := time.Now().UTC().Format(time.RFC3339Nano)
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "scale", Name: name + "-1", ResourceVersion: strconv.Itoa(version),
			Labels:      map[string]string{discoveryv1.LabelServiceName: name},
			Annotations: map[string]string{"endpoints.kubernetes.io/last-change-trigger-time": trigger}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}},
	}
	for j := 0; j < 10; j++ {
		n := rng.IntN(60000)
		node := "node-" + strconv.Itoa(n%50)
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
			Addresses: []string{fmt.Sprintf("10.%d.%d.%d", 128+n/65536, n/256%256, n%256)}, NodeName: &node})
	}
	return svc, slice
}

// BenchmarkControlPlane measures, with the real maps: a cold full sync of
// 1k and 10k services with 10 endpoints each, then the programming latency
// of single endpoint changes (change queued to maps updated, p50 and p99),
// the agent's RSS and the memory of the BPF maps with default sizes.
func BenchmarkControlPlane(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("services=%d", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				controlPlaneRun(b, n)
			}
		})
	}
}

func controlPlaneRun(b *testing.B, n int) {
	testenv.RequirePrivileged(b)
	opts := loader.DefaultOptions()
	opts.PinRoot = testenv.BPFFS(b)
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		b.Fatal(err)
	}
	src := newMemorySource()
	rng := rand.New(rand.NewPCG(uint64(n), 7))
	for i := 0; i < n; i++ {
		svc, slice := scaleService(i, 1, rng)
		src.svcs[svc.Namespace+"/"+svc.Name] = svc
		src.slices[slice.Namespace+"/"+slice.Name] = slice
	}
	cfg := Config{Datapath: opts, MaglevTableSize: 16381, MaglevSeed: 1, NodeName: "node-0",
		NodePortMin: 30000, NodePortMax: 32767, MinSyncPeriod: time.Millisecond, SyncPeriod: time.Hour,
		HealthTimeout: time.Minute}
	a, err := assemble(cfg, slog.New(slog.DiscardHandler), src, dp)
	if err != nil {
		b.Fatal(err)
	}
	synced := make(chan map[string]bool, 16)
	a.synced = func(changed map[string]bool) { synced <- changed }

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	rssBefore := rssBytes()
	if path := os.Getenv("XDPLB_BENCH_CPU_PROFILE"); path != "" {
		f, err := os.Create(fmt.Sprintf("%s.cold.%d", path, n))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	select {
	case <-synced:
	case err := <-done:
		b.Fatalf("agent stopped: %v", err)
	case <-time.After(2 * time.Minute):
		b.Fatal("no first sync")
	}
	cold := time.Since(start)
	if path := os.Getenv("XDPLB_BENCH_CPU_PROFILE"); path != "" {
		pprof.StopCPUProfile()
		f, err := os.Create(fmt.Sprintf("%s.changes.%d", path, n))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			b.Fatal(err)
		}
	}

	var lat []time.Duration
	changes := 200
	if os.Getenv("XDPLB_BENCH_COLD_ONLY") != "" {
		changes = 1
	}
	for i := 0; i < changes; i++ {
		k := rng.IntN(n)
		svc, slice := scaleService(k, 2+i, rng)
		key := fmt.Sprintf("scale/svc-%d:http/TCP", k)
		t0 := time.Now()
		src.put(svc, slice)
		for {
			changed := <-synced
			if changed == nil || changed[key] {
				break
			}
		}
		lat = append(lat, time.Since(t0))
	}
	if os.Getenv("XDPLB_BENCH_CPU_PROFILE") != "" {
		pprof.StopCPUProfile()
	}
	slices.Sort(lat)
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }

	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	agentHeap := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
	if path := os.Getenv("XDPLB_BENCH_HEAP_PROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			pprof.WriteHeapProfile(f)
			f.Close()
		}
	}
	mapBytes, err := dataplane.New(&dp.Maps).MemoryUsage()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(cold.Seconds(), "cold-sync-s")
	b.ReportMetric(float64(p(0.5).Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(p(0.99).Microseconds())/1000, "p99-ms")
	rss := rssBytes()
	b.ReportMetric(float64(rss)/(1<<20), "rss-MiB")
	b.ReportMetric(float64(rss-rssBefore)/(1<<20), "rss-growth-MiB")
	b.ReportMetric(agentHeap, "agent-heap-MiB")
	b.ReportMetric(float64(mapBytes)/(1<<20), "bpf-maps-MiB")
	b.ReportMetric(0, "ns/op")
	fmt.Printf("control plane, %d services x 10 endpoints: cold sync %s, programming latency p50 %s p99 %s, "+
		"agent heap %.0f MiB (process RSS %.0f MiB, with the test's own objects; %.0f MiB of it since the agent started), BPF maps %.0f MiB\n",
		n, cold.Round(time.Millisecond), p(0.5).Round(10*time.Microsecond), p(0.99).Round(10*time.Microsecond),
		agentHeap, float64(rss)/(1<<20), float64(rss-rssBefore)/(1<<20), float64(mapBytes)/(1<<20))
	cancel()
	<-done
	if err := loader.Detach(opts.PinRoot); err != nil {
		b.Fatal(err)
	}
}

// rssBytes is this process's resident set size.
func rssBytes() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
