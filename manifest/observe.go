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
var observeKeys = []string{"poll_ms", "deadband"}

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
	a, aok := toFloat(ref)
	b, bok := toFloat(next)
	if !aok || !bok {
		return fmt.Sprint(ref) != fmt.Sprint(next)
	}
	band := c.Deadband.Band(c.Range)
	return math.Abs(b-a) > band
}

func toFloat(v any) (float64, bool) {
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
	n := o.get("deadband")
	if n == nil {
		return
	}
	field := o.field("deadband")
	numeric := c.DataType == TypeFloat || c.DataType == TypeInt
	if c.DataType != "" && !numeric {
		p.add(o.key("deadband"), field, "remove deadband: every change of a "+c.DataType+" value counts", "deadband applies only to data_type float or int, not %s", c.DataType)
		return
	}
	c.Deadband = p.deadband(n, field, c.Range)
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
		"deadband": {Description: `physd: what counts as a change (float and int): an absolute band in the capability's unit, or "N%" of range. Default 0: every change.`,
			OneOf: []*jsonschema.Schema{number("", ptr(0.0), nil), {Type: "string", Pattern: `^\s*[0-9]+(\.[0-9]+)?\s*%\s*$`}}},
	}
}
