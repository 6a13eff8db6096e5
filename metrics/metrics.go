// Package metrics holds physd's Prometheus metrics on its own registry
// (no global state), with bounded labels: tool names come from the
// manifest, outcomes and permissions from fixed enums; never keys or text.
package metrics

import (
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is every series physd exports.
type Metrics struct {
	Registry *prometheus.Registry

	ToolCalls     *prometheus.CounterVec   // tool, outcome, permission
	ToolLatency   *prometheus.HistogramVec // kind
	CacheLookups  *prometheus.CounterVec   // result: hit | device
	DriverErrors  *prometheus.CounterVec   // bus
	GateDecisions *prometheus.CounterVec   // layer, decision
	Refusals      *prometheus.CounterVec   // permission
	Overrides     prometheus.Counter

	mu   sync.Mutex
	sets map[string]bool // GaugeSet names registered
}

// New registers the metrics, the Go runtime and the process collectors.
func New() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		ToolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_tool_calls_total",
			Help: "MCP tool calls by tool, outcome (quality, status, feasible/infeasible, error) and permission."},
			[]string{"tool", "outcome", "permission"}),
		ToolLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "physd_tool_call_duration_seconds",
			Help:    "Time inside physd's tool handler, by kind (read, do, can_do).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}},
			[]string{"kind"}),
		CacheLookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_read_cache_total",
			Help: "read_ answers served from the cache (hit) or the device (device)."}, []string{"result"}),
		DriverErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_driver_errors_total",
			Help: "Failed device accesses by bus."}, []string{"bus"}),
		GateDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_gate_decisions_total",
			Help: "Phocinae gate decisions on do_ calls by layer and decision."}, []string{"layer", "decision"}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_do_refusals_total",
			Help: "do_ calls refused before actuation, by permission (rate_limited, partition_no_quorum, …)."}, []string{"permission"}),
		Overrides: prometheus.NewCounter(prometheus.CounterOpts{Name: "physd_emergency_overrides_total",
			Help: "Emergency overrides started."}),
	}
	r.MustRegister(m.ToolCalls, m.ToolLatency, m.CacheLookups, m.DriverErrors, m.GateDecisions, m.Refusals, m.Overrides,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Resident memory split by kind: anonymous (the Go heap and stacks)
	// apart from file-backed pages (bbolt's mmap of physd.db: page cache
	// the kernel reclaims under pressure).
	for _, kind := range []string{"anon", "file"} {
		field := map[string]string{"anon": "RssAnon:", "file": "RssFile:"}[kind]
		m.Gauge("physd_process_resident_"+kind+"_bytes", "Resident memory of kind "+kind+" (/proc/self/status "+field+").", nil,
			func() float64 { return float64(procStatusBytes(field)) })
	}
	return m
}

// procStatusBytes reads one "Name: N kB" line of /proc/self/status; 0
// where it does not exist.
func procStatusBytes(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// Gauge registers a gauge whose value is read at scrape time (device up,
// ledger size …). Registering a name and labels again keeps the first
// registration (it is not an error: a manifest reload may ask again).
func (m *Metrics) Gauge(name, help string, labels prometheus.Labels, f func() float64) {
	err := m.Registry.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	if _, again := err.(prometheus.AlreadyRegisteredError); err != nil && !again {
		panic(err) // a name registered with other labels or help: a programming error, as MustRegister
	}
}

// GaugeSet registers gauges whose set of series is listed at scrape time:
// each scrape, list calls emit once per series with its value and its
// label values (in the order of labelNames). Buses and alarms that a
// manifest reload adds or removes appear and disappear without
// registering anything again. Registering the same name again keeps the
// first.
func (m *Metrics) GaugeSet(name, help string, labelNames []string, list func(emit func(value float64, labelValues ...string))) {
	c := &gaugeSet{desc: prometheus.NewDesc(name, help, labelNames, nil), list: list}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sets == nil {
		m.sets = map[string]bool{}
	}
	if m.sets[name] {
		return
	}
	m.Registry.MustRegister(c)
	m.sets[name] = true
}

// gaugeSet is an unchecked collector (its series vary): Describe sends
// nothing, Collect lists the series in force.
type gaugeSet struct {
	desc *prometheus.Desc
	list func(emit func(value float64, labelValues ...string))
}

func (g *gaugeSet) Describe(chan<- *prometheus.Desc) {}

func (g *gaugeSet) Collect(ch chan<- prometheus.Metric) {
	g.list(func(v float64, lv ...string) {
		if m, err := prometheus.NewConstMetric(g.desc, prometheus.GaugeValue, v, lv...); err == nil {
			ch <- m
		}
	})
}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// Since observes a handler's duration.
func (m *Metrics) Since(kind string, start time.Time) {
	m.ToolLatency.WithLabelValues(kind).Observe(time.Since(start).Seconds())
}
