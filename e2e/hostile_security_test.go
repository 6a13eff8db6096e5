package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// hsReq sends one raw request with the given Host, Origin and Authorization
// values (auth may hold several values: duplicate headers).
func hsReq(t *testing.T, d *daemon, method, path, host, origin, body string, auth ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, d.url("/"), strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.URL.Opaque = path // keep the path exactly as written (no cleaning)
	if host != "" {
		req.Host = host
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, a := range auth {
		req.Header.Add("Authorization", a)
	}
	resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode, resp.Header, string(b)
}

// TestHostileSecurityRouteTable: every route × rebinding Host, foreign
// Origin, no/wrong/duplicate Authorization and each role.
func TestHostileSecurityRouteTable(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	const (
		viewer = "Bearer " + viewerToken
		oper   = "Bearer " + operatorToken
		admin  = "Bearer " + adminDemoToken
	)
	routes := []struct{ method, path, body string }{
		{"GET", "/status", ""}, {"GET", "/", ""}, {"GET", "/metrics", ""},
		{"GET", "/approvals", ""}, {"GET", "/approvals/nope", ""}, {"POST", "/approvals/nope", `{"decision":"approve"}`},
		{"POST", "/mcp", `{}`}, {"POST", "/mcp/observe", `{}`}, {"POST", "/mcp/zone_a", `{}`},
		{"GET", "/sim/plant/", ""}, {"POST", "/sim/plant/fault", `{"point":"*","mode":"stuck"}`}, {"POST", "/sim/plant/clear", `{}`},
		{"GET", "/emergency/override", ""}, {"POST", "/emergency/override", `{"reason":"x","ttl_s":60}`}, {"DELETE", "/emergency/override", ""},
		{"GET", "/healthz", ""}, {"GET", "/readyz", ""},
	}
	open := func(p string) bool { return p == "/healthz" || p == "/readyz" }
	for _, r := range routes {
		// Rebinding Host and foreign Origin: refused even with the admin token.
		if c, _, b := hsReq(t, d, r.method, r.path, "attacker.example", "", r.body, admin); c != 403 {
			t.Errorf("%s %s with Host attacker.example (admin token): %d %.80s, want 403", r.method, r.path, c, b)
		}
		if c, _, b := hsReq(t, d, r.method, r.path, "attacker.example:80", "http://attacker.example:80", r.body, admin); c != 403 {
			t.Errorf("%s %s rebinding page (Origin=Host): %d %.80s, want 403", r.method, r.path, c, b)
		}
		if c, _, b := hsReq(t, d, r.method, r.path, "", "http://attacker.example", r.body, admin); c != 403 {
			t.Errorf("%s %s foreign Origin: %d %.80s, want 403", r.method, r.path, c, b)
		}
		if open(r.path) {
			continue
		}
		for _, a := range [][]string{nil, {"Bearer wrong-token"}, {"Basic YWRtaW46YWRtaW4="}, {"Bearer"}, {"bearer " + adminDemoToken + " x"}} {
			if c, _, b := hsReq(t, d, r.method, r.path, "", "", r.body, a...); c != 401 {
				t.Errorf("%s %s Authorization %q: %d %.80s, want 401", r.method, r.path, a, c, b)
			}
		}
		// Duplicate Authorization headers must not be resolved in the caller's favour.
		for _, a := range [][]string{{viewer, admin}, {"Bearer wrong", admin}, {admin, "Bearer wrong"}} {
			if c, _, b := hsReq(t, d, r.method, r.path, "", "", r.body, a...); c/100 == 2 {
				t.Errorf("%s %s duplicate Authorization %q: %d %.80s, want a refusal", r.method, r.path, a, c, b)
			}
		}
	}
	// Role floors.
	for _, c := range []struct {
		method, path, body, auth string
		want                     int
	}{
		{"GET", "/approvals", "", viewer, 403},
		{"GET", "/approvals/nope", "", viewer, 403},
		{"POST", "/approvals/nope", `{"decision":"approve"}`, viewer, 403},
		{"POST", "/sim/plant/fault", `{"point":"*","mode":"stuck"}`, viewer, 403},
		{"POST", "/emergency/override", `{"reason":"x","ttl_s":60}`, viewer, 403},
		{"POST", "/emergency/override", `{"reason":"x","ttl_s":60}`, oper, 403},
		{"DELETE", "/emergency/override", "", oper, 403},
		{"GET", "/status", "", viewer, 200},
		{"GET", "/approvals", "", oper, 200},
		{"POST", "/approvals/nope", `{"decision":"approve"}`, admin, 404},
	} {
		if code, _, b := hsReq(t, d, c.method, c.path, "", "", c.body, c.auth); code != c.want {
			t.Errorf("%s %s as %.20s: %d %.80s, want %d", c.method, c.path, c.auth, code, b, c.want)
		}
	}
	// Path tricks and methods: never 2xx without a credential; no CORS grant ever.
	for _, p := range []string{"/mcp/../mcp", "//mcp", "/mcp/observe/", "/mcp/%6Fbserve", "/mcp/nope", "/%2e%2e/mcp", "/status/", "/approvals/../status",
		"/sim/plant/../../status", "/emergency/override/", "/metrics?x=1", "/mcp%2Fobserve"} {
		for _, m := range []string{"GET", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"} {
			body := ""
			if m == "POST" || m == "PUT" || m == "PATCH" {
				body = `{}`
			}
			c, h, b := hsReq(t, d, m, p, "", "http://"+d.addr, body)
			if c/100 == 2 {
				t.Errorf("%s %s without a credential: %d %.80s", m, p, c, b)
			}
			if h.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s %s answers CORS: %v", m, p, h)
			}
		}
	}
	for _, m := range []string{"PUT", "DELETE", "PATCH"} {
		for _, p := range []string{"/status", "/metrics", "/approvals", "/mcp"} {
			if c, _, b := hsReq(t, d, m, p, "", "", `{}`, admin); c/100 == 2 && !(p == "/mcp" && m == "DELETE") {
				t.Errorf("%s %s as admin: %d %.80s, want 405/404", m, p, c, b)
			}
		}
	}
	c, h, _ := hsReq(t, d, "OPTIONS", "/mcp", "", "http://attacker.example", "", admin)
	if c/100 == 2 || h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("CORS preflight from a foreign origin: %d %v", c, h)
	}
	// Oversized header and body: refused, daemon alive.
	conn, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\nX-Big: %s\r\n\r\n", adminDemoToken, strings.Repeat("a", 2<<20))
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, _ := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if strings.Contains(line, " 200 ") {
		t.Errorf("2 MiB header: %q, want 431", line)
	}
	big := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"` + strings.Repeat("a", 40<<20) + `"}}`
	if c, _, b := hsReq(t, d, "POST", "/mcp", "", "", big, admin); c/100 == 2 {
		t.Errorf("40 MiB body: %d %.80s, want 413", c, b)
	}
	if c, _, b := hsReq(t, d, "POST", "/approvals/nope", "", "", `{"decision":"approve","x":"`+strings.Repeat("a", 8<<20)+`"}`, admin); c/100 == 2 {
		t.Errorf("8 MiB approval body: %d %.80s", c, b)
	}
	d.healthy(t)
	_, b := d.request(t, "GET", "/sim/plant/", "")
	if strings.Contains(string(b), "stuck") {
		t.Errorf("hostile requests left faults: %s", b)
	}
}

func sha(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:]) }

// twoPersonPolicy: the greenhouse policy with approver_role admin on the
// zone A heater, plus extra token lines.
func twoPersonPolicy(t *testing.T, extraTokens string) string {
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "{type: approval, when: above, above: 60}", "{type: approval, when: above, above: 60, approver_role: admin}", 1)
	s = strings.Replace(s, "{type: cooldown, ms: 15000}", "{type: cooldown, ms: 1}", 1)
	anchor := "    - {id: site_admin,"
	s = strings.Replace(s, anchor, extraTokens+anchor, 1)
	p := filepath.Join(t.TempDir(), "policy.yml")
	os.WriteFile(p, []byte(s), 0o600)
	return p
}

func approvalID(t *testing.T, r map[string]any) string {
	details, _ := r["details"].(string)
	_, id, _ := strings.Cut(details, "approval_id=")
	id, _, _ = strings.Cut(id, ";")
	if r["code"] != "approval_pending" || id == "" {
		t.Fatalf("want approval_pending: %v", r)
	}
	return id
}

func decide(t *testing.T, d *daemon, id, token, body string) int {
	c, _, _ := hsReq(t, d, "POST", "/approvals/"+id, "", "", body, "Bearer "+token)
	return c
}

// TestHostileSecuritySelfApprovalSameIdentity: a second token with the
// caller's identity id but the approver role must not approve the caller's
// own request (or the policy must refuse two tokens with one id).
func TestHostileSecuritySelfApprovalSameIdentity(t *testing.T) {
	t.Parallel()
	const second = "operator-console-second-token"
	pol := twoPersonPolicy(t, fmt.Sprintf("    - {id: operator_console, sha256: %s, role: admin}\n", sha(second)))
	if out, err := exec.Command(physdBin, "validate", "--policy", pol, greenhouse).CombinedOutput(); err != nil {
		t.Logf("policy with a duplicated identity id refused (held): %s", out)
		return
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	args := map[string]any{"value": 70, "idempotency_key": "same-id-1"}
	id := approvalID(t, structured(t, call(t, agent, "do_heater_zone_a", args)))
	if c := decide(t, d, id, second, `{"decision":"approve"}`); c == 200 {
		r := structured(t, call(t, agent, "do_heater_zone_a", args))
		t.Errorf("a second token of identity operator_console approved its own request (%d); call then: %v, writes %d",
			c, r["status"], d.sim(t).writes("zone_a.heater"))
	}
}

// TestHostileSecurityTwoPerson: viewer/no-token approvals, junk decisions,
// racing decisions, a grant reused for another value, key or caller, a
// grant raced through both retry paths, and replay.
func TestHostileSecurityTwoPerson(t *testing.T) {
	t.Parallel()
	pol := twoPersonPolicy(t, "")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	pending := func(key string) string {
		return approvalID(t, structured(t, call(t, agent, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": key})))
	}
	id := pending("tp-1")
	if c := decide(t, d, id, viewerToken, `{"decision":"approve"}`); c != 403 {
		t.Errorf("viewer approved: %d", c)
	}
	if c := decide(t, d, id, operatorToken, `{"decision":"approve"}`); c != 403 {
		t.Errorf("the caller approved itself: %d", c)
	}
	if c, _, _ := hsReq(t, d, "POST", "/approvals/"+id, "", "", `{"decision":"approve"}`); c != 401 {
		t.Errorf("no-token approval: %d", c)
	}
	for i, body := range []string{`{"decision":"APPROVE"}`, `{}`, `[]`, `{"decision":1}`, `"approve"`, `{"decision":"approve","extra":1}`, `{"decision":"approve "}`} {
		jid := pending(fmt.Sprintf("tp-junk-%d", i))
		if c := decide(t, d, jid, adminDemoToken, body); c == 200 {
			t.Errorf("junk decision %s accepted", body)
		}
	}
	if c := decide(t, d, id+"x", adminDemoToken, `{"decision":"approve"}`); c != 404 {
		t.Errorf("altered id: %d", c)
	}
	if c := decide(t, d, "../approvals/"+id, adminDemoToken, `{"decision":"approve"}`); c == 200 {
		t.Errorf("dotted id approved")
	}
	// Race approve and deny: exactly one wins.
	var wg sync.WaitGroup
	codes := make([]int, 10)
	grants := make([]string, 10)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"decision":"approve"}`
			if i%2 == 1 {
				body = `{"decision":"deny","reason":"race"}`
			}
			c, _, b := hsReq(t, d, "POST", "/approvals/"+id, "", "", body, "Bearer "+adminDemoToken)
			codes[i] = c
			var m map[string]any
			json.Unmarshal([]byte(b), &m)
			grants[i], _ = m["grant"].(string)
		}()
	}
	wg.Wait()
	won, grant := 0, ""
	for i, c := range codes {
		if c == 200 {
			won++
			grant = grants[i]
		} else if c != 409 {
			t.Errorf("racing decision answered %d, want 200 or 409", c)
		}
	}
	if won != 1 {
		t.Fatalf("%d racing decisions won: %v", won, codes)
	}
	if grant == "" {
		// the deny won; approve a fresh request for the grant attacks
		id = pending("tp-1b")
		c, _, b := hsReq(t, d, "POST", "/approvals/"+id, "", "", `{"decision":"approve"}`, "Bearer "+adminDemoToken)
		var m map[string]any
		json.Unmarshal([]byte(b), &m)
		grant, _ = m["grant"].(string)
		if c != 200 || grant == "" {
			t.Fatalf("approve: %d %s", c, b)
		}
		t.Log("deny won the race; using tp-1b")
		args := map[string]any{"value": 70, "idempotency_key": "tp-1b"}
		grantAttacks(t, d, agent, grant, args)
		return
	}
	grantAttacks(t, d, agent, grant, map[string]any{"value": 70, "idempotency_key": "tp-1"})
}

