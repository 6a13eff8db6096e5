package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Driving an output to its safe value (manifest capabilities[].safe) is an
// actuation of its own (docs/safety.md):
//
//   - It takes the capability's turn like a do_, so it never interleaves
//     with a device step, and it runs while the process drains (a stop is
//     when shutdown outputs go safe) but not after Close.
//   - The manifest's range applies (the parser checked safe.value against
//     it); rate limits, cooldowns, approvals and the idempotency ledger do
//     not: nobody asked for it, and it must not be refusable by a busy
//     rate window.
//   - The device step is the do_'s: a best-effort previous read (a device
//     that cannot be read is still written: the write is what matters),
//     the write, settle_ms, the verifying read-back.
//   - Success is a verified read-back. Anything else leaves the output
//     failed: /readyz names it, an alarm stays raised, and the write is
//     retried with backoff (1 s doubling to 30 s) until it is verified or
//     a later do_ that applied supersedes it.
//   - Every attempt is one audit line (event safe_state) with the event,
//     the reason, the previous, requested and read-back values; MQTT
//     publishes it as the capability's do result.

// Safe-state states (SafeStatus.State).
const (
	SafeDriving = "driving" // the safe write is under way
	SafeReached = "safe"    // the read-back showed the safe value
	SafeFailed  = "failed"  // not verified: retried with backoff
	SafeCleared = "cleared" // a later do_ applied: the output is commanded again
)

// SafeStatus is the fail-safe state of one output: its last drive to safe,
// until a do_ that applied supersedes it.
type SafeStatus struct {
	Tool   string `json:"tool"`
	State  string `json:"state"`
	Event  string `json:"event"`
	Reason string `json:"reason"`
	// Value is the safe value; Previous what the device held before (nil
	// when it could not be read), ReadBack what the verifying read showed.
	Value    any       `json:"value"`
	Previous any       `json:"previous_value,omitempty"`
	ReadBack any       `json:"read_back,omitempty"`
	Since    time.Time `json:"since"` // when the event happened
	Verified time.Time `json:"verified_at,omitzero"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error,omitempty"`
	// NextRetry is when a failed drive is tried again.
	NextRetry time.Time `json:"next_retry,omitzero"`
	// TimeToSafeMS is from the event to the verified read-back.
	TimeToSafeMS int64  `json:"time_to_safe_ms,omitempty"`
	AuditSeq     uint64 `json:"audit_seq,omitempty"`
}

// Safe-drive retry backoff.
const (
	safeRetryFirst = time.Second
	safeRetryMax   = 30 * time.Second
)

// failSafe is the node's fail-safe state: the outputs' safe statuses and
// their active leases (lease.go), by tool. It lives beside the binding,
// not in it: a reload that keeps a capability keeps its lease and status.
type failSafe struct {
	mu     sync.Mutex
	status map[string]*SafeStatus
	// gen counts the applied do_ calls of a tool: a safe drive (or its
	// retry) begun before one of them does not overwrite it.
	gen    map[string]uint64
	retry  map[string]*time.Timer
	leases map[string]*lease
	// tripping: an interlock's drive of the tool is starting (interlocks.go).
	tripping map[string]bool
	closed   bool // Close: no retry or lease timer starts
}

func newFailSafe() failSafe {
	return failSafe{status: map[string]*SafeStatus{}, gen: map[string]uint64{}, retry: map[string]*time.Timer{}, leases: map[string]*lease{}, tripping: map[string]bool{}}
}

// SafeValue is the safe value of a do_ capability, decoded as a do_
// argument would be (nil when it declares none).
func SafeValue(c *manifest.Capability) (any, error) {
	if c.Safe == nil {
		return nil, nil
	}
	raw, err := json.Marshal(c.Safe.Value)
	if err != nil {
		return nil, err
	}
	return DecodeValue(c, raw)
}

// ErrNoSafeState is DriveSafe's error for a capability without safe.
var ErrNoSafeState = errors.New("the capability declares no safe state")

