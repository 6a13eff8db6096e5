package mqtt

import (
	"encoding/json"
	"time"

	"github.com/physd/physd/audit"
)

// Result is what <prefix>/<device_id>/do/<tool> carries for a do_: the
// outcome as the caller was answered, without the caller's identity or the
// policy and gate notes (those stay in the audit trail).
type Result struct {
	Capability string `json:"capability"`
	// Event is the audit's: do (the actuation ran), do_refused (refused,
	// nothing applied), recovery (settled after a crash), safe_state (physd
	// drove the output to its safe value; Reason names the event).
	Event          string    `json:"event"`
	Status         string    `json:"status"`
	Verified       bool      `json:"verified"`
	Code           string    `json:"code,omitempty"`
	IdempotencyKey string    `json:"idempotency_key"`
	RequestedValue any       `json:"requested_value"`
	AppliedValue   any       `json:"applied_value"`
	PreviousValue  any       `json:"previous_value"`
	Reason         string    `json:"reason,omitempty"`
	Timestamp      time.Time `json:"timestamp"`
	AuditSeq       uint64    `json:"audit_seq"`
}

// ResultTopic is the topic of a do_ capability's last result.
func (p *Publisher) ResultTopic(tool string) string { return p.base + "/do/" + tool }

// AuditSink is an audit.Sink (audit.Options.Sink) that publishes the do_
// results the audit trail records, once they are on disk. Send is one
// non-blocking channel send (the line is parsed on the publisher's side),
// so the actuation's path gains nothing it could wait on; Close does
// nothing (Publisher.Close ends it).
func (p *Publisher) AuditSink() audit.Sink { return auditSink{p} }

type auditSink struct{ p *Publisher }

func (s auditSink) Send(line []byte) {
	select {
	case s.p.audit <- line:
	default:
		s.p.droppedFull.Add(1)
	}
}

func (auditSink) Close() error { return nil }

// auditLines turns the audit's do records into results until Close.
func (p *Publisher) auditLines() {
	defer p.done.Done()
	for {
		select {
		case <-p.stop:
			return
		case line := <-p.audit:
			if r, ok := resultOf(line); ok {
				if b, err := json.Marshal(r); err == nil {
					p.send(p.ResultTopic(r.Capability), b, true)
				}
			}
		}
	}
}

// resultOf reads a do_ result from an audit line (false for other events).
func resultOf(line []byte) (Result, bool) {
	var rec audit.Record
	if json.Unmarshal(line, &rec) != nil || rec.Tool == "" || rec.Event != "do" && rec.Event != "do_refused" && rec.Event != "recovery" && rec.Event != "safe_state" {
		return Result{}, false
	}
	r := Result{Capability: rec.Tool, Event: rec.Event, Status: rec.Status, IdempotencyKey: rec.IdempotencyKey, RequestedValue: rec.Requested,
		AppliedValue: rec.Applied, PreviousValue: rec.Previous, Reason: rec.Reason, Timestamp: rec.Time, AuditSeq: rec.Seq}
	if len(rec.Answer) > 0 {
		var a struct {
			Status         string    `json:"status"`
			Verified       bool      `json:"verified"`
			Code           string    `json:"code"`
			IdempotencyKey string    `json:"idempotency_key"`
			RequestedValue any       `json:"requested_value"`
			AppliedValue   any       `json:"applied_value"`
			PreviousValue  any       `json:"previous_value"`
			Reason         string    `json:"reason"`
			Timestamp      time.Time `json:"timestamp"`
		}
		if json.Unmarshal(rec.Answer, &a) == nil && a.Status != "" {
			r.Status, r.Verified, r.Code, r.Reason = a.Status, a.Verified, a.Code, a.Reason
			r.RequestedValue, r.AppliedValue, r.PreviousValue = a.RequestedValue, a.AppliedValue, a.PreviousValue
			if a.IdempotencyKey != "" {
				r.IdempotencyKey = a.IdempotencyKey
			}
			if !a.Timestamp.IsZero() {
				r.Timestamp = a.Timestamp
			}
		}
	}
	return r, true
}
