// Package safety is the do_ path's decision phase (docs/design.md): it joins
// the physmcp.policy.yml rules (package policy) and the phocinae gate
// (package gate) into the node's Guard, keeps the rate and cooldown
// history, and holds the emergency override.
package guard

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/interlock"
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
	g.rules.Store(newRules(c.Policy, c.Gate))
	return g
}

// rules is a policy and its gate, replaced together.
type rules struct {
	pol   *policy.Policy
	gate  *gate.Gate
	locks *interlock.Set // the policy's interlocks, indexed
}

func newRules(p *policy.Policy, gt *gate.Gate) *rules {
	return &rules{pol: p, gate: gt, locks: interlock.NewSet(p.Interlocks)}
}

// Reload puts a new (validated) policy and gate in force for every call
// that starts after it returns. Rate and cooldown history is kept.
func (g *Guard) Reload(p *policy.Policy, gt *gate.Gate) { g.rules.Store(newRules(p, gt)) }

// Interlocks are the policy's interlocks in force (node.InterlockSource):
// a reload swaps them with the rest of the policy.
func (g *Guard) Interlocks() *interlock.Set { return g.rules.Load().locks }

// RoleAllows implements node.RoleChecker with the policy in force.
func (g *Guard) RoleAllows(tool, role string) (reason, details string, allowed bool) {
	role, minRole, ok := g.rules.Load().pol.MayRun(tool, role)
	if ok {
		return "", "", true
	}
	return fmt.Sprintf("%s needs the %s role or higher; the caller has %s, and a recorded answer of this key is given only to a caller who may run the tool", tool, minRole, role),
		"required_role=" + minRole + "; caller_role=" + role, false
}

// PolicyConfigured reports whether a policy file stands behind the guard
// (false for the manifest-only guard, which has no gate).
func (g *Guard) PolicyConfigured() bool { return g.rules.Load().gate != nil }

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
		return Override{}, fmt.Errorf("ttl_s: an emergency override lasts 1 to %d seconds (emergency.override_token_ttl_seconds); got %d: send the time you need, at most the maximum",
			int64(e.MaxTTL/time.Second), int64(ttl/time.Second))
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

// Evaluate runs the policy, then the gate (docs/design.md "The actuation path").
// A real call leaves allowed with its rate and cooldown slot in
// Verdict.Slot, taken before the slow steps (quorum, L1); every other
// outcome has given the slot back. A dry run records nothing.
func (g *Guard) Evaluate(ctx context.Context, a node.Action, dryRun bool) node.Verdict {
	rs := g.rules.Load()
	ov := g.ActiveOverride()
	out := rs.pol.Evaluate(ctx, policy.Check{Tool: a.Tool, Value: a.Value, Role: a.Caller.Role, Transport: a.Caller.Transport, Now: a.Now,
		Override: ov != nil, Reserve: !dryRun}, g.lim, g.quorum)
	v := node.Verdict{Permission: out.Permission, Value: out.Value, Reason: out.Reason, Details: out.Details,
		ValidFor: out.ValidFor, Rate: rateLimit(out.Rate)}
	if out.MaxChange != nil {
		v.MaxChange = out.MaxChange.Max
	}
	if out.Slot != nil {
		v.Slot = slot{out.Slot}
	}
	defer func() {
		if v.Permission != promcp.PermAllowed && v.Slot != nil {
			v.Slot.Release() // never begun: nothing to persist
			v.Slot = nil
		}
	}()
	switch out.Permission {
	case promcp.PermAllowed, promcp.PermRequiresHumanApproval:
	default:
		v.Policy = promcp.PolicyNote{Configured: true, Decision: "denied", Note: "rule " + out.Rule}
		if rs.gate == nil {
			v.Policy = promcp.PolicyNote{Configured: false, Decision: "denied", Note: "manifest rule " + out.Rule + "; " + node.NoPolicyNote}
		}
		return v
	}
	v.Policy, v.Reason = policyNote(out, ov)
	if rs.gate == nil {
		// No policy file (ManifestOnly): the manifest's limits held, and
		// there is no gate to ask. The manifest alone has no approval rules.
		v.Policy.Configured, v.Policy.Note = false, node.NoPolicyNote
		v.Permission = promcp.PermAllowed
		return v
	}
	approved := a.Approved && a.ApprovedFor == approval.Digest(g.device, a.CapabilitySum, rs.rulesDigest(a.Tool)) &&
		approvalSatisfies(out.Approval, a, &rs.pol.Identity)

	// The gate judges the value as the caller requested it: a clamp applies
	// only after the gate allowed, so an L0 rule for a dangerous value sees
	// the dangerous value.
	req := gate.Request{Tool: a.Tool, Args: map[string]any{"value": a.Value}, DeviceID: g.device, Caller: a.Caller.ID, Key: a.IdempotencyKey}
	var gr gate.Result
	switch {
	case dryRun:
		gr = rs.gate.DryRun(ctx, req)
	case approved:
		// A human confirmed: re-check L0 (a rule that became deny wins),
		// do not ask L1 again.
		gr = rs.gate.Confirmed(req)
		if by := a.ApprovedBy; by.ID != "" && !samePerson(by, a.Caller, &rs.pol.Identity) && gr.Decision == gate.Allow {
			gr.Reason = "approved by " + by.ID + " (" + by.Role + ", not the caller; grant verified, L0 re-checked)"
		}
	default:
		gr = rs.gate.Decide(ctx, req)
	}
	// The fingerprint binds approvals to the request as the caller sent it.
	_, fp := gate.Canonical(a.Tool, map[string]any{"value": a.Value})
	v.Gate = &promcp.GateNote{Decision: string(gr.Decision), Layer: string(gr.Layer), Reason: gr.Reason, Engine: gr.Engine, Fingerprint: fp}

	var asks []string
	switch gr.Decision {
	case gate.Deny:
		v.Permission, v.Reason = promcp.PermPolicyDenied, "the phocinae gate denied it ("+string(gr.Layer)+"): "+gr.Reason
		v.Details = joinDetails(v.Details, "gate=deny; layer="+string(gr.Layer))
		if gr.Rule != "" {
			v.Details += "; rule=" + gr.Rule
		}
		v.Policy.Decision = "gate_denied"
		return v
	case gate.Ask:
		asks = append(asks, "the phocinae gate asks for a human's confirmation ("+string(gr.Layer)+"): "+gr.Reason)
	}
	if out.Permission == promcp.PermRequiresHumanApproval {
		asks = append([]string{out.Reason}, asks...)
	}
	switch {
	case len(asks) > 0 && !approved:
		v.Permission = promcp.PermRequiresHumanApproval
		v.Reason = strings.Join(asks, "; ")
		v.Policy.Decision = "approval_required"
		if r := out.Approval; r != nil && r.ApproverRole != "" {
			role, callerMay := r.Approver(a.Caller.Role)
			v.Approver = &node.ApproverRule{Role: role, CallerMay: callerMay}
		}
	default:
		v.Permission = promcp.PermAllowed
	}
	return v
}

