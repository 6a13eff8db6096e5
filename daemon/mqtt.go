package daemon

import (
	"errors"
	"log/slog"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/mqtt"
	"github.com/physd/physd/node"
)

// newMQTT builds the publisher (nil without --mqtt-url) before the audit
// trail opens, so the trail's sink can feed it the do_ results.
func newMQTT(c *mqtt.Config, m *manifest.Manifest, log *slog.Logger) (*mqtt.Publisher, error) {
	if c == nil {
		return nil, nil
	}
	c.Logger = log
	return mqtt.New(*c, m)
}

// teeSink sends each audit line to every sink.
type teeSink []audit.Sink

func (t teeSink) Send(line []byte) {
	for _, s := range t {
		s.Send(line)
	}
}

func (t teeSink) Close() error {
	var errs []error
	for _, s := range t {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// withMQTTSink adds the publisher's do_ results tap to the audit's sink.
func withMQTTSink(s audit.Sink, p *mqtt.Publisher) audit.Sink {
	if p == nil {
		return s
	}
	if s == nil {
		return p.AuditSink()
	}
	return teeSink{s, p.AuditSink()}
}

// followMQTT feeds the publisher the node's observation stream and the
// alarm engine's events, and exports its counters.
func followMQTT(p *mqtt.Publisher, n *node.Node, e *alarms.Engine, mx *metrics.Metrics) {
	if p == nil {
		return
	}
	p.Follow(n)
	if e != nil {
		e.OnEvent(p.Alarm)
	}
	mx.Gauge("physd_mqtt_connected", "1 while the MQTT broker is connected.", nil, func() float64 {
		if p.Stats().Connected {
			return 1
		}
		return 0
	})
	mx.Gauge("physd_mqtt_published", "MQTT messages the broker acknowledged.", nil, func() float64 { return float64(p.Stats().Published) })
	mx.Gauge("physd_mqtt_dropped", "MQTT messages dropped: queue full, or the broker not connected (retained values are sent again on reconnect).",
		nil, func() float64 { s := p.Stats(); return float64(s.DroppedFull + s.DroppedOffline) })
}
