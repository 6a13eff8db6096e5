package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestTwoPersonApprovalAgainstTheBinary: an agent whose client accepts
// every elicitation cannot approve its own call under a two-person rule;
// an admin approves it on /approvals, and the agent's repeated call runs.
func TestTwoPersonApprovalAgainstTheBinary(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	const rule = "{type: approval, when: above, above: 60}"
	if !strings.Contains(string(b), rule) {
		t.Fatal("the greenhouse policy changed: update this test")
	}
	pol := filepath.Join(t.TempDir(), "policy.yml")
	os.WriteFile(pol, []byte(strings.Replace(string(b), rule, "{type: approval, when: above, above: 60, approver_role: admin}", 1)), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept) // auto-accepts any elicitation

	args := map[string]any{"value": 70, "idempotency_key": "two-person-1"}
	r := structured(t, call(t, agent, "do_heater_zone_a", args))
	details, _ := r["details"].(string)
	_, id, _ := strings.Cut(details, "approval_id=")
	id, _, _ = strings.Cut(id, ";")
	if r["status"] != "failed" || r["code"] != "approval_pending" || id == "" || d.sim(t).writes("zone_a.heater") != 0 {
		t.Fatalf("the agent's own call: %v", r)
	}
	post := func(token string) (int, map[string]any) {
		req, _ := http.NewRequest(http.MethodPost, d.url("/approvals/"+id), strings.NewReader(`{"decision":"approve"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var m map[string]any
		json.Unmarshal(body, &m)
		return resp.StatusCode, m
	}
	if code, m := post(operatorToken); code != 403 {
		t.Fatalf("the agent's own token approved: %d %v", code, m)
	}
	if code, m := post(adminDemoToken); code != 200 || m["state"] != "approved" {
		t.Fatalf("admin approval: %d %v", code, m)
	}
	r = structured(t, call(t, agent, "do_heater_zone_a", args))
	if r["status"] != "success" || !strings.Contains(r["details"].(string), "approved_by=token:site_admin") || d.sim(t).writes("zone_a.heater") != 1 {
		t.Fatalf("approved call: %v", r)
	}
}
