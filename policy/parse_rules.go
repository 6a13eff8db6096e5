package policy

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// Rules: the capabilities.<tool>.rules entries, one reader per type.

// rawRule holds every key any rule type may use; parser.ruleKeys enforces which
// keys belong to which type.
type rawRule struct {
	Type        string   `yaml:"type"`
	AllowDuring []string `yaml:"allow_during"`
	DenyDuring  []string `yaml:"deny_during"`
	Require     []string `yaml:"require"`
	Max         any      `yaml:"max"` // rate string, or range_guard number
	Min         *float64 `yaml:"min"`
	OnViolation string   `yaml:"on_violation"`
	MinPeers    *int     `yaml:"min_peers"`
	OnFailure   string   `yaml:"on_failure"`
	MS          *int     `yaml:"ms"`
	When        string   `yaml:"when"`
	Window      string   `yaml:"window"`
	Above       *float64 `yaml:"above"`
	// approval: who may approve (two-person rule)
	ApproverRole string `yaml:"approver_role"`
	SelfApproval *bool  `yaml:"self_approval"`
}

var ruleKeys = map[string][]string{
	"time_window": {"allow_during", "deny_during"},
	"permission":  {"require"},
	"rate":        {"max"},
	"quorum":      {"min_peers", "on_failure"},
	"range_guard": {"min", "max", "on_violation"},
	"cooldown":    {"ms"},
	"approval":    {"when", "window", "above", "approver_role", "self_approval"},
	"max_change":  {"max"},
}

// keysOf lists the keys a mapping node sets.
func keysOf(n *yaml.Node) map[string]*yaml.Node {
	out := map[string]*yaml.Node{}
	for _, kv := range strictyaml.Pairs(n) {
		out[kv[0].Value] = kv[0]
	}
	return out
}

// rule reads one rule of a tool: its type and keys, then what the type
// says, into tp.
func (p *parser) rule(n *yaml.Node, field string, tp *ToolPolicy, pol *Policy) {
	var r rawRule
	if !p.Decode(n, field, &r) || !p.ruleKeys(n, field, r.Type) {
		return
	}
	switch r.Type {
	case "time_window":
		p.timeWindowRule(n, field, r, tp, pol)
	case "permission":
		p.permissionRule(n, field, r, tp)
	case "rate":
		p.rateRule(n, field, r, tp)
	case "quorum":
		p.quorumRule(n, field, r, tp)
	case "range_guard":
		p.rangeGuard(n, field, r, tp)
	case "max_change":
		p.maxChange(n, field, r, tp)
	case "cooldown":
		p.cooldownRule(n, field, r, tp)
	case "approval":
		p.approvalRule(n, field, r, tp, pol)
	}
}

// ruleKeys checks the rule's type and that every key it sets belongs to
// that type; it reports false for an unknown type.
func (p *parser) ruleKeys(n *yaml.Node, field, typ string) bool {
	allowed, known := ruleKeys[typ]
	if !known {
		types := make([]string, 0, len(ruleKeys))
		for t := range ruleKeys {
			types = append(types, t)
		}
		sort.Strings(types)
		p.Addf(n, field+".type", "use one of "+strings.Join(types, ", "), "unknown rule type %q", typ)
		return false
	}
	for k, kn := range keysOf(n) {
		if k != "type" && !slices.Contains(allowed, k) {
			p.Addf(kn, field+"."+k, "keys of a "+typ+" rule: "+strings.Join(allowed, ", "), "%q does not belong to a %s rule", k, typ)
		}
	}
	return true
}

// window returns the time window a rule names under key, or nil; an
// unknown name is reported, a declared but invalid one has its own error.
func (p *parser) window(n *yaml.Node, field, key, name string, pol *Policy) *Window {
	w := pol.Windows[name]
	if w == nil && !p.declared[name] {
		p.Addf(strictyaml.ElemOf(strictyaml.ValueOf(n, key), name), field+"."+key, "declare it under time_windows:", "unknown time window %q", name)
	}
	return w
}

func (p *parser) timeWindowRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy, pol *Policy) {
	if len(r.AllowDuring)+len(r.DenyDuring) == 0 {
		p.Addf(n, field, "list window names in allow_during and/or deny_during", "the rule names no window")
	}
	for _, name := range r.AllowDuring {
		if w := p.window(n, field, "allow_during", name, pol); w != nil {
			tp.AllowDuring = append(tp.AllowDuring, w)
		}
	}
	for _, name := range r.DenyDuring {
		if w := p.window(n, field, "deny_during", name, pol); w != nil {
			tp.DenyDuring = append(tp.DenyDuring, w)
		}
	}
}