func grantAttacks(t *testing.T, d *daemon, agent *mcp.ClientSession, grant string, args map[string]any) {
	key := args["idempotency_key"].(string)
	// Another caller (admin) sending the grant as requestState: nothing runs.
	other := connectAs(t, d, "2026-07-28", adminDemoToken, nil)
	res, err := other.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: args, RequestState: grant})
	if a := decodeDo(t, res, err); a.Status == "success" {
		t.Errorf("another caller ran the operator's grant: %s", a.raw)
	}
	// The grant for another value or key (explicit requestState): nothing runs.
	for _, a := range []map[string]any{{"value": 75, "idempotency_key": key}, {"value": 70, "idempotency_key": key + "-other"}, {"value": 70.0001, "idempotency_key": key}} {
		res, err := agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: a, RequestState: grant})
		if r := decodeDo(t, res, err); r.Status == "success" {
			t.Errorf("grant for %v ran %v: %s", args, a, r.raw)
		}
	}
	// An altered grant.
	alt := grant[:len(grant)-2] + "AA"
	if alt == grant {
		alt = grant[:len(grant)-2] + "BB"
	}
	res, err = agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: args, RequestState: alt})
	if a := decodeDo(t, res, err); a.Status == "success" {
		t.Errorf("altered grant ran: %s", a.raw)
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 0 {
		t.Fatalf("writes before the caller's own repeat: %d", w)
	}
	// Race: the grant through both paths at once (requestState and the plain repeat), 8 times.
	var wg sync.WaitGroup
	answers := make([]hAnswer, 8)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: args}
			if i%2 == 0 {
				p.RequestState = grant
			}
			res, err := agent.CallTool(context.Background(), p)
			answers[i] = decodeDo(t, res, err)
		}()
	}
	wg.Wait()
	if w := d.sim(t).writes("zone_a.heater"); w != 1 {
		t.Errorf("one grant raced through both paths wrote %d times, want 1: %+v", w, answers)
	}
	// Replay later: the recorded answer, no new write; the grant with a new key runs nothing.
	doCall(t, agent, "do_heater_zone_a", args)
	res, err = agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a",
		Arguments: map[string]any{"value": 70, "idempotency_key": key + "-replay"}, RequestState: grant})
	if a := decodeDo(t, res, err); a.Status == "success" {
		t.Errorf("used grant with a new key ran: %s", a.raw)
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 1 {
		t.Errorf("writes after replay: %d, want 1", w)
	}
}

