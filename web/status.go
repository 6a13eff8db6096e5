package web

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
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
	// Fleet is the site uplink's state ({"enabled": false} without one).
	Fleet any `json:"fleet"`
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

func (s *Server) status() Status {
	m := s.n.Manifest()
	ready, checks := s.n.Ready()
	st := Status{
		DeviceID: m.Device.ID, DeviceType: m.Device.Type, Zone: m.Device.Location.Zone, Version: mcpserver.Version,
		Started: s.start.UTC(), UptimeS: int64(time.Since(s.start).Seconds()),
		Ready: ready, Checks: checks, Policy: "none (" + node.NoPolicyNote + ")",
		Capabilities: s.n.Capabilities(), Recent: s.n.RecentActuations(),
		Mesh: map[string]any{"enabled": false}, Fleet: map[string]any{"enabled": false},
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
	if s.opts.Fleet != nil {
		st.Fleet = s.opts.Fleet()
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
