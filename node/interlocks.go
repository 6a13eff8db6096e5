package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// The policy's interlocks (package interlock) on the node:
//
//   - Every do_ is judged under its capability's turn, right before the
//     pending ledger commit: the reading the decision rests on and the
//     actuation are one step (a condition that starts to hold while the
//     call waited for its turn is seen). A stale or missing cached reading
//     is read from the device first, within the call's deadline.
//   - can_do judges the same way (a dry run that says allowed is allowed,
//     unless the plant changes in between).
//   - The plant is watched: every device read of a condition's capability
//     judges the outputs of its rules against their current values, and
//     a tick each second catches readings that went stale. A broken rule
//     drives the output to its safe value (event interlock_trip).
//
// Safe drives are never judged: a safe value keeps every rule (the policy
// parser checks it).

// InterlockSource is implemented by guards that carry the policy's
// interlocks (guard.Guard): a policy reload swaps them.
type InterlockSource interface {
	Interlocks() *interlock.Set
}

// interlocks are the rules in force (nil without a policy that has some).
func (n *Node) interlocks() *interlock.Set {
	if s, ok := n.guard.(InterlockSource); ok {
		return s.Interlocks()
	}
	return nil
}

// interlockTick is how often the rules are judged without a new reading.
const interlockTick = time.Second

// cachedReading is a condition's reading from the cache: no device access.
func (n *Node) cachedReading(tool string) interlock.Reading {
	if isRemoteKey(tool) {
		return n.remoteReading(tool)
	}
	cs := n.bound().byTool[tool]
	if cs == nil {
		return interlock.Reading{Error: tool + " is not a capability of the manifest in force"}
	}
	s := cs.last.Load()
	var rerr error
	if p := cs.lastErr.Load(); p != nil {
		rerr = *p
	}
	if s == nil {
		r := interlock.Reading{}
		if rerr != nil {
			r.Error = rerr.Error()
		}
		return r
	}
	o := n.observation(cs, s, false, rerr)
	r := interlock.Reading{Known: o.Value != nil, Value: o.Value, Quality: o.Quality, Age: time.Since(s.at)}
	if rerr != nil {
		r.Error = rerr.Error()
	}
	return r
}

// liveReading is the cached reading when it is good and within maxAge,
// else the device's (a shared read, within ctx).
func (n *Node) liveReading(ctx context.Context, tool string, maxAge time.Duration) interlock.Reading {
	r := n.cachedReading(tool)
	if r.Known && r.Quality == promcp.QualityGood && r.Age <= maxAge {
		return r
	}
	if isRemoteKey(tool) {
		source, read, _ := strings.Cut(tool, "/")
		n.fetchRemote(ctx, interlock.RemoteReading{Source: source, Read: read, MaxAge: maxAge})
		return n.cachedReading(tool)
	}
	cs := n.bound().byTool[tool]
	if cs == nil || cs.point == nil {
		return r
	}
	_, _ = n.refresh(ctx, cs)
	return n.cachedReading(tool)
}

// checkInterlocks judges value for cs: nil, or the refusal naming the rule.
func (n *Node) checkInterlocks(ctx context.Context, cs *capState, value any) *refusal {
	set := n.interlocks()
	if len(set.On(cs.tool)) == 0 {
		return nil
	}
	safe := cs.safe
	v := set.Check(interlock.Output{Tool: cs.tool, Safe: safe, Value: value, Known: true}, func(tool string, maxAge time.Duration) interlock.Reading {
		return n.liveReading(ctx, tool, maxAge)
	}, n.bypassed)
	if v == nil {
		return nil
	}
	return &refusal{perm: promcp.PermPolicyDenied, code: interlock.Code, details: v.Details(),
		reason: v.Reason() + ". Nothing was actuated: the rule allows the safe value " + promcp.FormatValue(safe) + ", or retry once the condition has changed"}
}

// afterRead judges the rules whose condition reads cs (every device read
// of it, good or not).
func (n *Node) afterRead(cs *capState) {
	set := n.interlocks()
	if set.Len() == 0 {
		return
	}
	if rules := set.Reading(cs.tool); len(rules) > 0 {
		n.judgePlant(rules)
	}
}

// judgePlant judges each rule's outputs at their current values and drives
// the ones that break a rule to safe. A reading never taken is not judged
// until the rule's max_age has passed since its capability was bound (a
// start or a reload: the first polls come in).
func (n *Node) judgePlant(rules []*interlock.Rule) {
	b := n.bound()
	for _, r := range rules {
		if n.bypassed(r) {
			continue
		}
		reading := n.cachedReading(r.Cond.Key())
		if !reading.Known && time.Since(n.firstReadingFrom(r.Cond.Key())) < r.MaxAge {
			continue // the first reading has not had its chance yet
		}
		for _, tool := range r.Outputs {
			cs := b.byTool[tool]
			if cs == nil || cs.cap.Kind != manifest.KindDo {
				continue
			}
			if v := r.Judge(n.outputNow(cs), reading); v != nil {
				n.trip(cs, v)
			}
		}
	}
}

