package daemon

import (
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// registerBusMetrics exports physd_bus_up for every bus, and the counters
// and queue depth of every bus engine that counts (drivers.Counters: the
// Modbus engines). The series are listed at scrape time
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
	stat := perBus(mx, n, func(b drivers.Bus) (drivers.BusCounters, bool) {
		c, ok := b.(drivers.Counters)
		if !ok {
			return drivers.BusCounters{}, false
		}
		return c.Counters(), true
	})
	stat("physd_bus_queue_depth", "Requests waiting in the bus worker's queue.", func(s drivers.BusCounters) float64 { return float64(s.QueueDepth) })
	stat("physd_bus_requests", "Modbus requests sent (a coalesced read counts once).", func(s drivers.BusCounters) float64 { return float64(s.Requests) })
	stat("physd_bus_coalesced_reads", "Point reads that shared another read's request.", func(s drivers.BusCounters) float64 { return float64(s.Coalesced) })
	stat("physd_bus_failures", "Requests that failed other than by a Modbus exception.", func(s drivers.BusCounters) float64 { return float64(s.Failures) })
	stat("physd_bus_timeouts", "Requests without a timely reply.", func(s drivers.BusCounters) float64 { return float64(s.Timeouts) })
	stat("physd_bus_exceptions", "Modbus exception replies.", func(s drivers.BusCounters) float64 { return float64(s.Exceptions) })
	stat("physd_bus_heartbeats", "Device-watchdog heartbeats the device acknowledged (a Modbus bus's heartbeat:).", func(s drivers.BusCounters) float64 { return float64(s.Heartbeats) })
	stat("physd_bus_heartbeat_errors", "Device-watchdog heartbeat and watchdog-time writes that failed.", func(s drivers.BusCounters) float64 { return float64(s.HeartbeatErrors) })
	registerMonitorMetrics(mx, n)
}

// registerMonitorMetrics exports the monitored items of every bus whose
// device monitors points (drivers.MonitorCounters: OPC UA), listed at
// scrape time as the bus counters are.
func registerMonitorMetrics(mx *metrics.Metrics, n *node.Node) {
	stat := perBus(mx, n, func(b drivers.Bus) (drivers.MonitorStats, bool) {
		c, ok := b.(drivers.MonitorCounters)
		if !ok {
			return drivers.MonitorStats{}, false
		}
		return c.MonitorCounters(), true
	})
	stat("physd_bus_subscriptions", "Subscriptions the server holds for the bus now.", func(s drivers.MonitorStats) float64 { return float64(s.Subscriptions) })
	stat("physd_bus_monitored_items", "Monitored items the server holds for the bus now.", func(s drivers.MonitorStats) float64 { return float64(s.Items) })
	stat("physd_bus_monitor_fallbacks", "Capabilities polled because the server refused to monitor them.", func(s drivers.MonitorStats) float64 { return float64(s.Fallbacks) })
	stat("physd_bus_notifications", "Value and status changes the server reported for monitored items.", func(s drivers.MonitorStats) float64 { return float64(s.Notifications) })
	stat("physd_bus_keepalives", "Keep-alives: the server had nothing to report.", func(s drivers.MonitorStats) float64 { return float64(s.KeepAlives) })
	stat("physd_bus_subscription_losses", "Subscriptions lost (server restart, network cut, keep-alive past its deadline).", func(s drivers.MonitorStats) float64 { return float64(s.Losses) })
}

// perBus returns a function that registers one gauge per bus: v of what
// get reads from each bus in force that has it, at scrape time.
func perBus[S any](mx *metrics.Metrics, n *node.Node, get func(drivers.Bus) (S, bool)) func(name, help string, v func(S) float64) {
	return func(name, help string, v func(S) float64) {
		mx.GaugeSet(name, help, []string{"bus"}, func(emit func(float64, ...string)) {
			for bus, b := range n.Buses() {
				if st, ok := get(b); ok {
					emit(v(st), bus)
				}
			}
		})
	}
}
