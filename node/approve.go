package node

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/promcp"
)

// The approval step of the do_ path: between the ledger lookup and the
// guard, under the key's turn, the call's approval (a grant it carries, a
// decision the authority holds for this person's call, or a round the MCP
// layer redeemed) is checked against the call and against the definition
// in force, and spent. The guard then judges who approved against the
// policy it decides under.

// ApprovalError is an approval the call carried that cannot be used
// (tampered, expired, issued for another call or caller, the caller's own):
// nothing was actuated.
type ApprovalError struct {
	Err error
	// Held: the grant was the decision the authority held for this call
	// (the caller sent none).
	Held bool
}

func (e *ApprovalError) Error() string {
	if e.Held {
		return "the approval given for this call cannot be used (" + ApprovalProblem(e.Err) + "); nothing was actuated. " +
			"Call again to ask for a new approval"
	}
	return "requestState: the approval grant cannot be used (" + ApprovalProblem(e.Err) + "); nothing was actuated. " +
		"Call again without requestState to ask for a new approval"
}

func (e *ApprovalError) Unwrap() error { return e.Err }

// ApprovalProblem says in words why an approval cannot be used.
func ApprovalProblem(err error) string {
	switch {
	case errors.Is(err, approval.ErrSelf):
		return "its approver is the caller: a second person must approve"
	case errors.Is(err, approval.ErrMismatch):
		return "it approves another call: tool, value, idempotency_key and the person who asked must be the approved ones"
	case errors.Is(err, approval.ErrElsewhere):
		return "it was issued by another gateway (or by this one before its state directory was replaced): an approval is redeemed where it was given"
	case errors.Is(err, approval.ErrTampered):
		return "it was altered or is not an approval of this gateway"
	case errors.Is(err, approval.ErrExpired):
		return "it expired"
	case errors.Is(err, approval.ErrReplayed):
		return "it was already used"
	case errors.Is(err, approval.ErrVoid):
		return "the capability's definition changed since it was approved"
	case err != nil:
		return err.Error()
	}
	return "unknown"
}

// approvalUse is what the approval step found.
type approvalUse struct {
	approved bool
	grant    bool // by another person
	by       Caller
	digest   string
}

// Party is c as the approval authority compares people.
func (c Caller) Party() approval.Party {
	return approval.Party{ID: c.ID, Role: c.Role, Credentials: c.Credentials}
}

// ApprovalDigest is the definition an approval of tool binds to now: its
// manifest entry with its binding, and the policy rules that apply to it
// ("" for an unknown tool).
func (n *Node) ApprovalDigest(tool string) string {
	cs, ok := n.bound().byTool[tool]
	if !ok {
		return ""
	}
	return n.approvalDigest(cs)
}

func (n *Node) approvalDigest(cs *capState) string {
	rules := ""
	if d, ok := n.guard.(RulesDigester); ok {
		rules = d.RulesDigest(cs.tool)
	}
	return approval.Digest(n.DeviceID(), cs.sum, rules)
}

// Approvals is the node's approval authority (nil without one).
func (n *Node) Approvals() *approval.Authority { return n.approval }

