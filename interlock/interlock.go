// Package interlock is the policy's interlocks (physmcp.policy.yml
// interlocks:, docs/safety.md#interlocks-permissives-and-trips): rules that
// tie an output to another capability's observation, in the ISA-84 split.
//
//   - A permissive is a precondition of an output: do_irrigation_valve
//     above 0 only while read_rain_tank_level > 10.
//   - An interlock bounds an output while a condition holds:
//     do_heater_zone_a at most 20 while read_vent_zone_a > 80.
//   - A trip holds outputs at their safe values while a condition holds:
//     do_heater_zone_a to safe while read_temperature_zone_a > 35.
//
// The package decides; it reads nothing itself. The node gives it the
// readings (value, quality, age) and the outputs' values, and it says
// whether a value is allowed (every do_ and can_do, and again under the
// output's turn) and whether the plant's state violates a rule now (on
// every observation of a condition's reading, and on a tick for
// staleness), in which case the node drives the output to its safe value.
//
// A reading that is not good and fresh — stale, degraded, in error,
// unread, older than the rule's max_age — counts as the unsafe side: a
// permissive's condition does not hold, an interlock's or trip's does.
package interlock

import (
	"fmt"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Kind is a rule's kind.
type Kind string

// Kinds.
const (
	Permissive Kind = "permissive"
	Interlock  Kind = "interlock"
	Trip       Kind = "trip"
)

// Kinds lists the kinds in the order the docs give them.
var Kinds = []Kind{Permissive, Interlock, Trip}

// Code is the refusal code of a do_ a rule stops.
const Code = "interlock_active"

// Condition compares one reading: exactly one of Above, Below or Equals.
type Condition struct {
	Read string // read_<cap>
	// Source is the gateway that owns Read when it is not this one (its
	// device.id): the reading comes over the mesh, and an owner that does
	// not answer counts as the unsafe side.
	Source string
	Above  *float64
	Below  *float64
	Equals any // a float64, bool or string, typed as the reading
}

// Key names the reading: read_x, or gw_b/read_x for another gateway's.
func (c Condition) Key() string {
	if c.Source != "" {
		return c.Source + "/" + c.Read
	}
	return c.Read
}

// String is "read_x > 10".
func (c Condition) String() string {
	switch {
	case c.Above != nil:
		return fmt.Sprintf("%s > %g", c.Key(), *c.Above)
	case c.Below != nil:
		return fmt.Sprintf("%s < %g", c.Key(), *c.Below)
	}
	return fmt.Sprintf("%s = %s", c.Key(), promcp.FormatValue(c.Equals))
}

// Rule is one entry of interlocks:.
type Rule struct {
	Name string
	Kind Kind
	// Outputs are the do_ tools the rule acts on: the permissive's or
	// interlock's tool, the trip's safe: list.
	Outputs []string
	// Cond is the permissive's requires: (what must hold for the output to
	// be above AppliesAbove), or the interlock's and trip's while:.
	Cond Condition
	// AppliesAbove (permissive): values above it need the condition; nil:
	// every value but the output's safe value.
	AppliesAbove *float64
	// Max, Min (interlock): the bound while the condition holds.
	Max, Min *float64
	// MaxAge is how old the reading may be to count as known.
	MaxAge time.Duration
	// Bypass, when set, lets two people lift the rule for a while
	// (permissives and interlocks only; a trip has none).
	Bypass *BypassTerms
}

// BypassTerms are a rule's bypass: who may ask and approve, for how long.
type BypassTerms struct {
	Role string        // the least role of the one who asks and of the one who approves
	Max  time.Duration // the longest bypass
}

// Reading is one observation as the rules see it.
type Reading struct {
	Known   bool // an observation exists
	Value   any
	Quality promcp.Quality
	Age     time.Duration
	Error   string
}

// String is "85 (good, 120 ms old)" or "unknown (error: …)".
func (r Reading) String() string {
	if !r.Known {
		if r.Error != "" {
			return "unknown (" + r.Error + ")"
		}
		return "unknown (never read)"
	}
	s := fmt.Sprintf("%s (%s, %d ms old", promcp.FormatValue(r.Value), r.Quality, r.Age.Milliseconds())
	if r.Error != "" {
		s += ", " + r.Error
	}
	return s + ")"
}

// usable reports whether r may decide a condition: good and fresh.
func (r Reading) usable(maxAge time.Duration) bool {
	return r.Known && r.Quality == promcp.QualityGood && r.Age <= maxAge && r.Value != nil
}

// holds evaluates c on r; ok is false when r is not usable.
func (c Condition) holds(r Reading, maxAge time.Duration) (holds, ok bool) {
	if !r.usable(maxAge) {
		return false, false
	}
	switch {
	case c.Above != nil:
		v, isNum := manifest.Number(r.Value)
		return isNum && v > *c.Above, isNum
	case c.Below != nil:
		v, isNum := manifest.Number(r.Value)
		return isNum && v < *c.Below, isNum
	}
	return equal(r.Value, c.Equals), true
}

func equal(a, b any) bool {
	if x, ok := manifest.Number(a); ok {
		y, ok := manifest.Number(b)
		return ok && x == y
	}
	return a == b
}

// Output is what the rules know of one output: its safe value and the
// value to judge (a requested value, or the device's current one).
type Output struct {
	Tool  string
	Safe  any
	Value any
	// Known is false when the current value is not known (judged as the
	// unsafe side: it may be anything).
	Known bool
}

// Violation is a rule that stops a value, with the reading it was decided
// on.
type Violation struct {
	Rule    *Rule
	Output  string
	Value   any
	Reading Reading
}

// Reason names the rule, the reading, its quality and age, and the fix.
func (v *Violation) Reason() string {
	r := v.Rule
	val := "an unknown value"
	if v.Value != nil {
		val = promcp.FormatValue(v.Value)
	}
	switch r.Kind {
	case Permissive:
		return fmt.Sprintf("permissive %s: %s %s needs %s, and %s is %s: it does not hold (a reading that is not good and at most %v old counts as not holding)",
			r.Name, v.Output, r.appliesText(), r.Cond, r.Cond.Key(), v.Reading, r.MaxAge)
	case Interlock:
		return fmt.Sprintf("interlock %s: %s %s while %s, and %s is %s; %s breaks the bound",
			r.Name, v.Output, r.boundText(), r.Cond, r.Cond.Key(), v.Reading, val)
	}
	return fmt.Sprintf("trip %s: %s is held at its safe value while %s, and %s is %s",
		r.Name, v.Output, r.Cond, r.Cond.Key(), v.Reading)
}

// Details is machine-parseable.
func (v *Violation) Details() string {
	d := fmt.Sprintf("code=%s; rule=%s; kind=%s; read=%s; quality=%s; age_ms=%d", Code, v.Rule.Name, v.Rule.Kind, v.Rule.Cond.Key(), v.Reading.Quality, v.Reading.Age.Milliseconds())
	if v.Reading.Known {
		d += "; reading=" + promcp.FormatValue(v.Reading.Value)
	}
	return d
}

func (r *Rule) appliesText() string {
	if r.AppliesAbove != nil {
		return fmt.Sprintf("above %g", *r.AppliesAbove)
	}
	return "away from its safe value"
}

func (r *Rule) boundText() string {
	var b []string
	if r.Max != nil {
		b = append(b, fmt.Sprintf("at most %g", *r.Max))
	}
	if r.Min != nil {
		b = append(b, fmt.Sprintf("at least %g", *r.Min))
	}
	return strings.Join(b, " and ")
}

// Judge says whether out's value breaks r given the reading of its
// condition, or nil.
func (r *Rule) Judge(out Output, reading Reading) *Violation {
	holds, ok := r.Cond.holds(reading, r.MaxAge)
	switch r.Kind {
	case Permissive:
		if (ok && holds) || !r.applies(out) {
			return nil
		}
	case Interlock:
		if (ok && !holds) || r.within(out) {
			return nil
		}
	case Trip:
		if (ok && !holds) || out.Known && equal(out.Value, out.Safe) {
			return nil
		}
	}
	return &Violation{Rule: r, Output: out.Tool, Value: out.Value, Reading: reading}
}

// applies: the permissive matters for this value (an unknown value may be
// anything, so it does).
func (r *Rule) applies(out Output) bool {
	if !out.Known {
		return true
	}
	if r.AppliesAbove != nil {
		v, ok := manifest.Number(out.Value)
		return !ok || v > *r.AppliesAbove
	}
	return !equal(out.Value, out.Safe)
}

// within: the value keeps the interlock's bound (unknown: it may not).
func (r *Rule) within(out Output) bool {
	if !out.Known {
		return false
	}
	v, ok := manifest.Number(out.Value)
	if !ok {
		return false
	}
	return (r.Max == nil || v <= *r.Max) && (r.Min == nil || v >= *r.Min)
}

// Set is the rules in force, indexed for the two questions.
type Set struct {
	Rules    []*Rule
	byOutput map[string][]*Rule
	byRead   map[string][]*Rule
}

// NewSet indexes rules.
func NewSet(rules []*Rule) *Set {
	s := &Set{Rules: rules, byOutput: map[string][]*Rule{}, byRead: map[string][]*Rule{}}
	for _, r := range rules {
		for _, o := range r.Outputs {
			s.byOutput[o] = append(s.byOutput[o], r)
		}
		s.byRead[r.Cond.Key()] = append(s.byRead[r.Cond.Key()], r)
	}
	return s
}

// Len is the number of rules (a nil Set has none).
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.Rules)
}

