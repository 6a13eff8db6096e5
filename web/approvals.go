package web

import (
	"embed"
	"errors"
	"html/template"
	"net/http"
	"strings"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
)

// Two-person approval (policy: approval rule with approver_role and
// self_approval false). The approval authority (package approval) keeps
// the requests and signs the grants; the node registers a request when
// the guard asks for another person, and redeems the grant (or the
// decision) when the caller repeats the call. This file is the HTTP side:
// GET /approvals lists the requests, POST /approvals/<id> decides one.

//go:embed approvals.html
var approvalsFS embed.FS

var approvalsPage = template.Must(template.ParseFS(approvalsFS, "approvals.html"))

// wantsHTML: a browser asking for the page rather than the JSON.
func wantsHTML(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "text/html") && !strings.Contains(a, "application/json")
}

// serveApprovals lists pending approvals (GET /approvals, GET
// /approvals/{id}) and takes decisions (POST /approvals/{id}).
func (s *Server) serveApprovals(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	a, id := s.n.Approvals(), r.PathValue("id")
	switch {
	case r.Method == http.MethodGet && id == "":
		list := a.List()
		if wantsHTML(r) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
			if err := approvalsPage.Execute(w, map[string]any{"Device": s.n.DeviceID(), "List": list}); err != nil {
				s.log.Error("approvals page", "err", err)
			}
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"approvals": list,
			"how": "POST /approvals/<id> with {\"decision\": \"approve\" | \"deny\", \"reason\": \"...\"}: a person with the approver_role, other than the one who asked (compared by every credential either presented)"})
	case r.Method == http.MethodGet:
		p, ok := a.Get(id)
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]any{"error": "no pending approval " + quote(id) + " (unknown, used or expired)"})
			return
		}
		writeJSON(w, http.StatusOK, p)
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
	if err := mcpserver.DecodeBody(http.MaxBytesReader(w, r.Body, 16<<10), &in); err != nil || (in.Decision != "approve" && in.Decision != "deny") {
		writeJSON(w, http.StatusBadRequest, map[string]any{"error": `body: send {"decision": "approve"} or {"decision": "deny", "reason": "..."}`})
		return
	}
	status, msg, d := s.decide(approver, id, in.Decision, in.Reason)
	if status != http.StatusOK {
		writeJSON(w, status, map[string]any{"error": msg})
		return
	}
	out := map[string]any{"id": id, "state": d.State, "tool": d.Tool, "value": d.Value, "idempotency_key": d.Key, "caller": d.Caller, "definition": d.Definition}
	if d.Grant != "" {
		out["grant"], out["grant_expires_at"] = d.Grant, d.GrantExpiresAt
		out["next"] = "the caller runs it by calling " + d.Tool + " again with the same arguments and idempotency_key (or with requestState set to grant), once, before grant_expires_at"
	}
	writeJSON(w, http.StatusOK, out)
}

// decide takes approver's decision ("approve" or "deny") on request id in
// the approval authority and audits it: the one decision path of the JSON
// route and the console's form. status is 200, or the refusal's status
// with msg saying why.
func (s *Server) decide(approver node.Caller, id, decision, reason string) (int, string, approval.Decision) {
	d, err := s.n.Approvals().Decide(id, approver.Party(), decision == "approve", reason, s.n.ApprovalDigest)
	audited := map[string]any{"approval_id": id, "approver_role": approver.Role, "requested_by": d.Caller,
		"requested_by_credentials": d.CallerCredentials, "definition": d.Definition, "decision": decision}
	status, msg := 0, ""
	switch {
	case errors.Is(err, approval.ErrUnknown):
		status, msg = http.StatusNotFound, "no pending approval "+quote(id)+" (unknown, already used, or expired: the caller must ask again)"
	case errors.Is(err, approval.ErrDecided):
		status, msg = http.StatusConflict, "approval "+id+" was already "+d.State+" by "+d.DecidedBy
	case errors.Is(err, approval.ErrVoid):
		status, msg = http.StatusConflict, "approval "+id+" is void: a manifest reload redefined "+d.Tool+" (its manifest entry, binding or policy rules) after it was requested; the caller must ask again"
	case errors.Is(err, approval.ErrSelf):
		status, msg = http.StatusForbidden, "the person who asked cannot approve their own request (a credential of theirs was presented, or the policy's identity.people joins them): "+
			d.Tool+" needs a second person with the "+d.Approver+" role"
	case errors.Is(err, approval.ErrRole):
		status, msg = http.StatusForbidden, "approving "+d.Tool+" needs the "+d.Approver+" role or higher; "+approver.ID+" has "+approver.Role
	case err != nil:
		status, msg = http.StatusInternalServerError, err.Error()
	}
	if status != 0 {
		if status == http.StatusForbidden || errors.Is(err, approval.ErrVoid) {
			s.auditApproval(&audit.Record{Event: "approval_refused", Tool: d.Tool, IdempotencyKey: d.Key, Caller: approver.ID,
				Credentials: approver.Credentials, Requested: d.Value, Reason: msg, Data: audited})
		}
		return status, msg, d
	}
	s.auditApproval(&audit.Record{Event: "approval_" + d.State, Tool: d.Tool, IdempotencyKey: d.Key, Caller: approver.ID,
		Credentials: approver.Credentials, Requested: d.Value, Reason: reason, Data: audited})
	return http.StatusOK, "", d
}

func (s *Server) auditApproval(rec *audit.Record) {
	if s.opts.Audit == nil {
		return
	}
	if _, err := s.opts.Audit.Append(rec); err != nil {
		s.log.Error("audit write failed", "event", rec.Event, "err", err)
	}
}