// TestHostileSecurityTrailingGarbageDecision: a decision body with bytes
// after the JSON object must be refused (400), not decided.
func TestHostileSecurityTrailingGarbageDecision(t *testing.T) {
	t.Parallel()
	pol := twoPersonPolicy(t, "")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	id := approvalID(t, structured(t, call(t, agent, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "tg-1"})))
	if c := decide(t, d, id, adminDemoToken, `{"decision":"approve"}{"decision":"deny"}`); c == 200 {
		t.Errorf(`body {"decision":"approve"}{"decision":"deny"} was accepted (200) as an approval`)
	}
}

const maxChangePolicy = `physmcp_policy_version: "0.1"
identity:
  tokens:
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
capabilities:
  do_fan_zone_b:
    rules:
      - {type: max_change, max: 40}
  do_heater_zone_c:
    rules:
      - {type: max_change, max: 10}
  do_heater_zone_a:
    rules:
      - {type: range_guard, min: 0, max: 30, on_violation: clamp}
      - {type: max_change, max: 10}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: all, tool: "do_*"}
`

// TestHostileSecurityMaxChange: the step limit through two racing calls,
// a clamp, a family tool and an unreadable device.
func TestHostileSecurityMaxChange(t *testing.T) {
	t.Parallel()
	pol := filepath.Join(t.TempDir(), "p.yml")
	os.WriteFile(pol, []byte(maxChangePolicy), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol, "--families", "on"}})
	cs := connectAs(t, d, "2026-07-28", adminDemoToken, nil)
	for i := range 5 {
		if a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": fmt.Sprintf("mc-%d-mid", i)}); a.Status != "success" {
			t.Fatalf("fan -> 40: %s %s", a.raw, a.toolErr)
		}
		// From 40, 80 and 0 are each one allowed step; together they are a step of 80.
		c1 := make(chan hAnswer, 1)
		c2 := make(chan hAnswer, 1)
		go func() {
			c1 <- doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 80, "idempotency_key": fmt.Sprintf("mc-%d-up", i)})
		}()
		go func() {
			c2 <- doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 0, "idempotency_key": fmt.Sprintf("mc-%d-down", i)})
		}()
		a1, a2 := <-c1, <-c2
		if (a1.Status == "success") == (a2.Status == "success") {
			t.Errorf("round %d: two quick calls from 40 to 80 and 0 (max_change 40): want exactly one success: %s / %s", i, a1.raw, a2.raw)
		}
	}
	// Clamp: 100 clamps to 30, a step of 30 from 0 > 10.
	if a := doCall(t, cs, "do_heater_zone_a", map[string]any{"value": 100, "idempotency_key": "mc-clamp"}); a.Code != "max_change_exceeded" {
		t.Errorf("clamped value (100 -> 30) past max_change 10: want max_change_exceeded: %s %s", a.raw, a.toolErr)
	}
	// Family tool: do_heater with zone zone_c.
	if a := doCall(t, cs, "do_heater", map[string]any{"zone": "zone_c", "value": 50, "idempotency_key": "mc-fam"}); a.Code != "max_change_exceeded" {
		t.Errorf("family do_heater zone_c 0 -> 50 (max_change 10): want max_change_exceeded: %s %s", a.raw, a.toolErr)
	}
	if w := d.sim(t).writes("zone_c.heater"); w != 0 {
		t.Errorf("zone_c heater written %d times", w)
	}
	// Unreadable device: offline, nothing written.
	d.fault(t, "zone_c.heater", "offline")
	if a := doCall(t, cs, "do_heater_zone_c", map[string]any{"value": 5, "idempotency_key": "mc-off"}); a.Status != "failed" || a.Permission != "source_unreachable" {
		t.Errorf("unreadable device: want failed/source_unreachable: %s %s", a.raw, a.toolErr)
	}
	if w := d.sim(t).writes("zone_c.heater"); w != 0 {
		t.Errorf("zone_c heater written %d times while unreadable", w)
	}
}

