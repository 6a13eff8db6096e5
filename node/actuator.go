package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// The actuator is one capability's do_ path after the decision
// (docs/design.md "The actuation path"): begin → actuate → commit, or release.
//
//   - Decisions (policy, gate, quorum, approval) of many calls run
//     concurrently; the rate slot each holds keeps the counts exact.
//   - The device step (previous read, write, settle, read-back) of one
//     capability runs for one call at a time; capabilities run in parallel.
//   - The pending ledger entry and the rate slot are durable before the
//     device is touched (one bbolt commit); the answer is durable before it
//     leaves (one fsynced audit line that carries it). The ledger's done
//     record rides on the next commit: three syncs per do_ in all.
//   - Every path that ends without touching the device releases the slot.
type actuator struct {
	turn chan struct{} // capacity 1: held during a device step
}

func newActuator() actuator { return actuator{turn: make(chan struct{}, 1)} }

// job is one allowed actuation.
type job struct {
	res    promcp.DoResult // the answer so far (decision filled in)
	caller Caller
	value  any    // what to write (a clamp may differ from the request)
	hash   string // of the arguments, for the ledger
	slot   Slot   // the rate slot, or nil
	// maxChange > 0 bounds the step from the device's current value.
	maxChange float64
	// hold is the lease the actuation starts (capabilities with lease).
	hold time.Duration
}

// execute runs an allowed job on cs's device.
func (n *Node) execute(ctx context.Context, cs *capState, j job) ([]byte, error) {
	// After a reload, the first call of an added or redefined capability
	// waits for the previous manifest's actuations on its bus — before it
	// takes its own turn: two redefined capabilities that wait for each
	// other's old turn while holding their own would deadlock.
	if err := cs.awaitPredecessors(ctx); err != nil {
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, refusal{perm: promcp.PermAllowed, code: "actuator_busy",
			reason: "an actuation of the previous manifest on the same bus was still under way when the caller's deadline ended (" + err.Error() +
				"). Nothing was actuated; retry with the same idempotency_key"})
	}
	// Another call may be in its device step: wait for the turn within the
	// caller's deadline; nothing has been touched yet, so giving up is safe.
	select {
	case cs.act.turn <- struct{}{}:
	case <-ctx.Done():
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, refusal{perm: promcp.PermAllowed, code: "actuator_busy",
			reason: "another actuation of " + cs.tool + " was still under way when the caller's deadline ended (" + ctx.Err().Error() +
				"). Nothing was actuated; retry with the same idempotency_key"})
	}
	n.markStep(cs)
	defer func() { cs.stepSince.Store(0); <-cs.act.turn }()
	if n.bound().byTool[cs.tool] != cs {
		// The manifest was reloaded while this call was deciding, and this
		// capability was removed or redefined: the decision was made for a
		// definition that is no longer in force.
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, refusal{perm: promcp.PermAllowed, code: CodeManifestReloaded,
			reason: "the manifest was reloaded while this call was being decided, and " + cs.tool + " was removed or redefined. Nothing was actuated; " +
				"list the tools again and retry with the same idempotency_key if the capability still exists"})
	}
	if !n.startActuation() {
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, refusal{perm: promcp.PermAllowed, code: "shutting_down",
			reason: ErrShuttingDown.Error() + ". Nothing was actuated; retry with the same idempotency_key once physd is back"})
	}
	defer n.endActuation()
	if !cs.bus.enter() {
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, refusal{perm: promcp.PermAllowed, code: CodeManifestReloaded,
			reason: "the bus " + cs.bus.name + " was closed by a manifest reload. Nothing was actuated; retry with the same idempotency_key"})
	}
	defer cs.bus.leave()

	// The interlocks are judged here, under the turn and right before the
	// commit: the readings they rest on are as fresh as the actuation.
	if r := n.checkInterlocks(ctx, cs, j.value); r != nil {
		releaseSlot(j.slot)
		return n.refuse(j.res, j.caller, *r)
	}

	// begin: from here on the device may be touched, so the key is durable
	// first, with the rate slot, and the actuation is not abandoned when
	// the caller hangs up.
	entry := store.LedgerEntry{Key: j.res.IdempotencyKey, Tool: cs.tool, ArgsHash: j.hash, Created: j.res.Timestamp}
	entry.Pending, _ = json.Marshal(pendingRecord{Value: j.value, Caller: j.caller})
	// The hold counts from the call's timestamp (the answer's): an agent
	// reads lease_expires_at as timestamp + hold_s, never later.
	ls := n.planLease(cs, j.value, j.res.IdempotencyKey, j.hold, j.res.Timestamp)
	begin, release := writesWith(j.slot, ls)
	if e, err := n.store.Begin(entry, begin); err != nil {
		releaseSlot(j.slot)
		n.storeErr.Store(&err) // /readyz says so until a write succeeds
		return nil, fmt.Errorf("ledger: %w; nothing was actuated", err)
	} else if e != nil {
		releaseSlot(j.slot)
		return replay(e, cs.tool, j.hash)
	}

	n.storeErr.Store(nil)
	a := n.actuate(context.WithoutCancel(ctx), cs, j.value, j.maxChange)
	if a.refused != nil {
		// Nothing was written, or the device rejected the write: the key
		// and the slot are given back in one commit.
		if err := n.store.Forget(entry.Key, release); err != nil {
			n.log.Error("ledger forget", "key", entry.Key, "err", err)
		}
		j.res.PreviousValue = a.previous
		return n.refuse(j.res, j.caller, *a.refused)
	}
	res := j.res
	res.Status, res.Verified, res.Code = a.status, a.verified, a.code
	res.AppliedValue, res.PreviousValue = a.applied, a.previous
	res.VerificationMS = a.verifyMS
	// The output is commanded again: its safe state (if any) is over, and
	// the lease this do_ asked for starts.
	n.superseded(cs)
	res.LeaseExpiresAt = n.applyLease(cs, ls, a.status)
	res.Reason = joinReason(res.Reason, a.reason)
	res.Details = joinDetails(res.Details, a.details)
	res.SideEffects = append(res.SideEffects, cs.cap.SideEffects...)
	if cs.cap.Compensable && a.previous != nil {
		hint := promcp.CompensationHint(cs.tool, a.previous)
		res.Compensable, res.CompensationHint = true, &hint
	}
	entry.State = store.StateDone
	return n.commit(cs, res, j.caller, entry)
}

