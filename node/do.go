package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	// Approved: a human confirmed this call (see Action.Approved).
	Approved bool
}

// ApprovalRequired is returned by Do when the call needs a human's
// approval. Nothing was actuated. The MCP layer either runs an approval
// round with the client (elicitation) or, for a client that cannot elicit,
// returns Body: the proMCP refusal with permission requires_human_approval.
type ApprovalRequired struct {
	Body        []byte
	Tool        string
	Value       any
	Reason      string
	SideEffects []string
	Gate        *promcp.GateNote
}

func (e *ApprovalRequired) Error() string { return "human approval required: " + e.Reason }

// ErrShuttingDown refuses new actuations once shutdown has begun.
var ErrShuttingDown = errors.New("physd is shutting down: no new actuations are accepted")

// MaxKeyLen bounds idempotency keys (a UUID is 36).
const MaxKeyLen = 128

// Do runs the do pipeline (DESIGN "The two paths"). It returns the exact
// JSON of the proMCP do_ response, which a replay of the same key returns
// byte for byte. An error is bad input or an internal fault: nothing was
// actuated.
func (n *Node) Do(ctx context.Context, req DoRequest) ([]byte, error) {
	select {
	case <-n.closing:
		return nil, ErrShuttingDown
	default:
	}
	n.doWG.Add(1)
	defer n.doWG.Done()

	// 1. argument check
	cs, err := n.capability(req.Tool)
	if err != nil {
		return nil, err
	}
	if cs.cap.Kind != manifest.KindDo {
		return nil, &InputError{Field: "name", Msg: cs.tool + " is an observation, not an actuation"}
	}
	if err := checkKey(req.IdempotencyKey); err != nil {
		return nil, err
	}
	value, err := DecodeValue(cs.cap, req.Value)
	if err != nil {
		return nil, err
	}
	hash := argsHash(cs.tool, value)

	// 2. idempotency ledger
	release, err := n.acquireKey(ctx, req.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	defer release()
	if e, err := n.store.Lookup(req.IdempotencyKey); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	} else if e != nil {
		return replay(e, cs.tool, hash)
	}

	now := time.Now()
	res := promcp.DoResult{
		IdempotencyKey: req.IdempotencyKey,
		Timestamp:      now.UTC(),
		SideEffects:    []string{},
		Capability:     cs.tool,
		Source:         n.DeviceID(),
		RequestedValue: value,
	}

	// The manifest range is the device's physical limit: a value outside
	// it is refused before any policy could clamp it into range.
	if !inRange(cs.cap, value) {
		return n.refuse(res, req.Caller, promcp.PermOutOfRange,
			fmt.Sprintf("%s accepts %s %s; %s is outside it. Nothing was actuated: send a value within the range",
				cs.tool, rangeText(cs.cap), cs.cap.Unit, promcp.FormatValue(value)),
			rangeDetails(cs.cap, value))
	}

	// 3–4. policy and gate
	v := n.guard.Evaluate(ctx, Action{Capability: cs.cap, Tool: cs.tool, Value: value,
		IdempotencyKey: req.IdempotencyKey, Caller: req.Caller, Now: now, Approved: req.Approved}, false)
	res.Policy, res.Gate, res.Permission = v.Policy, v.Gate, v.Permission
	if v.Permission == promcp.PermRequiresHumanApproval {
		body, err := n.refuseAs("do_approval_required", res, req.Caller, v.Permission, v.Reason+
			". Nothing was actuated. A client that supports elicitation is asked to confirm; otherwise a person with the required role must approve and run it", v.Details)
		if err != nil {
			return nil, err
		}
		return nil, &ApprovalRequired{Body: body, Tool: cs.tool, Value: value, Reason: v.Reason, SideEffects: cs.cap.SideEffects, Gate: v.Gate}
	}
	if v.Permission != promcp.PermAllowed {
		return n.refuse(res, req.Caller, v.Permission, v.Reason, v.Details)
	}
	if v.Reason != "" {
		res.Reason = v.Reason
	}
	value = v.Value
	// Whatever the guard decided, the value stays a valid one for the
	// device (a guard bug must not reach hardware).
	if err := checkValueType(cs.cap, value); err != nil || !inRange(cs.cap, value) {
		return nil, fmt.Errorf("guard produced an invalid value %v for %s", value, cs.tool)
	}
	if cs.point == nil {
		return n.refuse(res, req.Caller, promcp.PermSourceUnreachable,
			"the device is unavailable: "+cs.bindErr.Error()+". Nothing was actuated", "code=device_offline")
	}

	// 5. driver: previous → write → read-back. From here on the device may
	// be touched, so the key is recorded first and the actuation is not
	// abandoned when the caller hangs up.
	pending, _ := json.Marshal(map[string]any{"value": value, "caller": req.Caller})
	if e, err := n.store.Begin(store.LedgerEntry{Key: req.IdempotencyKey, Tool: cs.tool, ArgsHash: hash, Created: now, Pending: pending}, v.Persist...); err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	} else if e != nil {
		return replay(e, cs.tool, hash)
	}
	act := n.actuate(context.WithoutCancel(ctx), cs, value)
	if act.untouched {
		if err := n.store.Forget(req.IdempotencyKey); err != nil {
			n.log.Error("ledger forget", "key", req.IdempotencyKey, "err", err)
		}
		res.PreviousValue = act.previous
		return n.refuse(res, req.Caller, promcp.PermSourceUnreachable, act.reason, act.details)
	}
	res.Status, res.Verified = act.status, act.verified
	res.AppliedValue, res.PreviousValue = act.applied, act.previous
	if act.reason != "" {
		res.Reason = joinReason(res.Reason, act.reason)
	}
	res.Details = act.details
	if res.Status != promcp.StatusFailed {
		res.SideEffects = append(res.SideEffects, cs.cap.SideEffects...)
		if cs.cap.Compensable && act.previous != nil {
			hint := promcp.CompensationHint(cs.tool, act.previous)
			res.Compensable, res.CompensationHint = true, &hint
		}
	}

	// 6. audit and ledger durable before the reply.
	return n.commit(res, req.Caller)
}

