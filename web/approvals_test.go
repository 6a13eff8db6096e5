package web_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/web"
)

// Two supervisors: the caller and a second person.
const (
	supAToken = "two-person-supervisor-a-token"
	supBToken = "two-person-supervisor-b-token"
)

// twoPersonPolicy is the greenhouse policy with a two-person rule on
// do_heater_zone_c and two supervisor tokens.
func twoPersonPolicy(t *testing.T) string {
	t.Helper()
	p := greenhousePolicy(t)
	p = strings.Replace(p, "  tokens:\n", "  tokens:\n"+
		"    - {id: sup_a, sha256: "+policy.TokenHash(supAToken)+", role: supervisor}\n"+
		"    - {id: sup_b, sha256: "+policy.TokenHash(supBToken)+", role: supervisor}\n", 1)
	rule := "      - {type: range_guard, min: 0, max: 80, on_violation: deny}\n"
	if !strings.Contains(p, rule) {
		t.Fatal("the greenhouse policy changed: update twoPersonPolicy")
	}
	return strings.Replace(p, rule, rule+"      - {type: approval, when: always, approver_role: supervisor, self_approval: false}\n", 1)
}

// client connects the go-sdk client with a bearer token; elicitation is
// declared, so a server that wrongly asked the caller would be seen.
func client(t *testing.T, s *surface, token string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: bearerRT{map[string]string{"Authorization": "Bearer " + token}, http.DefaultTransport}}
	c := mcp.NewClient(&mcp.Implementation{Name: "two-person", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.srv.URL + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func heatCCall(t *testing.T, cs *mcp.ClientSession, value any, key, state string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c",
		Arguments: map[string]any{"value": value, "idempotency_key": key}, RequestState: state})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// decide posts a decision on approval id with token.
func decide(t *testing.T, s *surface, token, id, body string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, s.srv.URL+"/approvals/"+id, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(b, &m)
	return resp.StatusCode, m
}

func approvalID(t *testing.T, res map[string]any) string {
	t.Helper()
	d, _ := res["details"].(string)
	_, id, ok := strings.Cut(d, "approval_id=")
	if !ok || res["code"] != "approval_pending" || res["status"] != "failed" {
		t.Fatalf("want a pending approval, got %v", res)
	}
	id, _, _ = strings.Cut(id, ";")
	return id
}

// TestTwoPersonApproval: the caller (a supervisor) cannot approve its own
// call, by elicitation or on the route; an operator cannot approve it;
// another supervisor can, once; the approved call runs exactly as
// approved, and the audit names both.
func TestTwoPersonApproval(t *testing.T) {
	s := newSurface(t, twoPersonPolicy(t), web.Options{}, nil)
	caller := client(t, s, supAToken)
	writes := func() uint64 { return s.plant.Stats().Points["zone_c.heater"].Writes }

	res := heatCCall(t, caller, 30, "k1", "")
	if res.NeedsInput() {
		t.Fatal("the caller's own client was asked to confirm a two-person call")
	}
	id := approvalID(t, out(t, res))

	// The listing says what will happen.
	req, _ := http.NewRequest(http.MethodGet, s.srv.URL+"/approvals", nil)
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{id, `"what":"do_heater_zone_c value=30 percent on gw_greenhouse_001: Heating power in zone C`, `"approver_role":"supervisor"`, `"caller":"token:sup_a"`, `"state":"pending"`} {
		if resp.StatusCode != 200 || !strings.Contains(string(b), want) {
			t.Errorf("GET /approvals (%d) lacks %s:\n%s", resp.StatusCode, want, b)
		}
	}

	// The same list as a page for a browser (no scripts).
	req, _ = http.NewRequest(http.MethodGet, s.srv.URL+"/approvals", nil)
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	req.Header.Set("Accept", "text/html")
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(b), "do_heater_zone_c value=30 percent") ||
		!strings.Contains(string(b), id) || strings.Contains(string(b), "<script") {
		t.Errorf("approvals page:\n%s", b)
	}

	// Who may not decide.
	for _, c := range []struct {
		token string
		code  int
		msg   string
	}{
		{supAToken, 403, "cannot approve their own request"},
		{operatorToken, 403, "needs the supervisor role"},
		{viewerToken, 403, ""},
		{"", 401, ""},
	} {
		if code, m := decide(t, s, c.token, id, `{"decision":"approve"}`); code != c.code || !strings.Contains(toString(m["error"]), c.msg) {
			t.Errorf("approve with %q: %d %v", c.token, code, m)
		}
	}
	// Still pending: the caller's retry does not run.
	if r := out(t, heatCCall(t, caller, 30, "k1", "")); r["code"] != "approval_pending" || writes() != 0 {
		t.Fatalf("retry before approval: %v (writes %d)", r, writes())
	}

	// A second supervisor approves, once.
	code, m := decide(t, s, supBToken, id, `{"decision":"approve","reason":"checked the zone"}`)
	if code != 200 || m["state"] != "approved" || !strings.HasPrefix(toString(m["grant"]), "grant.") {
		t.Fatalf("approve: %d %v", code, m)
	}
	if code, m := decide(t, s, supBToken, id, `{"decision":"approve"}`); code != 409 {
		t.Errorf("approving twice: %d %v", code, m)
	}
	// Another value under the approved key is not the approved call.
	if r := heatCCall(t, caller, 31, "k1", ""); !r.IsError || writes() != 0 {
		t.Fatalf("another value ran on an approval: %v", r.Content)
	}
	// That used the decision up: the caller must ask again.
	if r := out(t, heatCCall(t, caller, 30, "k1", "")); r["code"] != "approval_pending" {
		t.Fatalf("after a mismatched retry: %v", r)
	}
}

