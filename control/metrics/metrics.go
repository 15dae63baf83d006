// Package metrics exposes the agent on Prometheus: sync and programming
// latencies, pending changes, Maglev rebuilds, map occupancy and memory,
// and the datapath's own counters read from BPF at scrape time.
package metrics

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xdplb/xdplb/control/dataplane"
	"github.com/xdplb/xdplb/xdp"
)

// Metrics holds the agent's instruments. Each agent has its own registry.
type Metrics struct {
	Registry *prometheus.Registry

	SyncDuration        prometheus.Histogram
	ProgrammingDuration prometheus.Histogram
	PendingChanges      prometheus.Gauge
	MaglevBuildDuration prometheus.Histogram
	Syncs               *prometheus.CounterVec
	LastSync            prometheus.Gauge
	ServicePorts        prometheus.Gauge
	Problems            prometheus.Gauge
	SourceStale         prometheus.Gauge
}

// New creates the instruments and, when dp is not nil, the collector of
// datapath counters and map occupancy.
func New(dp *dataplane.Dataplane, log *slog.Logger) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		Registry: reg,
		SyncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "xdplb_sync_duration_seconds",
			Help:    "Time to compute the desired state and program the datapath maps, per sync.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		ProgrammingDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "xdplb_network_programming_duration_seconds",
			Help: "Time from an endpoint change (endpoints.kubernetes.io/last-change-trigger-time) " +
				"until the datapath follows it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}),
		PendingChanges: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xdplb_sync_pending_changes",
			Help: "Change notifications received and not yet applied.",
		}),
		MaglevBuildDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "xdplb_maglev_build_duration_seconds",
			Help:    "Time spent building Maglev tables, per sync that built any.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 16),
		}),
		Syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xdplb_syncs_total",
			Help: "Syncs by result (ok, error).",
		}, []string{"result"}),
		LastSync: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xdplb_last_sync_timestamp_seconds",
			Help: "Unix time of the last successful sync.",
		}),
		ServicePorts: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xdplb_service_ports",
			Help: "Service ports programmed.",
		}),
		Problems: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xdplb_sync_problems",
			Help: "Objects or service ports the last sync skipped or could not program fully.",
		}),
		SourceStale: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xdplb_source_stale",
			Help: "1 while the source of truth (API server, services file) cannot be read.",
		}),
	}
	reg.MustRegister(m.SyncDuration, m.ProgrammingDuration, m.PendingChanges, m.MaglevBuildDuration,
		m.Syncs, m.LastSync, m.ServicePorts, m.Problems, m.SourceStale,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if dp != nil {
		reg.MustRegister(newDatapathCollector(dp, log))
	}
	return m
}

// Handler serves /metrics.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	return mux
}

// datapathCollector reads the BPF counters when scraped; map occupancy
// and memory, which cost more to read, are cached between scrapes.
type datapathCollector struct {
	dp    *dataplane.Dataplane
	log   *slog.Logger
	names []string

	packets, bytes   *prometheus.Desc
	svcPackets       *prometheus.Desc
	svcBytes         *prometheus.Desc
	svcNewFlows      *prometheus.Desc
	entries, maxSize *prometheus.Desc
	memory           *prometheus.Desc
	quarantined      *prometheus.Desc

	occupancyCache   *cached[map[string]int]
	memoryCache      *cached[map[string]uint64]
	quarantinedCache *cached[int]
}

// Map occupancy needs a walk over the maps, and the inner Maglev tables'
// memory an open of each.
const (
	occupancyTTL = 15 * time.Second
	memoryTTL    = time.Minute
)

// cached holds a reading for a while; a failed reading keeps the last
// good one.
type cached[V any] struct {
	ttl  time.Duration
	what string // for the log

	mu   sync.Mutex
	v    V
	have bool
	at   time.Time
}

func (c *cached[V]) get(read func() (V, error), log *slog.Logger) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.have && time.Since(c.at) < c.ttl {
		return c.v
	}
	v, err := read()
	if err != nil {
		if log != nil {
			log.Warn("read "+c.what, "error", err)
		}
		return c.v
	}
	c.v, c.have, c.at = v, true, time.Now()
	return v
}

