package mcpserver

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
)

// Two-person approval (policy: approval rule with approver_role and
// self_approval false). The caller's do_ registers a pending request and
// is answered failed/approval_pending at once: nothing is held (no lock,
// no rate slot) while a person decides. An approver with the role, who is
// not the caller, approves or denies it on POST /approvals/<id>; approval
// signs a grant (gate.Grant) bound to the approver, the exact call (tool,
// argument fingerprint, idempotency key, caller) and an expiry, usable
// once. The caller then repeats the call (same arguments and key), or
// sends the grant as requestState; the grant is verified, and the guard
// checks the approver against the policy in force before anything runs.

// Bounds of the book of pending approvals.
const (
	maxPending          = 256
	maxPendingPerCaller = 32
)

// pendingApproval is one call waiting for another person.
type pendingApproval struct {
	ID          string    `json:"id"`
	State       string    `json:"state"` // pending | approved | denied
	Tool        string    `json:"tool"`
	Value       any       `json:"value"`
	Unit        string    `json:"unit,omitempty"`
	Source      string    `json:"source"`
	Key         string    `json:"idempotency_key"`
	Caller      string    `json:"caller"`
	CallerRole  string    `json:"caller_role"`
	What        string    `json:"what"` // what will happen, in words
	Reason      string    `json:"reason"`
	SideEffects []string  `json:"side_effects"`
	Approver    string    `json:"approver_role"`
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	DecidedBy   string    `json:"decided_by,omitempty"`
	DecidedAt   time.Time `json:"decided_at,omitzero"`
	Why         string    `json:"decision_reason,omitempty"`

	fp    string
	grant string
	def   string // the capability's definition when it was requested (node.Definition)
}

// approvalBook holds pending approvals in memory: a restart forgets them
// (fail-safe: the caller asks again).
type approvalBook struct {
	mu   sync.Mutex
	byID map[string]*pendingApproval
	ttl  time.Duration
}

func newApprovalBook(ttl time.Duration) *approvalBook {
	return &approvalBook{byID: map[string]*pendingApproval{}, ttl: ttl}
}

// prune drops expired entries. b.mu held.
func (b *approvalBook) prune(now time.Time) {
	for id, p := range b.byID {
		if !now.Before(p.ExpiresAt) {
			delete(b.byID, id)
		}
	}
}

// find returns the entry for this caller's call (tool and key). b.mu held.
func (b *approvalBook) find(caller, tool, key string) *pendingApproval {
	for _, p := range b.byID {
		if p.Caller == caller && p.Tool == tool && p.Key == key {
			return p
		}
	}
	return nil
}

// requestApproval records a request, or returns the one already pending for the
// same call.
func (ts *toolSet) requestApproval(r node.ApprovalRequest) (node.PendingApproval, error) {
	b := ts.book
	_, fp := gate.Canonical(r.Tool, map[string]any{"value": r.Value})
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now)
	p := b.find(r.Caller.ID, r.Tool, r.IdempotencyKey)
	switch {
	case p != nil && p.fp != fp:
		return node.PendingApproval{}, fmt.Errorf("idempotency_key %q already waits for approval of another value (%s); use a new key for a new operation", r.IdempotencyKey, promcp.FormatValue(p.Value))
	case p == nil:
		n := 0
		for _, q := range b.byID {
			if q.Caller == r.Caller.ID {
				n++
			}
		}
		if len(b.byID) >= maxPending || n >= maxPendingPerCaller {
			return node.PendingApproval{}, fmt.Errorf("too many approvals are pending (%d in all, %d of this caller); wait for decisions or for them to expire", len(b.byID), n)
		}
		var id [16]byte
		if _, err := rand.Read(id[:]); err != nil {
			return node.PendingApproval{}, err
		}
		p = &pendingApproval{ID: hex.EncodeToString(id[:]), State: "pending", Tool: r.Tool, Value: r.Value, Source: ts.n.DeviceID(),
			Key: r.IdempotencyKey, Caller: r.Caller.ID, CallerRole: r.Caller.Role, Reason: r.Reason, SideEffects: r.SideEffects,
			Approver: r.ApproverRole, RequestedAt: now.UTC(), ExpiresAt: now.Add(b.ttl).UTC().Truncate(time.Second), fp: fp,
			def: ts.n.Definition(r.Tool)}
		p.What = fmt.Sprintf("%s value=%s", r.Tool, promcp.FormatValue(r.Value))
		if c := ts.n.Manifest().Capability(strings.TrimPrefix(r.Tool, "do_")); c != nil {
			p.Unit = c.Unit
			p.What += " " + c.Unit + " on " + ts.n.DeviceID() + ": " + c.Description
		}
		b.byID[p.ID] = p
	}
	return node.PendingApproval{ID: p.ID,
		Reason: fmt.Sprintf("A person with the %s role, other than the caller, must approve it: GET /approvals lists it, POST /approvals/%s with {\"decision\": \"approve\"} approves it. "+
			"Then call %s again with the same arguments and idempotency_key before %s to run it", p.Approver, p.ID, p.Tool, p.ExpiresAt.Format(time.RFC3339)),
		Details: "approval_id=" + p.ID + "; approver_role=" + p.Approver + "; expires_at=" + p.ExpiresAt.Format(time.RFC3339)}, nil
}

