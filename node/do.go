package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// DoRequest is one do_ call.
type DoRequest struct {
	Tool           string          // do_<cap>
	Value          json.RawMessage // decoded per the capability's data_type
	IdempotencyKey string
	Caller         Caller
	// Grant is a two-person grant the caller sent (MCP requestState, or a
	// routed call's): redeemed against this call and the definition in
	// force. Without one, a decision the approval authority holds for this
	// person's call is used.
	Grant string
	// Approved: the caller's own human confirmed this call in an approval
	// round (the MCP layer redeemed the round's state), and ApprovedFor is
	// the definition digest the round showed: the call runs only while
	// that definition is in force.
	Approved    bool
	ApprovedFor string
	// HoldS is the lease the call asks for, in seconds (0: the
	// capability's lease.default_s); only for capabilities with a lease.
	HoldS int
}

// PendingApproval is a registered two-person request.
type PendingApproval struct {
	ID      string
	Reason  string // for the caller: who approves, where, and what to do then
	Details string // machine: approval_id=…; approver_role=…; expires_at=…
}

// ApprovalRequired is returned by Do when the call needs a human's
// approval. Nothing was actuated and no rate slot is held. The MCP layer
// either runs an approval round with the client (elicitation) or, for a
// client that cannot elicit, returns Body: the proMCP refusal with
// permission requires_human_approval.
type ApprovalRequired struct {
	Body        []byte
	Tool        string
	Value       any
	Reason      string
	SideEffects []string
	Gate        *promcp.GateNote
	// Approver is who may approve (nil: the caller may confirm).
	Approver *ApproverRule
	// Pending is set when another person must approve and the request was
	// registered: Body says so; no elicitation round is started.
	Pending *PendingApproval
	// HoldS is the call's hold_s (0: none), bound into the round's
	// fingerprint like the value.
	HoldS int
}

func (e *ApprovalRequired) Error() string { return "human approval required: " + e.Reason }

// ErrShuttingDown refuses new actuations once shutdown has begun.
var ErrShuttingDown = errors.New("physd is shutting down: no new actuations are accepted")

// MaxKeyLen bounds idempotency keys (a UUID is 36).
const MaxKeyLen = 128

// Do runs the do_ path (docs/design.md "The actuation path"): argument check →
// idempotency ledger → node checks → policy and gate (which reserve the
// rate slot) → the capability's actuator (begin → device → commit, or
// release). It returns the exact JSON of the proMCP do_ answer, which a
// replay of the same key returns byte for byte. An error is bad input or an
// internal fault, and nothing was actuated.
func (n *Node) Do(ctx context.Context, req DoRequest) ([]byte, error) {
	if n.closingNow() {
		return nil, ErrShuttingDown
	}
	cs, value, err := n.doArgs(req)
	if err != nil {
		return nil, err
	}
	hold, err := holdOf(cs.cap, cs.tool, req.HoldS)
	if err != nil {
		return nil, err
	}
	release, err := n.acquireKey(ctx, req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	defer release()
	hash := argsHash(cs.tool, value)
	if req.HoldS != 0 {
		// The hold is an argument: a retry of the key with another hold is
		// a different call.
		hash = argsHash(cs.tool, fmt.Sprintf("%s\x00hold_s=%d", promcp.FormatValue(value), req.HoldS))
	}
	if e, err := n.store.Lookup(req.IdempotencyKey); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	} else if e != nil {
		// A recorded answer goes only to a caller whose role may run the
		// tool: a viewer who learns an operator's key gets no answer that
		// reads as if it had actuated.
		if reason, details, allowed := n.RoleAllows(cs.tool, req.Caller.Role); !allowed {
			return n.refuse(n.newResult(cs, req.IdempotencyKey, value), req.Caller,
				refusal{perm: promcp.PermPermissionInsufficient, code: string(promcp.PermPermissionInsufficient), reason: reason, details: details})
		}
		return replay(e, cs.tool, hash)
	}

	res := n.newResult(cs, req.IdempotencyKey, value)
	ap, refused, err := n.redeemApproval(req, cs, value, res)
	if refused != nil || err != nil {
		return refused, err
	}
	if r := n.precheck(cs, value); r != nil {
		return n.refuse(res, req.Caller, *r)
	}
	v := n.guard.Evaluate(ctx, Action{Capability: cs.cap, Tool: cs.tool, Value: value,
		IdempotencyKey: req.IdempotencyKey, Caller: req.Caller, Now: res.Timestamp, Approved: ap.approved, ApprovedBy: ap.by,
		ApprovedFor: ap.digest, CapabilitySum: cs.sum}, false)
	res.Policy, res.Gate, res.Permission = v.Policy, v.Gate, v.Permission
	switch v.Permission {
	case promcp.PermAllowed:
	case promcp.PermRequiresHumanApproval:
		return nil, n.approvalRequired(res, req, cs, v)
	default:
		return n.refuse(res, req.Caller, refusal{perm: v.Permission, code: string(v.Permission), reason: v.Reason, details: v.Details})
	}
	// Whatever the guard decided, the value stays a valid one for the
	// device (a guard bug must not reach hardware).
	if err := checkValueType(cs.cap, v.Value); err != nil || !inRange(cs.cap, v.Value) {
		releaseSlot(v.Slot)
		return nil, fmt.Errorf("guard produced an invalid value %v for %s", v.Value, cs.tool)
	}
	res.Reason, res.Details = v.Reason, v.Details
	if ap.grant {
		res.Details = joinDetails(res.Details, "approved_by="+ap.by.ID+"; approver_role="+ap.by.Role)
	}
	return n.execute(ctx, cs, job{res: res, caller: req.Caller, value: v.Value, hash: hash, slot: v.Slot, maxChange: v.MaxChange, hold: hold})
}

