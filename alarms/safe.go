package alarms

import (
	"fmt"
	"sort"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Safe-state alarms: every do_ capability with a safe state has two,
// raised from the node's safe-state changes (node.Observed.Safe), not from
// thresholds:
//
//   - safe_state is raised when physd drove the output to its safe value
//     (verified): the plant is not where the agent left it, and someone
//     should know why. It clears when a do_ commands the output again.
//   - safe_failed is raised while a drive to safe is not verified (physd
//     keeps retrying): the output may be in an unsafe state. It clears
//     once the drive is verified or a do_ commands the output.
const (
	KindSafeState  = "safe_state"
	KindSafeFailed = "safe_failed"
)

// safeAlarm is one raised safe-state alarm.
type safeAlarm struct {
	since   time.Time
	value   any
	message string
}

// safeKey is a tool and a safe-state alarm kind.
type safeKey struct{ tool, kind string }

// safeTools lists the do_ tools of m that have a safe state.
func safeTools(m *manifest.Manifest) map[string]bool {
	out := map[string]bool{}
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindDo && c.Safe != nil {
			out[c.ToolName()] = true
		}
	}
	return out
}

// observeSafe turns one safe-state change into alarm events (under e.mu).
func (e *Engine) observeSafe(st *node.SafeStatus, at time.Time) []Event {
	var evs []Event
	raise := func(kind, msg string) {
		k := safeKey{st.Tool, kind}
		if a := e.safeActive[k]; a != nil {
			a.message = msg // the latest attempt's words, no new event
			return
		}
		e.safeActive[k] = &safeAlarm{since: at, value: st.Value, message: msg}
		evs = append(evs, Event{Capability: st.Tool, Kind: kind, State: "raised", At: at.UTC(), Value: st.Value, Message: msg})
	}
	clear := func(kind, msg string) {
		k := safeKey{st.Tool, kind}
		if e.safeActive[k] == nil {
			return
		}
		delete(e.safeActive, k)
		evs = append(evs, Event{Capability: st.Tool, Kind: kind, State: "cleared", At: at.UTC(), Value: st.Value, Message: msg})
	}
	switch st.State {
	case node.SafeReached:
		clear(KindSafeFailed, "the drive to safe is verified")
		raise(KindSafeState, fmt.Sprintf("driven to its safe value %s on %s: %s", promcp.FormatValue(st.Value), st.Event, st.Reason))
	case node.SafeFailed:
		raise(KindSafeFailed, fmt.Sprintf("the %s drive to the safe value %s is not verified after %d attempt(s): %s", st.Event, promcp.FormatValue(st.Value), st.Attempts, st.Error))
	case node.SafeCleared:
		clear(KindSafeFailed, "a do_ commands the output again")
		clear(KindSafeState, "a do_ commands the output again")
	}
	return evs
}

// seedSafe raises the alarms of drives that happened before the engine
// followed the node (start_after_crash runs inside node.Open).
func (e *Engine) seedSafe(n *node.Node) []Event {
	var evs []Event
	for _, st := range n.SafeStatuses() {
		evs = append(evs, e.observeSafe(&st, st.Since)...)
	}
	return evs
}

// reloadSafe keeps the safe-state alarms of the tools that still have a
// safe state and clears the others (under e.mu).
func (e *Engine) reloadSafe(m *manifest.Manifest, now time.Time) []Event {
	e.safeTools = safeTools(m)
	keys := make([]safeKey, 0, len(e.safeActive))
	for k := range e.safeActive {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].tool+keys[i].kind < keys[j].tool+keys[j].kind })
	var evs []Event
	for _, k := range keys {
		if e.safeTools[k.tool] {
			continue
		}
		a := e.safeActive[k]
		delete(e.safeActive, k)
		evs = append(evs, Event{Capability: k.tool, Kind: k.kind, State: "cleared", At: now.UTC(), Value: a.value, Message: "the manifest reload removed this safe state"})
	}
	return evs
}
