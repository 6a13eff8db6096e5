package policy

import (
	"fmt"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// Load reads and validates a policy against the manifest it guards.
func Load(path string, m *manifest.Manifest) (*Policy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data, m)
}

type rawPolicy struct {
	Version      *string       `yaml:"physmcp_policy_version"`
	Defaults     *rawDefaults  `yaml:"defaults"`
	Capabilities *yaml.Node    `yaml:"capabilities"`
	TimeWindows  *yaml.Node    `yaml:"time_windows"`
	Identity     *rawIdentity  `yaml:"identity"`
	Emergency    *rawEmergency `yaml:"emergency"`
	Gate         *yaml.Node    `yaml:"gate"`
	Interlocks   *yaml.Node    `yaml:"interlocks"`
}

type rawDefaults struct {
	RequirePermission *string  `yaml:"require_permission"`
	RateLimit         *string  `yaml:"rate_limit"`
	AuditAll          *bool    `yaml:"audit_all"`
	MaxChangePercent  *float64 `yaml:"max_change_percent"`
}

type rawWindow struct {
	Days     []string `yaml:"days"`
	Start    string   `yaml:"start"`
	End      string   `yaml:"end"`
	Timezone string   `yaml:"timezone"`
}

type rawEmergency struct {
	OverridePermission      *string `yaml:"override_permission"`
	OverrideTokenTTLSeconds *int    `yaml:"override_token_ttl_seconds"`
	AuditAllOverrides       *bool   `yaml:"audit_all_overrides"`
}

type rawCapability struct {
	Rules []yaml.Node `yaml:"rules"`
}

type parser struct {
	strictyaml.Problems            // every problem, at its node (Addf) or from Decode
	doc                 *yaml.Node // the document, to position errors in sections decoded into structs
	// declared names every time window written in the file, valid or not:
	// a rule naming a window whose own definition is wrong must not add an
	// "unknown time window" error on top of the window's real one.
	declared map[string]bool
	seen     map[string]bool // "tool/rule" of rules a tool may have once
}

// at returns the value node at a path of keys from the document root, or
// the deepest mapping on the way (so an error is never without a line).
func (p *parser) at(keys ...string) *yaml.Node {
	n := p.doc
	for _, k := range keys {
		v := strictyaml.ValueOf(n, k)
		if v == nil {
			return n
		}
		n = v
	}
	return n
}

// addRate reports a manifest.ParseRate error at n, keeping its own fix.
func (p *parser) addRate(n *yaml.Node, field string, err error) {
	msg, fix := err.Error(), `write count/unit, e.g. "6/hour"`
	if pe, ok := err.(interface{ Problem() (string, string) }); ok {
		msg, fix = pe.Problem()
	}
	p.Addf(n, field, fix, "%s", msg)
}

// Parse validates a policy against its manifest. Every problem is reported
// at once with file:line:col; a policy is returned only when there are none.
func Parse(file string, data []byte, m *manifest.Manifest) (*Policy, error) {
	root, errs := strictyaml.ParseDocument(file, data)
	if len(errs) > 0 {
		return nil, errs
	}
	p := &parser{Problems: strictyaml.Problems{File: file}, doc: root, declared: map[string]bool{}, seen: map[string]bool{}}
	var raw rawPolicy
	// Keep going after an unknown top-level key: every problem is reported
	// at once.
	p.Decode(root, "", &raw)
	pol := &Policy{Path: file, Tools: map[string]*ToolPolicy{}, Windows: map[string]*Window{}, Gate: raw.Gate}
	p.version(raw.Version)
	p.defaults(raw.Defaults, pol)
	p.windows(raw.TimeWindows, pol)
	p.emergency(raw.Emergency, pol)
	p.identity(raw.Identity, pol)
	p.capabilities(raw.Capabilities, pol, m)
	p.interlocks(raw.Interlocks, pol, m)
	if p.Len() > 0 {
		return nil, p.Errs.SortByLine()
	}
	return pol, nil
}