// pendingRecord is what a pending ledger entry keeps of the call, for
// recovery (recover.go reads it back).
type pendingRecord struct {
	Value  any    `json:"value"`
	Caller Caller `json:"caller"`
}

// writesWith are the extra writes of the pending commit (begin) and of the
// Forget that undoes it (release): the rate slot's history and the lease
// record, each nil when there is nothing to write.
func writesWith(slot Slot, ls *leaseStep) (begin, release func() []store.KV) {
	if slot == nil && ls == nil {
		return nil, nil
	}
	begin = func() []store.KV {
		var kvs []store.KV
		if slot != nil {
			kvs = slot.Begin(time.Now())
		}
		if ls != nil {
			kvs = append(kvs, ls.begin)
		}
		return kvs
	}
	release = func() []store.KV {
		var kvs []store.KV
		if slot != nil {
			kvs = slot.Release()
		}
		if ls != nil {
			kvs = append(kvs, ls.restore)
		}
		return kvs
	}
	return begin, release
}

func releaseSlot(s Slot) {
	if s != nil {
		s.Release()
	}
}

// commit makes the answer durable and returns it: the fsynced audit line
// carries it (recovery replays it from there), and the ledger's done
// record follows with the next commit. If the audit cannot be written the
// ledger records the answer synchronously instead, the answer says so, and
// the node refuses new do_ calls until the audit works again.
func (n *Node) commit(cs *capState, res promcp.DoResult, caller Caller, entry store.LedgerEntry) ([]byte, error) {
	var body []byte
	_, err := n.appendAudit(func(seq uint64) (*audit.Record, error) {
		res.Audit = &promcp.AuditNote{Seq: seq}
		var err error
		body, err = json.Marshal(res)
		return doRecord("do", res, caller, body), err
	})
	if err == nil {
		entry.Response = body
		n.store.CompleteDeferred(entry)
		n.recent.add(body, caller.ID)
		return body, nil
	}
	n.log.Error("AUDIT WRITE FAILED after an actuation", "tool", res.Capability, "key", res.IdempotencyKey, "err", err)
	res.Audit = nil
	res.Reason = joinReason(res.Reason, "the audit record of this actuation could not be written ("+err.Error()+
		"); physd refuses further actuations until the audit works again")
	if body, err = json.Marshal(res); err != nil {
		return nil, err
	}
	entry.Response = body
	if err := n.store.Complete(entry); err != nil {
		n.log.Error("LEDGER WRITE FAILED after an actuation", "tool", res.Capability, "key", res.IdempotencyKey, "err", err)
		return nil, fmt.Errorf("the actuation ran (status %s) but neither its audit nor its ledger record could be written: %w. %s",
			res.Status, err, n.lookFirst(cs))
	}
	n.recent.add(body, caller.ID)
	return body, nil
}

