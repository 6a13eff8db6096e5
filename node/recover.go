package node

import (
	"context"
	"encoding/json"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// recoverPending resolves ledger entries that a stop left between "the
// device may be touched" and "the outcome is recorded". Nothing is
// re-actuated. An answer that reached the audit trail is the answer, byte
// for byte (the audit line is written before the reply leaves). Otherwise
// the device is read, and the answer says only what that proves: success
// when it shows the requested value; partial (outcome_unknown) in every
// other case, because the write may have landed and been changed since, or
// never have been sent — failed would invite a second actuation.
func (n *Node) recoverPending(ctx context.Context) error {
	pending, err := n.store.PendingEntries()
	if err != nil || len(pending) == 0 {
		return err
	}
	byKey := map[string]bool{}
	oldest := time.Now()
	for _, e := range pending {
		byKey[e.Key] = true
		if e.Created.Before(oldest) {
			oldest = e.Created
		}
	}
	audited := map[string]audit.Record{}
	if err := n.audit.ScanSince(oldest.Add(-time.Minute), func(r audit.Record) bool {
		if (r.Event == "do" || r.Event == "recovery") && byKey[r.IdempotencyKey] {
			audited[r.IdempotencyKey] = r
		}
		return true
	}); err != nil {
		return err
	}
	for _, e := range pending {
		body, status, err := n.recovered(ctx, e, audited)
		if err != nil {
			return err
		}
		e.Response = body
		if err := n.store.Complete(e); err != nil {
			return err
		}
		n.log.Warn("recovered an actuation interrupted by a stop", "tool", e.Tool, "key", e.Key, "status", status)
	}
	return nil
}

// recovered returns the final answer of a pending key.
func (n *Node) recovered(ctx context.Context, e store.LedgerEntry, audited map[string]audit.Record) ([]byte, promcp.Status, error) {
	if r, ok := audited[e.Key]; ok && len(r.Answer) > 0 {
		return r.Answer, promcp.Status(r.Status), nil
	}
	var p struct {
		Value  json.RawMessage `json:"value"`
		Caller Caller          `json:"caller"`
	}
	_ = json.Unmarshal(e.Pending, &p)
	requested := n.pendingValue(e.Tool, p.Value)
	res := promcp.DoResult{
		IdempotencyKey: e.Key, SideEffects: []string{}, Capability: e.Tool, Source: n.DeviceID(),
		RequestedValue: requested, Permission: promcp.PermAllowed,
		Policy: promcp.PolicyNote{Configured: n.PolicyConfigured(), Decision: "allowed",
			Note: "recovered after a restart: the policy allowed this call before physd stopped"},
	}
	if r, ok := audited[e.Key]; ok {
		n.fromLegacyRecord(&res, r) // an audit line written by physd ≤ 0.1
	} else {
		n.fromDevice(ctx, &res, e.Tool, requested)
	}
	if cs := n.bound().byTool[e.Tool]; cs != nil && res.Status != promcp.StatusFailed {
		res.SideEffects = append(res.SideEffects, cs.cap.SideEffects...)
		if cs.cap.Compensable && res.PreviousValue != nil {
			h := promcp.CompensationHint(e.Tool, res.PreviousValue)
			res.Compensable, res.CompensationHint = true, &h
		}
	}
	res.Timestamp = time.Now().UTC()
	var body []byte
	_, err := n.appendAudit(func(seq uint64) (*audit.Record, error) {
		res.Audit = &promcp.AuditNote{Seq: seq}
		var err error
		body, err = json.Marshal(res)
		return doRecord("recovery", res, p.Caller, body), err
	})
	if err != nil {
		return nil, "", err
	}
	return body, res.Status, nil
}

// fromDevice decides a pending key's answer by reading its device.
func (n *Node) fromDevice(ctx context.Context, res *promcp.DoResult, tool string, requested any) {
	res.Status, res.Code = promcp.StatusPartial, promcp.CodeOutcomeUnknown
	const stopped = "physd stopped during this actuation before answering"
	cs := n.bound().byTool[tool]
	if cs == nil || cs.point == nil {
		res.Reason = stopped + "; the capability is no longer available, so whether the write landed is unknown: read the device before acting again"
		return
	}
	var rb readBackResult
	var err error
	if requested != nil {
		rb, err = n.readBack(ctx, cs, requested, cs.expected(requested))
	} else {
		var s *sample
		if s, err = n.readDevice(ctx, cs); err == nil {
			rb = readBackResult{value: s.value, applied: s.value, details: "read_back=" + promcp.FormatValue(s.value)}
		}
	}
	switch {
	case err != nil:
		res.Reason = stopped + "; the device could not be read after the restart (" + err.Error() + "), so whether the write landed is unknown. " + n.readFirst(cs)
	case rb.ok:
		res.Status, res.Code, res.Verified, res.AppliedValue = promcp.StatusSuccess, "", true, rb.applied
		res.Reason = stopped + "; after the restart the device shows the requested value"
	default:
		res.AppliedValue = rb.value
		res.Details = rb.details
		shows := promcp.FormatValue(rb.value)
		if rb.verify != nil {
			shows = "at its verify point " + rb.verify.Point + " " + promcp.FormatValue(rb.verify.Observed)
		}
		res.Reason = stopped + "; after the restart the device shows " + shows +
			": the write may never have been sent, or may have landed and been changed since. " + n.readFirst(cs)
	}
}

// fromLegacyRecord rebuilds an answer from an audit line that carries the
// answer's fields but not the answer itself (physd ≤ 0.1).
func (n *Node) fromLegacyRecord(res *promcp.DoResult, r audit.Record) {
	res.Status = promcp.Status(r.Status)
	res.AppliedValue, res.PreviousValue, res.Reason = r.Applied, r.Previous, r.Reason
	res.RequestedValue = r.Requested
	res.Verified = res.Status == promcp.StatusSuccess && r.Reason == ""
	if res.Status == promcp.StatusFailed {
		// ≤ 0.1 answered failed for a stuck read-back too: not proof
		// that nothing was applied.
		res.Status, res.Code = promcp.StatusPartial, promcp.CodeMismatch
	} else if res.Status == promcp.StatusSuccess && !res.Verified {
		res.Status, res.Code = promcp.StatusPartial, promcp.CodeUnverified
	}
}

// pendingValue decodes the value a pending entry was about to write, in
// the capability's Go type (exact for 64-bit integers).
func (n *Node) pendingValue(tool string, raw json.RawMessage) any {
	if cs := n.bound().byTool[tool]; cs != nil && len(raw) > 0 {
		if v, err := DecodeValue(cs.cap, raw); err == nil {
			return v
		}
	}
	var v any
	_ = json.Unmarshal(raw, &v)
	return v
}
