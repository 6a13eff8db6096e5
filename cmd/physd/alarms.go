package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// startAlarms evaluates the manifest's alarms on the node's observation
// stream (nil when none is declared): every raised and cleared event is
// logged, appended to the audit trail and counted in /metrics, and each
// declared alarm has a physd_alarm_active gauge.
func startAlarms(n *node.Node, al *audit.Log, mx *metrics.Metrics, log *slog.Logger) *alarms.Engine {
	e := alarms.New(n.Manifest())
	if e == nil {
		return nil
	}
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_alarm_events_total", Help: "Alarms raised and cleared, by capability, kind and state."},
		[]string{"capability", "kind", "state"})
	mx.Registry.MustRegister(events)
	for _, d := range e.Declared() {
		tool, kind := d[0], d[1]
		mx.Gauge("physd_alarm_active", "1 while the alarm is raised.", map[string]string{"capability": tool, "kind": kind}, func() float64 {
			if e.IsActive(tool, kind) {
				return 1
			}
			return 0
		})
	}
	e.OnEvent(func(ev alarms.Event) {
		events.WithLabelValues(ev.Capability, ev.Kind, ev.State).Inc()
		log.Warn("alarm "+ev.State, "capability", ev.Capability, "kind", ev.Kind, "message", ev.Message)
		if _, err := al.Append(&audit.Record{Event: "alarm_" + ev.State, Tool: ev.Capability, Reason: ev.Message,
			Data: map[string]any{"kind": ev.Kind, "value": ev.Value, "at": ev.At}}); err != nil {
			log.Error("alarm not audited", "capability", ev.Capability, "err", err.Error())
		}
	})
	e.Follow(n)
	return e
}