// actuation is what the device step found.
type actuation struct {
	refused  *refusal // nothing changed on the device: answered failed
	status   promcp.Status
	verified bool
	code     string
	previous any
	applied  any
	reason   string
	details  string
	verifyMS int64 // settle and read-back after the write was acknowledged
}

// actuate reads the previous value, writes, waits settle_ms and reads
// back; each device access is bounded by the capability's timeout. The
// answer follows the outcome vocabulary: success only when the read-back
// shows the value; failed only when nothing can have changed; partial
// (with a code and "read before you retry") for everything in between.
func (n *Node) actuate(ctx context.Context, cs *capState, value any, maxChange float64) actuation {
	c := cs.cap
	prev, err := n.readDevice(ctx, cs)
	if err != nil {
		r := &refusal{perm: promcp.PermSourceUnreachable, code: "device_offline",
			reason:  "could not read the current value before writing, so nothing was written: " + err.Error(),
			details: "code=device_offline"}
		// A driver that knows why (index_range_ignored,
		// server_certificate_mismatch, …) gives the agent its own code.
		if code, fix, ok := drivers.CodeOf(err); ok {
			r.code, r.details = code, "code="+code
			if fix != "" && !strings.Contains(err.Error(), fix) {
				r.reason += "; fix: " + fix
			}
		}
		if maxChange > 0 {
			r.code, r.details = CodeCurrentValueUnreadable, "code="+CodeCurrentValueUnreadable+"; guard=max_change"
			r.reason = fmt.Sprintf("the max_change guard (at most %g %s per actuation) needs the device's current value, and reading it failed (%s). Nothing was written: retry when the device answers reads",
				maxChange, c.Unit, err.Error())
		}
		return actuation{refused: r}
	}
	a := actuation{previous: prev.value}
	if r := checkStep(cs, prev.value, value, maxChange); r != nil {
		a.refused = r
		return a
	}
	want := cs.expected(value)
	if err := n.writeDevice(ctx, cs, value); err != nil {
		if notApplied(err) {
			a.refused = deviceRefusal(cs, err)
			return a
		}
		// Sent, but the outcome is unknown (a timeout, a lost reply): look.
		if rb, rerr := n.readBack(ctx, cs, value, want); rerr == nil && rb.ok {
			a.status, a.verified, a.applied = promcp.StatusSuccess, true, rb.applied
			a.reason = "the write reported an error (" + err.Error() + ") but the read-back shows the value applied"
			a.details = rb.details
			return a
		} else if rerr == nil {
			a.details = rb.details
			if code, fix, ok := drivers.CodeOf(err); ok && rb.verify == nil && cs.matches(rb.value, prev.value) {
				// The device answered with an error (a device failure
				// exception) and still holds what it held: nothing applied.
				a.refused = &refusal{perm: promcp.PermAllowed, code: code, details: "code=" + code + "; " + rb.details,
					reason: "the device reported a failure and the read-back shows the previous value " + promcp.FormatValue(rb.value) +
						", so nothing changed: " + err.Error()}
				if fix != "" && !strings.Contains(err.Error(), fix) {
					a.refused.reason += "; fix: " + fix
				}
				return a
			}
		}
		if code, _, ok := drivers.CodeOf(err); ok {
			a.details = joinDetails("device_code="+code, a.details)
		}
		a.status, a.code = promcp.StatusPartial, promcp.CodeOutcomeUnknown
		a.reason = "the write was sent but its outcome is unknown (" + err.Error() + "). " + n.readFirst(cs)
		return a
	}
	verifyStart := time.Now()
	if c.SettleMS > 0 {
		t := time.NewTimer(time.Duration(c.SettleMS) * time.Millisecond)
		<-t.C
	}
	rb, err := n.readBack(ctx, cs, value, want)
	a.verifyMS = time.Since(verifyStart).Milliseconds()
	switch {
	case err != nil:
		a.status, a.code = promcp.StatusPartial, promcp.CodeUnverified
		a.reason = "the device acknowledged the write but the verifying read-back failed (" + err.Error() + "). " + n.readFirst(cs)
	case rb.ok:
		a.status, a.verified, a.applied, a.details = promcp.StatusSuccess, true, rb.applied, rb.details
	case rb.verify != nil:
		a.status, a.code, a.details = promcp.StatusPartial, promcp.CodeMismatch, rb.details
		a.reason = "the device acknowledged the write but its verify point " + rb.verify.Point + " shows " + promcp.FormatValue(rb.verify.Observed) +
			", not " + promcp.FormatValue(rb.verify.Expected) + " (what it shows once the command applied): a stuck actuator, a local override, or a device that applies it later. " + n.readFirst(cs)
	default:
		a.status, a.code, a.applied = promcp.StatusPartial, promcp.CodeMismatch, rb.value
		a.details = rb.details
		if cs.matches(rb.value, prev.value) {
			a.reason = "the device acknowledged the write but still shows the previous value " + promcp.FormatValue(rb.value) +
				" (a stuck actuator, a local override, or a device that applies it later). " + n.readFirst(cs)
		} else {
			a.reason = "the read-back shows " + promcp.FormatValue(rb.value) + ", neither the requested nor the previous value. " + n.readFirst(cs)
		}
	}
	return a
}