// approvedRetry handles a do_ call that may answer a two-person approval:
// a grant sent as requestState, or a decided entry in the book for this
// caller's call. handled=false: run the call normally (it registers or
// re-finds its pending request).
func (ts *toolSet) approvedRetry(ctx context.Context, req *mcp.CallToolRequest, dr node.DoRequest) (res *mcp.CallToolResult, handled bool) {
	token := req.Params.RequestState
	explicit := strings.HasPrefix(token, gate.GrantPrefix)
	var entry *pendingApproval
	if !explicit {
		b := ts.book
		b.mu.Lock()
		b.prune(time.Now())
		if p := b.find(dr.Caller.ID, dr.Tool, dr.IdempotencyKey); p != nil && p.State != "pending" {
			entry = p
			delete(b.byID, p.ID) // a decision is used once
		}
		b.mu.Unlock()
		if entry == nil {
			return nil, false
		}
		if entry.State == "denied" || entry.State == "void" {
			action := "deny"
			if entry.State == "void" {
				action = "void"
			}
			body, err := ts.n.DeclinedBy(dr, action, entry.DecidedBy, entry.Why)
			if err != nil {
				return toolError(err), true
			}
			return jsonResult(body), true
		}
		token = entry.grant
	}
	value, err := ts.n.DecodeValueFor(dr.Tool, dr.Value)
	if err != nil {
		return toolError(err), true
	}
	_, fp := gate.Canonical(dr.Tool, map[string]any{"value": value})
	g, err := ts.approvals.VerifyGrant(token, fp, dr.Tool, dr.IdempotencyKey, dr.Caller.ID)
	if errors.Is(err, gate.ErrApprovalReplayed) {
		// Used already, for this very call: run it unapproved, so a retry
		// gets the recorded answer (or, if the approved run was refused
		// and recorded nothing, a new approval request).
		return nil, false
	}
	if err != nil {
		return toolError(fmt.Errorf("requestState: the approval grant cannot be used (%s); nothing was actuated. "+
			"Call again without requestState to ask for a new approval", grantProblem(err))), true
	}
	if explicit {
		ts.book.mu.Lock()
		if p := ts.book.byID[g.ID]; p != nil {
			entry = p
			delete(ts.book.byID, g.ID)
		}
		ts.book.mu.Unlock()
	}
	if entry != nil {
		// The approval holds for the capability as it was defined when
		// the person approved it; the node refuses the call on another.
		dr.Definition = entry.def
	}
	dr.Approved, dr.ApprovedBy = true, node.Caller{ID: g.Approver, Role: g.ApproverRole}
	res, err = ts.runDo(ctx, req, dr, "")
	if err != nil {
		return toolError(err), true
	}
	return res, true
}

// voidRedefined voids the approvals, pending or given, of capabilities a
// manifest reload redefined or removed: a person approved what the
// capability was then. An approver can no longer approve them, and the
// caller's repeated call is answered that the approval is void.
func (ts *toolSet) voidRedefined() []*audit.Record {
	b := ts.book
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var recs []*audit.Record
	for _, p := range b.byID {
		if (p.State != "pending" && p.State != "approved") || p.def == ts.n.Definition(p.Tool) {
			continue
		}
		p.State, p.DecidedBy, p.DecidedAt = "void", "a manifest reload", time.Now().UTC()
		p.Why = "it redefined or removed " + p.Tool + " after this approval was requested"
		p.grant = ""
		recs = append(recs, &audit.Record{Event: "approval_void", Tool: p.Tool, IdempotencyKey: p.Key, Caller: p.Caller, Requested: p.Value,
			Reason: p.Why, Data: map[string]any{"approval_id": p.ID}})
	}
	return recs
}

//go:embed approvals.html
var approvalsFS embed.FS

var approvalsPage = template.Must(template.ParseFS(approvalsFS, "approvals.html"))

// wantsHTML: a browser asking for the page rather than the JSON.
func wantsHTML(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "text/html") && !strings.Contains(a, "application/json")
}

func grantProblem(err error) string {
	switch {
	case errors.Is(err, gate.ErrGrantSelf):
		return "its approver is the caller"
	case errors.Is(err, gate.ErrApprovalMismatch):
		return "it approves another call: tool, value, idempotency_key and caller must be the approved ones"
	}
	return approvalProblem(err, true)
}

