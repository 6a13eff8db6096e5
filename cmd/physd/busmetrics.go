package main

import (
	"github.com/physd/physd/drivers/modbus"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// registerBusMetrics exports physd_bus_up for every bus and the Modbus
// engines' counters and queue depth. The series are listed at scrape time
// from the buses in force (node.Buses), so a bus a manifest reload adds
// gets its series, a removed one loses them, and a reopened one (a new
// engine, counters from zero) is read, not the closed engine.
func registerBusMetrics(mx *metrics.Metrics, n *node.Node) {
	mx.GaugeSet("physd_bus_up", "1 while the bus is open and healthy.", []string{"bus"}, func(emit func(float64, ...string)) {
		for name, b := range n.Buses() {
			up := 0.0
			if b.Health() == nil {
				up = 1
			}
			emit(up, name)
		}
	})
	modbusStat := func(name, help string, v func(modbus.Stats) float64) {
		mx.GaugeSet(name, help, []string{"bus"}, func(emit func(float64, ...string)) {
			for bus, mb := range modbusBuses(n) {
				emit(v(mb.Stats()), bus)
			}
		})
	}
	modbusStat("physd_bus_queue_depth", "Requests waiting in the bus worker's queue.", func(s modbus.Stats) float64 { return float64(s.QueueDepth) })
	modbusStat("physd_bus_requests", "Modbus requests sent (a coalesced read counts once).", func(s modbus.Stats) float64 { return float64(s.Requests) })
	modbusStat("physd_bus_coalesced_reads", "Point reads that shared another read's request.", func(s modbus.Stats) float64 { return float64(s.Coalesced) })
	modbusStat("physd_bus_failures", "Requests that failed other than by a Modbus exception.", func(s modbus.Stats) float64 { return float64(s.Failures) })
	modbusStat("physd_bus_timeouts", "Requests without a timely reply.", func(s modbus.Stats) float64 { return float64(s.Timeouts) })
	modbusStat("physd_bus_exceptions", "Modbus exception replies.", func(s modbus.Stats) float64 { return float64(s.Exceptions) })
}

// modbusBuses are the Modbus engines in force, by bus name.
func modbusBuses(n *node.Node) map[string]*modbus.Bus {
	out := map[string]*modbus.Bus{}
	for name, b := range n.Buses() {
		if mb, ok := b.(*modbus.Bus); ok {
			out[name] = mb
		}
	}
	return out
}