// DriveSafe drives tool's output to its safe value for event (one of
// manifest.SafeEvents) and returns the outcome. It waits for the
// capability's turn within ctx; the device step itself is bounded by the
// capability's timeouts. A drive that is not verified is retried in the
// background until it is (see failSafe).
func (n *Node) DriveSafe(ctx context.Context, tool, event, reason string) (SafeStatus, error) {
	return n.driveSafe(ctx, tool, event, reason, time.Now(), nil)
}

// DriveSafeAll drives every output whose safe.on lists event, each on its
// own goroutine (their turns and buses are independent), and returns the
// outcomes by tool once all have ended or ctx has.
func (n *Node) DriveSafeAll(ctx context.Context, event, reason string) []SafeStatus {
	var tools []string
	for _, cs := range n.bound().caps {
		if cs.cap.Kind == manifest.KindDo && cs.cap.Safe.Has(event) {
			tools = append(tools, cs.tool)
		}
	}
	return n.driveSafeTools(ctx, tools, event, reason)
}

func (n *Node) driveSafeTools(ctx context.Context, tools []string, event, reason string) []SafeStatus {
	out := make([]SafeStatus, len(tools))
	var wg sync.WaitGroup
	at := time.Now()
	for i, tool := range tools {
		wg.Go(func() {
			st, err := n.driveSafe(ctx, tool, event, reason, at, nil)
			if err != nil && st.Tool == "" {
				st = SafeStatus{Tool: tool, State: SafeFailed, Event: event, Reason: reason, Error: err.Error(), Since: at.UTC()}
			}
			out[i] = st
		})
	}
	wg.Wait()
	return out
}

// driveSafe is one attempt. still, when set, is checked under the turn:
// false means the reason to drive went away while waiting for it (a lease
// renewed), and nothing is done.
func (n *Node) driveSafe(ctx context.Context, tool, event, reason string, since time.Time, still func() bool) (SafeStatus, error) {
	for {
		st, err, redefined := n.driveSafeOnce(ctx, tool, event, reason, since, still)
		if !redefined {
			return st, err
		}
		// A reload redefined the capability while this drive waited for
		// its turn: the safe value of the definition in force is the one
		// to write, under that definition's turn.
	}
}

