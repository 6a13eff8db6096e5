// Package safety is the do_ pipeline's steps 3 and 4 (DESIGN.md): it joins
// the physmcp.policy.yml rules (package policy) and the phocinae gate
// (package gate) into the node's Guard, keeps the rate and cooldown
// history, and holds the emergency override.
package safety

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/gate"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// Guard implements node.Guard.
type Guard struct {
	rules  atomic.Pointer[rules] // swapped whole on reload
	lim    *policy.Limiter
	quorum policy.QuorumFunc
	device string

	mu       sync.Mutex
	override *Override
}

// Override is an active emergency override.
type Override struct {
	By     string    `json:"by"`
	Reason string    `json:"reason"`
	Until  time.Time `json:"until"`
}

// Config builds a Guard.
type Config struct {
	Policy   *policy.Policy
	Gate     *gate.Gate
	State    policy.StateStore // rate and cooldown history (the bbolt store)
	Quorum   policy.QuorumFunc // nil: standalone (1 alive)
	DeviceID string
}

// New builds the guard.
func New(c Config) *Guard {
	q := c.Quorum
	if q == nil {
		q = policy.Standalone
	}
	g := &Guard{lim: policy.NewLimiter(c.State), quorum: q, device: c.DeviceID}
	g.rules.Store(&rules{c.Policy, c.Gate})
	return g
}

// rules is a policy and its gate, replaced together.
type rules struct {
	pol  *policy.Policy
	gate *gate.Gate
}

// Reload puts a new (validated) policy and gate in force for every call
// that starts after it returns. Rate and cooldown history is kept.
func (g *Guard) Reload(p *policy.Policy, gt *gate.Gate) { g.rules.Store(&rules{p, gt}) }

// Policy is the policy in force.
func (g *Guard) Policy() *policy.Policy { return g.rules.Load().pol }

// Gate is the phocinae gate in force.
func (g *Guard) Gate() *gate.Gate { return g.rules.Load().gate }

// StartOverride lifts time windows until now+ttl (bounded by the policy's
// override_token_ttl_seconds) for callers with the override role.
func (g *Guard) StartOverride(by, role, reason string, ttl time.Duration) (Override, error) {
	e := g.Policy().Emergency
	if policy.RoleLevel(role) < policy.RoleLevel(e.OverrideRole) {
		return Override{}, fmt.Errorf("an emergency override needs the %s role; the caller has %s", e.OverrideRole, role)
	}
	if strings.TrimSpace(reason) == "" {
		return Override{}, fmt.Errorf("an emergency override needs a reason")
	}
	if ttl <= 0 || ttl > e.MaxTTL {
		ttl = e.MaxTTL
	}
	o := Override{By: by, Reason: reason, Until: time.Now().Add(ttl).UTC()}
	g.mu.Lock()
	g.override = &o
	g.mu.Unlock()
	return o, nil
}

// EndOverride ends an active override.
func (g *Guard) EndOverride() {
	g.mu.Lock()
	g.override = nil
	g.mu.Unlock()
}

// ActiveOverride returns the override in force, if any.
func (g *Guard) ActiveOverride() *Override {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.override == nil || time.Now().After(g.override.Until) {
		g.override = nil
		return nil
	}
	o := *g.override
	return &o
}

// Evaluate runs the policy, then the gate. Only a real (not dry) allowed
// call is recorded against rate and cooldown limits.
func (g *Guard) Evaluate(ctx context.Context, a node.Action, dryRun bool) node.Verdict {
	rs := g.rules.Load()
	ov := g.ActiveOverride()
	out := rs.pol.Evaluate(ctx, policy.Check{Tool: a.Tool, Value: a.Value, Role: a.Caller.Role, Now: a.Now, Override: ov != nil}, g.lim, g.quorum)
	v := node.Verdict{Permission: out.Permission, Value: out.Value, Reason: out.Reason, Details: out.Details, ValidFor: out.ValidFor}
	v.Policy = promcp.PolicyNote{Configured: true, Decision: "allowed"}
	notes := append([]string(nil), out.Notes...)
	if ov != nil && len(out.Notes) > 0 {
		notes = append(notes, fmt.Sprintf("emergency override by %s until %s: %s", ov.By, ov.Until.Format(time.RFC3339), ov.Reason))
	}
	switch out.Permission {
	case promcp.PermAllowed, promcp.PermRequiresHumanApproval:
	default:
		v.Policy = promcp.PolicyNote{Configured: true, Decision: "denied", Note: "rule " + out.Rule}
		return v
	}
	if len(notes) > 0 {
		v.Policy.Note = strings.Join(notes, "; ")
		if strings.Contains(v.Policy.Note, "clamped") {
			v.Policy.Decision = "clamped"
		} else if strings.Contains(v.Policy.Note, "warning") {
			v.Policy.Decision = "warned"
		}
		v.Reason = v.Policy.Note
	}

	// The gate judges the value that would be written.
	req := gate.Request{Tool: a.Tool, Args: map[string]any{"value": v.Value}, DeviceID: g.device, Caller: a.Caller.ID}
	var gr gate.Result
	switch {
	case dryRun:
		gr = rs.gate.DryRun(req)
	case a.Approved:
		// A human confirmed: re-check L0 (a rule that became deny wins),
		// do not ask L1 again.
		gr = rs.gate.Confirmed(req)
	default:
		gr = rs.gate.Decide(ctx, req)
	}
	// The fingerprint binds approvals to the request as the caller sent it.
	_, fp := gate.Canonical(a.Tool, map[string]any{"value": a.Value})
	v.Gate = &promcp.GateNote{Decision: string(gr.Decision), Layer: string(gr.Layer), Reason: gr.Reason, Engine: gr.Engine, Fingerprint: fp}

	switch gr.Decision {
	case gate.Deny:
		v.Permission, v.Reason = promcp.PermPolicyDenied, "the phocinae gate denied it ("+string(gr.Layer)+"): "+gr.Reason
		v.Details = "gate=deny; layer=" + string(gr.Layer)
		if gr.Rule != "" {
			v.Details += "; rule=" + gr.Rule
		}
		v.Policy.Decision = "gate_denied"
		return v
	case gate.Ask:
		if !a.Approved {
			v.Permission = promcp.PermRequiresHumanApproval
			v.Reason = joinNonEmpty(v.Reason, "the phocinae gate asks for a human's confirmation ("+string(gr.Layer)+"): "+gr.Reason)
		}
	}
	if out.Permission == promcp.PermRequiresHumanApproval && a.Approved {
		v.Permission = promcp.PermAllowed
	}
	if v.Permission == promcp.PermRequiresHumanApproval && out.Permission == promcp.PermRequiresHumanApproval {
		v.Reason = joinNonEmpty(out.Reason, v.Reason)
	}
	if v.Permission == promcp.PermAllowed && !dryRun {
		// Counted now (a concurrent call sees it at once); made durable by
		// the node in the same commit as the ledger's pending entry, before
		// the device is touched.
		if key, b := g.lim.Note(rs.pol.Tools[a.Tool], a.Now); b != nil {
			v.Persist = append(v.Persist, store.KV{Bucket: policy.StateBucket, Key: key, Value: b})
		}
	}
	return v
}

func joinNonEmpty(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