// version checks physmcp_policy_version as strictly as the manifest checks
// physmcp_version: an unquoted 0.1 is a YAML number, not the version text.
func (p *parser) version(v *string) {
	n := strictyaml.ValueOf(p.doc, "physmcp_policy_version")
	switch {
	case n == nil:
		p.Addf(p.doc, "physmcp_policy_version", `add physmcp_policy_version: "0.1" at the top`, "required")
	case n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!float" || n.ShortTag() == "!!int"):
		p.Addf(n, "physmcp_policy_version", `quote the version: physmcp_policy_version: "0.1"`, "the version must be a string, got the number %s", n.Value)
	case v != nil && *v != Version:
		p.Addf(n, "physmcp_policy_version", `set physmcp_policy_version: "0.1" (physd implements PhysMCP v0.1 policies only)`, "unsupported version %q", *v)
	}
}

func (p *parser) role(n *yaml.Node, field, r string) bool {
	if RoleLevel(r) < 0 {
		p.Addf(n, field, manifest.OneOf(r, Roles), "unknown role %q", r)
		return false
	}
	return true
}

func (p *parser) defaults(d *rawDefaults, pol *Policy) {
	pol.Defaults = Defaults{RequirePermission: "none", AuditAll: true}
	if d == nil {
		return
	}
	if d.RequirePermission != nil && p.role(p.at("defaults", "require_permission"), "defaults.require_permission", *d.RequirePermission) {
		pol.Defaults.RequirePermission = *d.RequirePermission
	}
	if d.RateLimit != nil {
		r, err := manifest.ParseRate(*d.RateLimit, "rate_limit")
		if err != nil {
			p.addRate(p.at("defaults", "rate_limit"), "defaults.rate_limit", err)
		}
		pol.Defaults.RateLimit = r
	}
	if d.AuditAll != nil {
		pol.Defaults.AuditAll = *d.AuditAll
	}
	if pc := d.MaxChangePercent; pc != nil {
		if !(*pc > 0 && *pc < 100) {
			p.Addf(p.at("defaults", "max_change_percent"), "defaults.max_change_percent",
				"use a percentage of each capability's range above 0 and below 100, e.g. 25", "%g is out of range", *pc)
		} else {
			pol.Defaults.MaxChangePercent = *pc
		}
	}
}

func (p *parser) windows(n *yaml.Node, pol *Policy) {
	for _, kv := range strictyaml.Pairs(n) {
		name, field := kv[0].Value, "time_windows."+kv[0].Value
		p.declared[name] = true
		var rw rawWindow
		if !p.Decode(kv[1], field, &rw) {
			continue
		}
		// Each problem points at the key at fault, or at the window when
		// the key is missing.
		at := func(key string) *yaml.Node {
			if v := strictyaml.ValueOf(kv[1], key); v != nil {
				return v
			}
			return kv[1]
		}
		w := &Window{Name: name}
		ok := true
		if len(rw.Days) == 0 {
			p.Addf(at("days"), field+".days", "list the days the window starts on, e.g. [mon, tue, wed, thu, fri]", "required")
			ok = false
		}
		for _, d := range rw.Days {
			wd, found := dayNames[strings.ToLower(d)]
			if !found {
				p.Addf(strictyaml.ElemOf(at("days"), d), field+".days", "use mon, tue, wed, thu, fri, sat, sun", "unknown day %q", d)
				ok = false
				continue
			}
			w.Days[wd] = true
		}
		var err error
		if w.StartMin, err = parseClock(rw.Start); err != nil {
			p.Addf(at("start"), field+".start", `write "HH:MM", e.g. "07:00"`, "%v", err)
			ok = false
		}
		if w.EndMin, err = parseClock(rw.End); err != nil {
			p.Addf(at("end"), field+".end", `write "HH:MM", e.g. "19:00"; an end before the start crosses midnight`, "%v", err)
			ok = false
		}
		if ok && w.StartMin == w.EndMin {
			p.Addf(kv[1], field, "give different start and end times (an end before the start crosses midnight)", "the window is empty")
			ok = false
		}
		if rw.Timezone == "" {
			p.Addf(at("timezone"), field+".timezone", "name an IANA zone, e.g. Europe/Berlin or UTC", "required")
			ok = false
		} else if w.Loc, err = time.LoadLocation(rw.Timezone); err != nil {
			p.Addf(at("timezone"), field+".timezone", zoneFix(rw.Timezone), "unknown time zone %q", rw.Timezone)
			ok = false
		}
		if ok {
			pol.Windows[name] = w
		}
	}
}