// trip drives cs safe for v unless a drive of it is under way or retrying.
func (n *Node) trip(cs *capState, v *interlock.Violation) {
	n.fs.mu.Lock()
	if n.fs.closed || n.fs.tripping[cs.tool] {
		n.fs.mu.Unlock()
		return
	}
	// A drive under way will be judged again under the turn; a trip
	// already retrying keeps its own backoff. A drive of another event
	// that is waiting out its backoff does not delay the trip.
	if st := n.fs.status[cs.tool]; st != nil && (st.State == SafeDriving || st.State == SafeFailed && st.Event == manifest.SafeOnInterlockTrip) {
		n.fs.mu.Unlock()
		return
	}
	n.fs.tripping[cs.tool] = true
	n.fs.mu.Unlock()
	go func() {
		defer func() {
			n.fs.mu.Lock()
			delete(n.fs.tripping, cs.tool)
			n.fs.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), safeStepBound(cs.cap))
		defer cancel()
		reason := v.Reason()
		// Under the turn, the rule in force by that name is judged again on
		// the output's value then: a do_ that won the turn may have made it
		// safe already, and a policy reload may have changed or removed it.
		_, _ = n.driveSafe(ctx, cs.tool, manifest.SafeOnInterlockTrip, reason, time.Now(), func() bool {
			r := n.ruleNamed(v.Rule.Name)
			if r == nil || n.bypassed(r) {
				return false
			}
			return r.Judge(n.outputNow(cs), n.cachedReading(r.Cond.Key())) != nil
		})
	}()
}

// firstReadingFrom is when a condition's reading could first come in: its
// capability's binding (a start, or a reload that redefined it), or the
// node's start for another gateway's reading.
func (n *Node) firstReadingFrom(key string) time.Time {
	if cs := n.bound().byTool[key]; cs != nil {
		return cs.bound
	}
	return n.born
}

// ruleNamed is the rule in force with that name, or nil.
func (n *Node) ruleNamed(name string) *interlock.Rule {
	for _, r := range n.interlocks().Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// outputNow is an output's value as the rules judge it: the last value
// the device showed (a read, a verified write), unknown after a write
// whose outcome nobody saw.
func (n *Node) outputNow(cs *capState) interlock.Output {
	safe := cs.safe
	out := interlock.Output{Tool: cs.tool, Safe: safe}
	if s := cs.last.Load(); s != nil && !cs.outUnknown.Load() {
		out.Value, out.Known = s.value, true
	}
	return out
}

// superviseInterlocks judges every rule each tick until Close.
func (n *Node) superviseInterlocks() {
	defer n.polls.Done()
	t := time.NewTicker(interlockTick)
	defer t.Stop()
	for {
		select {
		case <-n.stopPoll:
			return
		case <-t.C:
		}
		if set := n.interlocks(); set.Len() > 0 {
			n.judgePlant(set.Rules)
		}
	}
}

// interlockNotes are can_do's view of the rules on an output: each rule
// with its condition's reading now.
func (n *Node) interlockNotes(cs *capState) []promcp.InterlockNote {
	rules := n.interlocks().On(cs.tool)
	if len(rules) == 0 {
		return nil
	}
	out := make([]promcp.InterlockNote, 0, len(rules))
	for _, r := range rules {
		out = append(out, n.interlockNote(r))
	}
	return out
}

// interlockNote is r with its condition's reading now and its bypass.
func (n *Node) interlockNote(r *interlock.Rule) promcp.InterlockNote {
	rd := n.cachedReading(r.Cond.Key())
	note := promcp.InterlockNote{Name: r.Name, Kind: string(r.Kind), Condition: r.Cond.String(), Reading: rd.String()}
	if r.Max != nil || r.Min != nil {
		note.Bound = fmt.Sprintf("%s while %s", boundOf(r), r.Cond)
	}
	for _, b := range n.Bypasses() {
		if b.Rule == r.Name && b.State == BypassActive {
			until := b.Until
			note.BypassedUntil, note.BypassedBy = &until, b.RequestedBy.ID+" and "+b.ApprovedBy.ID
		}
	}
	return note
}

func boundOf(r *interlock.Rule) string {
	switch {
	case r.Max != nil && r.Min != nil:
		return fmt.Sprintf("%g..%g", *r.Min, *r.Max)
	case r.Max != nil:
		return fmt.Sprintf("at most %g", *r.Max)
	}
	return fmt.Sprintf("at least %g", *r.Min)
}
