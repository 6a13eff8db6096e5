package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// The interlocks: section (docs/safety.md#interlocks-permissives-and-trips):
//
//	interlocks:
//	  - name: tank_low
//	    kind: permissive
//	    tool: do_irrigation_valve
//	    applies_above: 0
//	    requires: {read: read_rain_tank_level, above: 10}
//	  - name: vent_open
//	    kind: interlock
//	    tool: do_heater_zone_a
//	    while: {read: read_vent_zone_a, above: 80}
//	    max: 20
//	  - name: overtemp
//	    kind: trip
//	    while: {read: read_temperature_zone_a, above: 35}
//	    safe: [do_heater_zone_a]
//
// Every output a rule names must declare a manifest safe state with
// interlock_trip in safe.on (the rule drives it there when the plant's state
// breaks it), and its safe value must keep the rule (a safe value an
// interlock forbids is no safe value).

type rawInterlock struct {
	Name         *string       `yaml:"name"`
	Kind         *string       `yaml:"kind"`
	Tool         *string       `yaml:"tool"`
	AppliesAbove *float64      `yaml:"applies_above"`
	Requires     *rawCondition `yaml:"requires"`
	While        *rawCondition `yaml:"while"`
	Max          *float64      `yaml:"max"`
	Min          *float64      `yaml:"min"`
	Safe         []string      `yaml:"safe"`
	MaxAgeMS     *int          `yaml:"max_age_ms"`
	Bypass       *rawBypass    `yaml:"bypass"`
}

type rawBypass struct {
	Role       *string `yaml:"role"`
	MaxMinutes *int    `yaml:"max_minutes"`
}

type rawCondition struct {
	Read   *string    `yaml:"read"`
	Source *string    `yaml:"source"`
	Above  *float64   `yaml:"above"`
	Below  *float64   `yaml:"below"`
	Equals *yaml.Node `yaml:"equals"`
}

var ruleNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// DefaultInterlockMaxAge is a condition reading's default max_age when its
// capability is not polled: a reading older than this is unknown.
const DefaultInterlockMaxAge = 5 * time.Second

func (p *parser) interlocks(n *yaml.Node, pol *Policy, m *manifest.Manifest) {
	if n == nil {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.Addf(n, "interlocks", "write a list: interlocks: [{name: …, kind: permissive|interlock|trip, …}]", "expected a list")
		return
	}
	names := map[string]bool{}
	for i, item := range n.Content {
		if r := p.interlock(item, fmt.Sprintf("interlocks[%d]", i), names, m); r != nil {
			pol.Interlocks = append(pol.Interlocks, r)
		}
	}
}

// interlock checks one rule; nil when it has a problem (reported).
func (p *parser) interlock(item *yaml.Node, field string, names map[string]bool, m *manifest.Manifest) *interlock.Rule {
	var raw rawInterlock
	if !p.Decode(item, field, &raw) {
		return nil
	}
	at := func(key string) *yaml.Node {
		if v := strictyaml.ValueOf(item, key); v != nil {
			return v
		}
		return item
	}
	r := &interlock.Rule{}
	switch {
	case raw.Name == nil:
		p.Addf(item, field+".name", "name the rule, e.g. name: tank_low", "required")
	case !ruleNameRE.MatchString(*raw.Name):
		p.Addf(at("name"), field+".name", "use lower case letters, digits and _", "%q is not a rule name", *raw.Name)
	case names[*raw.Name]:
		p.Addf(at("name"), field+".name", "give each rule its own name", "%q is used twice", *raw.Name)
	default:
		names[*raw.Name] = true
		r.Name = *raw.Name
		field += "(" + r.Name + ")"
	}
	kinds := make([]string, len(interlock.Kinds))
	for i, k := range interlock.Kinds {
		kinds[i] = string(k)
	}
	if raw.Kind == nil || !slices.Contains(kinds, *raw.Kind) {
		p.Addf(at("kind"), field+".kind", "one of "+strings.Join(kinds, ", "), "required: what the rule does")
		return nil
	}
	r.Kind = interlock.Kind(*raw.Kind)
	cond, condKey := p.conditionKey(r.Kind, raw, at, field)
	p.kindKeys(r.Kind, raw, at, field)
	p.outputs(r, raw, item, at, field, m)
	if cond == nil {
		p.Addf(item, field+"."+condKey, fmt.Sprintf("say what the rule reads: %s: {read: read_…, above: N}", condKey), "required")
		return nil
	}
	c, ok := p.condition(at(condKey), field+"."+condKey, cond, m)
	if !ok {
		return nil
	}
	r.Cond = c
	r.MaxAge = DefaultInterlockMaxAge // another gateway's reading
	if c.Source == "" {
		r.MaxAge = conditionMaxAge(m.Capability(manifest.CapabilityName(c.Read)))
	}
	if raw.MaxAgeMS != nil {
		r.MaxAge = time.Duration(*raw.MaxAgeMS) * time.Millisecond
		floor := 100 * time.Millisecond
		if c.Source == "" {
			// Between two polls a reading ages by poll_ms: a max_age below
			// twice that would count a healthy reading as stale and trip.
			floor = 2 * m.Capability(manifest.CapabilityName(c.Read)).PollInterval()
		}
		switch {
		case *raw.MaxAgeMS < 1 || *raw.MaxAgeMS > 3_600_000:
			p.Addf(at("max_age_ms"), field+".max_age_ms", "use 1 to 3600000 ms", "%d is out of range", *raw.MaxAgeMS)
		case r.MaxAge < floor:
			p.Addf(at("max_age_ms"), field+".max_age_ms", fmt.Sprintf("use at least %d (twice the reading's poll_ms)", floor.Milliseconds()),
				"%d ms is shorter than twice %s's poll_ms: between two polls a healthy reading would count as stale and trip the rule", *raw.MaxAgeMS, c.Read)
		}
	}
	r.Bypass = p.bypass(raw.Bypass, r.Kind, at, field)
	if r.Name == "" || len(r.Outputs) == 0 {
		return nil
	}
	return r
}