var prevRe = regexp.MustCompile(`"prev":"[0-9a-f]{64}"`)

// TestHostileSecurityAuditChain: truncated, removed-middle and recomputed
// trails against `physd audit verify`.
func TestHostileSecurityAuditChain(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	d := startHTTP(t, daemonOpts{state: state})
	cs := connectHTTP(t, d, "2026-07-28")
	for i := range 9 {
		if r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": i, "idempotency_key": fmt.Sprintf("ac-%d", i)})); r["status"] != "success" {
			t.Fatalf("do_: %v", r)
		}
	}
	cs.Close()
	d.stop(t)
	dir := filepath.Join(state, "audit")
	b, err := os.ReadFile(filepath.Join(dir, "audit.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	orig := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(orig) < 9 {
		t.Fatalf("only %d audit lines", len(orig))
	}
	third := len(orig) / 3
	write := func(parts map[string][]string) {
		os.RemoveAll(dir)
		os.MkdirAll(dir, 0o750)
		for name, ls := range parts {
			s := strings.Join(ls, "")
			if !strings.HasSuffix(s, "\n") {
				s += "\n"
			}
			os.WriteFile(filepath.Join(dir, name), []byte(s), 0o640)
		}
	}
	verify := func() (int, string) {
		out, err := exec.Command(physdBin, "audit", "verify", state).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), string(out)
		} else if err != nil {
			t.Fatal(err)
		}
		return 0, string(out)
	}
	rot := func() map[string][]string {
		return map[string][]string{
			"audit-2026-11-29.jsonl": append([]string{}, orig[:third]...),
			"audit-2026-11-30.jsonl": append([]string{}, orig[third:2*third]...),
			"audit.jsonl":            append([]string{}, orig[2*third:]...),
		}
	}
	write(rot())
	if c, out := verify(); c != 0 {
		t.Fatalf("rotated, intact: %d %s", c, out)
	}
	// A rotated file removed from the middle.
	p := rot()
	delete(p, "audit-2026-11-30.jsonl")
	write(p)
	if c, out := verify(); c != 1 {
		t.Errorf("middle rotated file removed: exit %d, want 1\n%s", c, out)
	}
	// A rotated file cut short (its last line gone).
	p = rot()
	p["audit-2026-11-30.jsonl"] = p["audit-2026-11-30.jsonl"][:third-1]
	write(p)
	if c, out := verify(); c != 1 {
		t.Errorf("rotated file cut short: exit %d, want 1\n%s", c, out)
	}
	// The oldest file cut at its start (first line gone): the chain then starts mid-trail.
	p = rot()
	p["audit-2026-11-29.jsonl"] = p["audit-2026-11-29.jsonl"][1:]
	write(p)
	if c, out := verify(); c == 0 && !strings.Contains(out, "from the trail's first line") {
		t.Logf("first line removed: exit 0, and verify does not claim the trail's first line (documented):\n%s", out)
	} else if c == 0 {
		t.Errorf("first line removed, yet verify says it checked from the trail's first line:\n%s", out)
	}
	// A cut tail of audit.jsonl: documented as undetectable; the head hash changes.
	write(map[string][]string{"audit.jsonl": orig})
	_, full := verify()
	write(map[string][]string{"audit.jsonl": orig[:len(orig)-2]})
	c, cut := verify()
	headOf := func(s string) string {
		_, h, _ := strings.Cut(s, "head sha256:")
		h, _, _ = strings.Cut(h, " ")
		return h
	}
	if c != 0 || headOf(cut) == headOf(full) {
		t.Errorf("tail cut: exit %d, heads %q %q (documented: exit 0, different head)", c, headOf(cut), headOf(full))
	}
	// An edited line with the chain recomputed from it onwards.
	edited := append([]string{}, orig...)
	k := len(edited) / 2
	edited[k] = strings.Replace(edited[k], `"applied_value":`, `"applied_value":9`, 1)
	for i := k + 1; i < len(edited); i++ {
		h := sha256.Sum256([]byte(strings.TrimSuffix(edited[i-1], "\n")))
		edited[i] = prevRe.ReplaceAllString(edited[i], `"prev":"`+hex.EncodeToString(h[:])+`"`)
	}
	write(map[string][]string{"audit.jsonl": edited})
	c, out := verify()
	t.Logf("recomputed chain: exit %d (a keyless hash chain cannot detect it; only the head hash differs: %v)", c, headOf(out) != headOf(full))
	if c == 0 && headOf(out) == headOf(full) {
		t.Errorf("recomputed chain gives the same head: the head hash is no anchor")
	}
}

// TestHostileSecurityDuplicateDecisionKey: a decision body with the key
// twice is ambiguous (a proxy, log or reviewer reading the first value sees
// "deny"; physd's decoder takes the last). It must be refused, not decided.
func TestHostileSecurityDuplicateDecisionKey(t *testing.T) {
	t.Parallel()
	pol := twoPersonPolicy(t, "")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	id := approvalID(t, structured(t, call(t, agent, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "dup-1"})))
	if c := decide(t, d, id, adminDemoToken, `{"decision":"deny","reason":"no","decision":"approve"}`); c == 200 {
		_, _, b := hsReq(t, d, "GET", "/approvals/"+id, "", "", "", "Bearer "+adminDemoToken)
		t.Errorf(`{"decision":"deny",…,"decision":"approve"} was accepted (200) and decided: %.300s`, b)
	}
}

const meshTokens = `physmcp_policy_version: "0.1"
identity:
  tokens:
    - {id: wall_display, sha256: 4a6c683b39708a1b1785f4dc5070fc32893b1eabc5c41c9634a5070f63640dfb, role: viewer}
    - {id: operator_console, sha256: d44723fb54413f57fbf393e54ead396013e587a55f29ae10d8565e39e2d6189d, role: operator}
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
`

