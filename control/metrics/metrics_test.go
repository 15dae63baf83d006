package metrics_test

import (
	"io"

	"github.com/cilium/ebpf"
	"net/http/httptest"
	"net/netip"
	"regexp"
	"strings"
	"testing"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/control/metrics"
	"github.com/xdplb/xdplb/loader"
	"github.com/xdplb/xdplb/loader/loadertest"
	"github.com/xdplb/xdplb/tests/testenv"
	"github.com/xdplb/xdplb/xdp"
)

func TestScrapeReadsTheDatapath(t *testing.T) {
	opts := loader.DefaultOptions()
	opts.PinRoot = testenv.BPFFS(t)
	opts.ConntrackMax, opts.NATMax = 1024, 1024
	dp, err := loadertest.Load(opts, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dp.Close()
	plane := dataplane.New(&dp.Maps)
	plane.PutServiceName(3, "default/web:http/TCP")
	plane.PutBackend(1, dataplane.Backend{Addr: netip.MustParseAddr("10.0.0.1"), Port: 80})
	// Counters as the datapath would leave them (per CPU).
	per := make([]xdp.Counter, mustCPUs(t))
	per[0].Packets, per[0].Bytes = 5, 500
	if err := dp.Maps.Stats.Put(uint32(xdp.StatSTAT_TX), per); err != nil {
		t.Fatal(err)
	}
	svc := make([]xdp.SvcCounter, mustCPUs(t))
	svc[len(svc)-1].NewFlows = 2
	if err := dp.Maps.SvcStats.Put(uint32(3), svc); err != nil {
		t.Fatal(err)
	}

	m := metrics.New(plane, nil)
	m.SyncDuration.Observe(0.01)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`xdplb_datapath_packets_total{reason="tx"} 5`,
		`xdplb_datapath_bytes_total{reason="tx"} 500`,
		`xdplb_service_new_flows_total{service="default/web:http/TCP"} 2`,
		`xdplb_map_entries{map="backends"} 1`,
		`xdplb_map_max_entries{map="conntrack"} 1024`,
		`xdplb_map_memory_bytes{map="maglev_inner_tables"} 0`,
		`xdplb_sync_duration_seconds_count 1`,
		`xdplb_snat_ports_quarantined 0`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if !regexp.MustCompile(`(?m)^xdplb_map_memory_bytes\{map="conntrack"\} [1-9][0-9]*$`).Match(body) {
		t.Errorf("/metrics lacks the conntrack map's memory")
	}
}

func mustCPUs(t *testing.T) int {
	t.Helper()
	n, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