// commit writes the audit record and completes the ledger entry.
func (n *Node) commit(res promcp.DoResult, caller Caller) ([]byte, error) {
	seq, auditErr := n.audit.Append(&audit.Record{
		Event: "do", Tool: res.Capability, IdempotencyKey: res.IdempotencyKey, Caller: caller.ID,
		Status: string(res.Status), Permission: string(res.Permission),
		Requested: res.RequestedValue, Applied: res.AppliedValue, Previous: res.PreviousValue, Reason: res.Reason,
		Data: decisionData(res),
	})
	if auditErr != nil {
		n.log.Error("AUDIT WRITE FAILED after an actuation", "tool", res.Capability, "key", res.IdempotencyKey, "err", auditErr)
	} else {
		res.Audit = &promcp.AuditNote{Seq: seq}
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, err
	}
	if err := n.store.Complete(res.IdempotencyKey, body); err != nil {
		n.log.Error("LEDGER WRITE FAILED after an actuation", "tool", res.Capability, "key", res.IdempotencyKey, "err", err)
		return nil, fmt.Errorf("the actuation ran (%s) but its ledger record could not be written: %w", res.Status, err)
	}
	n.recent.add(body)
	return body, nil
}

// refuse answers a do_ that was not actuated: status failed with the
// permission and reason. It is audited but not ledgered, so the same key
// may be retried once the cause is gone.
func (n *Node) refuse(res promcp.DoResult, caller Caller, perm promcp.Permission, reason, details string) ([]byte, error) {
	return n.refuseAs("do_refused", res, caller, perm, reason, details)
}