// TestHostileSecurityMeshRoutedIdentity: through gateway A, a viewer's and
// an unknown token's routed do_ on B's operator-only fan are refused by B;
// an operator's runs and B audits the real caller and via gw_zone_a. A
// token B does not know (A-only) counts for nothing on B.
func TestHostileSecurityMeshRoutedIdentity(t *testing.T) {
	dir := t.TempDir()
	polA := filepath.Join(dir, "a.yml")
	polB := filepath.Join(dir, "b.yml")
	const aOnly = "gateway-a-only-admin-token"
	os.WriteFile(polA, []byte(meshTokens+fmt.Sprintf("    - {id: a_local_admin, sha256: %s, role: admin}\n", sha(aOnly))), 0o600)
	os.WriteFile(polB, []byte(meshTokens+`capabilities:
  do_fan_zone_b:
    rules:
      - {type: permission, require: [operator]}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
`), 0o600)
	mb, err := os.ReadFile(repoPath("examples/mesh-3node/node_a.yml"))
	if err != nil {
		t.Fatal(err)
	}
	manA := filepath.Join(dir, "node_a.yml")
	os.WriteFile(manA, append(mb, []byte("\nviews:\n  zone_a_only:\n    description: zone A only\n    zones: [zone_a]\n")...), 0o600)
	node := func(n, ip, pol string) *daemon {
		man := repoPath("examples/mesh-3node/node_" + n + ".yml")
		if n == "a" {
			man = manA
		}
		args := []string{"run", "--manifest", man, "--state", filepath.Join(dir, n), "--http", ip + ":0", "--sim-control", "--policy", pol}
		d := &daemon{cmd: exec.Command(physdBin, args...), state: filepath.Join(dir, n), stderr: &syncBuffer{}, done: make(chan error, 1), token: adminDemoToken}
		d.cmd.Stderr = d.stderr
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		t.Cleanup(func() { d.stop(t) })
		d.addr = d.stderr.logValue(t, "listening", "addr")
		d.stderr.logValue(t, "mesh joined", "node")
		return d
	}
	a := node("a", "127.0.0.2", polA)
	b := node("b", "127.0.0.3", polB)
	call := func(token, key string) hAnswer {
		cs := connectAs(t, a, "2026-07-28", token, nil)
		deadline := time.Now().Add(20 * time.Second)
		for {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b",
				Arguments: map[string]any{"value": 40, "idempotency_key": key, "source": "gw_zone_b"}})
			ans := decodeDo(t, res, err)
			if ans.toolErr == "" || time.Now().After(deadline) || !strings.Contains(ans.toolErr, "unknown") {
				return ans
			}
			time.Sleep(200 * time.Millisecond) // catalogs spread by gossip
		}
	}
	for _, c := range []struct{ who, token string }{{"viewer", viewerToken}, {"A-only admin", aOnly}} {
		if ans := call(c.token, "mesh-"+strings.ReplaceAll(c.who, " ", "-")); ans.Status == "success" || ans.Status == "partial" {
			t.Errorf("%s routed through A ran B's operator-only fan: %s", c.who, ans.raw)
		} else {
			t.Logf("%s: %s %s %s", c.who, ans.Permission, ans.Details, ans.toolErr)
		}
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 0 {
		t.Fatalf("B's fan written %d times by refused callers", w)
	}
	if ans := call(operatorToken, "mesh-op"); ans.Status != "success" {
		t.Fatalf("operator routed through A: %s %s", ans.raw, ans.toolErr)
	}
	// Through A's zone_a_only view, B's fan is out of reach whatever the source says.
	vs := connectAsPath(t, a, "/mcp/zone_a_only", operatorToken)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": "mesh-view-1", "source": "gw_zone_b"}},
		{"do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": "mesh-view-2"}},
		{"read_temperature_zone_b", map[string]any{"source": "gw_zone_b"}},
	} {
		res, err := vs.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err == nil && !res.IsError {
			t.Errorf("through /mcp/zone_a_only %s %v answered: %s", c.tool, c.args, text(res))
		}
	}
	if tl, err := vs.ListTools(context.Background(), nil); err == nil {
		for _, tool := range tl.Tools {
			js, _ := json.Marshal(tool)
			if strings.Contains(string(js), "gw_zone_b") || strings.Contains(string(js), "zone_b") {
				t.Errorf("/mcp/zone_a_only lists %s naming zone B", tool.Name)
			}
		}
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("B's fan writes after view attacks: %d, want 1", w)
	}
	trail, _ := os.ReadFile(filepath.Join(dir, "b", "audit", "audit.jsonl"))
	found := false
	for _, l := range strings.Split(string(trail), "\n") {
		if strings.Contains(l, `"event":"do"`) && strings.Contains(l, "mesh-op") {
			found = true
			if !strings.Contains(l, "operator_console") || !strings.Contains(l, `"via":"gw_zone_a"`) {
				t.Errorf("B's audit of the routed do_ lacks the caller or via: %s", l)
			}
		}
		if strings.Contains(l, "mesh-A-only") && strings.Contains(l, "a_local_admin") {
			t.Errorf("B audited a caller it cannot know: %s", l)
		}
	}
	if !found {
		t.Errorf("no do line for mesh-op in B's audit:\n%s", trail)
	}
}