// RefuseUnauthenticated answers a do_ whose caller this gateway could not
// authenticate itself (a call the fleet endpoint forwarded with a
// credential this gateway's policy does not accept, or with none): failed,
// permission_insufficient, code unauthenticated, audited as do_refused
// with why. Nothing is looked up in the ledger, decided or actuated, and
// nothing is recorded under the key. An error is bad input.
func (n *Node) RefuseUnauthenticated(req DoRequest, why string) ([]byte, error) {
	cs, value, err := n.doArgs(req)
	if err != nil {
		return nil, err
	}
	return n.refuse(n.newResult(cs, req.IdempotencyKey, value), req.Caller, refusal{perm: promcp.PermPermissionInsufficient, code: "unauthenticated",
		reason: "this gateway could not authenticate the caller (" + why + "), and it runs no do_ for a caller it cannot authenticate itself. Nothing was actuated: " +
			"call with a token or JWT this gateway's policy accepts (an OAuth token for its resource, its site_resource or its fleet_resource)",
		details: "code=unauthenticated"})
}

// doArgs checks a do_ call's arguments: the tool, the key and the value.
func (n *Node) doArgs(req DoRequest) (*capState, any, error) {
	cs, err := n.capability(req.Tool)
	if err != nil {
		return nil, nil, err
	}
	if cs.cap.Kind != manifest.KindDo {
		return nil, nil, &InputError{Field: "name", Msg: cs.tool + " is an observation, not an actuation"}
	}
	if !cs.cap.Exposed() {
		return nil, nil, NotExposed(cs.tool)
	}
	if err := checkKey(req.IdempotencyKey); err != nil {
		return nil, nil, err
	}
	value, err := DecodeValue(cs.cap, req.Value)
	return cs, value, err
}

func (n *Node) newResult(cs *capState, key string, value any) promcp.DoResult {
	return promcp.DoResult{
		IdempotencyKey: key,
		Timestamp:      time.Now().UTC(),
		SideEffects:    []string{},
		Capability:     cs.tool,
		Source:         n.DeviceID(),
		RequestedValue: value,
	}
}

// refusal is a do_ answered failed before anything touched the device.
type refusal struct {
	perm    promcp.Permission
	code    string
	reason  string
	details string
}

// precheck is what the node itself refuses before the policy: an audit
// that cannot record, a value outside the device's physical range (refused,
// never clamped into it), a value the device's encoding cannot hold, a
// capability whose bus is missing.
func (n *Node) precheck(cs *capState, value any) *refusal {
	err := n.auditReady()
	if err == nil {
		// A small check line may fit where a do_ line does not: the room
		// for the next records is checked before every actuation.
		err = n.auditHeadroom()
	}
	if err != nil {
		return &refusal{perm: promcp.PermPolicyDenied, code: "audit_unavailable",
			reason: "the audit trail cannot be written (" + err.Error() + "): physd actuates nothing it cannot record. Nothing was actuated; an operator must fix the audit (disk space, permissions), after which do_ calls work again"}
	}
	if !inRange(cs.cap, value) {
		return &refusal{perm: promcp.PermOutOfRange, code: string(promcp.PermOutOfRange),
			reason: fmt.Sprintf("%s accepts %s %s; %s is outside it. Nothing was actuated: send a value within the range",
				cs.tool, rangeText(cs.cap), cs.cap.Unit, promcp.FormatValue(value)),
			details: rangeDetails(cs.cap, value)}
	}
	if cs.point == nil {
		return &refusal{perm: promcp.PermSourceUnreachable, code: "device_offline",
			reason: "the device is unavailable: " + cs.bindErr.Error() + ". Nothing was actuated", details: "code=device_offline"}
	}
	if q, ok := cs.point.(drivers.Quantizer); ok {
		if _, err := q.Quantize(value); err != nil {
			return &refusal{perm: promcp.PermOutOfRange, code: "not_representable",
				reason: "the device cannot hold this value exactly: " + err.Error() + ". Nothing was actuated"}
		}
	}
	return nil
}