// readBackResult is the verifying read after a write.
type readBackResult struct {
	value   any  // the capability's value read back (nil when a verify point was read)
	ok      bool // it shows the write applied
	applied any  // the applied value to report when ok
	verify  *drivers.Verification
	details string // read_back=… or verify=…
}

// readBack is the verifying read after a write of value (want is what the
// point holds once it applied): the point itself, or the verify point its
// binding names (drivers.Verifier), within the capability's timeout.
func (n *Node) readBack(ctx context.Context, cs *capState, value, want any) (readBackResult, error) {
	v, ok := cs.point.(drivers.Verifier)
	if !ok {
		s, err := n.readDevice(ctx, cs)
		if err != nil {
			cs.outUnknown.Store(true)
			return readBackResult{}, err
		}
		return readBackResult{value: s.value, ok: cs.matches(s.value, want), applied: s.value, details: "read_back=" + promcp.FormatValue(s.value)}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, cs.cap.Timeout())
	defer cancel()
	r, err := v.Verify(ctx, value)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(err, drivers.ErrTimeout) {
			err = errors.Join(drivers.ErrTimeout, err)
		}
		if n.onDeviceErr != nil {
			n.onDeviceErr(cs.cap.Binding.Bus, err)
		}
		cs.outUnknown.Store(true)
		return readBackResult{}, fmt.Errorf("verify point %s: %w", r.Point, err)
	}
	// The verify point judged the command: applied, the output holds it
	// (the interlocks judge it on that); not, its value is unknown.
	if r.OK {
		now := time.Now()
		cs.remember(&sample{value: want, at: now, started: now.UnixNano()})
		cs.outUnknown.Store(false)
	} else {
		cs.outUnknown.Store(true)
	}
	d := "verify=" + r.Point + " shows " + promcp.FormatValue(r.Observed)
	if !r.OK {
		d += ", expected " + promcp.FormatValue(r.Expected)
	}
	return readBackResult{ok: r.OK, applied: want, verify: &r, details: d}, nil
}

// CodeCurrentValueUnreadable refuses an actuation whose max_change guard
// could not read the device's current value.
const CodeCurrentValueUnreadable = "current_value_unreadable"

// CodeMaxChange refuses an actuation whose step from the current value is
// larger than the policy's max_change.
const CodeMaxChange = "max_change_exceeded"

// checkStep is the max_change guard: the step from the current value
// (read just now by the actuator) to the value to write must not exceed
// max. A current value that is not a number cannot be checked: refused.
func checkStep(cs *capState, current, value any, max float64) *refusal {
	if max <= 0 {
		return nil
	}
	cur, okc := asFloat(current)
	v, okv := asFloat(value)
	if !okc || !okv {
		return &refusal{perm: promcp.PermSourceUnreachable, code: CodeCurrentValueUnreadable,
			reason:  "the max_change guard needs a numeric current value; the device reported " + promcp.FormatValue(current) + ". Nothing was written",
			details: "code=" + CodeCurrentValueUnreadable + "; guard=max_change"}
	}
	step := math.Abs(v - cur)
	if step <= max*(1+1e-12) {
		return nil
	}
	unit := cs.cap.Unit
	return &refusal{perm: promcp.PermOutOfRange, code: CodeMaxChange,
		reason: fmt.Sprintf("%s %s is %g %s away from the current value %s %s; %s moves at most %g %s in one actuation (max_change). "+
			"Nothing was written: check the value for a typo, or approach it in steps of at most %g",
			promcp.FormatValue(value), unit, step, unit, promcp.FormatValue(current), unit, cs.tool, max, unit, max),
		details: fmt.Sprintf("max_change=%g; current=%s; value=%s; step=%g", max, promcp.FormatValue(current), promcp.FormatValue(value), step)}
}

