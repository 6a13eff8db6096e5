package node

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/physd/physd/promcp"
)

// CapabilityStatus is one capability's last known state, for /status. It
// never touches the device.
type CapabilityStatus struct {
	Tool      string    `json:"tool"`
	Kind      string    `json:"kind"`
	Zone      string    `json:"zone"`
	Unit      string    `json:"unit,omitempty"`
	Value     any       `json:"value"`
	Timestamp time.Time `json:"timestamp,omitzero"`
	AgeMS     int64     `json:"age_ms,omitempty"`
	Quality   string    `json:"quality"` // from the cache: good, stale, degraded, error, or unread
	Error     string    `json:"error,omitempty"`
	// Monitored: the device pushes the changes (an OPC UA monitored item)
	// instead of being polled every poll_ms.
	Monitored bool `json:"monitored,omitempty"`
}

// Capabilities reports every capability's cached state.
func (n *Node) Capabilities() []CapabilityStatus {
	caps := n.bound().caps
	out := make([]CapabilityStatus, 0, len(caps))
	now := time.Now()
	for _, cs := range caps {
		st := CapabilityStatus{Tool: cs.tool, Kind: cs.cap.Kind, Zone: cs.cap.Zone, Unit: cs.cap.Unit, Quality: "unread", Monitored: cs.monitoredNow()}
		s := cs.last.Load()
		errp := cs.lastErr.Load()
		if cs.point == nil && cs.bindErr != nil {
			st.Quality, st.Error = string(promcp.QualityError), cs.bindErr.Error()
		}
		if s != nil {
			var rerr error
			if errp != nil {
				rerr = *errp
			}
			fresh := cs.cap.CacheTTL() > 0 && now.Sub(s.at) <= cs.cap.CacheTTL()
			o := n.observation(cs, s, fresh, rerr)
			st.Value, st.Timestamp, st.AgeMS, st.Quality = o.Value, o.Timestamp, o.AgeMS, string(o.Quality)
			if rerr != nil {
				st.Error = rerr.Error()
			}
		} else if errp != nil {
			st.Quality, st.Error = string(promcp.QualityError), (*errp).Error()
		}
		out = append(out, st)
	}
	return out
}

// Actuation is one do_ answer of the recent log with who called: the
// answer itself names no caller (it is what the caller was sent), but an
// operator's screen must say who moved the plant.
type Actuation struct {
	Caller string          `json:"caller"`
	Answer json.RawMessage `json:"answer"`
}

// recentLog keeps the last actuation decisions for operators.
type recentLog struct {
	mu   sync.Mutex
	buf  []Actuation
	next int
	full bool
}

const recentSize = 50

func (r *recentLog) add(body []byte, caller string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buf == nil {
		r.buf = make([]Actuation, recentSize)
	}
	r.buf[r.next] = Actuation{Caller: caller, Answer: append(json.RawMessage(nil), body...)}
	r.next = (r.next + 1) % recentSize
	r.full = r.full || r.next == 0
}

func (r *recentLog) list() []Actuation {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Actuation
	n := r.next
	if r.full {
		n = recentSize
	}
	for i := 1; i <= n; i++ {
		out = append(out, r.buf[(r.next-i+recentSize)%recentSize])
	}
	return out
}

// RecentActuations returns the last do_ answers (newest first), refusals
// included, as sent to callers.
func (n *Node) RecentActuations() []json.RawMessage {
	var out []json.RawMessage
	for _, a := range n.recent.list() {
		out = append(out, a.Answer)
	}
	return out
}

// RecentActuationsBy is RecentActuations with each answer's caller.
func (n *Node) RecentActuationsBy() []Actuation { return n.recent.list() }