// On lists the rules that act on output tool.
func (s *Set) On(tool string) []*Rule {
	if s == nil {
		return nil
	}
	return s.byOutput[tool]
}

// Reading lists the rules whose condition reads key (Condition.Key).
func (s *Set) Reading(key string) []*Rule {
	if s == nil {
		return nil
	}
	return s.byRead[key]
}

// Remote lists the conditions that read another gateway's capability, one
// per reading, with the shortest max_age of the rules that read it.
func (s *Set) Remote() []RemoteReading {
	if s == nil {
		return nil
	}
	var out []RemoteReading
	seen := map[string]int{}
	for _, r := range s.Rules {
		if r.Cond.Source == "" {
			continue
		}
		if i, ok := seen[r.Cond.Key()]; ok {
			out[i].MaxAge = min(out[i].MaxAge, r.MaxAge)
			continue
		}
		seen[r.Cond.Key()] = len(out)
		out = append(out, RemoteReading{Source: r.Cond.Source, Read: r.Cond.Read, MaxAge: r.MaxAge})
	}
	return out
}

// RemoteReading is another gateway's capability some rule reads.
type RemoteReading struct {
	Source, Read string
	MaxAge       time.Duration
}

// Key is Condition.Key of the reading.
func (r RemoteReading) Key() string { return r.Source + "/" + r.Read }

// Check judges out against every rule on it but those skip names (a
// bypass in force); read gives a condition's reading. The first violation
// is returned (rules in file order).
func (s *Set) Check(out Output, read func(tool string, maxAge time.Duration) Reading, skip func(*Rule) bool) *Violation {
	for _, r := range s.On(out.Tool) {
		if skip != nil && skip(r) {
			continue
		}
		if v := r.Judge(out, read(r.Cond.Key(), r.MaxAge)); v != nil {
			return v
		}
	}
	return nil
}
