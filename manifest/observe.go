package manifest

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"gopkg.in/yaml.v3"
)

// The observation keys of a capability (physd extensions): poll_ms asks
// the node to read the device in the background, deadband decides which
// observations count as a change (MCP resource updates, history).
const (
	// MinPollMS bounds poll_ms from below: a Modbus or I²C bus shared by
	// many capabilities cannot be read faster than this without starving
	// the reads and read-backs of do_ calls.
	MinPollMS = 100
	// MaxPollMS is a day.
	MaxPollMS = 86_400_000
)

// observeKeys are appended to capKeys.
var observeKeys = []string{"poll_ms", "deadband", "alarms"}

// alarmKeys are the keys of capabilities[].alarms.
var alarmKeys = []string{"high", "low", "hysteresis", "for_ms", "quality", "stale_s"}

// AlarmQualities are the qualities an alarm may watch for.
var AlarmQualities = []string{"stale", "degraded", "error"}

// Alarms is capabilities[].alarms (physd extension): conditions that raise
// an alarm once they have held for ForMS, and clear with hysteresis.
type Alarms struct {
	// High raises when the value is above it; clears at or below
	// High - Hysteresis. Low mirrors it. Numeric capabilities only.
	High       *float64 `json:"high,omitempty"`
	Low        *float64 `json:"low,omitempty"`
	Hysteresis float64  `json:"hysteresis,omitempty"`
	// ForMS is how long a condition must hold before it raises (noise
	// shorter than this raises nothing).
	ForMS int `json:"for_ms,omitempty"`
	// Quality raises while the observation's quality is one of these.
	Quality []string `json:"quality,omitempty"`
	// StaleS raises when no fresh value was read for this long (needs
	// poll_ms, so the node keeps reading).
	StaleS int `json:"stale_s,omitempty"`
}

// For is ForMS as a duration.
func (a *Alarms) For() time.Duration { return time.Duration(a.ForMS) * time.Millisecond }

// Deadband is capabilities[].deadband: a numeric observation counts as a
// change when it differs from the last value that counted by more than
// the band. Written as a number (absolute, in the capability's unit) or
// as "N%" (percent of range: max - min).
type Deadband struct {
	Value   float64 `json:"value"`
	Percent bool    `json:"percent,omitempty"`
	Source  string  `json:"source"` // as written
}

// Band is the absolute width of the deadband for a capability with range r.
func (d *Deadband) Band(r *Range) float64 {
	if d == nil {
		return 0
	}
	if d.Percent {
		if r == nil {
			return 0
		}
		return d.Value / 100 * (r.Max - r.Min)
	}
	return d.Value
}

// PollInterval is poll_ms as a duration (0: no background polling).
func (c *Capability) PollInterval() time.Duration {
	return time.Duration(c.PollMS) * time.Millisecond
}

// Changed reports whether next differs from ref by more than the
// capability's deadband. Numbers compare against the band (a zero band:
// any difference); other values change when they differ. A nil ref (no
// value yet) is always a change.
func (c *Capability) Changed(ref, next any) bool {
	if ref == nil || next == nil {
		return ref != next
	}
	a, aok := Number(ref)
	b, bok := Number(next)
	if !aok || !bok {
		return fmt.Sprint(ref) != fmt.Sprint(next)
	}
	band := c.Deadband.Band(c.Range)
	return math.Abs(b-a) > band
}

// Number is a capability value (or a driver's raw number) as a float64:
// ok is false for a value that is not a number.
func Number(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case float32:
		return float64(x), true
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case int32:
		return float64(x), true
	case uint16:
		return float64(x), true
	}
	return 0, false
}

// observe parses poll_ms and deadband.
func (p *parser) observe(o *obj, c *Capability) {
	if v, ok := o.intIn("poll_ms", MinPollMS, MaxPollMS); ok {
		c.PollMS = v
	}
	numeric := c.DataType == TypeFloat || c.DataType == TypeInt
	if n := o.get("deadband"); n != nil {
		field := o.field("deadband")
		if c.DataType != "" && !numeric {
			p.add(o.key("deadband"), field, "remove deadband: every change of a "+c.DataType+" value counts", "deadband applies only to data_type float or int, not %s", c.DataType)
		} else {
			c.Deadband = p.deadband(n, field, c.Range)
		}
	}
	if a := o.sub("alarms", alarmKeys, false); a != nil {
		c.Alarms = p.alarms(a, c, numeric)
	}
}