// redeemApproval is the approval step. A non-nil body is the call's
// answer (a denial or a void approval, audited); an error is an approval
// that cannot be used.
func (n *Node) redeemApproval(req DoRequest, cs *capState, value any, res promcp.DoResult) (approvalUse, []byte, error) {
	// The digest is computed only for a call that carries or may find an
	// approval: the plain do_ path pays nothing for it.
	if req.Approved {
		digest := n.approvalDigest(cs)
		if req.ApprovedFor != digest {
			body, err := n.voidAnswer(res, req.Caller, "", "the confirmation was given for a definition of "+cs.tool+" that is no longer in force")
			return approvalUse{}, body, err
		}
		return approvalUse{approved: true, by: req.Caller, digest: digest}, nil, nil
	}
	if n.approval == nil {
		if req.Grant != "" {
			return approvalUse{}, nil, &ApprovalError{Err: errors.New("this gateway gives no approvals (it runs without a policy)")}
		}
		return approvalUse{}, nil, nil
	}
	call := approval.Call{Tool: cs.tool, Value: value, Key: req.IdempotencyKey, Caller: req.Caller.Party(), HoldS: req.HoldS}
	token := req.Grant
	if token == "" {
		if !n.approval.Holds(cs.tool) {
			return approvalUse{}, nil, nil
		}
		d, ok := n.approval.Take(call)
		if !ok {
			return approvalUse{}, nil, nil
		}
		switch d.State {
		case approval.StateDenied:
			body, err := n.declined(res, req.Caller, "deny", d.DecidedBy, d.Why)
			return approvalUse{}, body, err
		case approval.StateVoid:
			body, err := n.voidAnswer(res, req.Caller, d.ID, d.Why)
			return approvalUse{}, body, err
		}
		token = d.Grant
	}
	call.Definition = n.approvalDigest(cs)
	g, err := n.approval.Redeem(token, call)
	switch {
	case err == nil:
		by := Caller{ID: g.Approver.ID, Role: g.Approver.Role, Credentials: g.Approver.Credentials}
		_, _ = n.appendAudit(func(uint64) (*audit.Record, error) {
			return &audit.Record{Event: "approval_redeemed", Tool: cs.tool, IdempotencyKey: req.IdempotencyKey, Caller: req.Caller.ID,
				Credentials: req.Caller.Credentials, Requested: value,
				Data: map[string]any{"approval_id": g.ID, "approved_by": g.Approver.ID, "approver_role": g.Approver.Role,
					"approver_credentials": g.Approver.Credentials, "definition": g.Definition,
					"grant_expires_at": time.Unix(g.ExpiresAt, 0).UTC().Format(time.RFC3339)}}, nil
		})
		return approvalUse{approved: true, grant: true, by: by, digest: g.Definition}, nil, nil
	case errors.Is(err, approval.ErrReplayed):
		// Used already, for this very call: run it unapproved, so a retry
		// gets the recorded answer (the ledger was asked first) or a new
		// approval request.
		return approvalUse{}, nil, nil
	case errors.Is(err, approval.ErrVoid):
		body, err := n.voidAnswer(res, req.Caller, g.ID, "the capability's definition (binding, range, unit or the policy rules that apply) changed after "+
			g.Approver.ID+" approved it")
		return approvalUse{}, body, err
	}
	_, _ = n.appendAudit(func(uint64) (*audit.Record, error) {
		return &audit.Record{Event: "approval_refused", Tool: cs.tool, IdempotencyKey: req.IdempotencyKey, Caller: req.Caller.ID,
			Credentials: req.Caller.Credentials, Requested: value, Reason: ApprovalProblem(err)}, nil
	})
	return approvalUse{}, nil, &ApprovalError{Err: err, Held: req.Grant == ""}
}

// voidAnswer answers a call whose approval is void: failed, code
// approval_void, audited as approval_void, nothing actuated, the key left
// free; the approval is spent.
func (n *Node) voidAnswer(res promcp.DoResult, caller Caller, id, why string) ([]byte, error) {
	res.Policy = promcp.PolicyNote{Configured: n.PolicyConfigured(), Decision: "approval_void"}
	details := "approval=void"
	if id != "" {
		details += "; approval_id=" + id
	}
	return n.refuseAs("approval_void", res, caller, refusal{perm: promcp.PermRequiresHumanApproval, code: "approval_void",
		reason: "the approval of this call is void: " + why + ". Nothing was actuated, and the approval is spent; call " + res.Capability +
			" again (a new idempotency_key is not needed) to ask for an approval of the capability as it is defined now",
		details: details})
}

// registerApproval books a call another person must approve.
func (n *Node) registerApproval(req DoRequest, cs *capState, value any, reason, approverRole string) (PendingApproval, error) {
	what := fmt.Sprintf("%s value=%s", cs.tool, promcp.FormatValue(value))
	if cs.cap.Unit != "" {
		what += " " + cs.cap.Unit
	}
	if req.HoldS != 0 {
		what += fmt.Sprintf(" held for %d s (hold_s)", req.HoldS) // the approver sees the lease asked for
	}
	what += " on " + n.DeviceID()
	if cs.cap.Description != "" {
		what += ": " + cs.cap.Description
	}
	p, err := n.approval.Register(approval.Ask{
		Call:   approval.Call{Tool: cs.tool, Value: value, Key: req.IdempotencyKey, Caller: req.Caller.Party(), Definition: n.approvalDigest(cs), HoldS: req.HoldS},
		Source: n.DeviceID(), Unit: cs.cap.Unit, What: what, Reason: reason, SideEffects: cs.cap.SideEffects, ApproverRole: approverRole,
	})
	if err != nil {
		return PendingApproval{}, err
	}
	exp := p.ExpiresAt.Format(time.RFC3339)
	return PendingApproval{ID: p.ID,
		Reason: fmt.Sprintf("A person with the %s role, other than the caller, must approve it: GET /approvals lists it, POST /approvals/%s with {\"decision\": \"approve\"} approves it. "+
			"Then call %s again with the same arguments and idempotency_key before %s to run it", p.Approver, p.ID, cs.tool, exp),
		Details: strings.Join([]string{"approval_id=" + p.ID, "approver_role=" + p.Approver, "expires_at=" + exp}, "; ")}, nil
}