// TestTwoPersonApprovalRuns: the approved call runs once with the
// approver recorded; the grant cannot be replayed for another key, nor
// used after tampering.
func TestTwoPersonApprovalRuns(t *testing.T) {
	s := newSurface(t, twoPersonPolicy(t), web.Options{}, nil)
	caller := client(t, s, supAToken)
	writes := func() uint64 { return s.plant.Stats().Points["zone_c.heater"].Writes }

	id := approvalID(t, out(t, heatCCall(t, caller, 30, "k1", "")))
	_, m := decide(t, s, supBToken, id, `{"decision":"approve"}`)
	grant := toString(m["grant"])
	done := heatCCall(t, caller, 30, "k1", "")
	r := out(t, done)
	gateNote, _ := r["gate"].(map[string]any)
	if r["status"] != "success" || !strings.Contains(toString(r["details"]), "approved_by=token:sup_b; approver_role=supervisor") || writes() != 1 ||
		gateNote["layer"] != "human_confirm" || !strings.Contains(toString(gateNote["reason"]), "approved by token:sup_b (supervisor, not the caller") {
		t.Fatalf("approved call: %v (writes %d)", r, writes())
	}
	// The same key again is the recorded answer, not a second actuation.
	again := heatCCall(t, caller, 30, "k1", grant)
	if again.IsError || toString(again.Content[0].(*mcp.TextContent).Text) != done.Content[0].(*mcp.TextContent).Text || writes() != 1 {
		t.Errorf("replay of the approved key: %v (writes %d)", again.Content, writes())
	}
	// The grant for k1 does not approve k2.
	if res := heatCCall(t, caller, 30, "k2", grant); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "approves another call") || writes() != 1 {
		t.Errorf("grant replayed on another key: %v (writes %d)", res.Content, writes())
	}
	// A tampered grant is refused; the intact one then works once.
	id = approvalID(t, out(t, heatCCall(t, caller, 40, "k3", "")))
	_, m = decide(t, s, supBToken, id, `{"decision":"approve"}`)
	grant = toString(m["grant"])
	tampered := []byte(grant)
	tampered[len("grant.")+10] ^= 1
	if res := heatCCall(t, caller, 40, "k3", string(tampered)); !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "altered") || writes() != 1 {
		t.Errorf("tampered grant: %v (writes %d)", res.Content, writes())
	}
	if r := out(t, heatCCall(t, caller, 40, "k3", grant)); r["status"] != "success" || writes() != 2 {
		t.Errorf("intact grant: %v (writes %d)", r, writes())
	}
	// A denial is final for that request.
	id = approvalID(t, out(t, heatCCall(t, caller, 10, "k4", "")))
	if code, _ := decide(t, s, supBToken, id, `{"decision":"deny","reason":"night shift"}`); code != 200 {
		t.Fatal("deny refused")
	}
	if r := out(t, heatCCall(t, caller, 10, "k4", "")); r["code"] != "approval_deny" || !strings.Contains(toString(r["reason"]), "denied by token:sup_b (night shift)") {
		t.Errorf("denied call: %v", r)
	}
	// The audit names the caller, the approver and the decision.
	b, _ := os.ReadFile(s.audit)
	for _, want := range []string{`"event":"approval_approved"`, `"event":"approval_denied"`, `"requested_by":"token:sup_a"`, `"event":"do_approval_pending"`, `approved_by=token:sup_b`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("audit lacks %s", want)
		}
	}
}

