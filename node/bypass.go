package node

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/interlock"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
)

// Bypasses lift a permissive or an interlock for a while under the
// two-person rule (policy interlocks[].bypass; a trip has none): one person
// asks (RequestBypass) with a reason and a duration within the rule's
// max_minutes, another person approves (ApproveBypass), both with at least
// the rule's bypass role. While it is in force the rule is not judged —
// not on do_, not in can_do, not on the plant — and everything that shows
// the rule shows the bypass. It ends by itself (the rule is judged on the
// plant at once), or when someone ends it; a request nobody approves
// lapses after bypassRequestTTL. Bypasses live in memory: a restart ends
// them all, which is the safe direction. Every step is audited.

// bypassRequestTTL is how long a bypass request waits for its approver.
const bypassRequestTTL = 10 * time.Minute

// Bypass states.
const (
	BypassPending = "pending"
	BypassActive  = "active"
)

// Bypass is one rule's bypass, asked for or in force.
type Bypass struct {
	Rule        string    `json:"rule"`
	State       string    `json:"state"`
	Reason      string    `json:"reason"`
	For         string    `json:"for"` // the duration asked for
	RequestedBy Caller    `json:"requested_by"`
	RequestedAt time.Time `json:"requested_at"`
	ApprovedBy  *Caller   `json:"approved_by,omitempty"`
	// Until is when a pending request lapses, or an active bypass ends.
	Until time.Time `json:"until"`

	dur   time.Duration
	timer *time.Timer
}

type bypasses struct {
	mu sync.Mutex
	m  map[string]*Bypass
}

// ErrBypass is the class of a refused bypass step (the message says why).
var ErrBypass = errors.New("bypass refused")

func bypassErr(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrBypass, fmt.Sprintf(format, a...))
}

// bypassRule is the rule in force with that name and its bypass terms.
func (n *Node) bypassRule(name string) (*interlock.Rule, error) {
	for _, r := range n.interlocks().Rules {
		if r.Name == name {
			if r.Bypass == nil {
				return nil, bypassErr("%s %s has no bypass: terms in the policy (interlocks[].bypass); a trip can never be bypassed", r.Kind, name)
			}
			return r, nil
		}
	}
	return nil, bypassErr("no interlock %q in the policy in force", name)
}

// RequestBypass asks for rule's bypass for d; another person must approve.
func (n *Node) RequestBypass(rule string, d time.Duration, reason string, by Caller) (Bypass, error) {
	r, err := n.bypassRule(rule)
	if err != nil {
		return Bypass{}, err
	}
	switch {
	case policy.RoleLevel(by.Role) < policy.RoleLevel(r.Bypass.Role):
		return Bypass{}, bypassErr("bypassing %s needs the %s role; %s has %s", rule, r.Bypass.Role, by.ID, by.Role)
	case d <= 0 || d > r.Bypass.Max:
		return Bypass{}, bypassErr("the duration must be more than 0 and at most %v (the rule's bypass.max_minutes)", r.Bypass.Max)
	case reason == "":
		return Bypass{}, bypassErr("say why: a bypass needs a reason")
	}
	now := time.Now()
	b := &Bypass{Rule: rule, State: BypassPending, Reason: reason, For: d.String(), RequestedBy: by, RequestedAt: now.UTC(), Until: now.Add(bypassRequestTTL).UTC(), dur: d}
	n.bp.mu.Lock()
	if old := n.bp.m[rule]; old != nil && old.State == BypassActive {
		n.bp.mu.Unlock()
		return Bypass{}, bypassErr("%s is already bypassed until %s", rule, old.Until.Format(time.RFC3339))
	}
	if old := n.bp.m[rule]; old != nil && old.timer != nil {
		old.timer.Stop()
	}
	n.bp.m[rule] = b
	b.timer = time.AfterFunc(bypassRequestTTL, func() { n.endBypass(rule, b, "the request was not approved within "+bypassRequestTTL.String()) })
	cp := *b
	n.bp.mu.Unlock()
	n.auditBypass("interlock_bypass_requested", cp, "")
	return cp, nil
}

// ApproveBypass puts rule's pending bypass in force; by must be another
// person than the one who asked, with the rule's bypass role.
func (n *Node) ApproveBypass(rule string, by Caller) (Bypass, error) {
	r, err := n.bypassRule(rule)
	if err != nil {
		return Bypass{}, err
	}
	if policy.RoleLevel(by.Role) < policy.RoleLevel(r.Bypass.Role) {
		return Bypass{}, bypassErr("approving a bypass of %s needs the %s role; %s has %s", rule, r.Bypass.Role, by.ID, by.Role)
	}
	n.bp.mu.Lock()
	b := n.bp.m[rule]
	switch {
	case b == nil || b.State != BypassPending:
		n.bp.mu.Unlock()
		return Bypass{}, bypassErr("no bypass of %s is waiting for approval", rule)
	case n.samePerson(b.RequestedBy, by):
		n.bp.mu.Unlock()
		n.auditBypass("interlock_bypass_refused", *b, "the approver is the person who asked (two-person rule)")
		return Bypass{}, bypassErr("the bypass of %s needs another person than the one who asked (%s)", rule, b.RequestedBy.ID)
	}
	b.timer.Stop()
	approver := by
	b.State, b.ApprovedBy, b.Until = BypassActive, &approver, time.Now().Add(b.dur).UTC()
	b.timer = time.AfterFunc(b.dur, func() { n.endBypass(rule, b, "its time ran out") })
	cp := *b
	n.bp.mu.Unlock()
	n.auditBypass("interlock_bypass_approved", cp, "")
	return cp, nil
}

