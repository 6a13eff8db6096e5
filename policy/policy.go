// Package policy reads physmcp.policy.yml (PhysMCP v0.1 §6, with physd's
// cooldown and approval rules, bearer-token identities and the gate
// section) and evaluates an actuation against it, merged with what the
// manifest already says (range, rate_limit, requires_permission,
// cooldown_ms, requires_quorum): where both speak, the stricter wins.
//
// Evaluation order (docs/design.md): role → time window → range guard → rate →
// cooldown → quorum → approval. The first refusal ends it; every refusal
// carries a human reason and machine details ("k=v; k=v").
package policy

import (
	"crypto/rsa"
	"encoding/json"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
)

// Version is the physmcp_policy_version physd reads.
const Version = "0.1"

// Roles in ascending order of privilege. viewer (physd's addition to the
// PhysMCP enum) may read the operational routes (/status, /, /metrics) and
// call /mcp when credentials are required; it carries no right to actuate
// beyond what a do_ tool grants to none.
var Roles = []string{"none", "viewer", "operator", "supervisor", "admin"}

// RoleLevel is the rank of a role (-1 when unknown).
func RoleLevel(role string) int {
	for i, r := range Roles {
		if r == role {
			return i
		}
	}
	return -1
}

// Policy is a validated policy merged with its manifest.
type Policy struct {
	Path      string
	Defaults  Defaults
	Tools     map[string]*ToolPolicy // every do_ tool of the manifest
	Windows   map[string]*Window
	Identity  Identity
	Emergency Emergency
	// Gate is the raw gate: section; the safety layer decodes it into the
	// phocinae gate's configuration.
	Gate *yaml.Node
	// Interlocks are the interlocks: section's permissives, interlocks and
	// trips, in file order (policy/interlocks.go).
	Interlocks []*interlock.Rule
}

// Defaults is the defaults: section.
type Defaults struct {
	RequirePermission string
	RateLimit         *manifest.RateLimit
	AuditAll          bool
	// MaxChangePercent, when > 0, gives every float and int do_ tool with
	// a range a max_change of this share of its range's width.
	MaxChangePercent float64
}

// Emergency is the emergency: section: an admin may lift time windows for
// a bounded time; it never lifts range, role, rate or gate decisions.
type Emergency struct {
	OverrideRole string
	MaxTTL       time.Duration
	AuditAll     bool
}

// Identity maps HTTP credentials (bearer tokens, JWTs, client
// certificates) to roles.
type Identity struct {
	Tokens []Token
	JWT    []JWTProvider
	MTLS   []MTLSProvider
	// OAuth, when set, accepts OAuth 2.1 access tokens (identity.oauth).
	OAuth *OAuth
	// People joins credentials that are one person's (identity.people).
	People []Person
}

// Token is a static bearer token, stored only as its SHA-256.
type Token struct {
	ID     string
	SHA256 [32]byte
	Role   string
}

// JWTProvider accepts JWTs of one issuer and audience.
type JWTProvider struct {
	Issuer    string
	Audience  string
	RoleClaim string
	HS256Key  []byte
	RS256Key  *rsa.PublicKey
}

// ToolPolicy is everything that guards one do_ tool, manifest and policy
// merged.
type ToolPolicy struct {
	Tool string
	Cap  *manifest.Capability
	// MinRole is the least role allowed: the strictest of the manifest's
	// requires_permission, defaults.require_permission and permission rules.
	MinRole     string
	AllowDuring []*Window // when set, the time must be inside one of them
	DenyDuring  []*Window
	Range       *RangeGuard
	Rates       []Rate
	Cooldown    time.Duration
	Quorum      int // peers (self included) that must be alive and answer; 0 = none
	Approval    *Approval
	MaxChange   *MaxChange
}

// MaxChange is the max_change guard: the largest step from the device's
// current value (read by the actuator just before the write) one
// actuation may make. The node enforces it in the device step.
type MaxChange struct {
	Max    float64 `json:"max"`
	Source string  `json:"source"` // policy | defaults
}

// RangeGuard is a range_guard rule, already intersected with the
// manifest's physical range.
type RangeGuard struct {
	Min, Max    float64
	OnViolation string // clamp | deny | warn
}

// Rate is one limit on actuations; Source says where it came from.
type Rate struct {
	Count  int
	Per    time.Duration
	Text   string
	Source string // manifest | policy | defaults
}

// Approval is physd's approval rule: a human must confirm.
type Approval struct {
	When   string  // always | outside_window | above
	Window *Window // for outside_window
	Above  float64 // for above
	// ApproverRole, when set, is the least role of the person who approves
	// (a two-person rule when SelfApproval is false): the approval is given
	// through the approvals route by an identity other than the caller.
	ApproverRole string
	// SelfApproval lets the caller confirm its own call (the MCP
	// elicitation round) when it holds ApproverRole (any role without one).
	SelfApproval bool
}

// Approver says who may approve a call by caller: the least role, and
// whether the caller itself may (it needs the role too).
func (a *Approval) Approver(callerRole string) (role string, callerMay bool) {
	if a.ApproverRole == "" {
		return "", a.SelfApproval
	}
	return a.ApproverRole, a.SelfApproval && RoleLevel(callerRole) >= RoleLevel(a.ApproverRole)
}