func connectAsPath(t *testing.T, d *daemon, path, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url(path), HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatalf("connect %s: %v\n%s", path, err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// TestHostileSecurityViewLeaks: through /mcp/zone_a (and a zone_a view with
// families), nothing of zone_b/zone_c is reachable: tools, family zone
// arguments, can_do candidates/blocked/related reads/observations,
// resources obs/history/alarms/manifest and subscriptions.
func TestHostileSecurityViewLeaks(t *testing.T) {
	t.Parallel()
	m := viewManifest(t)
	d := startHTTP(t, daemonOpts{manifest: m, extra: []string{"--policy", greenhousePolicy}})
	outside := []string{"zone_b", "zone_c"}
	leaks := func(where, s string) {
		for _, z := range outside {
			if i := strings.Index(s, z); i >= 0 {
				t.Errorf("%s names %s: …%s…", where, z, s[max(0, i-700):min(len(s), i+300)])
			}
		}
	}
	for _, path := range []string{"/mcp/zone_a", "/mcp/zone_a_fam"} {
		cs := connectAsPath(t, d, path, adminDemoToken)
		tl, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		names := []string{}
		for _, tool := range tl.Tools {
			names = append(names, tool.Name)
			js, _ := json.Marshal(tool)
			leaks(path+" tool "+tool.Name, string(js))
		}
		t.Logf("%s lists %v", path, names)
		// Tools outside by instance and by family.
		for _, c := range []struct {
			tool string
			args map[string]any
		}{
			{"read_temperature_zone_c", map[string]any{}},
			{"read_temperature", map[string]any{"zone": "zone_c"}},
			{"do_heater", map[string]any{"zone": "zone_c", "value": 10, "idempotency_key": "v-fam-" + path[5:]}},
			{"do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": "v-inst-" + path[5:]}},
			{"do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": "v-fan-" + path[5:]}},
		} {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
			if err == nil && !res.IsError {
				t.Errorf("%s: %s %v answered: %s", path, c.tool, c.args, text(res))
			}
		}
		// can_do for heating and ventilation: nothing outside in any part of the answer.
		for i, args := range []map[string]any{
			{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "value": 20}},
			{"intent": map[string]any{"semantic_tags": []string{"ventilation"}, "action": "set", "value": 20}},
			{"intent": map[string]any{"semantic_tags": []string{"temperature"}, "action": "read"}},
			{"intent": map[string]any{"semantic_tags": []string{"humidity"}, "action": "read"}},
			{"intent": map[string]any{"semantic_tags": []string{"cooling"}, "action": "set", "value": 20}},
			{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "value": 20, "target": "heater"}},
			{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "value": 20}, "scope": []string{"do_heater_zone_c", "heater_zone_c", "gw_greenhouse_001"}},
		} {
			tags := i
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: args})
			if err != nil {
				t.Fatal(err)
			}
			r := text(res)
			var rep map[string]any
			json.Unmarshal([]byte(r), &rep)
			delete(rep, "metadata")
			js, _ := json.Marshal(rep)
			leaks(fmt.Sprintf("%s can_do %v", path, tags), string(js))
		}
		// Resources.
		for _, uri := range []string{"physmcp://obs/temperature_zone_c", "physmcp://history/temperature_zone_c", "physmcp://history/heater_zone_c",
			"physmcp://obs/fan_zone_b", "physmcp://obs/temperature_zone_c?x=1", "physmcp://obs/temperature_zone_a/../temperature_zone_c",
			"physmcp://obs/TEMPERATURE_ZONE_C", "physmcp://history/temperature_zone_c%00"} {
			res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
			if err == nil {
				js, _ := json.Marshal(res)
				t.Errorf("%s: %s read outside the view: %.300s", path, uri, js)
			}
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("calls outside the view wrote %d times", w)
	}
}

// viewManifest: the greenhouse manifest with a zone_a view with families.
func viewManifest(t *testing.T) string {
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	m := filepath.Join(t.TempDir(), "m.yml")
	os.WriteFile(m, []byte(strings.Replace(string(b), "\nviews:\n", "\nviews:\n  zone_a_fam:\n    description: zone A by family\n    zones: [zone_a]\n    families: true\n", 1)), 0o600)
	return m
}

// TestHostileSecurityViewResourceList: resources/list through /mcp/zone_a
// must not list observation resources of capabilities outside the view
// (their resources/read is refused "not in the view").
func TestHostileSecurityViewResourceList(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	cs := connectAsPath(t, d, "/mcp/zone_a", adminDemoToken)
	rl, err := cs.ListResources(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rl.Resources {
		if strings.Contains(r.URI, "zone_b") || strings.Contains(r.URI, "zone_c") {
			_, rerr := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: r.URI})
			t.Errorf("/mcp/zone_a lists %s (read: %v)", r.URI, rerr)
		}
	}
}

// TestHostileSecurityViewManifestResource: physmcp://manifest through a view
// must show only the view's capabilities.
func TestHostileSecurityViewManifestResource(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	cs := connectAsPath(t, d, "/mcp/zone_a", adminDemoToken)
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://manifest"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"temperature_zone_c", "heater_zone_c", "fan_zone_b"} {
		if strings.Contains(res.Contents[0].Text, `"`+name+`"`) {
			t.Errorf("physmcp://manifest through /mcp/zone_a names %s", name)
		}
	}
}

// TestHostileSecurityStdioViewSubscribe: over stdio with --view zone_a (the
// 2025-11-25 era, where resources/subscribe is real), a subscription to an
// observation outside the view must be refused.
func TestHostileSecurityStdioViewSubscribe(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(physdBin, "run", "--manifest", greenhouse, "--state", t.TempDir(), "--stdio", "--view", "zone_a", "--http", "127.0.0.1:0", "--sim-control")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	updates := make(chan string, 64)
	c := mcp.NewClient(&mcp.Implementation{Name: "sub-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params.URI }})
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	d := &daemon{cmd: cmd, addr: stderr.logValue(t, "listening", "addr"), stderr: stderr}
	if _, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://obs/temperature_zone_c"}); err == nil {
		t.Errorf("read of an observation outside the view over stdio answered")
	}
	serr := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "physmcp://obs/temperature_zone_c"})
	if serr == nil {
		d.fault(t, "zone_c.temperature", "offline") // a quality change is an update
		select {
		case u := <-updates:
			t.Errorf("stdio --view zone_a: subscribed to physmcp://obs/temperature_zone_c and was told of its change (%s)", u)
		case <-time.After(5 * time.Second):
			t.Errorf("stdio --view zone_a: resources/subscribe to physmcp://obs/temperature_zone_c (outside the view) accepted")
		}
	}
}

// TestHostileSecurityListedMeansCallable: for each role, every listed do_
// is not refused for role, and every unlisted do_ is.
func TestHostileSecurityListedMeansCallable(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	vals := map[string]float64{"do_heater_zone_a": 10, "do_heater_zone_c": 10, "do_fan_zone_b": 10, "do_vent_zone_c": 50, "do_irrigation_valve": 10}
	for _, tok := range []string{viewerToken, operatorToken, adminDemoToken} {
		for _, path := range []string{"/mcp", "/mcp/zone_a", "/mcp/water", "/mcp/observe"} {
			cs := connectAsPath(t, d, path, tok)
			tl, err := cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			listed := map[string]bool{}
			for _, tool := range tl.Tools {
				listed[tool.Name] = true
			}
			for tool, v := range vals {
				a := doCall(t, cs, tool, map[string]any{"value": v, "idempotency_key": fmt.Sprintf("lc-%s-%s-%s", tok[11:14], strings.ReplaceAll(path, "/", "_"), tool)})
				refusedForRole := a.Permission == "permission_insufficient"
				if listed[tool] && (refusedForRole || a.toolErr != "") {
					t.Errorf("%s %s: %s listed but refused: %s %s", tok, path, tool, a.raw, a.toolErr)
				}
				if !listed[tool] && path == "/mcp" && !refusedForRole {
					t.Errorf("%s %s: %s not listed but runnable: %s %s", tok, path, tool, a.raw, a.toolErr)
				}
			}
		}
	}
}

