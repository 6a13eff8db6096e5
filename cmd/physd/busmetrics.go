package main

import (
	"github.com/physd/physd/drivers/modbus"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// registerBusMetrics exports the Modbus engines' counters and queue depth.
func registerBusMetrics(mx *metrics.Metrics, n *node.Node) {
	for name, b := range n.Buses() {
		mb, ok := b.(*modbus.Bus)
		if !ok {
			continue
		}
		labels := map[string]string{"bus": name}
		mx.Gauge("physd_bus_queue_depth", "Requests waiting in the bus worker's queue.", labels, func() float64 { return float64(mb.Stats().QueueDepth) })
		mx.Gauge("physd_bus_requests", "Modbus requests sent (a coalesced read counts once).", labels, func() float64 { return float64(mb.Stats().Requests) })
		mx.Gauge("physd_bus_coalesced_reads", "Point reads that shared another read's request.", labels, func() float64 { return float64(mb.Stats().Coalesced) })
		mx.Gauge("physd_bus_failures", "Requests that failed other than by a Modbus exception.", labels, func() float64 { return float64(mb.Stats().Failures) })
		mx.Gauge("physd_bus_timeouts", "Requests without a timely reply.", labels, func() float64 { return float64(mb.Stats().Timeouts) })
		mx.Gauge("physd_bus_exceptions", "Modbus exception replies.", labels, func() float64 { return float64(mb.Stats().Exceptions) })
	}
}
