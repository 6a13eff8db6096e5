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
	// Persist is state the guard needs durable once the actuation goes
	// ahead (rate and cooldown history); the node commits it with the
	// ledger's pending entry.
	Persist []store.KV
}

// Guard is DESIGN steps 3 (policy) and 4 (gate). Evaluate with dryRun set
// must not consume anything (rate tokens, cooldowns, approvals): can_do
// uses it to say what a do_ would meet.
type Guard interface {
	Evaluate(ctx context.Context, a Action, dryRun bool) Verdict
}

// NoPolicy is the guard when no physmcp.policy.yml is configured. It allows
// what the manifest allows; the node itself enforces the manifest's range.
// Its note tells every caller, honestly, what is not enforced.
type NoPolicy struct{}

// NoPolicyNote is the policy note of every do_ without a policy.
const NoPolicyNote = "no physmcp.policy.yml is configured: only the manifest's data type and range were enforced; " +
	"its rate_limit, requires_permission, cooldown_ms and requires_quorum are not enforced and no approval gate ran"

// Evaluate allows the action unchanged.
func (NoPolicy) Evaluate(_ context.Context, a Action, _ bool) Verdict {
	return Verdict{
		Permission: promcp.PermAllowed,
		Value:      a.Value,
		Policy:     promcp.PolicyNote{Configured: false, Decision: "not_evaluated", Note: NoPolicyNote},
	}
}
