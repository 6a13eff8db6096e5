package main

import (
	"github.com/physd/physd/drivers/modbus"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// registerBusMetrics exports the Modbus engines' counters and queue depth.
// Each scrape reads the bus in force under that name: a manifest reload
// that reopens a bus (new settings) replaces its engine, and the closed
// one's counters must not stand for it.
func registerBusMetrics(mx *metrics.Metrics, n *node.Node) {
	for name, b := range n.Buses() {
		if _, ok := b.(*modbus.Bus); !ok {
			continue
		}
		labels := map[string]string{"bus": name}
		stat := func(f func(modbus.Stats) float64) func() float64 {
			return func() float64 {
				if mb, ok := n.Buses()[name].(*modbus.Bus); ok {
					return f(mb.Stats())
				}
				return 0
			}
		}
		mx.Gauge("physd_bus_queue_depth", "Requests waiting in the bus worker's queue.", labels, stat(func(s modbus.Stats) float64 { return float64(s.QueueDepth) }))
		mx.Gauge("physd_bus_requests", "Modbus requests sent (a coalesced read counts once).", labels, stat(func(s modbus.Stats) float64 { return float64(s.Requests) }))
		mx.Gauge("physd_bus_coalesced_reads", "Point reads that shared another read's request.", labels, stat(func(s modbus.Stats) float64 { return float64(s.Coalesced) }))
		mx.Gauge("physd_bus_failures", "Requests that failed other than by a Modbus exception.", labels, stat(func(s modbus.Stats) float64 { return float64(s.Failures) }))
		mx.Gauge("physd_bus_timeouts", "Requests without a timely reply.", labels, stat(func(s modbus.Stats) float64 { return float64(s.Timeouts) }))
		mx.Gauge("physd_bus_exceptions", "Modbus exception replies.", labels, stat(func(s modbus.Stats) float64 { return float64(s.Exceptions) }))
	}
}