func (p *parser) permissionRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if len(r.Require) == 0 {
		p.Addf(n, field+".require", "list the roles allowed, e.g. [operator, supervisor]", "required")
	}
	least := ""
	for _, role := range r.Require {
		if p.role(n, field+".require", role) && (least == "" || RoleLevel(role) < RoleLevel(least)) {
			least = role
		}
	}
	// Roles are ordered: naming operator admits supervisors and admins.
	if least != "" && RoleLevel(least) > RoleLevel(tp.MinRole) {
		tp.MinRole = least
	}
}

func (p *parser) rateRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	s, ok := r.Max.(string)
	if !ok {
		p.Addf(n, field+".max", `write a rate such as "6/hour"`, "required")
		return
	}
	rl, err := manifest.ParseRate(s, "rate")
	if err != nil {
		p.addRate(strictyaml.ValueOf(n, "max"), field+".max", err)
		return
	}
	tp.Rates = append(tp.Rates, Rate{rl.Count, rl.Per, rl.Source, "policy"})
}

func (p *parser) quorumRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if r.MinPeers == nil || *r.MinPeers < 1 {
		p.Addf(n, field+".min_peers", "set min_peers: 2 or more (self included)", "required and ≥ 1")
		return
	}
	if r.OnFailure != "" && r.OnFailure != "deny" {
		p.Addf(n, field+".on_failure", "use deny (the only safe choice)", "unsupported on_failure %q", r.OnFailure)
	}
	tp.Quorum = max(tp.Quorum, *r.MinPeers)
}

func (p *parser) cooldownRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	if r.MS == nil || *r.MS < 1 {
		p.Addf(n, field+".ms", "set ms: the minimum time between actuations, e.g. 30000", "required and > 0")
		return
	}
	tp.Cooldown = max(tp.Cooldown, time.Duration(*r.MS)*time.Millisecond)
}

// approvalRule reads when a human must approve, and who may.
func (p *parser) approvalRule(n *yaml.Node, field string, r rawRule, tp *ToolPolicy, pol *Policy) {
	a := &Approval{When: r.When}
	switch r.When {
	case "always":
	case "outside_window":
		if r.Window == "" {
			p.Addf(n, field+".window", "name the window inside which no approval is needed", "required for when: outside_window")
			return
		}
		if a.Window = p.window(n, field, "window", r.Window, pol); a.Window == nil {
			return
		}
	case "above":
		if r.Above == nil || math.IsNaN(*r.Above) || math.IsInf(*r.Above, 0) {
			p.Addf(n, field+".above", "set the value above which a human must approve", "required for when: above")
			return
		}
		a.Above = *r.Above
		if tp.Cap.Range != nil && a.Above >= tp.Cap.Range.Max {
			p.Addf(n, field+".above", fmt.Sprintf("use a value below the physical maximum %g", tp.Cap.Range.Max), "unreachable rule: no value is above %g", a.Above)
		}
	default:
		p.Addf(n, field+".when", "use always, outside_window or above", "unknown when %q", r.When)
		return
	}
	if !p.approver(n, field, r, a) {
		return
	}
	if tp.Approval != nil {
		p.Addf(n, field, "keep one approval rule per tool", "a second approval rule")
	}
	tp.Approval = a
}

// approver reads who may approve: approver_role names the least role of
// the approver; self_approval (default false with an approver_role, true
// without) says whether the caller may be that approver.
func (p *parser) approver(n *yaml.Node, field string, r rawRule, a *Approval) bool {
	a.SelfApproval = r.ApproverRole == ""
	if r.SelfApproval != nil {
		a.SelfApproval = *r.SelfApproval
	}
	if r.ApproverRole == "" {
		if !a.SelfApproval {
			p.Addf(strictyaml.ValueOf(n, "self_approval"), field+".self_approval", "name who approves instead: approver_role: supervisor", "self_approval: false needs an approver_role")
			return false
		}
		return true
	}
	at := strictyaml.ValueOf(n, "approver_role")
	if !p.role(at, field+".approver_role", r.ApproverRole) {
		return false
	}
	if RoleLevel(r.ApproverRole) < RoleLevel("operator") {
		p.Addf(at, field+".approver_role", "use operator, supervisor or admin", "an approver must hold a role that can act (got %s)", r.ApproverRole)
		return false
	}
	a.ApproverRole = r.ApproverRole
	return true
}

