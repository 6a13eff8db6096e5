package mcpserver_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/sim"
)

// writePolicy writes a policy for the greenhouse manifest into a temp dir.
func writePolicy(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "physmcp.policy.yml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const maxChangePolicy = `physmcp_policy_version: "0.1"
capabilities:
  do_heater_zone_c:
    rules:
      - {type: max_change, max: 10}
gate:
  fail_closed: deny
  l0:
    allow: [{name: any, tool: "do_*"}]
`

func heatC(value any, key string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: map[string]any{"value": value, "idempotency_key": key}}
}

// TestMaxChange: the step from the device's current value is bounded even
// inside the range; a current value that cannot be read refuses the call.
func TestMaxChange(t *testing.T) {
	r := newRigPolicy(t, false, "operator", writePolicy(t, maxChangePolicy))
	writes := func() uint64 { return r.plant.Stats().Points["zone_c.heater"].Writes }

	// Allowed: 0 → 8 is a step of 8.
	res := out(t, r.call(t, heatC(8, "step-1")))
	if res["status"] != "success" || res["applied_value"] != 8.0 || res["previous_value"] != 0.0 {
		t.Fatalf("allowed step: %v", res)
	}
	// Refused: 80 typed for 8.0 is inside the range but 72 away.
	res = out(t, r.call(t, heatC(80, "typo")))
	if res["status"] != "failed" || res["code"] != "max_change_exceeded" || res["permission"] != "out_of_range" {
		t.Fatalf("refused step: %v", res)
	}
	for _, want := range []string{"max_change=10", "current=8", "value=80", "step=72"} {
		if !strings.Contains(res["details"].(string), want) {
			t.Errorf("details lack %q: %v", want, res["details"])
		}
	}
	if !strings.Contains(res["reason"].(string), "at most 10 percent") {
		t.Errorf("reason: %v", res["reason"])
	}
	if writes() != 1 {
		t.Fatalf("%d writes: the refused step reached the device", writes())
	}
	// The refusal recorded nothing under its key: a corrected value under
	// a new key, then exactly the limit, pass.
	res = out(t, r.call(t, heatC(18, "step-2")))
	if res["status"] != "success" || res["previous_value"] != 8.0 {
		t.Fatalf("step of exactly max_change: %v", res)
	}
	// Unreadable current value: refused, never written, code names it.
	if err := r.plant.SetFault("zone_c.heater", sim.Fault{Mode: sim.FaultOffline}); err != nil {
		t.Fatal(err)
	}
	res = out(t, r.call(t, heatC(20, "blind")))
	if res["status"] != "failed" || res["code"] != "current_value_unreadable" || !strings.Contains(res["details"].(string), "guard=max_change") {
		t.Fatalf("unreadable current value: %v", res)
	}
	if writes() != 2 {
		t.Fatalf("%d writes: a blind step reached the device", writes())
	}
	// The key was not recorded: once the device answers, the same key runs.
	r.plant.ClearFaults()
	if res = out(t, r.call(t, heatC(20, "blind"))); res["status"] != "success" {
		t.Fatalf("retry after the fault: %v", res)
	}
}

// TestMaxChangeInCanDo: can_do tells the planner what the do_ will meet.
func TestMaxChangeInCanDo(t *testing.T) {
	r := newRigPolicy(t, false, "operator", writePolicy(t, maxChangePolicy))
	canDo := func(v any) map[string]any {
		return out(t, r.call(t, &mcp.CallToolParams{Name: "can_do", Arguments: map[string]any{"intent": map[string]any{
			"semantic_tags": []string{"heating"}, "action": "set", "value": v, "location": "zone_c"}}}))
	}
	find := func(rep map[string]any, list string) map[string]any {
		items, _ := rep[list].([]any)
		for _, it := range items {
			if m := it.(map[string]any); m["capability"] == "do_heater_zone_c" {
				return m
			}
		}
		return nil
	}
	if b := find(canDo(80), "blocked"); b == nil || b["code"] != "max_change_exceeded" {
		t.Errorf("can_do 80 from 0 with max_change 10: %v", canDo(80))
	}
	c := find(canDo(5), "candidates")
	if c == nil || !strings.Contains(fmt.Sprint(c["match_reasons"]), "max_change: at most 10 percent") {
		t.Errorf("can_do 5: %v", c)
	}
}