func (n *Node) driveSafeOnce(ctx context.Context, tool, event, reason string, since time.Time, still func() bool) (_ SafeStatus, _ error, redefined bool) {
	cs, err := n.capability(tool)
	if err != nil {
		return SafeStatus{}, err, false
	}
	value, err := SafeValue(cs.cap)
	if err != nil || cs.cap.Kind != manifest.KindDo || value == nil {
		return SafeStatus{}, fmt.Errorf("%s: %w", tool, ErrNoSafeState), false
	}
	// A drive that could not get the turn in time is retried like one the
	// device refused, unless the reason for it went away while it waited
	// (a do_ applied, a lease was renewed, the rule no longer holds).
	gen0 := n.genOf(tool)
	notRun := func(why string, err error) (SafeStatus, error, bool) {
		if n.genOf(tool) != gen0 || still != nil && !still() {
			return n.moot(cs, event), nil, false
		}
		st := n.safeNotRun(cs, event, reason, since, value, why)
		n.scheduleSafeRetry(tool, event, reason, since, still)
		return st, err, false
	}
	if err := cs.awaitPredecessors(ctx); err != nil {
		return notRun("an actuation of the previous manifest held the bus past the deadline ("+err.Error()+")", err)
	}
	select {
	case cs.act.turn <- struct{}{}:
	case <-ctx.Done():
		return notRun("another actuation of "+tool+" held the output past the deadline ("+ctx.Err().Error()+")", ctx.Err())
	}
	n.markStep(cs)
	defer func() { cs.stepSince.Store(0); <-cs.act.turn }()
	if still != nil && !still() {
		return n.moot(cs, event), nil, false
	}
	if n.bound().byTool[tool] != cs {
		return SafeStatus{}, nil, true
	}
	if !n.startSafeStep() {
		return n.safeNotRun(cs, event, reason, since, value, "physd has closed its buses"), ErrShuttingDown, false
	}
	defer n.endActuation()
	if cs.point == nil || !cs.bus.enter() {
		why := "the bus is closed"
		if cs.bindErr != nil {
			why = cs.bindErr.Error()
		}
		st := n.safeNotRun(cs, event, reason, since, value, "the device is unavailable: "+why)
		n.scheduleSafeRetry(cs.tool, event, reason, since, still)
		return st, nil, false
	}
	defer cs.bus.leave()

	gen := n.safeBegin(cs, event, reason, since, value)
	// Like a do_, the step is not abandoned when the caller's context ends
	// once the device may be touched.
	dctx := context.WithoutCancel(ctx)
	st := SafeStatus{Tool: tool, Event: event, Reason: reason, Value: value, Since: since.UTC()}
	if prev, err := n.readDevice(dctx, cs); err == nil {
		st.Previous = prev.value
	}
	status, verified, detail := promcp.StatusFailed, false, ""
	werr := n.writeDevice(dctx, cs, value)
	if werr != nil && notApplied(werr) {
		detail = "the write did not reach the device: " + werr.Error()
	} else {
		if cs.cap.SettleMS > 0 && werr == nil {
			t := time.NewTimer(time.Duration(cs.cap.SettleMS) * time.Millisecond)
			<-t.C
		}
		rb, rerr := n.readBack(dctx, cs, value, cs.expected(value))
		switch {
		case rerr != nil:
			status, detail = promcp.StatusPartial, "the verifying read-back failed: "+rerr.Error()
		case rb.ok:
			status, verified = promcp.StatusSuccess, true
			st.ReadBack = rb.applied
		default:
			status, detail = promcp.StatusPartial, "the read-back shows "+promcp.FormatValue(rb.value)+", not the safe value"
			st.ReadBack = rb.value
		}
		if werr != nil && !verified {
			detail = "the write reported " + werr.Error() + "; " + detail
		}
	}
	if verified {
		st.State, st.Verified = SafeReached, time.Now().UTC()
		st.TimeToSafeMS = time.Since(since).Milliseconds()
	} else {
		st.State, st.Error = SafeFailed, detail
	}
	st.AuditSeq = n.auditSafe(cs, st, status)
	n.safeEnd(cs, gen, st, still)
	return n.SafeStatusOf(tool), nil, false
}

// moot ends a drive whose reason went away before it ran: a failed
// earlier attempt of the same event stops counting (its retries, /readyz
// and the alarm end with it).
func (n *Node) moot(cs *capState, event string) SafeStatus {
	n.fs.mu.Lock()
	st := n.fs.status[cs.tool]
	var cp SafeStatus
	if st != nil && st.Event == event && st.State == SafeFailed {
		st.State, st.NextRetry = SafeCleared, time.Time{}
		cp = *st
		if t := n.fs.retry[cs.tool]; t != nil {
			t.Stop()
			delete(n.fs.retry, cs.tool)
		}
	}
	n.fs.mu.Unlock()
	if cp.Tool != "" {
		n.publishSafe(cs, cp)
	}
	return SafeStatus{Tool: cs.tool, State: SafeCleared, Event: event}
}

// startSafeStep admits a safe drive's device step: while draining (a stop
// drives its outputs safe) but not once Close began.
func (n *Node) startSafeStep() bool {
	n.lifeMu.Lock()
	defer n.lifeMu.Unlock()
	if n.closed {
		return false
	}
	n.actuating.Add(1)
	return true
}

// safeNotRun records an attempt that could not reach the device.
func (n *Node) safeNotRun(cs *capState, event, reason string, since time.Time, value any, why string) SafeStatus {
	st := SafeStatus{Tool: cs.tool, State: SafeFailed, Event: event, Reason: reason, Value: value, Since: since.UTC(), Error: why}
	st.AuditSeq = n.auditSafe(cs, st, promcp.StatusFailed)
	n.fs.mu.Lock()
	prev := n.fs.status[cs.tool]
	if prev != nil && prev.Event == event {
		st.Attempts = prev.Attempts
	}
	st.Attempts++
	cp := st
	n.fs.status[cs.tool] = &cp
	n.fs.mu.Unlock()
	n.publishSafe(cs, st)
	return st
}