// serveApprovals lists pending approvals (GET /approvals, GET
// /approvals/{id}) and takes decisions (POST /approvals/{id}).
func (s *Server) serveApprovals(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	b, id := s.ts.book, r.PathValue("id")
	switch {
	case r.Method == http.MethodGet && id == "":
		b.mu.Lock()
		b.prune(time.Now())
		list := make([]pendingApproval, 0, len(b.byID))
		for _, p := range b.byID {
			list = append(list, *p)
		}
		b.mu.Unlock()
		sort.Slice(list, func(i, j int) bool { return list[i].RequestedAt.Before(list[j].RequestedAt) })
		if wantsHTML(r) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
			if err := approvalsPage.Execute(w, map[string]any{"Device": s.n.DeviceID(), "List": list}); err != nil {
				s.log.Error("approvals page", "err", err)
			}
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"approvals": list,
			"how": "POST /approvals/<id> with {\"decision\": \"approve\" | \"deny\", \"reason\": \"...\"}: an identity with the approver_role, other than the caller"})
	case r.Method == http.MethodGet:
		b.mu.Lock()
		b.prune(time.Now())
		p, ok := b.byID[id]
		var cp pendingApproval
		if ok {
			cp = *p
		}
		b.mu.Unlock()
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": "no pending approval " + quote(id) + " (unknown, used or expired)"})
			return
		}
		writeJSON(w, http.StatusOK, cp)
	case r.Method == http.MethodPost && id != "":
		s.decideApproval(w, r, caller, id)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (s *Server) decideApproval(w http.ResponseWriter, r *http.Request, approver node.Caller, id string) {
	var in struct {
		Decision string `json:"decision"`
		Reason   string `json:"reason"`
	}
	if err := decodeBody(http.MaxBytesReader(w, r.Body, 16<<10), &in); err != nil || (in.Decision != "approve" && in.Decision != "deny") {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": `body: send {"decision": "approve"} or {"decision": "deny", "reason": "..."}`})
		return
	}
	b := s.ts.book
	b.mu.Lock()
	b.prune(time.Now())
	p, ok := b.byID[id]
	status, msg := 0, ""
	switch {
	case !ok:
		status, msg = http.StatusNotFound, "no pending approval "+quote(id)+" (unknown, already used, or expired: the caller must ask again)"
	case p.State != "pending":
		status, msg = http.StatusConflict, "approval "+id+" was already "+p.State+" by "+p.DecidedBy
	case approver.ID == p.Caller:
		status, msg = http.StatusForbidden, "the caller cannot approve its own request: "+p.Tool+" needs a second person with the "+p.Approver+" role"
	case policy.RoleLevel(approver.Role) < policy.RoleLevel(p.Approver):
		status, msg = http.StatusForbidden, "approving "+p.Tool+" needs the "+p.Approver+" role or higher; "+approver.ID+" has "+approver.Role
	}
	if status != 0 {
		b.mu.Unlock()
		writeJSON(w, status, map[string]any{"error": msg})
		return
	}
	p.DecidedBy, p.DecidedAt, p.Why = approver.ID, time.Now().UTC(), in.Reason
	out := map[string]any{"id": id, "tool": p.Tool, "value": p.Value, "idempotency_key": p.Key, "caller": p.Caller}
	if in.Decision == "deny" {
		p.State = "denied"
		out["state"] = "denied"
	} else {
		token, exp, err := s.opts.Approvals.IssueGrant(gate.Grant{ID: id, Fingerprint: p.fp, Tool: p.Tool, Key: p.Key,
			Caller: p.Caller, Approver: approver.ID, ApproverRole: approver.Role})
		if err != nil {
			b.mu.Unlock()
			writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
			return
		}
		p.State, p.grant, p.ExpiresAt = "approved", token, exp.UTC() // kept until the grant expires
		out["state"], out["grant"], out["grant_expires_at"] = "approved", token, exp.UTC()
		out["next"] = "the caller runs it by calling " + p.Tool + " again with the same arguments and idempotency_key (or with requestState set to grant), once, before grant_expires_at"
	}
	rec := &audit.Record{Event: "approval_" + p.State, Tool: p.Tool, IdempotencyKey: p.Key, Caller: approver.ID, Requested: p.Value,
		Reason: in.Reason, Data: map[string]any{"approval_id": id, "approver_role": approver.Role, "requested_by": p.Caller}}
	b.mu.Unlock()
	if s.opts.Audit != nil {
		if _, err := s.opts.Audit.Append(rec); err != nil {
			s.log.Error("audit write failed", "event", rec.Event, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, out)
}