// approvalSatisfies reports whether who approved meets the approval rule
// that asked: the approver's role, and another person than the caller
// unless the rule lets the caller approve itself. A rule without an
// approver role (and a gate ask) takes the caller's own confirmation.
func approvalSatisfies(rule *policy.Approval, a node.Action, id *policy.Identity) bool {
	if rule == nil || rule.ApproverRole == "" {
		return true
	}
	by := a.ApprovedBy
	role := by.Role
	// The approver's role under the policy in force, not the one the
	// grant recorded: a reload that demoted or removed the approver (any
	// of the credentials it approved with) ends what it approved.
	if now, known := id.CurrentRoleOf(by.Party().Creds()); known {
		role = now
	}
	if by.ID == "" || policy.RoleLevel(role) < policy.RoleLevel(rule.ApproverRole) {
		return false
	}
	return rule.SelfApproval || !samePerson(by, a.Caller, id)
}

// samePerson compares two callers as people: a shared credential, or one
// person of identity.people. Never their formatted names.
func samePerson(x, y node.Caller, id *policy.Identity) bool {
	return id.SamePerson(x.Party().Creds(), y.Party().Creds())
}

// RulesDigest implements node.RulesDigester: the policy rules that apply
// to tool now, as physmcp://policy shows them.
func (g *Guard) RulesDigest(tool string) string { return g.rules.Load().rulesDigest(tool) }

func (rs *rules) rulesDigest(tool string) string {
	b, err := rs.pol.ToolRulesJSON(tool)
	if err != nil {
		return "unrenderable:" + err.Error() // never equal to a rendered one
	}
	return string(b)
}

// SamePerson reports, under the policy in force, whether two credential
// sets are one person (the approval authority's people rule).
func (g *Guard) SamePerson(a, b []string) bool { return g.Policy().Identity.SamePerson(a, b) }

// policyNote is the policy's decision on a call it let through, with the
// notes of every guard that spoke (clamp, warning, override).
func policyNote(out policy.Outcome, ov *Override) (promcp.PolicyNote, string) {
	note := promcp.PolicyNote{Configured: true, Decision: "allowed"}
	notes := append([]string(nil), out.Notes...)
	if ov != nil && len(out.Notes) > 0 {
		notes = append(notes, fmt.Sprintf("emergency override by %s until %s: %s", ov.By, ov.Until.Format(time.RFC3339), ov.Reason))
	}
	if len(notes) == 0 {
		return note, ""
	}
	note.Note = strings.Join(notes, "; ")
	if strings.Contains(note.Note, "clamped") {
		note.Decision = "clamped"
	} else if strings.Contains(note.Note, "warning") {
		note.Decision = "warned"
	}
	return note, note.Note
}

// slot adapts a policy reservation to the node's Slot: the history to
// persist travels as store writes in the ledger's own commit.
type slot struct{ r *policy.Reservation }

func (s slot) Begin(now time.Time) []store.KV { return kv(s.r.Begin(now)) }
func (s slot) Release() []store.KV            { return kv(s.r.Release()) }

func kv(key string, value []byte) []store.KV {
	if value == nil {
		return nil
	}
	return []store.KV{{Bucket: policy.StateBucket, Key: key, Value: value}}
}

func rateLimit(r *policy.RateState) *promcp.RateLimit {
	if r == nil {
		return nil
	}
	return &promcp.RateLimit{Max: r.Max, CurrentWindowRemaining: r.Remaining}
}

func joinDetails(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