// refuse answers a do_ that was not actuated: status failed with the
// permission, code and reason. It is audited but not ledgered, so the
// same key may be retried once the cause is gone (a physd extension of
// proMCP §4.2: a refusal commits nothing, so there is nothing to dedup).
func (n *Node) refuse(res promcp.DoResult, caller Caller, r refusal) ([]byte, error) {
	return n.refuseAs("do_refused", res, caller, r)
}

func (n *Node) refuseAs(event string, res promcp.DoResult, caller Caller, r refusal) ([]byte, error) {
	res.Status, res.Permission, res.Code = promcp.StatusFailed, r.perm, r.code
	res.Reason, res.Details = r.reason, joinDetails(res.Details, r.details)
	res.AppliedValue, res.Verified, res.Compensable, res.CompensationHint = nil, false, false, nil
	var body []byte
	_, err := n.appendAudit(func(seq uint64) (*audit.Record, error) {
		res.Audit = &promcp.AuditNote{Seq: seq}
		var err error
		body, err = json.Marshal(res)
		return doRecord(event, res, caller, body), err
	})
	if err != nil {
		res.Audit = nil
		if body, err = json.Marshal(res); err != nil {
			return nil, err
		}
	}
	n.recent.add(body, caller.ID)
	return body, nil
}

// approvalRequired builds the refusal a client that cannot elicit gets, or,
// when another person must approve, registers the request
// (req.RequestApproval) and answers that it is pending.
func (n *Node) approvalRequired(res promcp.DoResult, req DoRequest, cs *capState, v Verdict) error {
	ar := &ApprovalRequired{Tool: cs.tool, Value: res.RequestedValue, Reason: v.Reason, SideEffects: cs.cap.SideEffects, Gate: v.Gate, Approver: v.Approver, HoldS: req.HoldS}
	r := refusal{perm: v.Permission, code: string(v.Permission),
		reason:  v.Reason + ". Nothing was actuated. A client that supports elicitation is asked to confirm; otherwise a person with the required role must approve and run it",
		details: v.Details}
	event := "do_approval_required"
	if a := v.Approver; a != nil && !a.CallerMay {
		r.code = "approval_required"
		r.reason = v.Reason + ". Nothing was actuated: a person with the " + a.Role + " role other than the caller must approve this exact call"
		if n.approval != nil {
			p, err := n.registerApproval(req, cs, res.RequestedValue, v.Reason, a.Role)
			if err != nil {
				r.reason += "; the request could not be registered: " + err.Error()
			} else {
				event, r.code, ar.Pending = "do_approval_pending", "approval_pending", &p
				r.reason, r.details = v.Reason+". Nothing was actuated yet. "+p.Reason, joinDetails(v.Details, p.Details)
			}
		}
	}
	body, err := n.refuseAs(event, res, req.Caller, r)
	if err != nil {
		return err
	}
	ar.Body = body
	return ar
}

// Declined answers a call whose approval round a human declined or
// cancelled: status failed, permission requires_human_approval, audited,
// nothing actuated, the key not recorded (a later approved call may use it).
func (n *Node) Declined(req DoRequest, action string) ([]byte, error) {
	return n.DeclinedBy(req, action, "the human asked to confirm", "")
}

// DeclinedBy is Declined naming who declined and why (the approvals
// route's deny).
func (n *Node) DeclinedBy(req DoRequest, action, by, why string) ([]byte, error) {
	cs, value, err := n.doArgs(req)
	if err != nil {
		return nil, err
	}
	// The key may have actuated through another approval round meanwhile:
	// then its recorded answer is the answer, never "nothing was actuated".
	release, err := n.acquireKey(context.Background(), req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	defer release()
	if e, err := n.store.Lookup(req.IdempotencyKey); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	} else if e != nil {
		return replay(e, cs.tool, argsHash(cs.tool, value))
	}
	return n.declined(n.newResult(cs, req.IdempotencyKey, value), req.Caller, action, by, why)
}

