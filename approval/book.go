package approval

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/physd/physd/policy"
)

// The book of two-person requests. The caller's do_ registers a request
// (Register) and is answered approval_pending at once: nothing is held (no
// lock, no rate slot) while a person decides. An approver decides it
// (Decide); the caller's repeated call takes the decision (Take) and
// redeems its grant. The book is in memory: a restart forgets pending
// requests (fail-safe: the caller asks again); a grant already given
// survives a restart only as the token the caller holds (with a key set by
// PHYSD_APPROVAL_KEY), and is checked like any other.

// Bounds of the book.
const (
	MaxPending          = 256
	MaxPendingPerPerson = 32
)

// Request states.
const (
	StatePending  = "pending"
	StateApproved = "approved"
	StateDenied   = "denied"
	StateVoid     = "void"
)

// Request is one call waiting for, or decided by, another person: what
// the approver is shown and what a grant binds to.
type Request struct {
	ID                string    `json:"id"`
	State             string    `json:"state"`
	Tool              string    `json:"tool"`
	Value             any       `json:"value"`
	Unit              string    `json:"unit,omitempty"`
	Source            string    `json:"source"`
	Key               string    `json:"idempotency_key"`
	Caller            string    `json:"caller"`
	CallerRole        string    `json:"caller_role"`
	CallerCredentials []string  `json:"caller_credentials"`
	What              string    `json:"what"` // what will happen, in words
	Reason            string    `json:"reason"`
	SideEffects       []string  `json:"side_effects"`
	Approver          string    `json:"approver_role"`
	Definition        string    `json:"definition"` // Digest of what is shown
	RequestedAt       time.Time `json:"requested_at"`
	ExpiresAt         time.Time `json:"expires_at"`
	DecidedBy         string    `json:"decided_by,omitempty"`
	DecidedAt         time.Time `json:"decided_at,omitzero"`
	Why               string    `json:"decision_reason,omitempty"`

	fp     string
	caller Party
	grant  string
}

// Ask describes a call to register.
type Ask struct {
	Call         Call
	Source       string // the gateway that owns the capability
	Unit         string
	What         string // what will happen, in words
	Reason       string
	SideEffects  []string
	ApproverRole string
}

// Pending is what the caller is told about its registered request.
type Pending struct {
	ID        string
	Approver  string
	ExpiresAt time.Time
}

// prune drops expired entries. a.mu held.
func (a *Authority) prune(now time.Time) {
	for id, p := range a.byID {
		if !now.Before(p.ExpiresAt) {
			delete(a.byID, id)
		}
	}
}

// find returns the entry for this person's call of tool with key. a.mu held.
func (a *Authority) find(c Call) *Request {
	for _, p := range a.byID {
		if p.Tool == c.Tool && p.Key == c.Key && a.SamePerson(p.caller, c.Caller) {
			return p
		}
	}
	return nil
}

// Register records a request for ask's call, or returns the one already
// pending for the same person's call. A request of the same key for
// another value is refused; one pending under a definition no longer in
// force is replaced.
func (a *Authority) Register(ask Ask) (Pending, error) {
	c := ask.Call
	fp := c.Fingerprint()
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prune(now)
	p := a.find(c)
	if p != nil && p.fp != fp {
		return Pending{}, fmt.Errorf("idempotency_key %q already waits for approval of another value; use a new key for a new operation", c.Key)
	}
	if p != nil && (p.Definition != c.Definition || p.State == StateVoid) {
		delete(a.byID, p.ID)
		p = nil
	}
	if p == nil {
		n := 0
		for _, q := range a.byID {
			if a.SamePerson(q.caller, c.Caller) {
				n++
			}
		}
		if len(a.byID) >= MaxPending || n >= MaxPendingPerPerson {
			return Pending{}, fmt.Errorf("too many approvals are pending (%d in all, %d of this caller); wait for decisions or for them to expire", len(a.byID), n)
		}
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return Pending{}, err
		}
		p = &Request{ID: hex.EncodeToString(id[:]), State: StatePending, Tool: c.Tool, Value: c.Value, Unit: ask.Unit, Source: ask.Source,
			Key: c.Key, Caller: c.Caller.ID, CallerRole: c.Caller.Role, CallerCredentials: c.Caller.Creds(), What: ask.What,
			Reason: ask.Reason, SideEffects: ask.SideEffects, Approver: ask.ApproverRole, Definition: c.Definition,
			RequestedAt: now.UTC(), ExpiresAt: now.Add(a.ttl).UTC().Truncate(time.Second), fp: fp, caller: c.Caller}
		if p.SideEffects == nil {
			p.SideEffects = []string{}
		}
		a.byID[p.ID] = p
	}
	return Pending{ID: p.ID, Approver: p.Approver, ExpiresAt: p.ExpiresAt}, nil
}