// readFirst is the instruction every partial answer ends with. It names a
// tool that exists: read_<name> when the manifest in force has that read
// capability, else can_do, whose candidate for this tool carries the
// device's current value (current_state) — a do_ capability alone has no
// read_ tool.
func (n *Node) readFirst(cs *capState) string {
	return n.lookFirst(cs) + ": a retry with the same idempotency_key returns this answer, a new key actuates again"
}

// lookFirst is readFirst without what a retry does.
func (n *Node) lookFirst(cs *capState) string {
	if rc, ok := n.bound().byTool["read_"+cs.cap.Name]; ok && rc.cap.Kind == manifest.KindRead {
		return "Read read_" + cs.cap.Name + " before acting again"
	}
	intent, _ := json.Marshal(map[string]any{"intent": map[string]any{"semantic_tags": cs.cap.SemanticTags}})
	return "Look before acting again: call can_do with " + string(intent) + "; its candidate " + cs.tool +
		" shows the device's current value (current_state)"
}

// writeDevice writes within the capability's timeout.
func (n *Node) writeDevice(ctx context.Context, cs *capState, value any) error {
	ctx, cancel := context.WithTimeout(ctx, cs.cap.Timeout())
	defer cancel()
	err := cs.point.Write(ctx, value)
	if err != nil && n.onDeviceErr != nil {
		n.onDeviceErr(cs.cap.Binding.Bus, err)
	}
	return err
}

// notApplied reports a write error after which the device certainly holds
// what it held before (drivers.Point's contract).
func notApplied(err error) bool {
	return errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) || errors.Is(err, drivers.ErrReadOnly)
}

// deviceRefusal turns a write the device rejected (or that never left)
// into a failed answer with the device's own code and fix.
func deviceRefusal(cs *capState, err error) *refusal {
	code, fix, ok := drivers.CodeOf(err)
	r := &refusal{perm: promcp.PermAllowed, code: code}
	switch {
	case ok:
		r.reason = "the device rejected the write, nothing changed: " + err.Error()
		if fix != "" && !strings.Contains(err.Error(), fix) {
			r.reason += "; fix: " + fix
		}
		r.details = "code=" + code
	case errors.Is(err, drivers.ErrOffline):
		r.perm, r.code = promcp.PermSourceUnreachable, "device_offline"
		r.reason = "the write could not reach the device, nothing changed: " + err.Error()
		r.details = "code=device_offline"
	default:
		r.code = "device_rejected"
		r.reason = "the device rejected the write, nothing changed: " + err.Error()
	}
	return r
}

// appendAudit appends to the audit trail and tracks its health: a failed
// append makes the node refuse actuations (auditReady) until an append
// succeeds again.
func (n *Node) appendAudit(build func(seq uint64) (*audit.Record, error)) (uint64, error) {
	seq, err := n.audit.AppendFunc(build)
	if err != nil {
		n.auditErr.Store(&err)
		n.log.Error("audit append failed", "err", err)
		return 0, err
	}
	n.auditErr.Store(nil)
	return seq, nil
}

// auditReady is nil while the audit trail can be written. After a failure
// it tries one append (an audit_check line) so the node recovers by itself
// once the cause is gone.
func (n *Node) auditReady() error {
	if p := n.auditErr.Load(); p == nil {
		return nil
	}
	_, err := n.appendAudit(func(uint64) (*audit.Record, error) {
		return &audit.Record{Event: "audit_check", Reason: "the audit trail works again after a failed append"}, nil
	})
	return err
}

// startActuation admits one device step unless shutdown has begun; the
// check and the count are one step, so Close never misses a step.
func (n *Node) startActuation() bool {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.closed || n.draining {
		return false
	}
	n.actuating.Add(1)
	return true
}

func (n *Node) endActuation() { n.actuating.Done() }

func (n *Node) closingNow() bool {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	return n.closed
}