// EndBypass ends rule's bypass (pending or active) before its time.
func (n *Node) EndBypass(rule string, by Caller) error {
	n.bp.mu.Lock()
	b := n.bp.m[rule]
	n.bp.mu.Unlock()
	if b == nil {
		return bypassErr("no bypass of %s", rule)
	}
	n.endBypass(rule, b, "ended by "+by.ID)
	return nil
}

// endBypass removes b (if it is still rule's) and judges the rule on the
// plant at once.
func (n *Node) endBypass(rule string, b *Bypass, why string) {
	n.bp.mu.Lock()
	if n.bp.m[rule] != b {
		n.bp.mu.Unlock()
		return
	}
	delete(n.bp.m, rule)
	b.timer.Stop()
	cp := *b
	n.bp.mu.Unlock()
	n.auditBypass("interlock_bypass_ended", cp, why)
	for _, r := range n.interlocks().Rules {
		if r.Name == rule {
			n.judgePlant([]*interlock.Rule{r})
		}
	}
}

// bypassed reports whether r is bypassed now.
func (n *Node) bypassed(r *interlock.Rule) bool {
	n.bp.mu.Lock()
	defer n.bp.mu.Unlock()
	b := n.bp.m[r.Name]
	return b != nil && b.State == BypassActive && time.Now().Before(b.Until) && r.Bypass != nil
}

// Bypasses lists the bypasses asked for and in force.
func (n *Node) Bypasses() []Bypass {
	n.bp.mu.Lock()
	out := make([]Bypass, 0, len(n.bp.m))
	for _, b := range n.bp.m {
		out = append(out, *b)
	}
	n.bp.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Rule < out[j].Rule })
	return out
}

// samePerson decides the two-person rule on credentials (the policy's
// people when the guard knows them).
func (n *Node) samePerson(a, b Caller) bool {
	if sp, ok := n.guard.(interface{ SamePerson(a, b []string) bool }); ok {
		return sp.SamePerson(a.Credentials, b.Credentials)
	}
	for _, x := range a.Credentials {
		for _, y := range b.Credentials {
			if x == y {
				return true
			}
		}
	}
	return len(a.Credentials) == 0 && len(b.Credentials) == 0 && a.ID == b.ID
}

func (n *Node) auditBypass(event string, b Bypass, why string) {
	_, err := n.appendAudit(func(uint64) (*audit.Record, error) {
		d := map[string]any{"rule": b.Rule, "state": b.State, "for": b.For, "until": b.Until, "requested_by": b.RequestedBy.ID}
		if b.ApprovedBy != nil {
			d["approved_by"] = b.ApprovedBy.ID
			d["approver_credentials"] = b.ApprovedBy.Credentials
		}
		reason := b.Reason
		if why != "" {
			reason = why + " (" + b.Reason + ")"
		}
		return &audit.Record{Event: event, Caller: b.RequestedBy.ID, Credentials: b.RequestedBy.Credentials, Reason: reason, Data: d}, nil
	})
	if err != nil {
		n.log.Error("bypass not audited", "rule", b.Rule, "event", event, "err", err)
	}
	n.log.Warn(event, "rule", b.Rule, "state", b.State, "until", b.Until, "reason", b.Reason, "why", why)
}

// InterlockState is one rule in force as operators see it.
type InterlockState struct {
	promcp.InterlockNote
	Outputs []string `json:"outputs"`
	// Bypass is the rule's bypass asked for or in force.
	Bypass *Bypass `json:"bypass,omitempty"`
	// Bypassable: the policy gives the rule bypass terms.
	Bypassable bool `json:"bypassable"`
}

// InterlockStates lists the policy's rules in force, each with its
// condition's reading now and its bypass.
func (n *Node) InterlockStates() []InterlockState {
	rules := n.interlocks()
	if rules.Len() == 0 {
		return []InterlockState{}
	}
	byRule := map[string]Bypass{}
	for _, b := range n.Bypasses() {
		byRule[b.Rule] = b
	}
	out := make([]InterlockState, 0, rules.Len())
	for _, r := range rules.Rules {
		st := InterlockState{InterlockNote: n.interlockNote(r), Outputs: r.Outputs, Bypassable: r.Bypass != nil}
		if b, ok := byRule[r.Name]; ok {
			st.Bypass = &b
		}
		out = append(out, st)
	}
	return out
}