// TestHostileSecurityHostSpellings: Host values that look local but name
// another host never pass the Host check.
func TestHostileSecurityHostSpellings(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	_, port, _ := net.SplitHostPort(d.addr)
	for _, h := range []string{"127.0.0.1.nip.io", "localhost.attacker.example", "attacker.example:" + port, "127.0.0.1.attacker.example:" + port,
		"localhost:" + port + ".attacker.example", "xn--localhost", "127.0.0.1 attacker.example", "attacker.example,127.0.0.1", "0x7f000001.attacker.example"} {
		c, _, b := hsReq(t, d, "GET", "/status", h, "", "", "Bearer "+adminDemoToken)
		if c/100 == 2 {
			t.Errorf("Host %q reached /status: %d %.80s", h, c, b)
		}
	}
	// The loopback spellings do pass (the check is not simply closed).
	for _, h := range []string{"localhost:" + port, "127.0.0.1:" + port, "LOCALHOST:" + port} {
		if c, _, b := hsReq(t, d, "GET", "/status", h, "", "", "Bearer "+adminDemoToken); c != 200 {
			t.Errorf("Host %q: %d %.80s, want 200", h, c, b)
		}
	}
}

// TestHostileSecurityApprovalsPageEscapes: a key chosen by the caller shows
// on the approvals page escaped, never as markup.
func TestHostileSecurityApprovalsPageEscapes(t *testing.T) {
	t.Parallel()
	pol := twoPersonPolicy(t, "")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	const key = `<script>alert(1)</script><img/src=x/onerror=alert(2)>`
	res, err := agent.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: map[string]any{"value": 70, "idempotency_key": key}})
	if a := decodeDo(t, res, err); a.Code != "approval_pending" {
		t.Skipf("the key was refused before an approval was registered (held): %s %s", a.raw, a.toolErr)
	}
	req, _ := http.NewRequest("GET", d.url("/approvals"), nil)
	req.Header.Set("Accept", "text/html")
	req.Header.Set("Authorization", "Bearer "+adminDemoToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if strings.Contains(string(b), "<script>alert") || strings.Contains(string(b), "<img/src") {
		t.Errorf("approvals page renders the caller's key as markup:\n%s", b)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); csp == "" {
		t.Logf("approvals page has no Content-Security-Policy header")
	}
}

// TestHostileSecurityGrantAfterReload: a grant signed by an admin whose role
// a policy reload then lowers runs nothing (the approver is re-checked
// against the policy in force).
func TestHostileSecurityGrantAfterReload(t *testing.T) {
	t.Parallel()
	pol := twoPersonPolicy(t, "")
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	args := map[string]any{"value": 70, "idempotency_key": "reload-1"}
	id := approvalID(t, structured(t, call(t, agent, "do_heater_zone_a", args)))
	if c := decide(t, d, id, adminDemoToken, `{"decision":"approve"}`); c != 200 {
		t.Fatalf("approve: %d", c)
	}
	b, _ := os.ReadFile(pol)
	demoted := strings.Replace(string(b), "site_admin, sha256: "+adminDemoTokenHash+", role: admin", "site_admin, sha256: "+adminDemoTokenHash+", role: operator", 1)
	if demoted == string(b) {
		t.Fatal("could not demote site_admin")
	}
	os.WriteFile(pol, []byte(demoted), 0o600)
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.logValue(t, "policy reloaded", "tools")

	d.token = operatorToken
	a := doCall(t, agent, "do_heater_zone_a", args)
	if a.Status == "success" || d.sim(t).writes("zone_a.heater") != 0 {
		t.Errorf("a grant by an approver demoted to operator still ran: %s %s", a.raw, a.toolErr)
	}
}

// TestHostileSecuritySelfApprovalTrueWithoutRole: self_approval: true lets
// only a caller that holds the approver role confirm itself; an operator
// under approver_role admin is still told to find another person.
func TestHostileSecuritySelfApprovalTrueWithoutRole(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	s := strings.Replace(string(b), "{type: approval, when: above, above: 60}", "{type: approval, when: above, above: 60, approver_role: admin, self_approval: true}", 1)
	pol := filepath.Join(t.TempDir(), "p.yml")
	os.WriteFile(pol, []byte(s), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept) // accepts every elicitation
	a := doCall(t, agent, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "selftrue-1"})
	if a.Status == "success" || d.sim(t).writes("zone_a.heater") != 0 {
		t.Errorf("an operator confirmed its own call under approver_role admin: %s", a.raw)
	}
	// An admin caller may confirm itself.
	self := connectAs(t, d, "2026-07-28", adminDemoToken, accept)
	if a := doCall(t, self, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "selftrue-2"}); a.Status != "success" {
		t.Errorf("admin self-confirmation under self_approval: true: %s %s", a.raw, a.toolErr)
	}
}

// TestHostileSecurityOddCredentialsAndOverride: a token in the query string
// or a cookie authenticates nothing; TRACE echoes nothing; the override's
// ttl is capped by override_token_ttl_seconds (900) whatever is asked.
func TestHostileSecurityOddCredentialsAndOverride(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	for _, p := range []string{"/status?access_token=" + adminDemoToken, "/status?token=" + adminDemoToken, "/metrics?auth=" + adminDemoToken} {
		// access_token is OAuth's query parameter: refused outright as
		// invalid_request (RFC 6750 §2.3, the MCP authorization spec); the
		// other names are no credential at all.
		want := 401
		if strings.Contains(p, "access_token=") {
			want = 400
		}
		if c, _, _ := hsReq(t, d, "GET", p, "", "", ""); c != want {
			t.Errorf("GET %s: %d, want %d", p, c, want)
		}
	}
	req, _ := http.NewRequest("GET", d.url("/status"), nil)
	req.AddCookie(&http.Cookie{Name: "token", Value: adminDemoToken})
	req.Header.Set("X-Auth-Token", adminDemoToken)
	req.Header.Set("Proxy-Authorization", "Bearer "+adminDemoToken)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("cookie/X-Auth-Token/Proxy-Authorization authenticated: %v %v", err, resp.StatusCode)
	}
	if c, _, b := hsReq(t, d, "TRACE", "/status", "", "", "", "Bearer "+adminDemoToken); c/100 == 2 || strings.Contains(b, adminDemoToken) {
		t.Errorf("TRACE: %d %.100s", c, b)
	}
	for _, body := range []string{`{"reason":"x","ttl_s":99999999}`, `{"reason":"x","ttl_s":-5}`, `{"reason":"x","ttl_s":1e300}`, `{"reason":"","ttl_s":60}`} {
		c, _, b := hsReq(t, d, "POST", "/emergency/override", "", "", body, "Bearer "+adminDemoToken)
		t.Logf("override %s: %d %.200s", body, c, b)
		if c != 200 {
			continue // refused: fine
		}
		var m map[string]any
		json.Unmarshal([]byte(b), &m)
		until, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(m["until"]))
		if until.IsZero() {
			t.Logf("override %s: 200 %s", body, b)
		} else if time.Until(until) > 901*time.Second || time.Until(until) < 0 {
			t.Errorf("override %s lasts until %v (cap 900 s)", body, until)
		}
		if strings.Contains(body, `"reason":""`) {
			t.Errorf("override with an empty reason accepted: %s", b)
		}
		hsReq(t, d, "DELETE", "/emergency/override", "", "", "", "Bearer "+adminDemoToken)
	}
}