// declined answers a call whose approval was declined, denied or made
// void: failed, requires_human_approval, code approval_<action>, audited,
// nothing actuated, the key not recorded.
func (n *Node) declined(res promcp.DoResult, caller Caller, action, by, why string) ([]byte, error) {
	res.Policy = promcp.PolicyNote{Configured: n.PolicyConfigured(), Decision: "approval_" + action}
	reason := "the approval request was " + pastTense(action) + " by " + by
	if why != "" {
		reason += " (" + why + ")"
	}
	reason += "; nothing was actuated"
	return n.refuseAs("do_declined", res, caller, refusal{perm: promcp.PermRequiresHumanApproval, code: "approval_" + action,
		reason: reason, details: "approval=" + action})
}

func pastTense(action string) string {
	switch action {
	case "decline":
		return "declined"
	case "cancel":
		return "cancelled"
	case "deny":
		return "denied"
	case "void":
		return "made void"
	}
	return action
}

// doRecord is the audit line of a do_ answer: the answer itself (with the
// policy and gate decision, the code and details), a few of its fields
// again for people and tools that grep, and how the caller came in.
func doRecord(event string, res promcp.DoResult, caller Caller, answer []byte) *audit.Record {
	var d map[string]any
	if caller.Transport != "" {
		d = map[string]any{"transport": caller.Transport}
	}
	if caller.Via != "" {
		if d == nil {
			d = map[string]any{}
		}
		d["via"] = caller.Via
	}
	return &audit.Record{
		Event: event, Tool: res.Capability, IdempotencyKey: res.IdempotencyKey, Caller: caller.ID, Credentials: caller.Credentials,
		Status: string(res.Status), Permission: string(res.Permission),
		Requested: res.RequestedValue, Applied: res.AppliedValue, Previous: res.PreviousValue, Reason: res.Reason,
		Data: d, Answer: answer,
	}
}

func joinReason(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

// joinDetails keeps every guard's and the driver's machine notes.
func joinDetails(a, b string) string { return joinReason(a, b) }

func replay(e *store.LedgerEntry, tool, hash string) ([]byte, error) {
	if e.Tool != tool || e.ArgsHash != hash {
		return nil, &InputError{Field: "idempotency_key", Msg: fmt.Sprintf(
			"%q was already used at %s for %s with different arguments; one key names one operation: "+
				"retry with the same arguments to get the recorded result, or use a new key for a new operation",
			e.Key, e.Created.UTC().Format(time.RFC3339), e.Tool)}
	}
	if e.State != store.StateDone {
		return nil, fmt.Errorf("the earlier call with idempotency_key %q has no recorded outcome yet; read_%s to see the device state", e.Key, tool[len("do_"):])
	}
	return e.Response, nil
}

// acquireKey serialises calls that carry the same idempotency key, so a
// concurrent retry waits for the first call's outcome instead of racing it.
func (n *Node) acquireKey(ctx context.Context, key string) (func(), error) {
	for {
		n.inflightMu.Lock()
		ch, busy := n.inflight[key]
		if !busy {
			ch = make(chan struct{})
			n.inflight[key] = ch
			n.inflightMu.Unlock()
			return func() {
				n.inflightMu.Lock()
				delete(n.inflight, key)
				n.inflightMu.Unlock()
				close(ch)
			}, nil
		}
		n.inflightMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func checkKey(k string) error {
	switch {
	case k == "":
		return &InputError{Field: "idempotency_key", Msg: "required: send a new UUID for each operation and reuse it on every retry of that operation"}
	case len(k) > MaxKeyLen:
		return &InputError{Field: "idempotency_key", Msg: fmt.Sprintf("at most %d bytes (got %d): a UUID is enough", MaxKeyLen, len(k))}
	case !utf8.ValidString(k):
		return &InputError{Field: "idempotency_key", Msg: "must be valid UTF-8 text"}
	}
	for _, r := range k {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return &InputError{Field: "idempotency_key", Msg: "must not contain spaces or control characters"}
		}
	}
	return nil
}

func argsHash(tool string, v any) string {
	h := sha256.Sum256([]byte(tool + "\x00" + fmt.Sprintf("%T", v) + "\x00" + promcp.FormatValue(v)))
	return hex.EncodeToString(h[:])
}

func jsonRaw(v any) (json.RawMessage, error) { return json.Marshal(v) }
