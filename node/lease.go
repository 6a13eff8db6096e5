package node

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// Leases are a dead-man for agents (manifest capabilities[].lease,
// docs/safety.md). A do_ on a capability with a lease holds its value for
// hold_s seconds (the argument; lease.default_s without one; at most
// lease.max_s); a later do_ that applies starts a new hold (renewing with
// the same value is such a do_); when the hold runs out the output is
// driven to its safe value (event lease_expiry).
//
//   - In the process a hold is timed by the monotonic clock (a wall-clock
//     step neither shortens nor extends it): one timer per active lease.
//   - The lease record (value, key, hold, expiry as wall time) is written
//     in the same bbolt commit as the do_'s pending ledger entry, before
//     the device is touched: a crash after the write cannot leave an output
//     held with no lease on record. A do_ refused after that gives the
//     previous record back in the commit that forgets its key.
//   - A restart arms each recorded lease for what is left of it, never
//     for more than its hold (a clock set backwards does not lengthen it);
//     one that ran out while physd was down is driven safe before Open
//     returns, so before any call is served.
//   - A do_ that writes the safe value and is verified ends the lease; a
//     partial one keeps it (the output may still hold the earlier value).

// leaseBucket is the store bucket of the lease records, by tool.
const leaseBucket = "leases"

// lease is one active hold.
type lease struct {
	Tool      string    `json:"tool"`
	Value     any       `json:"value"`
	Key       string    `json:"idempotency_key"`
	HoldS     int       `json:"hold_s"`
	ExpiresAt time.Time `json:"expires_at"`

	timer *time.Timer
}

func (l *lease) stop() {
	if l != nil && l.timer != nil {
		l.timer.Stop()
	}
}

// Lease is an active lease, as can_do and /status show it.
type Lease struct {
	Tool           string    `json:"tool"`
	Value          any       `json:"value"`
	IdempotencyKey string    `json:"idempotency_key"`
	HoldS          int       `json:"hold_s"`
	ExpiresAt      time.Time `json:"expires_at"`
	// Expired: the hold ran out and the drive to safe is not verified yet.
	Expired bool `json:"expired,omitempty"`
}

// holdOf checks a do_'s hold_s against the capability's lease terms and
// returns the hold (0 for a capability without a lease).
func holdOf(c *manifest.Capability, tool string, holdS int) (time.Duration, error) {
	if c.Lease == nil {
		if holdS != 0 {
			return 0, &InputError{Field: "hold_s", Msg: tool + " declares no lease (manifest lease:), so it holds no value for a time: leave hold_s out"}
		}
		return 0, nil
	}
	switch {
	case holdS == 0:
		return c.Lease.Default(), nil
	case holdS < 0 || holdS > c.Lease.MaxS:
		return 0, &InputError{Field: "hold_s", Msg: fmt.Sprintf("%d is outside 1..%d (lease.max_s of %s): ask for at most %d s and renew before it runs out",
			holdS, c.Lease.MaxS, tool, c.Lease.MaxS)}
	}
	return time.Duration(holdS) * time.Second, nil
}

// leaseStep is what a do_ of a leased capability writes with its pending
// ledger entry, and what it gives back if the device step is refused.
type leaseStep struct {
	next    *lease   // the lease the do_ starts (nil: it writes the safe value)
	begin   store.KV // written with the pending entry
	restore store.KV // written with Forget when nothing was applied
}

// planLease is called under the turn, before store.Begin.
func (n *Node) planLease(cs *capState, value any, key string, hold time.Duration, now time.Time) *leaseStep {
	if cs.cap.Lease == nil {
		return nil
	}
	n.fs.mu.Lock()
	cur := n.fs.leases[cs.tool]
	n.fs.mu.Unlock()
	st := &leaseStep{restore: store.KV{Bucket: leaseBucket, Key: cs.tool}}
	if cur != nil {
		st.restore.Value, _ = json.Marshal(cur)
	}
	if safe := cs.safe; safe != nil && cs.matches(value, safe) {
		// The safe value needs no hold. Its record stays until the write
		// is verified (applyLease): a crash in between leaves the old
		// lease to run out, which drives the output safe again.
		st.begin = st.restore
		return st
	}
	st.next = &lease{Tool: cs.tool, Value: value, Key: key, HoldS: int(hold / time.Second), ExpiresAt: now.Add(hold).UTC()}
	raw, _ := json.Marshal(st.next)
	st.begin = store.KV{Bucket: leaseBucket, Key: cs.tool, Value: raw}
	return st
}

// applyLease puts the do_'s lease in force once the device step applied
// (status success or partial) and returns its expiry for the answer.
func (n *Node) applyLease(cs *capState, st *leaseStep, status promcp.Status) *time.Time {
	if st == nil {
		return nil
	}
	if st.next == nil {
		if status == promcp.StatusSuccess {
			n.endLease(cs.tool)
		}
		return nil
	}
	n.armLease(st.next, time.Until(st.next.ExpiresAt))
	at := st.next.ExpiresAt
	return &at
}

// armLease starts l's timer for d and replaces the tool's lease.
func (n *Node) armLease(l *lease, d time.Duration) {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	if n.fs.closed {
		return
	}
	n.fs.leases[l.Tool].stop()
	n.fs.leases[l.Tool] = l
	l.timer = time.AfterFunc(max(d, 0), func() { n.leaseExpired(l) })
}

