package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// toolNameRE finds the tool names an answer's reason tells an agent to call.
var toolNameRE = regexp.MustCompile(`\b(?:read|do)_[a-z0-9_]+\b|\bcan_do\b`)

// TestStuckVentHintNamesServedTools: a stuck vent's partial answer names
// only tools the daemon serves (the old hint named read_vent_zone_c, which
// is "unknown tool"), and the can_do call it spells out, sent as given,
// shows the vent's current value.
func TestStuckVentHintNamesServedTools(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	tools := map[string]bool{}
	for _, name := range listed(t, cs) {
		tools[name] = true
	}
	d.fault(t, "zone_c.vent", "stuck")
	r := structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "hint-stuck-1"}))
	reason, _ := r["reason"].(string)
	if r["status"] != "partial" || !strings.Contains(reason, "before acting again") {
		t.Fatalf("stuck vent: %v", r)
	}
	for _, name := range toolNameRE.FindAllString(reason, -1) {
		if !tools[name] {
			t.Errorf("the hint names %s, which the daemon does not serve: %q", name, reason)
		}
	}
	const cue = "call can_do with "
	i := strings.Index(reason, cue)
	if i < 0 {
		t.Fatalf("the vent has no read_ tool; the hint should name can_do: %q", reason)
	}
	var args map[string]any
	if err := json.NewDecoder(strings.NewReader(reason[i+len(cue):])).Decode(&args); err != nil {
		t.Fatalf("the can_do arguments in %q do not parse: %v", reason, err)
	}
	rep := structured(t, call(t, cs, "can_do", args))
	cands, _ := rep["candidates"].([]any)
	for _, c := range cands {
		c := c.(map[string]any)
		if c["capability"] == "do_vent_zone_c" {
			if st, _ := c["current_state"].(map[string]any); st == nil || st["value"] == nil {
				t.Errorf("do_vent_zone_c's candidate has no current value: %v", c)
			}
			return
		}
	}
	t.Errorf("can_do %v lists no do_vent_zone_c: %v", args, rep)
}

// TestRoleRefusalRemedyPerTransport: a refusal for a missing role tells
// each caller how it can carry the role: over stdio --stdio-role (stdio
// has no token), over HTTP a bearer token or JWT. Neither is told the
// other transport's remedy.
func TestRoleRefusalRemedyPerTransport(t *testing.T) {
	t.Parallel()
	refusal := func(t *testing.T, cs *mcp.ClientSession) string {
		t.Helper()
		r := structured(t, call(t, cs, "do_heater_zone_a", map[string]any{"value": 20, "idempotency_key": "hint-role-1"}))
		if r["permission"] != "permission_insufficient" {
			t.Fatalf("do_heater_zone_a without the operator role: %v", r)
		}
		return r["reason"].(string)
	}
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		cs, _ := startStdio(t, "2026-07-28", daemonOpts{extra: []string{"--policy", greenhousePolicy}})
		reason := refusal(t, cs)
		if !strings.Contains(reason, "--stdio-role operator") || strings.Contains(reason, "token") {
			t.Errorf("over stdio the remedy is --stdio-role, never a token: %q", reason)
		}
	})
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
		cs := connectAs(t, d, "2026-07-28", "greenhouse-viewer-demo-token", nil)
		reason := refusal(t, cs)
		if !strings.Contains(reason, "bearer token or JWT") || strings.Contains(reason, "--stdio-role") {
			t.Errorf("over HTTP the remedy is a token, never --stdio-role: %q", reason)
		}
	})
}