// bypass checks a rule's bypass: (none for a trip).
func (p *parser) bypass(raw *rawBypass, k interlock.Kind, at func(string) *yaml.Node, field string) *interlock.BypassTerms {
	if raw == nil {
		return nil
	}
	if k == interlock.Trip {
		p.Addf(at("bypass"), field+".bypass", "remove it: a trip holds outputs safe and cannot be lifted (change the policy to change the trip)", "a trip has no bypass")
		return nil
	}
	b := &interlock.BypassTerms{Role: "supervisor", Max: time.Hour}
	if raw.Role != nil {
		if RoleLevel(*raw.Role) < RoleLevel("operator") {
			p.Addf(at("bypass"), field+".bypass.role", "operator, supervisor or admin", "%q cannot lift a safety rule", *raw.Role)
		} else {
			b.Role = *raw.Role
		}
	}
	if raw.MaxMinutes != nil {
		if *raw.MaxMinutes < 1 || *raw.MaxMinutes > 24*60 {
			p.Addf(at("bypass"), field+".bypass.max_minutes", "use 1 to 1440 minutes", "%d is out of range", *raw.MaxMinutes)
		} else {
			b.Max = time.Duration(*raw.MaxMinutes) * time.Minute
		}
	}
	return b
}

// conditionKey is the kind's condition (requires: for a permissive, while:
// otherwise), refusing the other.
func (p *parser) conditionKey(k interlock.Kind, raw rawInterlock, at func(string) *yaml.Node, field string) (*rawCondition, string) {
	if k == interlock.Permissive {
		if raw.While != nil {
			p.Addf(at("while"), field+".while", "a permissive says what must hold: requires: {read: …, above: …}", "not a key of a permissive")
		}
		return raw.Requires, "requires"
	}
	if raw.Requires != nil {
		p.Addf(at("requires"), field+".requires", "an "+string(k)+" says when it acts: while: {read: …, above: …}", "not a key of a %s", k)
	}
	return raw.While, "while"
}