// safeBegin marks the drive under way and returns the tool's do_
// generation it began under.
func (n *Node) safeBegin(cs *capState, event, reason string, since time.Time, value any) uint64 {
	n.fs.mu.Lock()
	attempts := 0
	if prev := n.fs.status[cs.tool]; prev != nil && prev.Event == event && prev.State != SafeCleared {
		attempts = prev.Attempts
	}
	st := &SafeStatus{Tool: cs.tool, State: SafeDriving, Event: event, Reason: reason, Value: value, Since: since.UTC(), Attempts: attempts}
	n.fs.status[cs.tool] = st
	gen := n.fs.gen[cs.tool]
	cp := *st
	n.fs.mu.Unlock()
	n.publishSafe(cs, cp)
	return gen
}

// safeEnd records the attempt's outcome: verified, the output's lease is
// over; not, a retry is scheduled.
func (n *Node) safeEnd(cs *capState, gen uint64, st SafeStatus, still func() bool) {
	n.fs.mu.Lock()
	if prev := n.fs.status[cs.tool]; prev != nil {
		st.Attempts = prev.Attempts
	}
	st.Attempts++
	if n.fs.gen[cs.tool] != gen {
		// A do_ applied while this drive ran (impossible under the turn,
		// kept so a future change cannot resurrect an old state).
		n.fs.mu.Unlock()
		return
	}
	cp := st
	n.fs.status[cs.tool] = &cp
	var endLease *lease
	if st.State == SafeReached {
		endLease = n.fs.leases[cs.tool]
		delete(n.fs.leases, cs.tool)
		if t := n.fs.retry[cs.tool]; t != nil {
			t.Stop()
			delete(n.fs.retry, cs.tool)
		}
	}
	n.fs.mu.Unlock()
	if endLease != nil {
		endLease.stop()
		n.forgetLease(cs.tool)
	}
	n.publishSafe(cs, st)
	if st.State == SafeFailed {
		n.scheduleSafeRetry(cs.tool, st.Event, st.Reason, st.Since, still)
	}
}

// scheduleSafeRetry tries a failed drive again after the backoff its
// attempts have earned, unless a do_ applies meanwhile, still (the drive's
// own condition, when it has one) no longer holds, or the node closes.
func (n *Node) scheduleSafeRetry(tool, event, reason string, since time.Time, still func() bool) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	st := n.fs.status[tool]
	if n.fs.closed || st == nil || st.State != SafeFailed {
		return
	}
	wait := safeRetryFirst
	for i := 1; i < st.Attempts && wait < safeRetryMax; i++ {
		wait *= 2
	}
	wait = min(wait, safeRetryMax)
	st.NextRetry = time.Now().Add(wait).UTC()
	gen := n.fs.gen[tool]
	if t := n.fs.retry[tool]; t != nil {
		t.Stop()
	}
	n.fs.retry[tool] = time.AfterFunc(wait, func() {
		n.fs.mu.Lock()
		stale := n.fs.closed || n.fs.gen[tool] != gen
		delete(n.fs.retry, tool)
		n.fs.mu.Unlock()
		if stale {
			return
		}
		cs, err := n.capability(tool)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), safeStepBound(cs.cap))
		defer cancel()
		_, _ = n.driveSafe(ctx, tool, event, reason, since, func() bool {
			return n.genOf(tool) == gen && (still == nil || still())
		})
	})
}

// genOf is tool's do_ generation (superseded bumps it).
func (n *Node) genOf(tool string) uint64 {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	return n.fs.gen[tool]
}

