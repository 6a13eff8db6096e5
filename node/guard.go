package node

import (
	"context"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// Caller is who asked, as the transport established it.
type Caller struct {
	ID        string `json:"id"`        // token subject, "stdio", or "anonymous"
	Role      string `json:"role"`      // none | operator | supervisor | admin
	Transport string `json:"transport"` // http | stdio | mesh
	// Via names the gateway a routed call came through (the owner's
	// audit records it beside the caller the owner authenticated).
	Via string `json:"via,omitempty"`
	// Credentials are every credential the caller proved ("token:<id>",
	// "jwt:<issuer>/<subject>", "cert:<name>", "certfp:<sha256>", "stdio",
	// ...): who a person is, for the two-person rule, is decided on these,
	// never on ID.
	Credentials []string `json:"credentials,omitempty"`
	// Credential is the bearer token or JWT the caller presented, kept only
	// to forward to the owner of a routed call, which authenticates it
	// itself; never serialized, logged or audited.
	Credential string `json:"-"`
}

// Action is one actuation the guard decides on.
type Action struct {
	Capability     *manifest.Capability
	Tool           string
	Value          any // checked against data_type, not yet against policy
	IdempotencyKey string
	Caller         Caller
	Now            time.Time
	// Approved is set when a human confirmed this exact call through an
	// approval round (verified by the MCP layer): it can turn
	// requires_human_approval into allowed, never a refusal.
	Approved bool
	// ApprovedBy is who approved (the caller itself after an elicitation
	// round; another person through the approvals route). The guard
	// checks it against the approval rule's approver role and self rule.
	ApprovedBy Caller
	// ApprovedFor is the definition digest the approval was given for, and
	// CapabilitySum the capability's definition in force (its manifest
	// entry and binding): the guard re-derives the digest with the policy
	// it decides under, so a reload between the redemption and the
	// decision cannot carry an approval over to other rules.
	ApprovedFor   string
	CapabilitySum string
}

// RulesDigester is implemented by guards whose rules for a tool can
// change (a policy reload): RulesDigest identifies the rules that apply to
// tool now. An approval binds to it (approval.Digest).
type RulesDigester interface {
	RulesDigest(tool string) string
}

// ApproverRule is who may approve a call the guard holds for approval.
type ApproverRule struct {
	// Role is the least role of the approver ("" for anyone the MCP
	// client's human is).
	Role string
	// CallerMay: the caller itself may confirm (an elicitation round);
	// false means another identity must approve (a two-person rule).
	CallerMay bool
}

// Verdict is the guard's decision.
type Verdict struct {
	Permission promcp.Permission // allowed, or the refusal
	Value      any               // the value to write (a clamp may change it)
	Reason     string            // human reason for a refusal or a change
	Details    string            // machine-parseable "k=v; k=v"
	Policy     promcp.PolicyNote
	Gate       *promcp.GateNote
	// ValidFor bounds how long a can_do dry run of this verdict holds
	// (rate windows, cooldowns); zero leaves the proMCP band default.
	ValidFor time.Duration
	// Rate is the tightest rate rule's state, for can_do candidates.
	Rate *promcp.RateLimit
	// Slot is the rate and cooldown reservation of an allowed real call
	// (nil when no such rule applies, and on every other verdict).
	Slot Slot
	// Approver, on requires_human_approval, says who may approve (nil: the
	// caller's own confirmation, as for a gate ask).
	Approver *ApproverRule
	// MaxChange, when > 0, is the largest step from the device's current
	// value this actuation may make (the policy's max_change). The
	// actuator checks it against its previous-value read before writing;
	// when that read fails the call is refused, never let through.
	MaxChange float64
}

// Slot is a rate and cooldown reservation the guard took for one
// actuation, counted from the moment it was taken. The node Begins it in
// the ledger's pending commit (the history it returns is persisted there)
// or Releases it when the call ends without touching the device (the
// history it returns, if any, is persisted with the ledger's Forget).
type Slot interface {
	Begin(now time.Time) []store.KV
	Release() []store.KV
}

// RoleChecker is implemented by guards that can say, without deciding a
// call, whether a role may run a tool: a recorded answer is replayed only
// to such a caller.
type RoleChecker interface {
	RoleAllows(tool, role string) (reason, details string, allowed bool)
}

// RoleAllows asks the guard in force whether role may run tool — the one
// role rule (policy.Policy.MayRun through the guard) — for the replay of a
// recorded answer and for the tool lists each caller is shown. A guard
// without a role rule (or none) allows every role.
func (n *Node) RoleAllows(tool, role string) (reason, details string, allowed bool) {
	if rc, ok := n.guard.(RoleChecker); ok {
		return rc.RoleAllows(tool, role)
	}
	return "", "", true
}

// Guard is the decision phase of the do_ path: policy, then gate
// (docs/design.md "The actuation path").
// Evaluate with dryRun set must not consume anything (rate slots,
// cooldowns, approvals): can_do uses it to say what a do_ would meet, and
// it must say what the real call would decide. A real call that comes back
// allowed holds its rate slot in Verdict.Slot; any other verdict holds none.
type Guard interface {
	Evaluate(ctx context.Context, a Action, dryRun bool) Verdict
}

// NoPolicy allows what the manifest's data type and range allow (the node
// enforces those itself): the guard of a node built without one (tests,
// tools). physd run without a policy file uses safety's manifest-only
// guard, which also enforces the manifest's roles, rates, cooldowns and
// quorum.
type NoPolicy struct{}

// NoPolicyNote is the policy note of every do_ without a policy.
const NoPolicyNote = "no physmcp.policy.yml is configured: the manifest's own limits were enforced (data type, range, " +
	"requires_permission, rate_limit, cooldown_ms, requires_quorum); no phocinae gate ran and no approval, time-window or range-guard rules apply"

// Evaluate allows the action unchanged.
func (NoPolicy) Evaluate(_ context.Context, a Action, _ bool) Verdict {
	return Verdict{
		Permission: promcp.PermAllowed,
		Value:      a.Value,
		Policy:     promcp.PolicyNote{Configured: false, Decision: "not_evaluated", Note: NoPolicyNote},
	}
}