func newDatapathCollector(dp *dataplane.Dataplane, log *slog.Logger) *datapathCollector {
	names, err := xdp.StatNames()
	if err != nil && log != nil {
		log.Error("datapath counter names unavailable", "error", err)
	}
	return &datapathCollector{
		dp: dp, log: log, names: names,
		occupancyCache:   &cached[map[string]int]{ttl: occupancyTTL, what: "map occupancy"},
		memoryCache:      &cached[map[string]uint64]{ttl: memoryTTL, what: "map memory"},
		quarantinedCache: &cached[int]{ttl: occupancyTTL, what: "SNAT ports in quarantine"},
		packets: prometheus.NewDesc("xdplb_datapath_packets_total",
			"Packets by the datapath's verdict or event (see docs/counters.md).", []string{"reason"}, nil),
		bytes: prometheus.NewDesc("xdplb_datapath_bytes_total",
			"Bytes by the datapath's verdict or event.", []string{"reason"}, nil),
		svcPackets: prometheus.NewDesc("xdplb_service_packets_total",
			"Packets to a service port's frontends and from its backends.", []string{"service"}, nil),
		svcBytes: prometheus.NewDesc("xdplb_service_bytes_total",
			"Bytes to a service port's frontends and from its backends.", []string{"service"}, nil),
		svcNewFlows: prometheus.NewDesc("xdplb_service_new_flows_total",
			"Flows started to a service port.", []string{"service"}, nil),
		entries: prometheus.NewDesc("xdplb_map_entries",
			"Entries in a datapath map.", []string{"map"}, nil),
		maxSize: prometheus.NewDesc("xdplb_map_max_entries",
			"Capacity of a datapath map.", []string{"map"}, nil),
		memory: prometheus.NewDesc("xdplb_map_memory_bytes",
			"Kernel memory a datapath map takes (charged to the agent's memory cgroup); "+
				dataplane.InnerTablesMemory+": the inner Maglev tables together.", []string{"map"}, nil),
		quarantined: prometheus.NewDesc("xdplb_snat_ports_quarantined",
			"SNAT ports of closed TCP flows (RST, or FIN both ways) within their timeout: no new flow takes them until then.", nil, nil),
	}
}

func (c *datapathCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.packets, c.bytes, c.svcPackets, c.svcBytes, c.svcNewFlows, c.entries, c.maxSize, c.memory, c.quarantined} {
		ch <- d
	}
}

func (c *datapathCollector) Collect(ch chan<- prometheus.Metric) {
	if counters, err := c.dp.Counters(); err == nil {
		for i, v := range counters {
			if i >= len(c.names) {
				break
			}
			ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(v.Packets), c.names[i])
			ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(v.Bytes), c.names[i])
		}
	} else if c.log != nil {
		c.log.Warn("read datapath counters", "error", err)
	}
	if names, err := c.dp.ServiceNames(); err == nil {
		for id, name := range names {
			sc, err := c.dp.ServiceCounters(id)
			if err != nil {
				continue
			}
			ch <- prometheus.MustNewConstMetric(c.svcPackets, prometheus.CounterValue, float64(sc.Packets), name)
			ch <- prometheus.MustNewConstMetric(c.svcBytes, prometheus.CounterValue, float64(sc.Bytes), name)
			ch <- prometheus.MustNewConstMetric(c.svcNewFlows, prometheus.CounterValue, float64(sc.NewFlows), name)
		}
	}
	for name, n := range c.occupancyCache.get(c.dp.Occupancy, c.log) {
		ch <- prometheus.MustNewConstMetric(c.entries, prometheus.GaugeValue, float64(n), name)
	}
	for name, n := range c.dp.Capacities() {
		ch <- prometheus.MustNewConstMetric(c.maxSize, prometheus.GaugeValue, float64(n), name)
	}
	for name, n := range c.memoryCache.get(c.dp.MapMemory, c.log) {
		ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(n), name)
	}
	ch <- prometheus.MustNewConstMetric(c.quarantined, prometheus.GaugeValue,
		float64(c.quarantinedCache.get(c.dp.QuarantinedSNATPorts, c.log)))
}
