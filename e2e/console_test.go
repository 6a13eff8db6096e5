package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// consoleFixture is the greenhouse with a two-person rule on heating zones
// A and C above 60 % (an operator approves, never the one who asked) and a high
// humidity alarm in zone A (its 72 % is above 60 from the start).
func consoleFixture(t *testing.T) (*daemon, string) {
	t.Helper()
	dir := t.TempDir()
	pb, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	const rule = "{type: approval, when: above, above: 60}"
	mb, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	const hum = "    family: humidity\n    cache_ttl_ms: 2000\n"
	if !strings.Contains(string(pb), rule) || !strings.Contains(string(mb), hum) {
		t.Fatal("the greenhouse example changed: update this test")
	}
	pol := filepath.Join(dir, "policy.yml")
	const rangeC = "{type: range_guard, min: 0, max: 80, on_violation: deny}\n"
	if !strings.Contains(string(pb), rangeC) {
		t.Fatal("the greenhouse policy changed: update this test")
	}
	ptext := strings.Replace(string(pb), rule, "{type: approval, when: above, above: 60, approver_role: operator}", 1)
	ptext = strings.Replace(ptext, rangeC, rangeC+"      - {type: approval, when: above, above: 60, approver_role: operator}\n", 1)
	if err := os.WriteFile(pol, []byte(ptext), 0o600); err != nil {
		t.Fatal(err)
	}
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(strings.Replace(string(mb), hum, hum+"    alarms: {high: 60, hysteresis: 2}\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return startHTTP(t, daemonOpts{manifest: man, extra: []string{"--policy", pol}}), pol
}

// pendingApprovals is GET /approvals as the admin sees it.
func pendingApprovals(t *testing.T, d *daemon) []map[string]any {
	t.Helper()
	code, body := d.request(t, "GET", "/approvals", "")
	var out struct {
		Approvals []map[string]any `json:"approvals"`
	}
	if code != 200 || json.Unmarshal(body, &out) != nil {
		t.Fatalf("GET /approvals: %d %s", code, body)
	}
	return out.Approvals
}

// TestConsoleInChromium drives the operator's console in headless
// Chromium through the DevTools protocol, with the keyboard: a wrong token
// is refused and a right one signs in; a value changes on screen within
// 2 s without a reload; the operator who asked is refused approving their
// own request; a form post without the CSRF token and one from another
// origin are refused; after signing out, a second person approves, the
// agent's repeated call actuates, and the console shows the actuation.
// With PHYSD_SCREENSHOTS=<dir> it saves the console at 1280 and 390 px.
func TestConsoleInChromium(t *testing.T) {
	d, _ := consoleFixture(t)
	p := openBrowser(t)
	status := func() int {
		var code int
		p.eval(`performance.getEntriesByType('navigation')[0].responseStatus`, &code)
		return code
	}

	// Sign in: the console sends a browser without a session to the form.
	p.navigate(d.url("/"))
	if u := p.str("location.pathname + location.search"); u != "/login?next=%2F" {
		t.Fatalf("GET / without a session landed on %s", u)
	}
	p.typeInto("#token", "greenhouse-not-a-token")
	p.eval(`window.__nav = 1`, nil)
	p.press("Enter", 13)
	p.loaded()
	if !strings.Contains(p.str(`document.getElementById('login-error')?.innerText || ''`), "not known to this policy") || status() != 401 {
		t.Fatalf("a wrong token: %d %s", status(), p.text())
	}
	if focused := p.str(`document.activeElement.id`); focused != "token" {
		t.Errorf("after a refused sign-in the focus is on %q, not the token field", focused)
	}
	p.typeInto("#token", operatorToken)
	p.eval(`window.__nav = 1`, nil)
	p.press("Enter", 13)
	p.loaded()
	if p.str("location.pathname") != "/" || !strings.Contains(p.text(), "Signed in as token:operator_console (operator)") {
		t.Fatalf("after signing in: %s\n%s", p.str("location.href"), p.text())
	}
	if p.str(`document.cookie`) != "" {
		t.Errorf("script can read cookies: %q", p.str(`document.cookie`))
	}
	// Values nobody polled are read by the console itself.
	p.until("the zone A temperature", `/^\d+(\.\d+)? celsius$/.test(document.querySelector('#cap-read_temperature_zone_a td.value').innerText.trim())`, 3*time.Second)
	p.until("the live badge", `document.getElementById('conn').innerText === 'live'`, 3*time.Second)

	// A value changes on screen without a reload.
	agent := connectAs(t, d, "2026-07-28", operatorToken, accept)
	p.eval(`window.__same = 1`, nil)
	if r := structured(t, call(t, agent, "do_fan_zone_b", map[string]any{"value": 37, "idempotency_key": "console-fan"})); r["status"] != "success" {
		t.Fatalf("do_fan_zone_b: %v", r)
	}
	took := p.until("the fan's new value", `document.querySelector('#cap-do_fan_zone_b .v').innerText === '37'`, 2*time.Second)
	if p.str(`String(window.__same)`) != "1" {
		t.Fatal("the page reloaded to show the value")
	}
	t.Logf("the fan's new value showed %v after the actuation", took)

	// The operator's own request: shown exactly, and refused to them.
	args := map[string]any{"value": 70, "idempotency_key": "console-heat"}
	r := structured(t, call(t, agent, "do_heater_zone_a", args))
	if r["code"] != "approval_pending" {
		t.Fatalf("do_heater_zone_a 70: %v", r)
	}
	pend := pendingApprovals(t, d)
	if len(pend) != 1 {
		t.Fatalf("pending: %v", pend)
	}
	id, def := pend[0]["id"].(string), pend[0]["definition"].(string)
	card := `document.getElementById('approval-` + id + `')`
	p.until("the pending approval", card+` !== null`, 3*time.Second)
	cardText := p.str(card + `.innerText`)
	for _, want := range []string{"do_heater_zone_a to 70 percent", "Requested value\n70 percent", "Value now\n0 percent", "token:operator_console (operator)", def, "console-heat", "operator or higher"} {
		if !strings.Contains(cardText, want) {
			t.Errorf("the approval card lacks %q:\n%s", want, cardText)
		}
	}
	approve := `[id="approval-` + id + `"] button.approve`
	p.submitWith(approve)
	if got := p.str(`document.getElementById('notice')?.innerText || ''`); status() != 403 || !strings.Contains(got, "cannot approve their own request") {
		t.Fatalf("approving one's own request: %d %q\n%s", status(), got, p.text())
	}
	if focused := p.str(`document.activeElement.id`); focused != "notice" {
		t.Errorf("the refusal does not take the focus (focus on %q)", focused)
	}
	if pend := pendingApprovals(t, d); len(pend) != 1 || pend[0]["state"] != "pending" {
		t.Fatalf("after the self-approval: %v", pend)
	}

	// Forged posts: the session's cookie goes along, the token does not.
	p.navigate(d.url("/"))
	var code int
	p.eval(`fetch('/console/approvals/`+id+`', {method: 'POST', body: new URLSearchParams({decision: 'approve'})}).then(r => r.status)`, &code)
	if code != 403 {
		t.Errorf("a same-origin post without the CSRF token: %d", code)
	}
	// Another origin of the same site (another port of 127.0.0.1: the
	// SameSite=Strict cookie is sent) posts a form to the console.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<form id="f" method="post" action="%s"><input name="decision" value="approve"><input name="csrf" value="guess"></form>`+
			`<script>document.getElementById('f').submit()</script>`, d.url("/console/approvals/"+id))
	}))
	defer evil.Close()
	p.navigate(evil.URL)
	p.until("the cross-origin post's answer", `location.href.startsWith(`+jsString(d.url("/console/approvals/"))+`) && document.readyState === 'complete'`, 10*time.Second)
	if body := p.text(); status() != 403 || !strings.Contains(body, "is not this server's origin") {
		t.Errorf("a cross-origin form post: %d %s", status(), body)
	}
	if pend := pendingApprovals(t, d); len(pend) != 1 || pend[0]["state"] != "pending" {
		t.Fatalf("after the forged posts: %v", pend)
	}

	// Sign out; a second person signs in and approves.
	p.navigate(d.url("/"))
	p.submitWith(`form[action="/logout"] button`)
	if p.str("location.pathname") != "/login" {
		t.Fatalf("after signing out: %s", p.str("location.href"))
	}
	p.typeInto("#token", adminDemoToken)
	p.eval(`window.__nav = 1`, nil)
	p.press("Enter", 13)
	p.loaded()
	p.until("the approval for the admin", `document.querySelector(`+jsString(approve)+`) !== null`, 3*time.Second)
	p.typeInto(`[id="reason-`+id+`"]`, "zone A is cold, checked on site")
	p.submitWith(approve)
	if got := p.str(`document.getElementById('notice')?.innerText || ''`); p.str("location.pathname") != "/" || !strings.Contains(got, "Approved "+id) {
		t.Fatalf("the admin's approval: %q\n%s", got, p.text())
	}
	if r := structured(t, call(t, agent, "do_heater_zone_a", args)); r["status"] != "success" || !strings.Contains(fmt.Sprint(r["details"]), "approved_by=token:site_admin") {
		t.Fatalf("the approved call: %v", r)
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 1 {
		t.Fatalf("zone A heater writes: %d", w)
	}
	row := `[...document.querySelectorAll('#recent tbody tr')].find(r => r.innerText.includes('do_heater_zone_a'))`
	p.until("the actuation in the console", row+`?.innerText.includes('success') && `+row+`.innerText.includes('token:operator_console')`, 2*time.Second)
	p.until("the heater's value", `document.querySelector('#cap-do_heater_zone_a .v').innerText === '70'`, 2*time.Second)

	// Acknowledge the humidity alarm with the keyboard; it stays listed,
	// acknowledged, below any unacknowledged one.
	ack := `#alarms form[action="/console/alarms/ack"] button`
	p.until("the humidity alarm", `document.querySelector(`+jsString(ack)+`) !== null`, 5*time.Second)
	p.submitWith(ack)
	if got := p.text(); !strings.Contains(got, "Acknowledged high on read_humidity_zone_a") || !strings.Contains(got, "acknowledged by token:site_admin") {
		t.Fatalf("after acknowledging:\n%s", got)
	}

	if dir := os.Getenv("PHYSD_SCREENSHOTS"); dir != "" {
		// A request waiting for the admin, for the pictures.
		r := structured(t, call(t, agent, "do_heater_zone_c", map[string]any{"value": 65, "idempotency_key": "console-shot"}))
		if r["code"] != "approval_pending" {
			t.Fatalf("do_heater_zone_c 65: %v", r)
		}
		p.navigate(d.url("/"))
		p.until("the zone C request", `[...document.querySelectorAll('article.approval')].some(a => a.innerText.includes('do_heater_zone_c'))`, 3*time.Second)
		if !filepath.IsAbs(dir) {
			dir = repoPath(dir)
		}
		for _, w := range []int{1280, 390} {
			path := filepath.Join(dir, fmt.Sprintf("console-%d.png", w))
			p.screenshot(path, w)
			t.Logf("screenshot %s", path)
		}
	}
}
