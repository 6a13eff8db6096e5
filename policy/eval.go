package policy

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Check is one actuation to judge.
type Check struct {
	Tool  string
	Value any // float64, int64, bool or string (already type-checked)
	Role  string
	// Transport is how the caller reached physd (http, https, stdio,
	// mesh; "" when unknown): a refusal's remedy depends on it, since
	// stdio has no token and a routed call's role is proven on its owner.
	Transport string
	Now       time.Time
	Override  bool // an emergency override is active: time windows are lifted
	// Reserve takes the rate and cooldown slot (a real call); without it
	// Evaluate records nothing (the can_do dry run).
	Reserve bool
}

// Outcome is the policy's verdict on a Check.
type Outcome struct {
	Permission promcp.Permission // allowed, requires_human_approval or a refusal
	Value      any               // possibly clamped
	Reason     string
	Details    string
	Notes      []string      // warnings and changes on an allowed call
	Rule       string        // which rule decided (role, time_window, …)
	ValidFor   time.Duration // how long a dry-run answer holds
	// Slot is the rate and cooldown reservation of a real call that was not
	// refused (nil when the tool has no such rule). The caller Begins it
	// with the actuation or Releases it.
	Slot *Reservation
	// Rate is the tightest rate rule's state (nil without rate rules).
	Rate *RateState
	// MaxChange is the tool's max_change guard (nil: none). It needs the
	// device's current value, so the actuator enforces it after its
	// previous-value read, just before the write.
	MaxChange *MaxChange
	// Approval is the approval rule when it asked (nil otherwise): who may
	// approve.
	Approval *Approval
}

// QuorumFunc asks the mesh how many peers (self included) are alive and
// answer within a short deadline; a standalone node answers 1.
type QuorumFunc func(ctx context.Context, need int) (alive int)

// Standalone is the QuorumFunc of a node without a mesh.
func Standalone(context.Context, int) int { return 1 }

// Evaluate judges c in the documented order (role → window → range →
// rate → cooldown → quorum → approval). With c.Reserve set, an allowed
// call (or one that needs approval) leaves with the rate and cooldown slot
// taken in Outcome.Slot — checked and recorded in one step before the slow
// quorum step — and any refusal after the slot was taken gives it back.
// Without c.Reserve nothing is recorded: the can_do dry run.
func (p *Policy) Evaluate(ctx context.Context, c Check, lim *Limiter, quorum QuorumFunc) Outcome {
	tp := p.Tools[c.Tool]
	out := Outcome{Permission: promcp.PermAllowed, Value: c.Value}
	if tp == nil {
		return Outcome{Permission: promcp.PermPolicyDenied, Rule: "unknown_tool", Reason: c.Tool + " has no policy"}
	}
	// 1. role
	if d, denied := p.checkRole(c); denied {
		return d
	}
	// 2. time windows (an emergency override lifts them, and only them)
	if d, denied := checkWindows(c, tp, &out); denied {
		return d
	}
	// 3. range guard
	if d, denied := applyRange(c, tp, &out); denied {
		return d
	}
	// 4. rate, 5. cooldown: checked (and, for a real call, recorded) in one step.
	var lc limitCheck
	if c.Reserve {
		lc, out.Slot = lim.reserve(tp, c.Now)
	} else {
		lc = lim.probe(tp, c.Now)
	}
	out.Rate = lc.rate
	if lc.denied != nil {
		d := *lc.denied
		d.Value, d.Rate = c.Value, lc.rate
		return d
	}
	validFor := lc.validFor
	// 6. quorum: fresh answers from peers, decided within the mesh's deadline.
	if tp.Quorum > 1 {
		if quorum == nil {
			quorum = Standalone
		}
		if alive := quorum(ctx, tp.Quorum); alive < tp.Quorum {
			out.Slot.Release()
			return Outcome{Permission: promcp.PermPartitionNoQuorum, Value: c.Value, Rule: "quorum", Rate: lc.rate,
				Reason:  fmt.Sprintf("%s needs %d live peers (self included); %d answered", c.Tool, tp.Quorum, alive),
				Details: fmt.Sprintf("alive=%d; required=%d", alive, tp.Quorum)}
		}
		validFor = time.Second
	}
	// 7. approval
	askApproval(c, tp, &out)
	out.ValidFor = validFor
	out.MaxChange = tp.MaxChange
	return out
}

