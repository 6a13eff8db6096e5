package manifest

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The fail-safe keys of a do_ capability (physd extensions): safe is the
// value that makes the output safe and the events that drive it there;
// lease makes every do_ hold its value only for a while (a dead-man for
// agents), after which the output goes to its safe value.

// Safe-state events (capabilities[].safe.on).
const (
	// SafeOnShutdown: physd stops (SIGTERM, SIGINT): the output goes safe
	// before the process exits.
	SafeOnShutdown = "shutdown"
	// SafeOnStartAfterCrash: the previous run did not stop cleanly (the
	// state directory's run marker): the output goes safe before physd
	// serves any call.
	SafeOnStartAfterCrash = "start_after_crash"
	// SafeOnLeaseExpiry: the lease of the last do_ ran out.
	SafeOnLeaseExpiry = "lease_expiry"
	// SafeOnQuorumLoss: the gateway has been in a minority partition for
	// longer than the partition hold.
	SafeOnQuorumLoss = "quorum_loss"
	// SafeOnBusRestored: the output's bus answers again after it was
	// down: what the device did meanwhile is unknown.
	SafeOnBusRestored = "bus_restored"
	// SafeOnInterlockTrip: a trip of the policy names this output.
	SafeOnInterlockTrip = "interlock_trip"
)

// SafeEvents are the events safe.on may list.
var SafeEvents = []string{SafeOnShutdown, SafeOnStartAfterCrash, SafeOnLeaseExpiry, SafeOnQuorumLoss, SafeOnBusRestored, SafeOnInterlockTrip}

// MaxLeaseS bounds lease.max_s: a day. A lease is a dead-man for an agent
// that stopped calling; a longer one is no dead-man.
const MaxLeaseS = 86_400

var (
	safeKeys  = []string{"value", "on"}
	leaseKeys = []string{"default_s", "max_s"}
)

// failSafeKeys are the fail-safe keys of capKeys.
var failSafeKeys = []string{"safe", "lease"}

// Safe is capabilities[].safe: the output's safe value and the events that
// drive it there. Driving to safe is an actuation of its own: the
// manifest's range applies; rate limits, cooldowns and approvals do not.
type Safe struct {
	// Value is the safe value: a float64 for float and int capabilities
	// (whole for int), a bool, or one of an enum's values.
	Value any      `json:"value"`
	On    []string `json:"on"`
}

// Has reports whether event drives the output to safe.
func (s *Safe) Has(event string) bool { return s != nil && slices.Contains(s.On, event) }

// Lease is capabilities[].lease: a do_ holds its value for hold_s seconds
// (the call's argument, default DefaultS, at most MaxS); a later do_
// extends it; when it runs out the output goes to its safe value.
type Lease struct {
	DefaultS int `json:"default_s"`
	MaxS     int `json:"max_s"`
}

// Default is the hold of a do_ that names none.
func (l *Lease) Default() time.Duration { return time.Duration(l.DefaultS) * time.Second }

// Max is the longest hold a do_ may ask for.
func (l *Lease) Max() time.Duration { return time.Duration(l.MaxS) * time.Second }

// failSafe parses safe and lease.
func (p *parser) failSafe(o *obj, c *Capability, isDo bool) {
	for _, k := range failSafeKeys {
		if o.get(k) != nil && c.Kind != "" && !isDo {
			p.add(o.key(k), o.field(k), "remove "+k+", or set kind: do", "%s is only allowed on kind do", k)
			return
		}
	}
	if s := o.sub("safe", safeKeys, false); s != nil {
		c.Safe = p.safe(s, c)
	}
	if l := o.sub("lease", leaseKeys, false); l != nil {
		c.Lease = p.lease(l)
		if c.Lease != nil && !c.Safe.Has(SafeOnLeaseExpiry) {
			p.add(o.key("lease"), o.field("lease"), "add safe: {value: …, on: [lease_expiry]} so an expired lease has somewhere to go, or remove lease",
				"a lease needs a safe value that lease_expiry drives to")
		}
	}
	if c.Safe.Has(SafeOnLeaseExpiry) && c.Lease == nil && o.get("lease") == nil {
		p.add(o.get("safe"), o.field("safe.on"), "add lease: {max_s: 600} (the longest hold a do_ may ask for), or remove lease_expiry from safe.on",
			"safe.on lists lease_expiry but the capability has no lease")
	}
}