func (p *parser) emergency(e *rawEmergency, pol *Policy) {
	pol.Emergency = Emergency{OverrideRole: "admin", MaxTTL: 5 * time.Minute, AuditAll: true}
	if e == nil {
		return
	}
	if e.OverridePermission != nil && p.role(p.at("emergency", "override_permission"), "emergency.override_permission", *e.OverridePermission) {
		if RoleLevel(*e.OverridePermission) < RoleLevel("operator") {
			p.Addf(p.at("emergency", "override_permission"), "emergency.override_permission", "use supervisor or admin", "an override must need a role")
		}
		pol.Emergency.OverrideRole = *e.OverridePermission
	}
	if e.OverrideTokenTTLSeconds != nil {
		s := *e.OverrideTokenTTLSeconds
		if s < 1 || s > 24*3600 {
			p.Addf(p.at("emergency", "override_token_ttl_seconds"), "emergency.override_token_ttl_seconds", "use 1 to 86400 seconds", "%d is out of range", s)
		}
		pol.Emergency.MaxTTL = time.Duration(s) * time.Second
	}
	if e.AuditAllOverrides != nil && !*e.AuditAllOverrides {
		p.Addf(p.at("emergency", "audit_all_overrides"), "emergency.audit_all_overrides", "remove the key or set it to true", "physd always audits overrides")
	}
}

func (p *parser) capabilities(n *yaml.Node, pol *Policy, m *manifest.Manifest) {
	// Every do_ tool gets a policy, from the manifest and defaults at least.
	for _, c := range m.Capabilities {
		if c.Kind != manifest.KindDo {
			continue
		}
		tp := &ToolPolicy{Tool: c.ToolName(), Cap: c, MinRole: c.RequiresPermission}
		if RoleLevel(pol.Defaults.RequirePermission) > RoleLevel(tp.MinRole) {
			tp.MinRole = pol.Defaults.RequirePermission
		}
		if c.RateLimit != nil {
			tp.Rates = append(tp.Rates, Rate{c.RateLimit.Count, c.RateLimit.Per, c.RateLimit.Source, "manifest"})
		}
		if r := pol.Defaults.RateLimit; r != nil {
			tp.Rates = append(tp.Rates, Rate{r.Count, r.Per, r.Source, "defaults"})
		}
		tp.Cooldown = time.Duration(c.CooldownMS) * time.Millisecond
		if c.RequiresQuorum {
			tp.Quorum = c.QuorumSize
		}
		if pc := pol.Defaults.MaxChangePercent; pc > 0 && c.Range != nil && numeric(c) {
			tp.MaxChange = &MaxChange{Max: pc / 100 * (c.Range.Max - c.Range.Min), Source: "defaults"}
		}
		pol.Tools[tp.Tool] = tp
	}
	if n != nil && n.Kind != yaml.MappingNode {
		p.Addf(n, "capabilities", "map each do_ tool name to {rules: [...]}", "expected a mapping")
		return
	}
	for _, kv := range strictyaml.Pairs(n) {
		tool, field := kv[0].Value, "capabilities."+kv[0].Value
		tp := pol.Tools[tool]
		if tp == nil {
			fix := "key rules by the full tool name of a do_ capability, e.g. do_" + firstDo(m)
			if c := m.Capability(manifest.CapabilityName(tool)); c != nil && c.Kind == manifest.KindRead {
				fix = "policy guards actuations only; " + tool + " is an observation"
			} else if c := m.Capability(tool); c != nil {
				fix = "use the tool name " + c.ToolName()
			}
			p.Addf(kv[0], field, fix, "unknown tool %q: the manifest has no such do_ capability", tool)
			continue
		}
		var rc rawCapability
		if !p.Decode(kv[1], field, &rc) {
			continue
		}
		for i := range rc.Rules {
			p.rule(&rc.Rules[i], fmt.Sprintf("%s.rules[%d]", field, i), tp, pol)
		}
	}
}

func firstDo(m *manifest.Manifest) string {
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindDo {
			return c.Name
		}
	}
	return "name"
}