// refusal is the Outcome of a refusal of c by rule.
func refusal(c Check, perm promcp.Permission, rule, reason, details string) Outcome {
	return Outcome{Permission: perm, Value: c.Value, Rule: rule, Reason: reason, Details: details}
}

// MayRun is the one role rule, which every place that asks it shares (the
// decision here, the guard's replay check, the tool lists each caller is
// shown): a caller whose role (none when empty) is at least the tool's
// least role may run it; a tool without a policy entry is not limited by
// role. It returns the caller's role as judged and the least role.
func (p *Policy) MayRun(tool, role string) (callerRole, minRole string, ok bool) {
	if role == "" {
		role = "none"
	}
	tp := p.Tools[tool]
	if tp == nil {
		return role, "", true
	}
	return role, tp.MinRole, RoleLevel(role) >= RoleLevel(tp.MinRole)
}

// checkRole refuses a caller below the tool's least role.
func (p *Policy) checkRole(c Check) (Outcome, bool) {
	role, minRole, ok := p.MayRun(c.Tool, c.Role)
	if ok {
		return Outcome{}, false
	}
	return refusal(c, promcp.PermPermissionInsufficient, "role",
		fmt.Sprintf("%s needs the %s role or higher; the caller has %s. Ask an operator, or %s", c.Tool, minRole, role, RoleRemedy(c.Transport, minRole)),
		"required_role="+minRole+"; caller_role="+role), true
}

// RoleRemedy is how a caller on transport gets minRole: the credential
// that transport can carry.
func RoleRemedy(transport, minRole string) string {
	switch transport {
	case "stdio":
		return "have the MCP client start physd with --stdio-role " + minRole +
			" (over stdio the role is the one physd run --stdio is started with, no credential is sent; physd client-config --stdio-role " + minRole + " prints the entry)"
	case "http":
		return "call with a bearer token or JWT that the policy's identity maps to " + minRole + " (Authorization: Bearer …)"
	case "https":
		return "call with a bearer token, JWT or client certificate that the policy's identity maps to " + minRole
	case "mesh":
		return "call through your gateway with a bearer token or JWT that the policy of the gateway owning the tool maps to " + minRole +
			" (your gateway forwards the token with the routed call and the owner checks it itself; a client certificate or --stdio-role on your gateway does not travel)"
	}
	return "call with a credential that carries the role (over HTTP a token, JWT or client certificate the policy maps to it; over stdio physd's --stdio-role)"
}

// checkWindows refuses a call inside a deny_during window or outside every
// allow_during window, unless an emergency override lifts them (noted in
// out).
func checkWindows(c Check, tp *ToolPolicy, out *Outcome) (Outcome, bool) {
	if c.Override && (len(tp.DenyDuring) > 0 || len(tp.AllowDuring) > 0) {
		out.Notes = append(out.Notes, "time windows lifted by an emergency override")
		return Outcome{}, false
	}
	for _, w := range tp.DenyDuring {
		if w.Contains(c.Now) {
			end := w.End(c.Now)
			return refusal(c, promcp.PermPolicyDenied, "time_window",
				fmt.Sprintf("%s is not allowed during %s; it is allowed again at %s", c.Tool, w, end.Format(time.RFC3339)),
				"window="+w.Name+"; window_resets_at="+end.UTC().Format(time.RFC3339)+"; retry_after_ms="+ms(end.Sub(c.Now))), true
		}
	}
	if len(tp.AllowDuring) == 0 {
		return Outcome{}, false
	}
	var next time.Time
	var names []string
	for _, w := range tp.AllowDuring {
		names = append(names, w.String())
		if w.Contains(c.Now) {
			return Outcome{}, false
		}
		if s := w.NextStart(c.Now); !s.IsZero() && (next.IsZero() || s.Before(next)) {
			next = s
		}
	}
	return refusal(c, promcp.PermPolicyDenied, "time_window",
		fmt.Sprintf("%s is allowed only during %s; the next window opens at %s", c.Tool, strings.Join(names, " or "), next.Format(time.RFC3339)),
		"window_resets_at="+next.UTC().Format(time.RFC3339)+"; retry_after_ms="+ms(next.Sub(c.Now))), true
}