func (p *parser) alarms(a *obj, c *Capability, numeric bool) *Alarms {
	out := &Alarms{}
	for _, k := range []string{"high", "low", "hysteresis"} {
		if a.get(k) != nil && c.DataType != "" && !numeric {
			p.add(a.key(k), a.field(k), "remove "+k+", or use quality/stale_s alarms for a "+c.DataType+" capability", "%s applies only to data_type float or int, not %s", k, c.DataType)
		}
	}
	if v, ok := a.floatMin("high", math.Inf(-1), false); ok {
		out.High = &v
	}
	if v, ok := a.floatMin("low", math.Inf(-1), false); ok {
		out.Low = &v
	}
	if v, ok := a.floatMin("hysteresis", 0, false); ok {
		out.Hysteresis = v
		if out.High == nil && out.Low == nil {
			p.add(a.key("hysteresis"), a.field("hysteresis"), "add high: or low:, or remove hysteresis", "hysteresis without a high or low threshold")
		}
	}
	if out.High != nil && out.Low != nil && *out.Low+out.Hysteresis >= *out.High-out.Hysteresis {
		p.add(a.key("low"), a.field("low"), "keep low + hysteresis below high - hysteresis, so one value cannot clear one alarm and raise the other", "low %g and high %g overlap with hysteresis %g", *out.Low, *out.High, out.Hysteresis)
	}
	out.ForMS, _ = a.intIn("for_ms", 0, MaxPollMS)
	out.Quality, _ = a.strList("quality", false, func(n *yaml.Node, f, s string) bool {
		if !contains(AlarmQualities, s) {
			p.add(n, f, oneOf(s, AlarmQualities), "invalid quality %s", quoteShort(s))
			return false
		}
		return true
	})
	if v, ok := a.intIn("stale_s", 1, MaxPollMS/1000); ok {
		out.StaleS = v
		if c.PollMS == 0 {
			p.add(a.key("stale_s"), a.field("stale_s"), "add poll_ms (e.g. poll_ms: 1000) so the node keeps reading the capability", "stale_s needs background polling")
		} else if time.Duration(v)*time.Second <= c.PollInterval() {
			p.add(a.get("stale_s"), a.field("stale_s"), fmt.Sprintf("use more than poll_ms (%d ms), e.g. stale_s: %d", c.PollMS, max(3*c.PollMS/1000, 2)), "stale_s %d is not longer than one poll", v)
		}
	}
	if out.High == nil && out.Low == nil && len(out.Quality) == 0 && out.StaleS == 0 {
		p.add(a.node, a.path, "declare at least one of high, low, quality or stale_s", "alarms declares no condition")
		return nil
	}
	return out
}

func (p *parser) deadband(n *yaml.Node, field string, r *Range) *Deadband {
	const fix = `write an absolute band in the capability's unit (e.g. 0.2) or a percent of range (e.g. "0.5%")`
	if n.Kind != yaml.ScalarNode || isNull(n) {
		p.add(n, field, fix, "expected a number or a percent, got %s", describe(n))
		return nil
	}
	s := strings.TrimSpace(n.Value)
	pct := strings.HasSuffix(s, "%")
	num := strings.TrimSpace(strings.TrimSuffix(s, "%"))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		p.add(n, field, fix, "invalid deadband %s", quoteShort(n.Value))
		return nil
	}
	switch {
	case v < 0:
		p.add(n, field, "use a band of at least 0 (0: every change counts)", "deadband must not be negative, got %s", n.Value)
		return nil
	case pct && v > 100:
		p.add(n, field, "use a percent from 0% to 100% of range", "deadband %s is more than the whole range", n.Value)
		return nil
	case pct && r == nil:
		p.add(n, field, "add range: {min, max}, or write the band in the capability's unit (e.g. 0.2)", "a percent deadband needs the capability's range")
		return nil
	}
	return &Deadband{Value: v, Percent: pct, Source: s}
}

// observeSchema describes poll_ms and deadband for capabilitySchema.
func observeSchema() props {
	return props{
		"poll_ms": integer(fmt.Sprintf("physd: read the device in the background every poll_ms (%d to %d); observations feed MCP resource subscriptions and history. Default: no polling.", MinPollMS, MaxPollMS), MinPollMS, MaxPollMS),
		"alarms": object("capabilities[].alarms", alarmKeys, nil, props{
			"high":       number("physd: raise when the value is above this (float and int).", nil, nil),
			"low":        number("physd: raise when the value is below this (float and int).", nil, nil),
			"hysteresis": number("physd: an alarm clears only at high - hysteresis (low + hysteresis). Default 0.", ptr(0.0), nil),
			"for_ms":     integer("physd: how long a condition must hold before it raises. Default 0.", 0, MaxPollMS),
			"quality":    uniqueList(enum(AlarmQualities, ""), "physd: raise while the quality is one of these."),
			"stale_s":    integer("physd: raise when no fresh value was read for this many seconds (needs poll_ms).", 1, MaxPollMS/1000),
		}),
		"deadband": {Description: `physd: what counts as a change (float and int): an absolute band in the capability's unit, or "N%" of range. Default 0: every change.`,
			OneOf: []*jsonschema.Schema{number("", ptr(0.0), nil), {Type: "string", Pattern: `^\s*[0-9]+(\.[0-9]+)?\s*%\s*$`}}},
	}
}
