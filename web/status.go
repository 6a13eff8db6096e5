package web

import (
	"embed"
	"encoding/json"
	"html/template"
	"net/http"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Status is GET /status: what an operator needs to see at a glance.
type Status struct {
	DeviceID     string                  `json:"device_id"`
	DeviceType   string                  `json:"device_type"`
	Zone         string                  `json:"zone"`
	Version      string                  `json:"version"`
	Started      time.Time               `json:"started"`
	UptimeS      int64                   `json:"uptime_s"`
	Ready        bool                    `json:"ready"`
	Checks       []node.Readiness        `json:"checks"`
	Policy       string                  `json:"policy"`
	Override     any                     `json:"emergency_override"`
	Capabilities []node.CapabilityStatus `json:"capabilities"`
	Recent       []json.RawMessage       `json:"recent_actuations"`
	Mesh         any                     `json:"mesh"`
	// Alarms are the alarms raised now (none without declared alarms).
	Alarms []alarms.Active `json:"alarms"`
	// SafeStates are the outputs physd drove to safe (until a do_
	// commands them again); Leases the holds in force.
	SafeStates []node.SafeStatus `json:"safe_states"`
	Leases     []node.Lease      `json:"leases"`
	// Interlocks are the policy's rules in force with their readings and
	// bypasses.
	Interlocks []node.InterlockState `json:"interlocks"`
}

// pageData is the status page: the status and each capability's chart.
type pageData struct {
	Status
	Charts map[string]template.HTML
}

func (s *Server) status() Status {
	m := s.n.Manifest()
	ready, checks := s.n.Ready()
	st := Status{
		DeviceID: m.Device.ID, DeviceType: m.Device.Type, Zone: m.Device.Location.Zone, Version: mcpserver.Version,
		Started: s.start.UTC(), UptimeS: int64(time.Since(s.start).Seconds()),
		Ready: ready, Checks: checks, Policy: "none (" + node.NoPolicyNote + ")",
		Capabilities: s.n.Capabilities(), Recent: s.n.RecentActuations(),
		Mesh:       map[string]any{"enabled": false},
		SafeStates: []node.SafeStatus{}, Leases: s.n.Leases(), Interlocks: s.n.InterlockStates(),
	}
	for _, ss := range s.n.SafeStatuses() {
		if ss.State != node.SafeCleared {
			st.SafeStates = append(st.SafeStates, ss)
		}
	}
	if s.opts.Mesh != nil {
		st.Mesh = s.opts.Mesh()
	}
	st.Alarms = []alarms.Active{}
	if s.opts.Alarms != nil {
		st.Alarms = s.opts.Alarms.Active()
	}
	if st.Recent == nil {
		st.Recent = []json.RawMessage{}
	}
	if s.opts.Guard != nil {
		st.Policy = s.opts.PolicyPath
		if o := s.opts.Guard.ActiveOverride(); o != nil {
			st.Override = o
		}
	}
	return st
}

func (s *Server) serveStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.status())
}

//go:embed status.html
var pageFS embed.FS

var page = template.Must(template.New("status.html").Funcs(template.FuncMap{
	"value": func(v any) string {
		if v == nil {
			return "—"
		}
		return promcp.FormatValue(v)
	},
	"decode": func(raw json.RawMessage) map[string]any {
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		return m
	},
	"fmtv": func(v any) string {
		if v == nil {
			return "—"
		}
		if f, ok := v.(float64); ok {
			return promcp.FormatValue(f)
		}
		return promcp.FormatValue(v)
	},
}).ParseFS(pageFS, "status.html"))

// servePage is a small read-only HTML view of /status for an operator's
// browser: no scripts, no external assets, refreshed every 5 s.
func (s *Server) servePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if err := page.Execute(w, pageData{Status: s.status(), Charts: s.charts(time.Now())}); err != nil {
		s.log.Error("status page", "err", err)
	}
}