// TestTwoPersonApprovalExpires: a request nobody decided in time cannot be
// approved, and a grant used after its expiry runs nothing.
func TestTwoPersonApprovalExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, "supervisor", writePolicy(t, twoPersonPolicy(t)))
		h := r.web.Handler()
		post := func(id string) (int, map[string]any) {
			req := httptest.NewRequest(http.MethodPost, "http://localhost/approvals/"+id, strings.NewReader(`{"decision":"approve"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+supBToken)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			var m map[string]any
			json.Unmarshal(w.Body.Bytes(), &m)
			return w.Code, m
		}
		call := func(key, state string) *mcp.CallToolResult {
			return r.call(t, &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: map[string]any{"value": 30, "idempotency_key": key}, RequestState: state})
		}
		writes := func() uint64 { return r.plant.Stats().Points["zone_c.heater"].Writes }

		id := approvalID(t, out(t, call("late", "")))
		time.Sleep(11 * time.Minute)
		if code, m := post(id); code != 404 {
			t.Errorf("approving an expired request: %d %v", code, m)
		}
		id = approvalID(t, out(t, call("slow", "")))
		code, m := post(id)
		if code != 200 {
			t.Fatalf("approve: %d %v", code, m)
		}
		time.Sleep(11 * time.Minute)
		res := call("slow", toString(m["grant"]))
		if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "expired") || writes() != 0 {
			t.Errorf("expired grant: %v (writes %d)", res.Content, writes())
		}
	})
}

func toString(v any) string { s, _ := v.(string); return s }

// rig serves the greenhouse with the policy at policyPath to an in-memory
// MCP client on 2026-07-28 that declares elicitation (a stdio-like
// connection whose caller has role), and its HTTP surface as a handler
// (no listener, so that it runs in a synctest bubble).
type rig struct {
	cs    *mcp.ClientSession
	plant *sim.Plant
	web   *web.Server
}

func newRig(t *testing.T, role, policyPath string) *rig {
	t.Helper()
	tr := testrig.Open(t, example("physmcp.manifest.yml"), testrig.ReadFile(t, policyPath), nil)
	n, gd, al := tr.Node, tr.Guard, tr.Audit
	srv := mcpserver.New(n, mcpserver.Options{StdioRole: role, Guard: gd, Audit: al})
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "approver", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true}})
	cs, err := c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	return &rig{cs: cs, plant: tr.Plant, web: web.New(srv, web.Options{Guard: gd, Audit: al})}
}

func (r *rig) call(t *testing.T, p *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	res, err := r.cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return res
}
