package mcpserver

import (
	"context"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// approvalKey names the one input request of an approval round.
const approvalKey = "approval"

// canElicit reports whether this call's client can be asked to confirm:
// a 2026-07-28 client that declared elicitation (MRTR), or a legacy client
// with elicitation on a connection that carries server requests (stdio;
// the SDK turns the input request into elicitation/create). Legacy clients
// over stateless HTTP cannot be asked.
func canElicit(req *mcp.CallToolRequest) bool {
	caps := req.ClientCapabilities()
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	if req.ProtocolVersion() >= "2026-07-28" {
		return true
	}
	return req.Extra == nil || req.Extra.Header == nil
}

// approvalRound returns an input-required result that asks the client's
// human to confirm exactly this call.
func (ts *toolSet) approvalRound(ar *node.ApprovalRequired, caller node.Caller, note string) (*mcp.CallToolResult, error) {
	token, exp, err := ts.approvals().IssueRound(approval.Call{Tool: ar.Tool, Value: ar.Value, Caller: caller.Party(), Definition: ts.n.ApprovalDigest(ar.Tool), HoldS: ar.HoldS}, layerOf(ar))
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	if note != "" {
		b.WriteString(note + "\n\n")
	}
	fmt.Fprintf(&b, "physd asks you to confirm an actuation on real equipment.\n\n")
	fmt.Fprintf(&b, "Tool: %s\nSource: %s\nValue: %s", ar.Tool, ts.n.DeviceID(), promcp.FormatValue(ar.Value))
	if c := ts.n.Manifest().Capability(strings.TrimPrefix(ar.Tool, "do_")); c != nil {
		if c.Unit != "" {
			b.WriteString(" " + c.Unit)
		}
		fmt.Fprintf(&b, "\nWhat it does: %s", c.Description)
	}
	if len(ar.SideEffects) > 0 {
		fmt.Fprintf(&b, "\nSide effects: %s", strings.Join(ar.SideEffects, ", "))
	}
	fmt.Fprintf(&b, "\nWhy approval is needed: %s", ar.Reason)
	fmt.Fprintf(&b, "\nThis request expires at %s. Set confirm to true to run it; decline to leave the equipment as it is.", exp.Format("15:04:05 MST"))
	return &mcp.CallToolResult{
		InputRequests: mcp.InputRequestMap{approvalKey: &mcp.ElicitParams{
			Mode:    "form",
			Message: b.String(),
			RequestedSchema: map[string]any{
				"type": "object",
				"properties": map[string]any{
					"confirm": map[string]any{"type": "boolean", "title": "Run " + ar.Tool + " with value " + promcp.FormatValue(ar.Value) + "?", "default": false},
				},
				"required": []any{"confirm"},
			},
		}},
		RequestState: token,
	}, nil
}

func layerOf(ar *node.ApprovalRequired) string {
	if ar.Gate != nil && ar.Gate.Decision == "ask" {
		return ar.Gate.Layer
	}
	return "policy"
}

// approvalAnswer is what the client's human said in round 2.
func approvalAnswer(req *mcp.CallToolRequest) (action string, ok bool) {
	r, found := req.Params.InputResponses[approvalKey]
	if !found {
		return "", false
	}
	er, isElicit := r.(*mcp.ElicitResult)
	if !isElicit {
		return "", false
	}
	switch er.Action {
	case "accept":
		if c, _ := er.Content["confirm"].(bool); c {
			return "accept", true
		}
		return "decline", true // accepted the form but did not confirm
	case "decline", "cancel":
		return er.Action, true
	}
	return "", false
}

// handleApprovalRetry handles round 2 of an approval: a verified, confirmed
// approval runs the call as approved; a decline or cancel refuses it; any
// state that does not verify (tampered, expired, replayed, for another
// call, or for a definition no longer in force) starts a fresh round and
// never executes.
func (ts *toolSet) handleApprovalRetry(ctx context.Context, req *mcp.CallToolRequest, dr node.DoRequest) (*mcp.CallToolResult, error) {
	action, answered := approvalAnswer(req)
	value, err := ts.n.DecodeValueFor(dr.Tool, dr.Value)
	if err != nil {
		return toolError(err), nil
	}
	def := ts.n.ApprovalDigest(dr.Tool)
	_, verr := ts.approvals().RedeemRound(req.Params.RequestState, approval.Call{Tool: dr.Tool, Value: value, Caller: dr.Caller.Party(), Definition: def, HoldS: dr.HoldS})
	if verr != nil || !answered {
		// A round confirmed for a definition no longer in force is spent
		// (ErrVoid) and, like any state that does not verify, starts a
		// fresh round that shows the definition in force.
		// Start over: run the pipeline again, which asks again.
		note := "The previous approval could not be used (" + approvalProblem(verr, answered) + "); please confirm again."
		return ts.runDo(ctx, req, dr, note)
	}
	if action != "accept" {
		body, err := ts.n.Declined(dr, action)
		if err != nil {
			return toolError(err), nil
		}
		return jsonResult(body), nil
	}
	dr.Approved, dr.ApprovedFor = true, def
	return ts.runDo(ctx, req, dr, "")
}

func approvalProblem(err error, answered bool) string {
	switch {
	case err != nil:
		return node.ApprovalProblem(err)
	case !answered:
		return "no answer to the approval request was sent"
	}
	return "unknown"
}

// voidRedefined voids the approvals, pending or given, whose definition a
// reload changed (the capability's manifest entry, its binding, or the
// policy rules that apply to it): an approver can no longer approve them,
// and the caller's repeated call is answered that the approval is void.
func (ts *toolSet) voidRedefined() []*audit.Record {
	a := ts.n.Approvals()
	if a == nil {
		return nil
	}
	var recs []*audit.Record
	for _, v := range a.VoidChanged(ts.n.ApprovalDigest) {
		recs = append(recs, &audit.Record{Event: "approval_void", Tool: v.Tool, IdempotencyKey: v.Key, Caller: v.Caller,
			Credentials: v.CallerCredentials, Requested: v.Value, Reason: v.Why, Data: map[string]any{"approval_id": v.ID, "definition": v.Definition}})
	}
	return recs
}
