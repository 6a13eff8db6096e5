package node

import (
	"context"
	"encoding/json"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// recoverPending resolves ledger entries that a crash left between "the
// device may be touched" and "the outcome is recorded". Nothing is
// re-actuated: the audit trail is searched for the answer that was given,
// and otherwise the device is read to see whether the value landed. The
// recorded answer is final for that key.
func (n *Node) recoverPending(ctx context.Context) error {
	pending, err := n.store.PendingEntries()
	if err != nil || len(pending) == 0 {
		return err
	}
	byKey := map[string]*store.LedgerEntry{}
	for i := range pending {
		byKey[pending[i].Key] = &pending[i]
	}
	// An audit "do" record carries the fields of the answer; if present,
	// rebuild from it. (The audit is written before the ledger completes.)
	audited := map[string]audit.Record{}
	if err := n.audit.Scan(func(r audit.Record) bool {
		if r.Event == "do" && byKey[r.IdempotencyKey] != nil {
			audited[r.IdempotencyKey] = r
		}
		return true
	}); err != nil {
		return err
	}
	for _, e := range pending {
		res := n.recoveredResult(ctx, &e, audited)
		body, err := json.Marshal(res)
		if err != nil {
			return err
		}
		if r, ok := audited[e.Key]; !ok || r.Status != string(res.Status) {
			if _, err := n.audit.Append(&audit.Record{Event: "recovery", Tool: e.Tool, IdempotencyKey: e.Key,
				Status: string(res.Status), Applied: res.AppliedValue, Reason: res.Reason}); err != nil {
				return err
			}
		}
		if err := n.store.Complete(e.Key, body); err != nil {
			return err
		}
		n.log.Warn("recovered an actuation interrupted by a stop", "tool", e.Tool, "key", e.Key, "status", res.Status)
	}
	return nil
}

func (n *Node) recoveredResult(ctx context.Context, e *store.LedgerEntry, audited map[string]audit.Record) promcp.DoResult {
	var p struct {
		Value  any    `json:"value"`
		Caller Caller `json:"caller"`
	}
	_ = json.Unmarshal(e.Pending, &p)
	res := promcp.DoResult{
		Status: promcp.StatusFailed, IdempotencyKey: e.Key, Timestamp: e.Created.UTC(),
		SideEffects: []string{}, Capability: e.Tool, Source: n.DeviceID(), RequestedValue: p.Value,
		Permission: promcp.PermAllowed,
		Policy:     promcp.PolicyNote{Configured: n.PolicyConfigured(), Decision: "allowed"},
	}
	cs := n.byTool[e.Tool]
	if r, ok := audited[e.Key]; ok && cs != nil {
		res.Status = promcp.Status(r.Status)
		res.AppliedValue, res.PreviousValue, res.Reason = r.Applied, r.Previous, r.Reason
		res.RequestedValue = r.Requested
		res.Verified = res.Status == promcp.StatusSuccess && r.Reason == ""
		res.Audit = &promcp.AuditNote{Seq: r.Seq}
		if res.Status != promcp.StatusFailed {
			res.SideEffects = append(res.SideEffects, cs.cap.SideEffects...)
			if cs.cap.Compensable && r.Previous != nil {
				h := promcp.CompensationHint(e.Tool, r.Previous)
				res.Compensable, res.CompensationHint = true, &h
			}
		}
		return res
	}
	res.Reason = "physd stopped during this actuation before answering"
	if cs == nil || cs.point == nil {
		res.Reason += "; the capability is no longer available, so the outcome is unknown: read the device before acting"
		return res
	}
	rctx, cancel := context.WithTimeout(ctx, cs.cap.Timeout())
	defer cancel()
	s, err := n.readDevice(rctx, cs)
	switch {
	case err != nil:
		res.Reason += "; the device could not be read after the restart (" + err.Error() + "), so the outcome is unknown"
	case p.Value != nil && valuesMatch(cs.cap, s.value, normaliseJSON(cs, p.Value)):
		res.Status, res.AppliedValue = promcp.StatusSuccess, s.value
		res.Reason += "; after the restart the device shows the requested value"
		res.SideEffects = append(res.SideEffects, cs.cap.SideEffects...)
	default:
		res.Reason += "; after the restart the device shows " + promcp.FormatValue(s.value) + ", so the value was not applied"
	}
	res.Timestamp = time.Now().UTC()
	return res
}

// normaliseJSON maps a JSON-decoded value back to the driver's Go type.
func normaliseJSON(cs *capState, v any) any {
	if f, ok := v.(float64); ok && cs.cap.DataType == "int" {
		return int64(f)
	}
	return v
}