// outputs fills the rule's outputs and bounds and checks each output.
func (p *parser) outputs(r *interlock.Rule, raw rawInterlock, item *yaml.Node, at func(string) *yaml.Node, field string, m *manifest.Manifest) {
	switch {
	case r.Kind == interlock.Trip:
		if len(raw.Safe) == 0 {
			p.Addf(at("safe"), field+".safe", "list the do_ tools the trip holds at their safe values, e.g. safe: [do_heater_zone_a]", "required")
		}
		r.Outputs = raw.Safe
	case raw.Tool == nil:
		p.Addf(item, field+".tool", "name the do_ tool the rule guards, e.g. tool: do_"+firstDo(m), "required")
	default:
		r.Outputs = []string{*raw.Tool}
	}
	r.AppliesAbove, r.Max, r.Min = raw.AppliesAbove, raw.Max, raw.Min
	if r.Kind == interlock.Interlock && r.Max == nil && r.Min == nil {
		p.Addf(item, field+".max", "bound the output while the condition holds: max: N and/or min: N", "an interlock needs max or min")
	}
	if r.Max != nil && r.Min != nil && *r.Min > *r.Max {
		p.Addf(at("min"), field+".min", "min must not be above max", "min %g > max %g", *r.Min, *r.Max)
	}
	for j, tool := range r.Outputs {
		of, node := field+".tool", at("tool")
		if r.Kind == interlock.Trip {
			of, node = fmt.Sprintf("%s.safe[%d]", field, j), at("safe")
		}
		p.interlockOutput(node, of, tool, r, m)
	}
}

// kindKeys refuses the keys that belong to another kind.
func (p *parser) kindKeys(k interlock.Kind, raw rawInterlock, at func(string) *yaml.Node, field string) {
	bad := func(set bool, key, fix string) {
		if set {
			p.Addf(at(key), field+"."+key, fix, "not a key of a %s", k)
		}
	}
	bad(k != interlock.Permissive && raw.AppliesAbove != nil, "applies_above", "applies_above belongs to a permissive")
	bad(k != interlock.Interlock && raw.Max != nil, "max", "max belongs to an interlock")
	bad(k != interlock.Interlock && raw.Min != nil, "min", "min belongs to an interlock")
	bad(k != interlock.Trip && raw.Safe != nil, "safe", "a "+string(k)+" names one output with tool:")
	bad(k == interlock.Trip && raw.Tool != nil, "tool", "a trip lists its outputs with safe: [do_…]")
}

// interlockOutput checks one output of r.
func (p *parser) interlockOutput(n *yaml.Node, field, tool string, r *interlock.Rule, m *manifest.Manifest) {
	c := m.Capability(manifest.CapabilityName(tool))
	if c == nil || c.Kind != manifest.KindDo || c.ToolName() != tool {
		p.Addf(n, field, "name a do_ tool of the manifest, e.g. do_"+firstDo(m), "%q is not a do_ tool of the manifest", tool)
		return
	}
	if !c.Safe.Has(manifest.SafeOnInterlockTrip) {
		p.Addf(n, field, "give "+c.Name+" a safe state in the manifest with interlock_trip in safe.on (physd drives it there when the rule is broken)",
			"%s has no safe state on interlock_trip", tool)
		return
	}
	num := c.DataType == manifest.TypeFloat || c.DataType == manifest.TypeInt
	if (r.Max != nil || r.Min != nil || r.AppliesAbove != nil) && !num {
		p.Addf(n, field, "bounds need a float or int output", "%s is %s", tool, c.DataType)
		return
	}
	safe, _ := manifest.Number(c.Safe.Value)
	if r.Kind == interlock.Interlock && (r.Max != nil && safe > *r.Max || r.Min != nil && safe < *r.Min) {
		p.Addf(n, field, "widen the bound or change the safe value: the safe value must keep the interlock", "the safe value %g of %s breaks the bound", safe, tool)
	}
	if r.Kind == interlock.Permissive && r.AppliesAbove != nil && safe > *r.AppliesAbove {
		p.Addf(n, field, "the safe value must not need the permissive: raise applies_above to at least it", "the safe value %g of %s is above applies_above %g", safe, tool, *r.AppliesAbove)
	}
}