// safeStepBound bounds waiting for the turn and running one safe drive:
// three device accesses and the settle time, with a margin.
func safeStepBound(c *manifest.Capability) time.Duration {
	return 4*c.Timeout() + time.Duration(c.SettleMS)*time.Millisecond + time.Second
}

// superseded is called under the turn when a do_ applied (success or
// partial): the output is commanded again, so its safe state is over.
func (n *Node) superseded(cs *capState) {
	n.fs.mu.Lock()
	n.fs.gen[cs.tool]++
	st := n.fs.status[cs.tool]
	if t := n.fs.retry[cs.tool]; t != nil {
		t.Stop()
		delete(n.fs.retry, cs.tool)
	}
	var cp SafeStatus
	if st != nil && st.State != SafeCleared {
		st.State, st.NextRetry = SafeCleared, time.Time{}
		cp = *st
	}
	n.fs.mu.Unlock()
	if cp.Tool != "" {
		n.publishSafe(cs, cp)
	}
}

// SafeStatusOf is tool's fail-safe state (State empty: never driven).
func (n *Node) SafeStatusOf(tool string) SafeStatus {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if st := n.fs.status[tool]; st != nil {
		return *st
	}
	return SafeStatus{Tool: tool}
}

// SafeStatuses lists every output that was driven to safe, by tool.
func (n *Node) SafeStatuses() []SafeStatus {
	n.fs.mu.Lock()
	out := make([]SafeStatus, 0, len(n.fs.status))
	for _, st := range n.fs.status {
		out = append(out, *st)
	}
	n.fs.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Tool < out[j].Tool })
	return out
}

// safeReadiness is one /readyz check per output whose safe drive is not
// verified.
func (n *Node) safeReadiness() []Readiness {
	var out []Readiness
	for _, st := range n.SafeStatuses() {
		if st.State == SafeFailed || st.State == SafeDriving && st.Attempts > 0 {
			out = append(out, Readiness{Name: "safe:" + st.Tool, OK: false,
				Error: fmt.Sprintf("the %s drive to the safe value %s is not verified after %d attempt(s): %s; retried until it is, or until a do_ commands the output",
					st.Event, promcp.FormatValue(st.Value), st.Attempts, st.Error)})
		}
	}
	return out
}

// auditSafe writes one attempt's audit line (event safe_state).
func (n *Node) auditSafe(cs *capState, st SafeStatus, status promcp.Status) uint64 {
	seq, err := n.appendAudit(func(uint64) (*audit.Record, error) {
		d := map[string]any{"event": st.Event, "state": st.State, "attempt": st.Attempts + 1, "since": st.Since}
		if st.Error != "" {
			d["error"] = st.Error
		}
		if st.TimeToSafeMS > 0 {
			d["time_to_safe_ms"] = st.TimeToSafeMS
		}
		return &audit.Record{Event: "safe_state", Tool: cs.tool, Caller: "physd", Status: string(status),
			Requested: st.Value, Applied: st.ReadBack, Previous: st.Previous, Reason: st.Event + ": " + st.Reason, Data: d}, nil
	})
	if err != nil {
		n.log.Error("SAFE STATE NOT AUDITED", "tool", cs.tool, "event", st.Event, "err", err)
	}
	level := n.log.Warn
	if st.State == SafeFailed {
		level = n.log.Error
	}
	level("safe state "+st.State, "tool", cs.tool, "event", st.Event, "reason", st.Reason, "value", promcp.FormatValue(st.Value), "error", st.Error)
	return seq
}

// publishSafe puts a safe-state change on the observation stream (alarms,
// MQTT and the console follow it there).
func (n *Node) publishSafe(cs *capState, st SafeStatus) {
	if !n.obs.active() {
		return
	}
	n.obs.publish(Observed{Cap: cs.cap, At: time.Now(), Safe: &st})
}

