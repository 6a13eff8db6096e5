package web

import (
	"net/http"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
)

// serveOverride starts (POST {"reason": "...", "ttl_s": 300}) or ends
// (DELETE) an emergency override. It needs the policy's override role, and
// every start and end is audited.
func (s *Server) serveOverride(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	g := s.opts.Guard
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"override": g.ActiveOverride()})
	case http.MethodPost:
		var in struct {
			Reason string `json:"reason"`
			TTLS   int    `json:"ttl_s"`
		}
		if err := mcpserver.DecodeBody(http.MaxBytesReader(w, r.Body, 16<<10), &in); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "body: " + err.Error() + `; send {"reason": "...", "ttl_s": 300}`})
			return
		}
		o, err := g.StartOverride(caller.ID, caller.Role, in.Reason, time.Duration(in.TTLS)*time.Second)
		if err != nil {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": err.Error()})
			return
		}
		s.auditOverride("override_start", caller, in.Reason, o.Until)
		writeJSON(w, http.StatusOK, map[string]any{"override": o, "lifts": []string{"time_window"},
			"never_lifts": []string{"role", "range", "rate", "cooldown", "quorum", "gate deny"}})
	case http.MethodDelete:
		if _, err := g.StartOverride(caller.ID, caller.Role, "end", time.Nanosecond); err != nil {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": err.Error()})
			return
		}
		g.EndOverride()
		s.auditOverride("override_end", caller, "", time.Now())
		writeJSON(w, http.StatusOK, map[string]any{"override": nil})
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (s *Server) auditOverride(event string, caller node.Caller, reason string, until time.Time) {
	if s.opts.Audit == nil {
		return
	}
	if _, err := s.opts.Audit.Append(&audit.Record{Event: event, Caller: caller.ID, Reason: reason,
		Data: map[string]any{"role": caller.Role, "until": until.UTC()}}); err != nil {
		s.log.Error("audit write failed", "event", event, "err", err)
	}
}