func (p *parser) safe(s *obj, c *Capability) *Safe {
	out := &Safe{}
	if vn := s.need("value", "add value: the output's safe value (what de-energises it), e.g. value: 0"); vn != nil {
		out.Value = p.safeValue(vn, s.field("value"), c)
	}
	seen := map[string]bool{}
	out.On, _ = s.strList("on", true, func(n *yaml.Node, f, v string) bool {
		if !contains(SafeEvents, v) {
			p.add(n, f, oneOf(v, SafeEvents), "invalid safe event %s", quoteShort(v))
			return false
		}
		if seen[v] {
			p.add(n, f, "list each event once", "duplicate safe event %q", v)
			return false
		}
		seen[v] = true
		return true
	})
	if on := s.get("on"); on != nil && on.Kind == yaml.SequenceNode && len(on.Content) == 0 {
		p.add(on, s.field("on"), "list the events that drive the output to safe, e.g. on: [shutdown, start_after_crash]", "safe.on must not be empty")
	}
	if out.Value == nil {
		return nil
	}
	return out
}

// safeValue checks the safe value against the capability's data type,
// range and enum values: a safe value the device cannot take is no safe
// state.
func (p *parser) safeValue(n *yaml.Node, field string, c *Capability) any {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		p.add(n, field, "write one value of the capability's data type", "expected a value, got %s", describe(n))
		return nil
	}
	raw := strings.TrimSpace(n.Value)
	switch c.DataType {
	case TypeFloat, TypeInt:
		v, err := strconv.ParseFloat(raw, 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || n.Tag == "!!str" {
			p.add(n, field, "write a number, e.g. value: 0", "safe value %s is not a number (data_type %s)", quoteShort(n.Value), c.DataType)
			return nil
		}
		if c.DataType == TypeInt && v != math.Trunc(v) {
			p.add(n, field, fmt.Sprintf("write a whole number, e.g. value: %g", math.Trunc(v)), "safe value %s is not whole (data_type int)", n.Value)
			return nil
		}
		if r := c.Range; r != nil && (v < r.Min || v > r.Max) {
			p.add(n, field, fmt.Sprintf("use a value from %g to %g (the capability's range)", r.Min, r.Max), "safe value %s is outside the range", n.Value)
			return nil
		}
		return v
	case TypeBool:
		switch raw {
		case "true":
			return true
		case "false":
			return false
		}
		p.add(n, field, "write true or false", "safe value %s is not a bool", quoteShort(n.Value))
		return nil
	case TypeEnum:
		if !contains(c.EnumValues, raw) {
			p.add(n, field, oneOf(raw, c.EnumValues), "safe value %s is not one of enum_values", quoteShort(raw))
			return nil
		}
		return raw
	}
	return nil // the data type itself is reported
}

func (p *parser) lease(l *obj) *Lease {
	out := &Lease{}
	if l.need("max_s", fmt.Sprintf("add max_s: the longest hold a do_ may ask for, in seconds (1 to %d)", MaxLeaseS)) != nil {
		out.MaxS, _ = l.intIn("max_s", 1, MaxLeaseS)
	}
	out.DefaultS = out.MaxS
	if v, ok := l.intIn("default_s", 1, MaxLeaseS); ok {
		out.DefaultS = v
		if out.MaxS > 0 && v > out.MaxS {
			p.add(l.get("default_s"), l.field("default_s"), fmt.Sprintf("use at most max_s (%d)", out.MaxS), "default_s %d is longer than max_s %d", v, out.MaxS)
		}
	}
	if out.MaxS == 0 {
		return nil
	}
	return out
}

// failSafeSchema describes safe and lease for capabilitySchema.
func failSafeSchema() props {
	return props{
		"safe": object("capabilities[].safe", safeKeys, safeKeys, props{
			"value": {Description: "physd: the output's safe value (of its data type, within its range): what de-energises it.",
				Types: []string{"number", "boolean", "string"}},
			"on": uniqueList(enum(SafeEvents, ""), "physd: the events that drive the output to its safe value."),
		}),
		"lease": object("capabilities[].lease", leaseKeys, []string{"max_s"}, props{
			"default_s": integer("physd: the hold of a do_ that names no hold_s, in seconds. Default max_s.", 1, MaxLeaseS),
			"max_s":     integer("physd: the longest hold_s a do_ may ask for; when a hold runs out the output goes to its safe value.", 1, MaxLeaseS),
		}),
	}
}

// SafeCapabilities are the do_ capabilities whose safe.on lists event.
func (m *Manifest) SafeCapabilities(event string) []*Capability {
	var out []*Capability
	for _, c := range m.Capabilities {
		if c.Kind == KindDo && c.Safe.Has(event) {
			out = append(out, c)
		}
	}
	return out
}