// endLease ends the tool's lease, in memory and on record.
func (n *Node) endLease(tool string) {
	n.fs.mu.Lock()
	l := n.fs.leases[tool]
	delete(n.fs.leases, tool)
	n.fs.mu.Unlock()
	l.stop()
	n.forgetLease(tool)
}

func (n *Node) forgetLease(tool string) {
	if err := n.store.Put(leaseBucket, tool, nil); err != nil {
		n.log.Error("lease record not removed (the next start drives the output safe when it runs out)", "tool", tool, "err", err)
	}
}

// leaseExpired drives the output safe, unless a do_ replaced the lease
// while this waited for the capability's turn.
func (n *Node) leaseExpired(l *lease) {
	current := func() bool {
		n.fs.mu.Lock()
		defer n.fs.mu.Unlock()
		return n.fs.leases[l.Tool] == l && !n.fs.closed
	}
	if !current() {
		return
	}
	cs, err := n.capability(l.Tool)
	if err != nil {
		n.endLease(l.Tool)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), safeStepBound(cs.cap))
	defer cancel()
	reason := fmt.Sprintf("the lease of %s (value %s, key %s, held %d s) ran out at %s with no renewal",
		l.Tool, promcp.FormatValue(l.Value), l.Key, l.HoldS, l.ExpiresAt.Format(time.RFC3339))
	_, _ = n.driveSafe(ctx, l.Tool, manifest.SafeOnLeaseExpiry, reason, l.ExpiresAt, current)
}

// Leases lists the active leases, by tool.
func (n *Node) Leases() []Lease {
	n.fs.mu.Lock()
	out := make([]Lease, 0, len(n.fs.leases))
	now := time.Now()
	for _, l := range n.fs.leases {
		out = append(out, Lease{Tool: l.Tool, Value: l.Value, IdempotencyKey: l.Key, HoldS: l.HoldS, ExpiresAt: l.ExpiresAt, Expired: !now.Before(l.ExpiresAt)})
	}
	n.fs.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Tool < out[j].Tool })
	return out
}

// LeaseOf is tool's active lease, or nil.
func (n *Node) LeaseOf(tool string) *Lease {
	n.fs.mu.Lock()
	defer n.fs.mu.Unlock()
	l := n.fs.leases[tool]
	if l == nil {
		return nil
	}
	return &Lease{Tool: l.Tool, Value: l.Value, IdempotencyKey: l.Key, HoldS: l.HoldS, ExpiresAt: l.ExpiresAt, Expired: !time.Now().Before(l.ExpiresAt)}
}

// restoreLeases arms the recorded leases after a start and returns the
// tools whose lease ran out while physd was down.
func (n *Node) restoreLeases() ([]*lease, error) {
	recs, err := n.store.All(leaseBucket)
	if err != nil {
		return nil, err
	}
	var expired []*lease
	now := time.Now()
	for tool, raw := range recs {
		var l lease
		cs, ok := n.bound().byTool[tool]
		if json.Unmarshal(raw, &l) != nil || !ok || cs.cap.Lease == nil || l.Tool != tool {
			n.log.Warn("dropping a lease record the manifest in force has no leased capability for", "tool", tool)
			n.forgetLease(tool)
			continue
		}
		left := min(l.ExpiresAt.Sub(now), time.Duration(l.HoldS)*time.Second)
		if end := now.Add(left).UTC(); left > 0 && end.Before(l.ExpiresAt) {
			// The record ends further out than its hold allows (the clock
			// was set back): it ends a hold from now, and the record says
			// so, so that another restart does not grant a new hold.
			l.ExpiresAt = end
			if raw, err := json.Marshal(&l); err == nil {
				if err := n.store.Put(leaseBucket, tool, raw); err != nil {
					n.log.Error("lease record not corrected", "tool", tool, "err", err)
				}
			}
		}
		if left <= 0 {
			lc := l
			n.fs.mu.Lock()
			n.fs.leases[tool] = &lc
			n.fs.mu.Unlock()
			expired = append(expired, &lc)
			continue
		}
		n.armLease(&l, left)
		n.log.Info("lease restored", "tool", tool, "value", promcp.FormatValue(l.Value), "left", left.Round(time.Second))
	}
	sort.Slice(expired, func(i, j int) bool { return expired[i].Tool < expired[j].Tool })
	return expired, nil
}

// failSafeNote is can_do's view of an output's safe state and lease.
func (n *Node) failSafeNote(cs *capState) *promcp.FailSafe {
	c := cs.cap
	if c.Kind != manifest.KindDo || c.Safe == nil {
		return nil
	}
	fs := &promcp.FailSafe{SafeValue: cs.safe, On: c.Safe.On}
	if c.Lease != nil {
		fs.Lease = &promcp.LeaseTerms{DefaultS: c.Lease.DefaultS, MaxS: c.Lease.MaxS}
		if l := n.LeaseOf(cs.tool); l != nil {
			fs.Lease.Active = &promcp.ActiveLease{Value: l.Value, IdempotencyKey: l.IdempotencyKey, ExpiresAt: l.ExpiresAt}
		}
	}
	fs.Interlocks = n.interlockNotes(cs)
	if st := n.SafeStatusOf(cs.tool); st.State != "" && st.State != SafeCleared {
		since := st.Since
		fs.State, fs.Event, fs.Since, fs.Error = st.State, st.Event, &since, st.Error
	}
	return fs
}