// closeFailSafe stops retries and lease timers (Close).
func (n *Node) closeFailSafe() {
	n.fs.mu.Lock()
	n.fs.closed = true
	for tool, t := range n.fs.retry {
		t.Stop()
		delete(n.fs.retry, tool)
	}
	ls := make([]*lease, 0, len(n.fs.leases))
	for _, l := range n.fs.leases {
		ls = append(ls, l)
	}
	n.fs.mu.Unlock()
	for _, l := range ls {
		l.stop()
	}
	n.bp.mu.Lock()
	for _, b := range n.bp.m {
		b.timer.Stop()
	}
	n.bp.mu.Unlock()
}

// startFailSafe runs once the node is bound and its ledger recovered, before
// Open returns (so before anything is served): the outputs with
// start_after_crash go safe when the previous run did not stop cleanly, the
// recorded leases are armed again, and those that ran out while physd was
// down are driven safe.
func (n *Node) startFailSafe(ctx context.Context) error {
	expired, err := n.restoreLeases()
	if err != nil {
		return fmt.Errorf("lease records: %w", err)
	}
	driven := map[string]bool{}
	if rec := n.store.UncleanStop(); rec != nil {
		reason := "the previous run did not stop cleanly (its run marker is still in the state directory"
		if rec.PID != 0 {
			reason += fmt.Sprintf(": pid %d, started %s", rec.PID, rec.Started.Format(time.RFC3339))
		}
		reason += "): what the outputs did since is unknown"
		for _, st := range n.DriveSafeAll(ctx, manifest.SafeOnStartAfterCrash, reason) {
			driven[st.Tool] = true
		}
	}
	for _, l := range expired {
		if driven[l.Tool] {
			continue
		}
		reason := fmt.Sprintf("the lease of %s (value %s, key %s, held %d s) ran out at %s while physd was not running",
			l.Tool, promcp.FormatValue(l.Value), l.Key, l.HoldS, l.ExpiresAt.Format(time.RFC3339))
		_, _ = n.driveSafe(ctx, l.Tool, manifest.SafeOnLeaseExpiry, reason, l.ExpiresAt, nil)
	}
	return nil
}

// reconcileFailSafe drops, after a reload, the leases and safe states of
// outputs the manifest in force no longer gives them: a removed
// capability, or one whose lease or safe state the reload took away. Their
// timers stop, their records go, /readyz stops naming them.
func (n *Node) reconcileFailSafe(b *binding) {
	n.fs.mu.Lock()
	var ends []string
	for tool := range n.fs.leases {
		if cs := b.byTool[tool]; cs == nil || cs.cap.Lease == nil || cs.cap.Safe == nil {
			ends = append(ends, tool)
		}
	}
	for tool, st := range n.fs.status {
		if cs := b.byTool[tool]; cs == nil || cs.cap.Safe == nil {
			if t := n.fs.retry[tool]; t != nil {
				t.Stop()
				delete(n.fs.retry, tool)
			}
			delete(n.fs.status, tool)
			n.log.Warn("a reload removed the safe state of "+tool+"; its drive to safe is no longer tracked", "state", st.State, "event", st.Event)
		}
	}
	n.fs.mu.Unlock()
	for _, tool := range ends {
		n.log.Warn("a reload removed the lease terms of "+tool+"; its lease ends without a drive to safe", "tool", tool)
		n.endLease(tool)
	}
}

// DriveSafeAllUntil is DriveSafeAll for a stop: a drive that is not
// verified is tried again (100 ms, doubling to 1 s) until it is or ctx
// ends, since no background retry outlives the process.
func (n *Node) DriveSafeAllUntil(ctx context.Context, event, reason string) []SafeStatus {
	out := n.DriveSafeAll(ctx, event, reason)
	wait := 100 * time.Millisecond
	for {
		var again []string
		for _, st := range out {
			if st.State == SafeFailed {
				again = append(again, st.Tool)
			}
		}
		if len(again) == 0 {
			return out
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return out
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
		byTool := map[string]SafeStatus{}
		for _, st := range n.driveSafeTools(ctx, again, event, reason) {
			byTool[st.Tool] = st
		}
		for i, st := range out {
			if r, ok := byTool[st.Tool]; ok {
				out[i] = r
			}
		}
	}
}
