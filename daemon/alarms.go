package daemon

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// startAlarms evaluates the manifest's alarms on the node's observation
// stream: every raised and cleared event is logged, appended to the audit
// trail and counted in /metrics, and each declared alarm has a
// physd_alarm_active gauge. The engine exists even when the manifest
// declares no alarm: a reload may declare some (reloadSteps); the gauges
// follow the alarms in force at each scrape.
func startAlarms(n *node.Node, al *audit.Log, mx *metrics.Metrics, log *slog.Logger) *alarms.Engine {
	e := alarms.New(n.Manifest())
	events := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_alarm_events_total", Help: "Alarms raised and cleared, by capability, kind and state."},
		[]string{"capability", "kind", "state"})
	mx.Registry.MustRegister(events)
	mx.GaugeSet("physd_alarm_active", "1 while the alarm is raised.", []string{"capability", "kind"}, func(emit func(float64, ...string)) {
		active := map[[2]string]bool{}
		for _, a := range e.Active() {
			active[[2]string{a.Capability, a.Kind}] = true
		}
		for _, d := range e.Declared() {
			v := 0.0
			if active[d] {
				v = 1
			}
			emit(v, d[0], d[1])
		}
	})
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