// toolDoc is what physmcp://policy shows of one tool: what is enforced.
type toolDoc struct {
	MinRole     string      `json:"min_role"`
	AllowDuring []string    `json:"allow_during,omitempty"`
	DenyDuring  []string    `json:"deny_during,omitempty"`
	Range       *RangeGuard `json:"range_guard,omitempty"`
	Physical    any         `json:"physical_range,omitempty"`
	Rates       []rateDoc   `json:"rates,omitempty"`
	CooldownMS  int64       `json:"cooldown_ms,omitempty"`
	Quorum      int         `json:"quorum_size,omitempty"`
	Approval    any         `json:"approval,omitempty"`
	MaxChange   *MaxChange  `json:"max_change,omitempty"`
}

type rateDoc struct {
	Limit  string `json:"limit"`
	Source string `json:"source"`
}

func (tp *ToolPolicy) doc() toolDoc {
	t := toolDoc{MinRole: tp.MinRole, Range: tp.Range, CooldownMS: tp.Cooldown.Milliseconds(), Quorum: tp.Quorum, MaxChange: tp.MaxChange}
	if tp.Cap != nil && tp.Cap.Range != nil {
		t.Physical = tp.Cap.Range
	}
	for _, w := range tp.AllowDuring {
		t.AllowDuring = append(t.AllowDuring, w.String())
	}
	for _, w := range tp.DenyDuring {
		t.DenyDuring = append(t.DenyDuring, w.String())
	}
	for _, r := range tp.Rates {
		t.Rates = append(t.Rates, rateDoc{r.Text, r.Source})
	}
	if a := tp.Approval; a != nil {
		m := map[string]any{"when": a.When}
		if a.Window != nil {
			m["window"] = a.Window.String()
		}
		if a.When == "above" {
			m["above"] = a.Above
		}
		if a.ApproverRole != "" {
			m["approver_role"] = a.ApproverRole
		}
		m["self_approval"] = a.SelfApproval
		t.Approval = m
	}
	return t
}

// ToolRulesJSON renders the rules that apply to tool (as physmcp://policy
// shows them, windows spelled out), deterministically: an approval binds
// to it, so any change of a rule of the tool changes it. A tool without
// rules renders as null.
func (p *Policy) ToolRulesJSON(tool string) ([]byte, error) {
	tp := p.Tools[tool]
	if tp == nil {
		return []byte("null"), nil
	}
	return json.Marshal(tp.doc())
}

// MarshalJSON renders the effective policy for the physmcp://policy
// resource: what is enforced per tool, with windows spelled out.
func (p *Policy) MarshalJSON() ([]byte, error) {
	tools := map[string]toolDoc{}
	for name, tp := range p.Tools {
		tools[name] = tp.doc()
	}
	ids := []map[string]string{}
	for _, t := range p.Identity.Tokens {
		ids = append(ids, map[string]string{"type": "token", "id": t.ID, "role": t.Role})
	}
	for _, j := range p.Identity.JWT {
		ids = append(ids, map[string]string{"type": "jwt", "issuer": j.Issuer, "audience": j.Audience, "role_claim": j.RoleClaim})
	}
	for _, m := range p.Identity.MTLS {
		for _, c := range m.Clients {
			id := map[string]string{"type": "mtls", "role": c.Role}
			for k, v := range map[string]string{"cn": c.CN, "san": c.SAN, "ca_cert_path": m.CAPath} {
				if v != "" {
					id[k] = v
				}
			}
			ids = append(ids, id)
		}
	}
	if o := p.Identity.OAuth; o != nil {
		for _, as := range o.Servers {
			ids = append(ids, map[string]string{"type": "oauth", "issuer": as.Issuer, "resource": o.Resource, "scopes": strings.Join(o.ScopeNames(), " ")})
		}
	}
	for _, person := range p.Identity.People {
		ids = append(ids, map[string]string{"type": "person", "name": person.Name, "credentials": strings.Join(person.Credentials, " ")})
	}
	return json.Marshal(map[string]any{
		"physmcp_policy_version": Version,
		"path":                   p.Path,
		"order":                  []string{"role", "time_window", "range_guard", "rate", "cooldown", "quorum", "approval", "gate", "max_change (device step)"},
		"precedence":             "manifest and policy both apply; the stricter wins; the manifest range is a hard limit",
		"defaults": map[string]any{"require_permission": p.Defaults.RequirePermission, "audit_all": p.Defaults.AuditAll,
			"max_change_percent": p.Defaults.MaxChangePercent},
		"tools":    tools,
		"identity": ids,
		"emergency": map[string]any{"override_permission": p.Emergency.OverrideRole,
			"override_token_ttl_seconds": int(p.Emergency.MaxTTL.Seconds()), "lifts": []string{"time_window"},
			"never_lifts": []string{"role", "range", "rate", "cooldown", "quorum", "gate deny"}},
	})
}

// ManifestOnly is the policy physd enforces when no physmcp.policy.yml is
// given: the manifest's own limits of every do_ capability
// (requires_permission, rate_limit, cooldown_ms, requires_quorum), no time
// windows, range guards, approvals or identities. A manifest that says a
// heater may run at most 30 times an hour is obeyed with or without a
// policy file.
func ManifestOnly(m *manifest.Manifest) (*Policy, error) {
	return Parse("(manifest "+m.Path+")", []byte(`physmcp_policy_version: "`+Version+`"`), m)
}