// condition checks a requires:/while: mapping.
func (p *parser) condition(n *yaml.Node, field string, raw *rawCondition, m *manifest.Manifest) (interlock.Condition, bool) {
	var c interlock.Condition
	if raw.Read == nil {
		p.Addf(n, field+".read", "name the read_ tool the rule watches, e.g. read: read_…", "required")
		return c, false
	}
	if raw.Source != nil && *raw.Source != m.Device.ID {
		return p.remoteCondition(n, field, raw, m)
	}
	rc := m.Capability(manifest.CapabilityName(*raw.Read))
	if rc == nil || rc.Kind != manifest.KindRead || rc.ToolName() != *raw.Read {
		p.Addf(strictyaml.ValueOf(n, "read"), field+".read", "name a read_ tool of this gateway's manifest, or add source: <device id> for another gateway's",
			"%q is not a read_ tool of the manifest", *raw.Read)
		return c, false
	}
	if rc.PollInterval() <= 0 {
		p.Addf(strictyaml.ValueOf(n, "read"), field+".read", "give "+rc.Name+" poll_ms in the manifest (e.g. poll_ms: 1000): physd judges the rule on every reading",
			"%s is not polled, so the rule would only see it when someone reads it", *raw.Read)
		return c, false
	}
	c.Read = *raw.Read
	if !p.oneComparison(n, field, raw) {
		return c, false
	}
	num := rc.DataType == manifest.TypeFloat || rc.DataType == manifest.TypeInt
	if (raw.Above != nil || raw.Below != nil) && !num {
		p.Addf(n, field, "compare a "+rc.DataType+" reading with equals:", "above/below need a float or int reading")
		return c, false
	}
	c.Above, c.Below = raw.Above, raw.Below
	if e := raw.Equals; e != nil {
		var v any
		if err := e.Decode(&v); err != nil || e.Kind != yaml.ScalarNode {
			p.Addf(e, field+".equals", "a number, true/false or an enum value", "not a value")
			return c, false
		}
		if f, ok := manifest.Number(v); ok {
			v = f
		}
		switch rc.DataType {
		case manifest.TypeBool:
			if _, ok := v.(bool); !ok {
				p.Addf(e, field+".equals", "true or false", "%s is bool", c.Read)
				return c, false
			}
		case manifest.TypeEnum, manifest.TypeString:
			s, ok := v.(string)
			if !ok || rc.DataType == manifest.TypeEnum && !slices.Contains(rc.EnumValues, s) {
				p.Addf(e, field+".equals", "one of "+strings.Join(rc.EnumValues, ", "), "not a value of %s", c.Read)
				return c, false
			}
		default:
			if _, ok := v.(float64); !ok {
				p.Addf(e, field+".equals", "a number", "%s is %s", c.Read, rc.DataType)
				return c, false
			}
		}
		c.Equals = v
	}
	return c, true
}

// oneComparison: exactly one of above, below, equals.
func (p *parser) oneComparison(n *yaml.Node, field string, raw *rawCondition) bool {
	set := 0
	for _, b := range []bool{raw.Above != nil, raw.Below != nil, raw.Equals != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		p.Addf(n, field, "give exactly one of above: N, below: N or equals: V", "%d comparisons", set)
	}
	return set == 1
}

var remoteReadRE = regexp.MustCompile(`^read_[a-z][a-z0-9_]*$`)

// remoteCondition is a condition on another gateway's reading: it cannot
// be checked against that gateway's manifest here, so its name and
// comparison are checked, and the mesh must be on. Its equals: stays as
// written (a number, bool or text).
func (p *parser) remoteCondition(n *yaml.Node, field string, raw *rawCondition, m *manifest.Manifest) (interlock.Condition, bool) {
	c := interlock.Condition{Read: *raw.Read, Source: *raw.Source, Above: raw.Above, Below: raw.Below}
	ok := true
	if !m.Network.Mesh.Enabled {
		p.Addf(strictyaml.ValueOf(n, "source"), field+".source", "enable network.mesh in the manifest, or read a capability of this gateway", "%s is another gateway, and this one has no mesh", *raw.Source)
		ok = false
	}
	if !remoteReadRE.MatchString(*raw.Read) {
		p.Addf(strictyaml.ValueOf(n, "read"), field+".read", "name the owner's read_ tool, e.g. read_vent_zone_c", "%q is not a read_ tool name", *raw.Read)
		ok = false
	}
	if !p.oneComparison(n, field, raw) {
		return c, false
	}
	if e := raw.Equals; e != nil {
		var v any
		if err := e.Decode(&v); err != nil || e.Kind != yaml.ScalarNode {
			p.Addf(e, field+".equals", "a number, true/false or an enum value", "not a value")
			return c, false
		}
		if f, isNum := manifest.Number(v); isNum {
			v = f
		}
		c.Equals = v
	}
	return c, ok
}

// conditionMaxAge is how old a reading of c may be: two poll rounds and a
// timeout for a polled capability, else DefaultInterlockMaxAge (or the
// cache TTL when that is longer).
func conditionMaxAge(c *manifest.Capability) time.Duration {
	if every := c.PollInterval(); every > 0 {
		return 2*every + c.Timeout()
	}
	return max(DefaultInterlockMaxAge, c.CacheTTL())
}