// TestHostileSecurityAuditReorderAndDuplicate: two lines swapped, a line
// duplicated, and a line deleted in the middle are each a break.
func TestHostileSecurityAuditReorderAndDuplicate(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	d := startHTTP(t, daemonOpts{state: state})
	cs := connectHTTP(t, d, "2026-07-28")
	for i := range 6 {
		if r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": i, "idempotency_key": fmt.Sprintf("ro-%d", i)})); r["status"] != "success" {
			t.Fatalf("do_: %v", r)
		}
	}
	cs.Close()
	d.stop(t)
	path := filepath.Join(state, "audit", "audit.jsonl")
	b, _ := os.ReadFile(path)
	orig := strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
	n := len(orig)
	if n < 6 {
		t.Fatalf("%d lines", n)
	}
	fix := func(ls []string) string {
		s := strings.Join(ls, "")
		if !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		return s
	}
	for name, ls := range map[string][]string{
		"swapped":    append(append(append([]string{}, orig[:2]...), orig[3], orig[2]), orig[4:]...),
		"duplicated": append(append([]string{}, orig[:3]...), orig[2:]...),
		"deleted":    append(append([]string{}, orig[:2]...), orig[3:]...),
	} {
		os.WriteFile(path, []byte(fix(ls)), 0o640)
		out, err := exec.Command(physdBin, "audit", "verify", state).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "BROKEN") {
			t.Errorf("%s line: %v\n%s", name, err, out)
		}
	}
}

// TestHostileSecurityViewCanDoUnroutable: can_do through /mcp/zone_a must
// not name capabilities outside the view anywhere, including
// unroutable[].producers_found and missing_requirements.
func TestHostileSecurityViewCanDoUnroutable(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	cs := connectAsPath(t, d, "/mcp/zone_a", adminDemoToken)
	for _, loc := range []string{"zone C", "zone_c", "greenhouse"} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: map[string]any{
			"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "value": 20, "location": loc}}})
		if err != nil {
			t.Fatal(err)
		}
		var rep map[string]any
		json.Unmarshal([]byte(text(res)), &rep)
		delete(rep, "metadata")
		js, _ := json.Marshal(rep)
		for _, name := range []string{"do_heater_zone_c", "heater_zone_c", "zone zone_c", "vent_zone_c", "fan_zone_b"} {
			if strings.Contains(string(js), name) {
				t.Errorf("can_do (location %q) through /mcp/zone_a names %s: %s", loc, name, js)
			}
		}
	}
}

// TestHostileSecurityFamilyListsFollowRole: with families on, a family do_
// tool is listed only to roles that can run it, and every zone of a listed
// family tool is callable (not refused for role).
func TestHostileSecurityFamilyListsFollowRole(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy, "--families", "on"}})
	for _, tok := range []string{viewerToken, operatorToken, adminDemoToken} {
		cs := connectAs(t, d, "2026-07-28", tok, nil)
		tl, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]*mcp.Tool{}
		for _, tool := range tl.Tools {
			listed[tool.Name] = tool
		}
		if (listed["do_heater"] != nil) != (tok != viewerToken) {
			t.Errorf("%s: do_heater listed=%v", tok, listed["do_heater"] != nil)
		}
		for _, zone := range []string{"zone_a", "zone_c"} {
			a := doCall(t, cs, "do_heater", map[string]any{"zone": zone, "value": 10, "idempotency_key": "fam-" + tok[11:14] + "-" + zone})
			refused := a.Permission == "permission_insufficient"
			if listed["do_heater"] != nil && (refused || a.toolErr != "") {
				t.Errorf("%s: do_heater listed but zone %s refused: %s %s", tok, zone, a.raw, a.toolErr)
			}
			if listed["do_heater"] == nil && a.Status == "success" {
				t.Errorf("%s: do_heater not listed but zone %s ran: %s", tok, zone, a.raw)
			}
		}
		// Instance tools stay callable but unlisted; they are judged by role all the same.
		if tok == viewerToken {
			if a := doCall(t, cs, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": "fam-inst-viewer"}); a.Permission != "permission_insufficient" {
				t.Errorf("viewer, unlisted instance do_heater_zone_c: %s %s", a.raw, a.toolErr)
			}
		}
	}
}

// TestHostileSecurityOpenRoutesTellNothing: /healthz and /readyz answer
// without a credential but name neither the device nor the version; a
// viewer gets them.
func TestHostileSecurityOpenRoutesTellNothing(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	for _, p := range []string{"/healthz", "/readyz", "/healthz?verbose=1", "/readyz?full=true"} {
		c, h, b := hsReq(t, d, "GET", p, "", "", "")
		if c != 200 && c != 503 {
			t.Errorf("%s: %d", p, c)
		}
		for _, secret := range []string{"gw_greenhouse_001", "physd/", "zone_a", "heater"} {
			if strings.Contains(b, secret) || strings.Contains(fmt.Sprint(h), secret) {
				t.Errorf("%s without a credential tells %q: %s %v", p, secret, b, h)
			}
		}
		if c, _, b := hsReq(t, d, "GET", p, "", "", "", "Bearer "+viewerToken); c != 200 || !strings.Contains(b, "gw_greenhouse_001") {
			t.Logf("%s as viewer: %d %.200s", p, c, b)
		}
	}
}