func (p *parser) rangeGuard(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	c := tp.Cap
	if c.DataType != manifest.TypeFloat && c.DataType != manifest.TypeInt {
		p.Addf(n, field, "range guards apply to float and int capabilities", "%s is data_type %s", tp.Tool, c.DataType)
		return
	}
	mx, ok := toFloat(r.Max)
	if r.Min == nil || !ok {
		p.Addf(n, field, "set both min and max", "min and max are required numbers")
		return
	}
	g := &RangeGuard{Min: *r.Min, Max: mx, OnViolation: r.OnViolation}
	switch g.OnViolation {
	case "clamp", "deny", "warn":
	case "":
		p.Addf(n, field+".on_violation", "use clamp, deny or warn", "required")
		return
	default:
		p.Addf(n, field+".on_violation", "use clamp, deny or warn", "unknown on_violation %q", g.OnViolation)
		return
	}
	if g.Min > g.Max {
		p.Addf(n, field, "set min ≤ max", "min (%g) is greater than max (%g)", g.Min, g.Max)
		return
	}
	if pr := c.Range; pr != nil {
		if g.Max < pr.Min || g.Min > pr.Max {
			p.Addf(n, field, fmt.Sprintf("overlap the physical range [%g, %g]", pr.Min, pr.Max), "unreachable rule: [%g, %g] lies outside the capability's range", g.Min, g.Max)
			return
		}
		// A bound beyond the manifest range can never apply (the range is a
		// hard limit) and usually means another unit or another device.
		bad := false
		if g.Min < pr.Min {
			p.Addf(strictyaml.ValueOf(n, "min"), field+".min", fmt.Sprintf("use a min from %g to %g (the manifest range of %s), or correct the manifest range", pr.Min, pr.Max, c.Name), "min %g is below the capability's range [%g, %g]", g.Min, pr.Min, pr.Max)
			bad = true
		}
		if g.Max > pr.Max {
			p.Addf(strictyaml.ValueOf(n, "max"), field+".max", fmt.Sprintf("use a max from %g to %g (the manifest range of %s), or correct the manifest range", pr.Min, pr.Max, c.Name), "max %g is above the capability's range [%g, %g]", g.Max, pr.Min, pr.Max)
			bad = true
		}
		if bad {
			return
		}
	}
	if tp.Range != nil {
		p.Addf(n, field, "keep one range_guard per tool", "a second range_guard")
	}
	tp.Range = g
}

func numeric(c *manifest.Capability) bool {
	return c.DataType == manifest.TypeFloat || c.DataType == manifest.TypeInt
}

// maxChange reads {type: max_change, max: N}: the largest step from the
// device's current value that one actuation may make.
func (p *parser) maxChange(n *yaml.Node, field string, r rawRule, tp *ToolPolicy) {
	c := tp.Cap
	if !numeric(c) {
		p.Addf(n, field, "max_change applies to float and int capabilities; remove the rule", "%s is data_type %s", tp.Tool, c.DataType)
		return
	}
	at := strictyaml.ValueOf(n, "max")
	if at == nil {
		p.Addf(n, field+".max", "set max: the largest step from the current value one actuation may make, e.g. max: 10", "required")
		return
	}
	mx, ok := toFloat(r.Max)
	if !ok || mx <= 0 {
		got := at.Value
		if at.ShortTag() == "!!str" {
			got = fmt.Sprintf("the text %q (write the number without quotes)", at.Value)
		}
		p.Addf(at, field+".max", "a number above 0 in the capability's unit, e.g. max: 10", "must be a positive number, got %s", got)
		return
	}
	if pr := c.Range; pr != nil && mx >= pr.Max-pr.Min {
		p.Addf(at, field+".max", fmt.Sprintf("use a step below %g (the width of the range [%g, %g]), or remove the rule", pr.Max-pr.Min, pr.Min, pr.Max),
			"unreachable rule: no step inside the range is larger than %g", mx)
		return
	}
	if p.seen[tp.Tool+"/max_change"] {
		p.Addf(n, field, "keep one max_change rule per tool", "a second max_change")
		return
	}
	p.seen[tp.Tool+"/max_change"] = true
	// With defaults.max_change_percent too, the stricter step wins.
	if tp.MaxChange == nil || mx < tp.MaxChange.Max {
		tp.MaxChange = &MaxChange{Max: mx, Source: "policy"}
	}
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case float64:
		return x, !math.IsNaN(x) && !math.IsInf(x, 0)
	}
	return 0, false
}