// applyRange applies the range guard to a value outside it: a refusal, a
// clamp (out.Value) or a warning.
func applyRange(c Check, tp *ToolPolicy, out *Outcome) (Outcome, bool) {
	g := tp.Range
	if g == nil {
		return Outcome{}, false
	}
	v, ok := manifest.Number(c.Value)
	if !ok || v >= g.Min && v <= g.Max {
		return Outcome{}, false
	}
	bounds := fmt.Sprintf("min=%g; max=%g; requested=%s", g.Min, g.Max, promcp.FormatValue(c.Value))
	switch g.OnViolation {
	case "deny":
		return refusal(c, promcp.PermOutOfRange, "range_guard",
			fmt.Sprintf("%s is outside the allowed range [%g, %g] %s; nothing was actuated", promcp.FormatValue(c.Value), g.Min, g.Max, tp.Cap.Unit), bounds), true
	case "clamp":
		cv := math.Min(math.Max(v, g.Min), g.Max)
		if _, isInt := c.Value.(int64); isInt {
			// Clamp inward to a whole number inside the guard.
			cv = math.Min(math.Max(math.Ceil(g.Min), math.Round(cv)), math.Floor(g.Max))
			out.Value = int64(cv)
		} else {
			out.Value = cv
		}
		out.Notes = append(out.Notes, fmt.Sprintf("clamped %s to %s (range_guard [%g, %g])", promcp.FormatValue(c.Value), promcp.FormatValue(out.Value), g.Min, g.Max))
		out.Details = "clamped_to=" + promcp.FormatValue(out.Value) + "; " + bounds
	case "warn":
		out.Notes = append(out.Notes, fmt.Sprintf("warning: %s is outside the advised range [%g, %g]", promcp.FormatValue(c.Value), g.Min, g.Max))
		out.Details = "warn=outside_range; " + bounds
	}
	return Outcome{}, false
}

// askApproval turns out into requires_human_approval when the tool's
// approval rule asks for this call.
func askApproval(c Check, tp *ToolPolicy, out *Outcome) {
	a := tp.Approval
	if a == nil {
		return
	}
	need, why := false, ""
	switch a.When {
	case "always":
		need, why = true, "this actuation always needs a human's approval"
	case "outside_window":
		if !a.Window.Contains(c.Now) {
			need, why = true, "outside "+a.Window.String()+" a human must approve this actuation"
		}
	case "above":
		// The value as requested: a clamp must not hide a dangerous
		// request from the person who approves.
		if v, ok := manifest.Number(c.Value); ok && v > a.Above {
			need, why = true, fmt.Sprintf("values above %g %s need a human's approval", a.Above, tp.Cap.Unit)
		}
	}
	if !need {
		return
	}
	out.Permission, out.Rule, out.Reason, out.Approval = promcp.PermRequiresHumanApproval, "approval", why, a
	if a.ApproverRole != "" {
		out.Reason += " (a " + a.ApproverRole + " or above"
		if !a.SelfApproval {
			out.Reason += " other than the caller"
		}
		out.Reason += ")"
	}
}

func ms(d time.Duration) string { return fmt.Sprint(max(d.Milliseconds(), 0)) }
