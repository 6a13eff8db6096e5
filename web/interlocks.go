package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
)

// serveInterlocks is GET /interlocks: the policy's rules in force, each
// with its condition's reading now and its bypass.
func (s *Server) serveInterlocks(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"interlocks": s.n.InterlockStates()})
}

// serveBypass asks for (POST {"minutes": 10, "reason": "..."}), approves
// (POST …/bypass/approve) or ends (DELETE) a rule's bypass. The node
// decides who may (the rule's bypass role, another person to approve) and
// audits every step; the caller is who the boundary authenticated.
func (s *Server) serveBypass(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	rule := r.PathValue("rule")
	var b node.Bypass
	switch {
	case r.Method == http.MethodPost && r.PathValue("action") == "approve":
		b, err = s.n.ApproveBypass(rule, caller)
	case r.Method == http.MethodPost && r.PathValue("action") == "":
		var in struct {
			Minutes int    `json:"minutes"`
			Reason  string `json:"reason"`
		}
		if err := mcpserver.DecodeBody(http.MaxBytesReader(w, r.Body, 16<<10), &in); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "body: " + err.Error() + `; send {"minutes": 10, "reason": "..."}`})
			return
		}
		b, err = s.n.RequestBypass(rule, time.Duration(in.Minutes)*time.Minute, in.Reason, caller)
	case r.Method == http.MethodDelete && r.PathValue("action") == "":
		if err = s.n.EndBypass(rule, caller); err == nil {
			writeJSON(w, http.StatusOK, map[string]any{"bypass": nil})
			return
		}
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "method not allowed: POST /interlocks/{rule}/bypass asks, POST …/bypass/approve approves, DELETE …/bypass ends", http.StatusMethodNotAllowed)
		return
	}
	if errors.Is(err, node.ErrBypass) {
		writeJSON(w, http.StatusForbidden, map[string]any{"error": err.Error()})
		return
	} else if err != nil {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"error": err.Error()})
		return
	}
	next := "another person with the rule's bypass role approves with POST /interlocks/" + rule + "/bypass/approve within 10 minutes"
	if b.State == node.BypassActive {
		next = "the rule is lifted until " + b.Until.Format(time.RFC3339) + "; DELETE /interlocks/" + rule + "/bypass ends it sooner"
	}
	writeJSON(w, http.StatusOK, map[string]any{"bypass": b, "next": next})
}