func (n *Node) refuseAs(event string, res promcp.DoResult, caller Caller, perm promcp.Permission, reason, details string) ([]byte, error) {
	res.Status, res.Permission = promcp.StatusFailed, perm
	res.Reason, res.Details = reason, details
	res.AppliedValue, res.Compensable, res.CompensationHint = nil, false, nil
	seq, err := n.audit.Append(&audit.Record{
		Event: event, Tool: res.Capability, IdempotencyKey: res.IdempotencyKey, Caller: caller.ID,
		Status: string(res.Status), Permission: string(perm), Requested: res.RequestedValue, Reason: reason,
		Data: decisionData(res),
	})
	if err != nil {
		n.log.Error("audit write failed", "err", err)
	} else {
		res.Audit = &promcp.AuditNote{Seq: seq}
	}
	body, err := json.Marshal(res)
	if err == nil {
		n.recent.add(body)
	}
	return body, err
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

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

type actuation struct {
	untouched bool // nothing was written: the key may be reused
	status    promcp.Status
	verified  bool
	previous  any
	applied   any
	reason    string
	details   string
}

// actuate reads the previous value, writes, waits settle_ms and reads back.
func (n *Node) actuate(ctx context.Context, cs *capState, value any) actuation {
	c := cs.cap
	ctx, cancel := context.WithTimeout(ctx, c.Timeout()+time.Duration(c.SettleMS)*time.Millisecond)
	defer cancel()
	prev, err := n.readDevice(ctx, cs)
	if err != nil {
		return actuation{untouched: true, reason: "could not read the current value before writing, so nothing was written: " + err.Error(), details: "code=device_offline"}
	}
	a := actuation{previous: prev.value}
	if err := cs.point.Write(ctx, value); err != nil {
		if errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) || errors.Is(err, drivers.ErrReadOnly) {
			a.untouched = true
			a.reason = "the device refused the write, nothing changed: " + err.Error()
			return a
		}
		// Unknown outcome (timeout, I/O error): look before answering.
		rb, rerr := n.readDevice(ctx, cs)
		switch {
		case rerr == nil && valuesMatch(c, rb.value, value):
			a.status, a.verified, a.applied = promcp.StatusSuccess, true, rb.value
			a.reason = "the write reported an error (" + err.Error() + ") but the read-back shows the value applied"
		default:
			a.status = promcp.StatusFailed
			a.reason = "the write failed: " + err.Error()
			if rerr == nil {
				a.details = "read_back=" + promcp.FormatValue(rb.value)
			}
		}
		return a
	}
	if c.SettleMS > 0 {
		t := time.NewTimer(time.Duration(c.SettleMS) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	rb, err := n.readDevice(ctx, cs)
	switch {
	case err != nil:
		a.status, a.applied = promcp.StatusSuccess, value
		a.reason = "the write was accepted but the verifying read-back failed (" + err.Error() + "); read again before relying on it"
	case valuesMatch(c, rb.value, value):
		a.status, a.verified, a.applied = promcp.StatusSuccess, true, rb.value
	case valuesMatch(c, rb.value, prev.value):
		a.status = promcp.StatusFailed
		a.reason = "the device did not take the value: the read-back still shows " + promcp.FormatValue(rb.value) +
			" (stuck actuator or a local override)"
		a.details = "read_back=" + promcp.FormatValue(rb.value)
	default:
		a.status, a.applied = promcp.StatusPartial, rb.value
		a.reason = "the read-back shows " + promcp.FormatValue(rb.value) + ", neither the requested nor the previous value"
		a.details = "read_back=" + promcp.FormatValue(rb.value)
	}
	return a
}

func valuesMatch(c *manifest.Capability, got, want any) bool {
	gf, gok := asFloat(got)
	wf, wok := asFloat(want)
	if gok && wok {
		return math.Abs(gf-wf) <= c.Tolerance+1e-12
	}
	return got == want
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

// DecodeValueFor decodes a do_ value for a tool (see DecodeValue).
func (n *Node) DecodeValueFor(tool string, raw json.RawMessage) (any, error) {
	cs, err := n.capability(tool)
	if err != nil {
		return nil, err
	}
	return DecodeValue(cs.cap, raw)
}

// maxExactInt is the largest integer a JSON number carries exactly.
const maxExactInt = 1 << 53

// DecodeValue checks a do_ value against the capability's data type and
// returns it normalised (float64, int64, bool or string). Errors name the
// field and the fix.
func DecodeValue(c *manifest.Capability, raw json.RawMessage) (any, error) {
	raw = bytes.TrimSpace(raw)
	bad := func(msg string) error {
		return &InputError{Field: "value", Msg: msg + "; " + exampleFor(c)}
	}
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, bad("required")
	}
	kind := jsonKind(raw)
	switch c.DataType {
	case manifest.TypeFloat, manifest.TypeInt:
		if kind != "number" {
			return nil, bad("must be a JSON number (data_type " + c.DataType + "), got " + kind)
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			return nil, bad("number " + truncate(string(raw)) + " is not finite")
		}
		if c.DataType == manifest.TypeFloat {
			return f, nil
		}
		if f != math.Trunc(f) {
			return nil, bad("must be a whole number (data_type int), got " + truncate(string(raw)))
		}
		if math.Abs(f) > maxExactInt {
			return nil, bad("integer " + truncate(string(raw)) + " is too large")
		}
		return int64(f), nil
	case manifest.TypeBool:
		if kind != "boolean" {
			return nil, bad("must be true or false (data_type bool), got " + kind)
		}
		return bytes.Equal(raw, []byte("true")), nil
	case manifest.TypeEnum, manifest.TypeString:
		if kind != "string" {
			return nil, bad("must be a string (data_type " + c.DataType + "), got " + kind)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, bad("invalid string")
		}
		if c.DataType == manifest.TypeEnum {
			for _, e := range c.EnumValues {
				if s == e {
					return s, nil
				}
			}
			return nil, bad(fmt.Sprintf("%q is not one of %v", truncate(s), c.EnumValues))
		}
		return s, nil
	}
	return nil, bad("unsupported data_type " + c.DataType)
}

func exampleFor(c *manifest.Capability) string {
	switch c.DataType {
	case manifest.TypeFloat, manifest.TypeInt:
		ex := "21"
		if c.Range != nil {
			ex = promcp.FormatValue(math.Round((c.Range.Min + c.Range.Max) / 2))
		}
		return "fix: send e.g. {\"value\": " + ex + "} within " + rangeText(c) + " " + c.Unit
	case manifest.TypeBool:
		return "fix: send {\"value\": true} or {\"value\": false}"
	case manifest.TypeEnum:
		return fmt.Sprintf("fix: send one of %v", c.EnumValues)
	}
	return "fix: send a string"
}

func jsonKind(raw []byte) string {
	switch raw[0] {
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "number"
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func jsonRaw(v any) (json.RawMessage, error) { return json.Marshal(v) }

// Declined answers a call whose approval round a human declined or
// cancelled: status failed, permission requires_human_approval, audited,
// nothing actuated, the key not recorded (a later approved call may use it).
func (n *Node) Declined(req DoRequest, action string) ([]byte, error) {
	cs, err := n.capability(req.Tool)
	if err != nil {
		return nil, err
	}
	if err := checkKey(req.IdempotencyKey); err != nil {
		return nil, err
	}
	value, err := DecodeValue(cs.cap, req.Value)
	if err != nil {
		return nil, err
	}
	res := promcp.DoResult{
		IdempotencyKey: req.IdempotencyKey, Timestamp: time.Now().UTC(), SideEffects: []string{},
		Capability: cs.tool, Source: n.DeviceID(), RequestedValue: value,
		Policy: promcp.PolicyNote{Configured: n.PolicyConfigured(), Decision: "approval_" + action},
	}
	return n.refuseAs("do_declined", res, req.Caller, promcp.PermRequiresHumanApproval,
		"the approval request was "+pastTense(action)+" by the human asked to confirm; nothing was actuated", "approval="+action)
}

func pastTense(action string) string {
	switch action {
	case "decline":
		return "declined"
	case "cancel":
		return "cancelled"
	}
	return action
}

// decisionData is what the audit keeps of the policy and gate decisions
// (decision, layer, reason, engine, fingerprint) and the caller's transport.
func decisionData(res promcp.DoResult) map[string]any {
	d := map[string]any{"policy": res.Policy}
	if res.Gate != nil {
		d["gate"] = res.Gate
	}
	if res.Details != "" {
		d["details"] = res.Details
	}
	return d
}