// Decision errors of Decide; each leaves the request as it was.
var (
	ErrUnknown = errors.New("no pending approval (unknown, already used, or expired: the caller must ask again)")
	ErrDecided = errors.New("the approval was already decided")
	ErrRole    = errors.New("the approver lacks the approver role")
)

// Decision is a decided request, and the grant when it was approved.
type Decision struct {
	Request
	Grant          string
	GrantExpiresAt time.Time
}

// Decide records an approver's decision on request id. The approver must
// not be the person who asked (ErrSelf, whatever credentials either side
// presented) and must hold the approver role (ErrRole); current is the
// definition in force for a tool: a request whose definition changed is
// voided here, never approved (ErrVoid). An approval signs the grant,
// bound to the definition the request showed.
func (a *Authority) Decide(id string, approver Party, approve bool, reason string, current func(tool string) string) (Decision, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prune(time.Now())
	p, ok := a.byID[id]
	switch {
	case !ok:
		return Decision{}, ErrUnknown
	case p.State != StatePending:
		return Decision{Request: *p}, fmt.Errorf("%w: %s by %s", ErrDecided, p.State, p.DecidedBy)
	case a.SamePerson(approver, p.caller):
		return Decision{Request: *p}, ErrSelf
	case policy.RoleLevel(approver.Role) < policy.RoleLevel(p.Approver):
		return Decision{Request: *p}, ErrRole
	case current != nil && current(p.Tool) != p.Definition:
		a.void(p, "the capability was redefined or removed after this approval was requested")
		return Decision{Request: *p}, ErrVoid
	}
	p.DecidedBy, p.DecidedAt, p.Why = approver.ID, time.Now().UTC(), reason
	if !approve {
		p.State = StateDenied
		return Decision{Request: *p}, nil
	}
	token, exp, err := a.issueGrant(Grant{ID: id, Fingerprint: p.fp, Tool: p.Tool, Key: p.Key, Caller: p.caller,
		Approver: Party{ID: approver.ID, Role: approver.Role, Credentials: approver.Creds()}, Definition: p.Definition})
	if err != nil {
		p.DecidedBy, p.DecidedAt, p.Why = "", time.Time{}, ""
		return Decision{Request: *p}, err
	}
	p.State, p.grant, p.ExpiresAt = StateApproved, token, exp.UTC() // kept until the grant expires
	return Decision{Request: *p, Grant: token, GrantExpiresAt: exp.UTC()}, nil
}

// Holds reports whether the book has any request for tool (a cheap test
// before Take on the do_ path).
func (a *Authority) Holds(tool string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.byID {
		if p.Tool == tool {
			return true
		}
	}
	return false
}

// Take removes and returns the decided request (approved, denied or void)
// for this person's call, if any: a decision is used once. A pending
// request stays.
func (a *Authority) Take(c Call) (Decision, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prune(time.Now())
	p := a.find(c)
	if p == nil || p.State == StatePending {
		return Decision{}, false
	}
	delete(a.byID, p.ID)
	return Decision{Request: *p, Grant: p.grant}, true
}

// List returns the requests in the book, oldest first.
func (a *Authority) List() []Request {
	a.mu.Lock()
	a.prune(time.Now())
	out := make([]Request, 0, len(a.byID))
	for _, p := range a.byID {
		out = append(out, *p)
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].RequestedAt.Before(out[j].RequestedAt) })
	return out
}

// Get returns one request.
func (a *Authority) Get(id string) (Request, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prune(time.Now())
	p, ok := a.byID[id]
	if !ok {
		return Request{}, false
	}
	return *p, true
}

// VoidChanged voids every pending or approved request whose definition is
// not current(tool) any more (a manifest or policy reload changed what
// the approver saw): it can no longer be approved, and its grant is
// dropped (a copy the caller holds is refused by Redeem as ErrVoid).
func (a *Authority) VoidChanged(current func(tool string) string) []Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Request
	for _, p := range a.byID {
		if (p.State != StatePending && p.State != StateApproved) || current(p.Tool) == p.Definition {
			continue
		}
		a.void(p, "a reload redefined or removed "+p.Tool+" (or changed the policy rules that apply to it) after this approval was requested")
		out = append(out, *p)
	}
	return out
}

// void marks p void. a.mu held.
func (a *Authority) void(p *Request, why string) {
	p.State, p.DecidedBy, p.DecidedAt, p.Why, p.grant = StateVoid, "a manifest reload", time.Now().UTC(), why, ""
}
