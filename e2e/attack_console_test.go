package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Attacks on the operator's console (sign-in sessions, CSRF, the console's
// approval and alarm forms, /console/live) and on the boundary's caller
// tickets, through the built binary's real HTTP surface. Each test would
// fail if the defence it names were missing.

// acOpts is one hand-made HTTP request: what a browser, a forger or a
// script would send.
type acOpts struct {
	host, origin, secFetch string
	origins                []string // several Origin headers
	cookies                map[string]string
	form                   url.Values // sent as application/x-www-form-urlencoded
	rawBody, ctype         string     // another body and media type
	json                   string
	auth                   string
	csrfHeader             string
	accept                 string
	from                   string // the local IP to connect from (127.0.0.0/8)
	header                 http.Header
}

type acResp struct {
	code int
	hdr  http.Header
	body string
}

var acTransports sync.Map // from IP -> *http.Transport

func acTransport(from string) *http.Transport {
	if v, ok := acTransports.Load(from); ok {
		return v.(*http.Transport)
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	tr := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64, DisableCompression: true}
	v, _ := acTransports.LoadOrStore(from, tr)
	return v.(*http.Transport)
}

// acDo sends one request; it is safe in goroutines (a transport error is
// reported with t.Errorf and answers code 0).
func acDo(t *testing.T, d *daemon, method, path string, o acOpts) acResp {
	t.Helper()
	var body io.Reader
	ctype := ""
	switch {
	case o.form != nil:
		body, ctype = strings.NewReader(o.form.Encode()), "application/x-www-form-urlencoded"
	case o.json != "":
		body, ctype = strings.NewReader(o.json), "application/json"
	case o.rawBody != "":
		body = strings.NewReader(o.rawBody)
	}
	if o.ctype != "" {
		ctype = o.ctype
	}
	req, err := http.NewRequest(method, d.url(path), body)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return acResp{}
	}
	if o.host != "" {
		req.Host = o.host
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, vs := range o.header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if o.origin != "" {
		req.Header.Set("Origin", o.origin)
	}
	for _, x := range o.origins {
		req.Header.Add("Origin", x)
	}
	if o.secFetch != "" {
		req.Header.Set("Sec-Fetch-Site", o.secFetch)
	}
	for k, v := range o.cookies {
		req.AddCookie(&http.Cookie{Name: k, Value: v})
	}
	if o.auth != "" {
		req.Header.Set("Authorization", "Bearer "+o.auth)
	}
	if o.csrfHeader != "" {
		req.Header.Set("X-CSRF-Token", o.csrfHeader)
	}
	if o.accept != "" {
		req.Header.Set("Accept", o.accept)
	}
	hc := &http.Client{Transport: acTransport(o.from), Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, path, err)
		return acResp{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return acResp{resp.StatusCode, resp.Header, string(b)}
}

// acSess is a signed-in browser: its session cookie and its CSRF token.
type acSess struct {
	id, csrf string
}

func (s acSess) cookies() map[string]string { return map[string]string{"physd-session": s.id} }

var acCSRFField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func setCookie(r acResp, name string) string {
	for _, c := range (&http.Response{Header: r.hdr}).Cookies() {
		if c.Name == name && c.MaxAge >= 0 {
			return c.Value
		}
	}
	return ""
}

// acSignIn posts the sign-in form as a browser would (the physd-csrf
// cookie and the form's csrf field) from local address from, and answers
// the response and, on success, the session with the console page's CSRF
// token.
func acSignIn(t *testing.T, d *daemon, token, from string) (acResp, acSess) {
	t.Helper()
	pre := strings.Repeat("p", 43) // a browser's double-submit token: any value it holds in both places
	r := acDo(t, d, "POST", "/login", acOpts{from: from, cookies: map[string]string{"physd-csrf": pre},
		form: url.Values{"csrf": {pre}, "token": {token}, "next": {"/"}}})
	id := setCookie(r, "physd-session")
	if r.code != http.StatusSeeOther || id == "" {
		return r, acSess{}
	}
	return r, acSess{id: id, csrf: acPageCSRF(t, d, acSess{id: id})}
}

// acPageCSRF is the CSRF token the console page of s carries.
func acPageCSRF(t *testing.T, d *daemon, s acSess) string {
	t.Helper()
	p := acDo(t, d, "GET", "/", acOpts{cookies: s.cookies(), accept: "text/html"})
	m := acCSRFField.FindStringSubmatch(p.body)
	if p.code != 200 || m == nil {
		t.Fatalf("the console page of a fresh session: %d %.300s", p.code, p.body)
	}
	return m[1]
}

func mustSignIn(t *testing.T, d *daemon, token string) acSess {
	t.Helper()
	r, s := acSignIn(t, d, token, "")
	if s.id == "" {
		t.Fatalf("sign-in with %s: %d %.400s", token, r.code, r.body)
	}
	return s
}

// alive reports whether the session still authenticates: /healthz tells
// an authenticated viewer the device id, and nobody else.
func (s acSess) alive(t *testing.T, d *daemon) bool {
	t.Helper()
	r := acDo(t, d, "GET", "/healthz", acOpts{cookies: s.cookies()})
	if r.code != 200 {
		t.Errorf("/healthz with a session cookie: %d %s", r.code, r.body)
	}
	return strings.Contains(r.body, "device_id")
}

// approveForm posts the console's Approve (or Deny) button of id.
func approveForm(t *testing.T, d *daemon, s acSess, id, decision string) acResp {
	t.Helper()
	return acDo(t, d, "POST", "/console/approvals/"+id, acOpts{cookies: s.cookies(), form: url.Values{"csrf": {s.csrf}, "decision": {decision}}})
}

// pendingZoneC makes op's call of do_heater_zone_c to 70 pending (the
// console fixture's two-person rule) and returns the approval id.
func pendingZoneC(t *testing.T, op *mcp.ClientSession, key string) string {
	t.Helper()
	return approvalID(t, structured(t, call(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": key})))
}

func approvalState(t *testing.T, d *daemon, id string) string {
	t.Helper()
	for _, p := range pendingApprovals(t, d) {
		if p["id"] == id {
			return fmt.Sprint(p["state"])
		}
	}
	return "gone"
}

// TestAttackConsoleSessionEnds: a session cookie is useless after
// POST /logout, after a SIGHUP that removes its token, and after one that
// demotes its token; a session ended by the policy does not come back when
// the token does; a cookie does not open the console under a Host that is
// not the server's.
func TestAttackConsoleSessionEnds(t *testing.T) {
	t.Parallel()
	d, pol := consoleFixture(t)
	viewer, op, admin := mustSignIn(t, d, viewerToken), mustSignIn(t, d, operatorToken), mustSignIn(t, d, adminDemoToken)
	for name, s := range map[string]acSess{"viewer": viewer, "operator": op, "admin": admin} {
		if r := acDo(t, d, "GET", "/console/live", acOpts{cookies: s.cookies()}); r.code != 200 {
			t.Fatalf("%s's fresh session on /console/live: %d %s", name, r.code, r.body)
		}
	}

	// Another Host (DNS rebinding: the attacker's name) refuses the cookie too.
	if r := acDo(t, d, "GET", "/console/live", acOpts{cookies: op.cookies(), host: "evil.example:80"}); r.code != http.StatusForbidden {
		t.Errorf("a session cookie under Host evil.example: %d %s", r.code, r.body)
	}

	// Sign-out ends the session on the server: the replayed cookie is dead.
	if r := acDo(t, d, "POST", "/logout", acOpts{cookies: op.cookies(), form: url.Values{"csrf": {op.csrf}}}); r.code != http.StatusSeeOther {
		t.Fatalf("sign-out: %d %s", r.code, r.body)
	}
	if r := acDo(t, d, "GET", "/console/live", acOpts{cookies: op.cookies()}); r.code != http.StatusUnauthorized {
		t.Errorf("a signed-out cookie replayed on /console/live: %d %.200s", r.code, r.body)
	}
	if r := acDo(t, d, "GET", "/", acOpts{cookies: op.cookies(), accept: "text/html"}); r.code != http.StatusSeeOther || !strings.HasPrefix(r.hdr.Get("Location"), "/login") {
		t.Errorf("a signed-out cookie replayed on the console: %d %s", r.code, r.hdr.Get("Location"))
	}
	if r := acDo(t, d, "POST", "/console/alarms/ack", acOpts{cookies: op.cookies(), form: url.Values{"csrf": {op.csrf}, "tool": {"read_humidity_zone_a"}, "kind": {"high"}}}); r.code < 400 {
		t.Errorf("a signed-out cookie acknowledged an alarm: %d %s", r.code, r.body)
	}

	// SIGHUP: the viewer's token removed, the admin's demoted to operator.
	orig, err := os.ReadFile(pol)
	if err != nil {
		t.Fatal(err)
	}
	const viewerLine = "    - {id: wall_display, sha256: 4a6c683b39708a1b1785f4dc5070fc32893b1eabc5c41c9634a5070f63640dfb, role: viewer}\n"
	const adminLine = "    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}\n"
	if !strings.Contains(string(orig), viewerLine) || !strings.Contains(string(orig), adminLine) {
		t.Fatal("the greenhouse policy's tokens changed: update this test")
	}
	edited := strings.Replace(strings.Replace(string(orig), viewerLine, "", 1), adminLine, strings.Replace(adminLine, "role: admin", "role: operator", 1), 1)
	if err := os.WriteFile(pol, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	hupAndWait(t, d, "policy reloaded")
	if viewer.alive(t, d) {
		t.Error("the viewer's session outlived the removal of its token")
	}
	if admin.alive(t, d) {
		t.Error("the admin's session outlived the demotion of its token to operator")
	}
	if r := acDo(t, d, "POST", "/emergency/override", acOpts{cookies: admin.cookies(), csrfHeader: admin.csrf, json: `{"reason":"x","ttl_s":60}`}); r.code < 400 {
		t.Errorf("the demoted admin's cookie used the override: %d %s", r.code, r.body)
	}
	// The demoted token signs in again, as what it is now.
	if s := mustSignIn(t, d, adminDemoToken); !strings.Contains(acDo(t, d, "GET", "/", acOpts{cookies: s.cookies(), accept: "text/html"}).body, "(operator)") {
		t.Error("the demoted token's new session is not an operator's")
	}

	// The token back: the sessions that failed a check stay dead.
	if err := os.WriteFile(pol, orig, 0o600); err != nil {
		t.Fatal(err)
	}
	hupAndWait(t, d, "policy reloaded")
	if viewer.alive(t, d) || admin.alive(t, d) {
		t.Error("a session ended by a reload came back when its token did")
	}
	if r, _ := acSignIn(t, d, viewerToken, ""); r.code != http.StatusSeeOther {
		t.Errorf("the restored viewer token does not sign in: %d", r.code)
	}
}

// TestAttackConsoleCSRF: forged decisions with the admin's live session
// cookie (what a browser attaches by itself): no token, another session's
// token, the token in the query string, the sessionless double-submit
// cookie instead of the session's token, a cross-origin Origin, Origin
// null, two Origins, Sec-Fetch-Site cross-site or same-site without
// Origin, a JSON post without the token, other media types, a bearer
// viewer with the admin's cookie. None decides, nothing actuates; the
// genuine form then approves and the call runs once.
func TestAttackConsoleCSRF(t *testing.T) {
	t.Parallel()
	d, _ := consoleFixture(t)
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	id := pendingZoneC(t, op, "csrf-1")
	admin, other := mustSignIn(t, d, adminDemoToken), mustSignIn(t, d, operatorToken)
	self := "http://" + d.addr
	_, port, _ := net.SplitHostPort(d.addr)
	otherPort := "http://127.0.0.1:1" + port[1:]
	if otherPort == self {
		otherPort = "http://127.0.0.1:2" + port[1:]
	}
	ok := url.Values{"csrf": {admin.csrf}, "decision": {"approve"}}
	path := "/console/approvals/" + id
	with := func(m map[string]string) map[string]string {
		c := admin.cookies()
		for k, v := range m {
			c[k] = v
		}
		return c
	}
	forged := []struct {
		name   string
		path   string
		o      acOpts
		status int
	}{
		{"no CSRF token", path, acOpts{form: url.Values{"decision": {"approve"}}}, 403},
		{"an empty CSRF token", path, acOpts{form: url.Values{"decision": {"approve"}, "csrf": {""}}}, 403},
		{"another session's CSRF token", path, acOpts{form: url.Values{"decision": {"approve"}, "csrf": {other.csrf}}}, 403},
		{"another session's token in the header", path, acOpts{form: url.Values{"decision": {"approve"}}, csrfHeader: other.csrf}, 403},
		{"a wrong header over a right field", path, acOpts{form: ok, csrfHeader: "wrong"}, 403},
		{"the token in the query string", path + "?csrf=" + url.QueryEscape(admin.csrf), acOpts{form: url.Values{"decision": {"approve"}}}, 403},
		{"the token in the query string, decision in the query", path + "?decision=approve&csrf=" + url.QueryEscape(admin.csrf), acOpts{form: url.Values{}}, 403},
		{"the double-submit cookie without the session's token", path,
			acOpts{cookies: with(map[string]string{"physd-csrf": strings.Repeat("a", 43)}), form: url.Values{"decision": {"approve"}, "csrf": {strings.Repeat("a", 43)}}}, 403},
		{"a cross-origin Origin", path, acOpts{form: ok, origin: "http://evil.example"}, 403},
		{"another port of the same host", path, acOpts{form: ok, origin: otherPort}, 403},
		{"Origin null", path, acOpts{form: ok, origin: "null"}, 403},
		{"two Origin headers", path, acOpts{form: ok, origins: []string{self, "http://evil.example"}}, 403},
		{"Sec-Fetch-Site cross-site without Origin", path, acOpts{form: ok, secFetch: "cross-site"}, 403},
		{"Sec-Fetch-Site same-site without Origin", path, acOpts{form: ok, secFetch: "same-site"}, 403},
		{"Host evil.example", path, acOpts{form: ok, host: "evil.example"}, 403},
		{"the JSON route with the cookie and no token", "/approvals/" + id, acOpts{json: `{"decision":"approve"}`}, 403},
		{"the JSON route with the cookie and another session's token", "/approvals/" + id, acOpts{json: `{"decision":"approve"}`, csrfHeader: other.csrf}, 403},
		{"text/plain with the token", path, acOpts{rawBody: ok.Encode(), ctype: "text/plain"}, 415},
		{"multipart with the token", path, acOpts{rawBody: "--x\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n" + admin.csrf +
			"\r\n--x\r\nContent-Disposition: form-data; name=\"decision\"\r\n\r\napprove\r\n--x--\r\n", ctype: "multipart/form-data; boundary=x"}, 415},
		{"a viewer's bearer token with the admin's cookie", path, acOpts{form: ok, auth: viewerToken}, 403},
		{"a viewer's bearer token with the admin's cookie, JSON", "/approvals/" + id, acOpts{json: `{"decision":"approve"}`, auth: viewerToken, csrfHeader: admin.csrf}, 403},
	}
	for _, f := range forged {
		if f.o.cookies == nil {
			f.o.cookies = admin.cookies()
		}
		if r := acDo(t, d, "POST", f.path, f.o); r.code != f.status {
			t.Errorf("%s: %d, want %d: %.200s", f.name, r.code, f.status, r.body)
		}
	}
	// Sign-out and acknowledgement are forms too.
	if r := acDo(t, d, "POST", "/console/alarms/ack", acOpts{cookies: admin.cookies(), form: url.Values{"tool": {"read_humidity_zone_a"}, "kind": {"high"}}}); r.code != 403 {
		t.Errorf("an alarm acknowledged without the token: %d", r.code)
	}
	if r := acDo(t, d, "POST", "/logout", acOpts{cookies: admin.cookies(), form: url.Values{}}); r.code != 403 || !admin.alive(t, d) {
		t.Errorf("a forged sign-out: %d", r.code)
	}
	if r := acDo(t, d, "POST", "/login", acOpts{form: url.Values{"token": {viewerToken}}}); r.code != 403 {
		t.Errorf("a sign-in without the double-submit token (login CSRF): %d", r.code)
	}
	if r := acDo(t, d, "POST", "/login", acOpts{origin: "http://evil.example", cookies: map[string]string{"physd-csrf": strings.Repeat("q", 43)},
		form: url.Values{"token": {viewerToken}, "csrf": {strings.Repeat("q", 43)}}}); r.code != 403 {
		t.Errorf("a cross-origin sign-in (login CSRF): %d", r.code)
	}
	if st := approvalState(t, d, id); st != "pending" {
		t.Fatalf("after the forged posts the approval is %s", st)
	}
	if w := atkZoneC(t, d); w != 0 {
		t.Fatalf("the forged posts moved the heater: %d writes", w)
	}

	// The genuine form, same origin: decided, and the call runs once.
	if r := acDo(t, d, "POST", path, acOpts{cookies: admin.cookies(), form: ok, origin: self, secFetch: "same-origin"}); r.code != http.StatusSeeOther {
		t.Fatalf("the genuine approval: %d %s", r.code, r.body)
	}
	if a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": "csrf-1"}); a.Status != "success" {
		t.Fatalf("the approved call: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Fatalf("zone C heater writes after one approval: %d", w)
	}
}

// TestAttackConsoleApprovalRaces: through the console, the requester
// cannot approve their own request and a viewer cannot approve at all;
// eight of the admin's sessions approving one request at once decide it
// once; approve racing deny decides it once, and what actuates is what
// won; a decided or unknown request is refused. Exactly one write per
// approval.
func TestAttackConsoleApprovalRaces(t *testing.T) {
	t.Parallel()
	d, _ := consoleFixture(t)
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	id := pendingZoneC(t, op, "race-1")
	opS, viewerS := mustSignIn(t, d, operatorToken), mustSignIn(t, d, viewerToken)
	if r := approveForm(t, d, opS, id, "approve"); r.code != 403 || !strings.Contains(r.body, "cannot approve their own request") {
		t.Errorf("the requester approving in the console: %d %.300s", r.code, r.body)
	}
	if r := approveForm(t, d, viewerS, id, "approve"); r.code != 403 {
		t.Errorf("a viewer approving in the console: %d %.300s", r.code, r.body)
	}
	if r := approveForm(t, d, viewerS, id, "deny"); r.code != 403 {
		t.Errorf("a viewer denying in the console: %d %.300s", r.code, r.body)
	}
	if st := approvalState(t, d, id); st != "pending" {
		t.Fatalf("after the refused decisions: %s", st)
	}
	if a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": "race-1"}); a.Status == "success" {
		t.Fatalf("the call ran without an approval: %s", a.raw)
	}

	admins := make([]acSess, 8)
	for i := range admins {
		admins[i] = mustSignIn(t, d, adminDemoToken)
	}
	race := func(id string, decisions func(i int) string) (won int, codes []int) {
		codes = make([]int, len(admins))
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i, s := range admins {
			wg.Go(func() {
				<-start
				codes[i] = approveForm(t, d, s, id, decisions(i)).code
			})
		}
		close(start)
		wg.Wait()
		won = -1
		for i, c := range codes {
			switch c {
			case http.StatusSeeOther:
				if won >= 0 {
					t.Errorf("request %s decided twice (sessions %d and %d): %v", id, won, i, codes)
				}
				won = i
			case http.StatusConflict, http.StatusNotFound:
			default:
				t.Errorf("a racing decision answered %d: %v", c, codes)
			}
		}
		if won < 0 {
			t.Fatalf("no racing decision won: %v", codes)
		}
		return won, codes
	}
	race(id, func(int) string { return "approve" })
	if r := approveForm(t, d, admins[0], id, "deny"); r.code != http.StatusConflict {
		t.Errorf("denying an approved request: %d %.200s", r.code, r.body)
	}
	for range 3 {
		if a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": "race-1"}); a.Status != "success" {
			t.Fatalf("the approved call: %s%s", a.raw, a.toolErr)
		}
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Fatalf("eight racing approvals and three repeats wrote the heater %d times, want 1", w)
	}
	if r := approveForm(t, d, admins[0], id, "approve"); r.code != http.StatusNotFound {
		t.Errorf("approving a used request: %d", r.code)
	}
	if r := approveForm(t, d, admins[0], "ap-doesnotexist", "approve"); r.code != http.StatusNotFound {
		t.Errorf("approving an unknown id: %d", r.code)
	}

	// Approve racing deny, three rounds: what actuates is what won.
	writes := uint64(1)
	for round := range 3 {
		key := fmt.Sprintf("race-ad-%d", round)
		value := 62 + round
		id := approvalID(t, structured(t, call(t, op, "do_heater_zone_c", map[string]any{"value": value, "idempotency_key": key})))
		won, _ := race(id, func(i int) string {
			if (i+round)%2 == 0 {
				return "approve"
			}
			return "deny"
		})
		approved := (won+round)%2 == 0
		a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": value, "idempotency_key": key})
		if approved {
			writes++
			if a.Status != "success" {
				t.Errorf("round %d: approve won but the call: %s%s", round, a.raw, a.toolErr)
			}
		} else if a.Status == "success" {
			t.Errorf("round %d: deny won but the call ran: %s", round, a.raw)
		}
		if w := atkZoneC(t, d); w != writes {
			t.Fatalf("round %d (approve won: %v): %d writes, want %d", round, approved, w, writes)
		}
	}
}

// TestAttackConsoleApprovalVoidAfterReload: the console shows a request
// with the definition digest it binds to; a SIGHUP then changes the
// capability's policy rules (zone C's range narrowed). Approving what was
// shown must be void and nothing moves; the next request shows the new
// digest, which is what GET /approvals reports and what then runs.
func TestAttackConsoleApprovalVoidAfterReload(t *testing.T) {
	t.Parallel()
	d, pol := consoleFixture(t)
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	id := pendingZoneC(t, op, "void-1")
	admin := mustSignIn(t, d, adminDemoToken)
	page := acDo(t, d, "GET", "/", acOpts{cookies: admin.cookies(), accept: "text/html"}).body
	pend := pendingApprovals(t, d)
	if len(pend) != 1 || pend[0]["id"] != id {
		t.Fatalf("pending: %v", pend)
	}
	def := pend[0]["definition"].(string)
	if !strings.Contains(page, "approval-"+id) || !strings.Contains(page, def) {
		t.Fatalf("the console does not show %s with its definition %s", id, def)
	}
	editFile(t, pol, "{type: range_guard, min: 0, max: 80, on_violation: deny}", "{type: range_guard, min: 0, max: 75, on_violation: deny}")
	hupAndWait(t, d, "policy reloaded")
	r := approveForm(t, d, admin, id, "approve")
	if r.code != http.StatusConflict || !strings.Contains(r.body, "void") {
		t.Errorf("approving what the console showed before the reload: %d %.300s", r.code, r.body)
	}
	a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": "void-1"})
	if a.Status == "success" {
		t.Errorf("the call approved before the reload ran: %s", a.raw)
	}
	if w := atkZoneC(t, d); w != 0 {
		t.Fatalf("the void approval moved the heater: %d writes", w)
	}

	id2 := pendingZoneC(t, op, "void-2")
	var def2 string
	for _, p := range pendingApprovals(t, d) {
		if p["id"] == id2 {
			def2 = p["definition"].(string)
		}
	}
	if def2 == "" || def2 == def {
		t.Fatalf("the new request's definition %q (old %q)", def2, def)
	}
	if page := acDo(t, d, "GET", "/", acOpts{cookies: admin.cookies(), accept: "text/html"}).body; !strings.Contains(page, def2) {
		t.Error("the console does not show the new definition")
	}
	if r := approveForm(t, d, admin, id2, "approve"); r.code != http.StatusSeeOther {
		t.Fatalf("approving the new request: %d %.300s", r.code, r.body)
	}
	if a := doCall(t, op, "do_heater_zone_c", map[string]any{"value": 70, "idempotency_key": "void-2"}); a.Status != "success" {
		t.Fatalf("the approved call: %s%s", a.raw, a.toolErr)
	}
	if w := atkZoneC(t, d); w != 1 {
		t.Fatalf("zone C heater writes: %d, want 1", w)
	}
}

// signInCodes posts n wrong sign-ins at once from one address and counts
// the answers by status.
func signInCodes(t *testing.T, d *daemon, from string, n int, token func(i int) string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			r, _ := acSignIn(t, d, token(i), from)
			mu.Lock()
			codes[r.code]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return codes
}

// TestAttackConsoleSignInFlood: wrong sign-ins at once, 150 from each of
// three addresses: from each, only the free five and the one that starts
// the wait may be tried (401), the rest are 429 — the throttle must hold
// under concurrency, not only for one guess after another. Meanwhile the
// right token signs in from another address, and from a flooded one once
// the wait is over.
func TestAttackConsoleSignInFlood(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	froms := []string{"127.0.0.3", "127.0.0.6", "127.0.0.7"}
	all := make([]map[int]int, len(froms))
	took := make([]time.Duration, len(froms))
	var wg sync.WaitGroup
	for i, from := range froms {
		wg.Go(func() {
			start := time.Now()
			all[i] = signInCodes(t, d, from, 150, func(j int) string { return fmt.Sprintf("guess-%d-%d", i, j) })
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	for i, codes := range all {
		allowed := throttleAllows(took[i])
		t.Logf("150 concurrent wrong sign-ins from %s in %v: %v (at most %d may be tried)", froms[i], took[i].Round(time.Millisecond), codes, allowed)
		if codes[http.StatusUnauthorized] > allowed || codes[http.StatusUnauthorized]+codes[http.StatusTooManyRequests] != 150 {
			t.Errorf("150 concurrent wrong sign-ins from %s in %v: %v; want at most %d tried (401), the rest 429", froms[i], took[i], codes, allowed)
		}
	}
	if r, _ := acSignIn(t, d, operatorToken, "127.0.0.4"); r.code != http.StatusSeeOther {
		t.Errorf("the right token from another address during the flood: %d %.200s", r.code, r.body)
	}
	// A flood a loaded machine stretched over seconds may have outlasted
	// its last delay: one more wrong guess (tried, with a longer delay
	// after it, or refused) makes sure the address is throttled now.
	if r, _ := acSignIn(t, d, "guess-after-the-flood", "127.0.0.3"); r.code != http.StatusTooManyRequests && r.code != http.StatusUnauthorized {
		t.Fatalf("a wrong guess after the flood: %d", r.code)
	}
	r, _ := acSignIn(t, d, operatorToken, "127.0.0.3")
	if r.code != http.StatusTooManyRequests || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("the right token from the flooded address: %d, Retry-After %q", r.code, r.hdr.Get("Retry-After"))
	}
	var wait int
	fmt.Sscan(r.hdr.Get("Retry-After"), &wait)
	if wait < 1 || wait > 60 {
		t.Fatalf("Retry-After %d", wait)
	}
	time.Sleep(time.Duration(wait)*time.Second + 200*time.Millisecond)
	if r, s := acSignIn(t, d, operatorToken, "127.0.0.3"); r.code != http.StatusSeeOther || !s.alive(t, d) {
		t.Errorf("the right token after the wait: %d %.200s", r.code, r.body)
	}
}

// TestAttackConsoleSignInThrottleReset: an insider with a valid viewer
// token guesses the admin's: five guesses, a right sign-in with their own
// token, five more, and so on. Their own success must not forgive the
// guesses: the throttle must start after the fifth wrong one overall.
func TestAttackConsoleSignInThrottleReset(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	const from = "127.0.0.5"
	tried, refused := 0, 0
	start := time.Now()
	for round := range 4 {
		for i := range 5 {
			r, _ := acSignIn(t, d, fmt.Sprintf("admin-guess-%d-%d", round, i), from)
			switch r.code {
			case http.StatusUnauthorized:
				tried++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("guess: %d", r.code)
			}
		}
		acSignIn(t, d, viewerToken, from) // their own token: 303, or 429 while throttled
	}
	took := time.Since(start)
	allowed := throttleAllows(took)
	t.Logf("20 guesses interleaved with the guesser's own sign-ins in %v: %d tried, %d throttled (at most %d may be tried)", took.Round(time.Millisecond), tried, refused, allowed)
	if tried > allowed {
		t.Errorf("the guesser's own sign-ins reset the throttle: %d of 20 wrong tokens were tried in %v (want at most %d; a reset grants 5 a round, 20)", tried, took, allowed)
	}
}

// throttleAllows is how many wrong sign-ins from one address the throttle
// may let through in took: five free tries, a sixth, then one more each
// time a doubling delay (1 s, 2 s, 4 s, …) has passed. A run that a loaded
// machine stretches past a second earns its seventh try honestly; what
// must never happen is a try per request, or a throttle that forgets.
func throttleAllows(took time.Duration) int {
	return 6 + int(math.Log2(took.Seconds()+1))
}

// TestAttackConsoleSessionBound: 600 sign-ins of one person keep 8
// sessions (the newest), the older cookies are dead, and the store is not
// full for the others.
func TestAttackConsoleSessionBound(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	ids := make([]string, 600)
	var wg sync.WaitGroup
	var next atomic.Int64
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(ids) {
					return
				}
				pre := strings.Repeat("p", 43)
				r := acDo(t, d, "POST", "/login", acOpts{cookies: map[string]string{"physd-csrf": pre}, form: url.Values{"csrf": {pre}, "token": {adminDemoToken}}})
				if r.code != http.StatusSeeOther {
					t.Errorf("sign-in %d: %d %.200s", i, r.code, r.body)
				}
				ids[i] = setCookie(r, "physd-session")
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	alive := 0
	for _, id := range ids {
		if (acSess{id: id}).alive(t, d) {
			alive++
		}
	}
	if alive != 8 {
		t.Errorf("after 600 sign-ins of one person %d sessions are alive, want 8", alive)
	}
	// The newest four were made last by the four workers... at least the
	// very last sign-in is among the living.
	if !(acSess{id: ids[len(ids)-1]}).alive(t, d) {
		t.Error("the newest session was evicted")
	}
	for _, tok := range []string{viewerToken, operatorToken} {
		if s := mustSignIn(t, d, tok); !s.alive(t, d) {
			t.Errorf("%s cannot sign in after the flood", tok)
		}
	}
}

// TestAttackConsoleLivePollers: 50 consoles polling /console/live without
// pause for 3 s must not multiply device reads: each point the console
// reads is read about once per second (its cache TTL, at least 1 s), as
// with one console.
func TestAttackConsoleLivePollers(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	s := mustSignIn(t, d, viewerToken)
	before := d.sim(t)
	const dur = 3 * time.Second
	var polls atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(dur)
	for range 50 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if r := acDo(t, d, "GET", "/console/live", acOpts{cookies: s.cookies()}); r.code != 200 {
					t.Errorf("/console/live: %d %.200s", r.code, r.body)
					return
				}
				polls.Add(1)
			}
		})
	}
	wg.Wait()
	after := d.sim(t)
	limit := uint64(dur/time.Second) + 2
	var total uint64
	for p, st := range after.Stats.Points {
		n := st.Reads - before.Stats.Points[p].Reads
		total += n
		if n > limit {
			t.Errorf("%s: %d device reads under %d polls in %v, want at most %d", p, n, polls.Load(), dur, limit)
		}
	}
	t.Logf("%d polls of /console/live by 50 pollers in %v: %d device reads in all", polls.Load(), dur, total)
	if polls.Load() < 50 {
		t.Errorf("only %d polls", polls.Load())
	}
}

// acRPC posts one 2026-07-28 tools/call by hand, with extra headers (a
// forged caller stamp), and answers the status and the call's structured
// result (nil when there is none).
func acRPC(t *testing.T, d *daemon, token string, extra http.Header, tool string, args map[string]any) (int, map[string]any, string) {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args, "_meta": map[string]any{
		"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": map[string]any{}}}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
	h := http.Header{"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2026-07-28"}, "Mcp-Method": {"tools/call"}, "Mcp-Name": {tool}}
	for k, v := range extra {
		h[k] = append(h[k], v...)
	}
	r := acDo(t, d, "POST", "/mcp", acOpts{auth: token, json: string(body), header: h})
	var m struct {
		Result struct {
			Structured map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	_ = json.Unmarshal([]byte(r.body), &m)
	return r.code, m.Result.Structured, r.body
}

// canDoZoneC is what can_do says of do_heater_zone_c (operator only) for
// the caller: its permission, candidate or blocked.
func canDoZoneC(rep map[string]any) string {
	for _, list := range []string{"candidates", "blocked"} {
		xs, _ := rep[list].([]any)
		for _, x := range xs {
			if m, _ := x.(map[string]any); m["capability"] == "do_heater_zone_c" {
				return list + ":" + fmt.Sprint(m["permission"])
			}
		}
	}
	return "absent"
}

var zoneCIntent = map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_c", "value": 40}}

// slowBody opens a POST /mcp as token whose body trickles in for hold: the
// request, and so its caller ticket, stays in flight. It answers when the
// request has been sent in full and closes the connection.
func slowBody(t *testing.T, d *daemon, token string, hold time.Duration) <-chan struct{} {
	t.Helper()
	done := make(chan struct{})
	body := `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"read_temperature_zone_a","arguments":{},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	c, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: read_temperature_zone_a\r\nContent-Length: %d\r\n\r\n", d.addr, token, len(body))
	go func() {
		defer close(done)
		defer c.Close()
		step := hold / time.Duration(len(body))
		for i := range len(body) {
			if _, err := c.Write([]byte{body[i]}); err != nil {
				return
			}
			time.Sleep(step)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<16))
	}()
	return done
}

// TestAttackConsoleCallerTicketsUnderLoad: 200 MCP calls at once from
// viewer, operator and admin sessions, while admin requests with slow
// bodies keep their caller tickets in flight: every call sees its own
// caller. A viewer's do_ is always permission_insufficient and never
// touches the device; can_do reports each role's own permission.
func TestAttackConsoleCallerTicketsUnderLoad(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	tokens := []string{viewerToken, operatorToken, adminDemoToken}
	want := map[string]string{}
	clients := map[string][]*mcp.ClientSession{}
	for _, tok := range tokens {
		for range 2 {
			clients[tok] = append(clients[tok], connectAs(t, d, "2026-07-28", tok, nil))
		}
		want[tok] = canDoZoneC(structured(t, call(t, clients[tok][0], "can_do", zoneCIntent)))
	}
	if want[viewerToken] == want[operatorToken] || !strings.HasSuffix(want[operatorToken], "allowed") {
		t.Fatalf("can_do of do_heater_zone_c: viewer %s, operator %s", want[viewerToken], want[operatorToken])
	}
	var slow []<-chan struct{}
	for range 4 {
		slow = append(slow, slowBody(t, d, adminDemoToken, 4*time.Second))
	}
	time.Sleep(200 * time.Millisecond) // the slow requests are in flight
	var wg sync.WaitGroup
	start := make(chan struct{})
	var viewerDo, wrong atomic.Int64
	for i := range 200 {
		tok := tokens[i%3]
		cs := clients[tok][(i/3)%2]
		wg.Go(func() {
			<-start
			if tok == viewerToken && i%2 == 0 {
				viewerDo.Add(1)
				a := doCall(t, cs, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": fmt.Sprintf("mix-%d", i)})
				if a.Status != "failed" || a.Permission != "permission_insufficient" {
					wrong.Add(1)
					t.Errorf("call %d, a viewer's do_heater_zone_c: %s%s", i, a.raw, a.toolErr)
				}
				return
			}
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: zoneCIntent})
			if err != nil || res.IsError {
				t.Errorf("call %d, can_do: %v %v", i, err, res)
				return
			}
			b, _ := json.Marshal(res.StructuredContent)
			var rep map[string]any
			_ = json.Unmarshal(b, &rep)
			if got := canDoZoneC(rep); got != want[tok] {
				wrong.Add(1)
				t.Errorf("call %d as %s: can_do says %s, want %s", i, tok, got, want[tok])
			}
		})
	}
	close(start)
	wg.Wait()
	for _, c := range slow {
		<-c
	}
	t.Logf("200 concurrent calls (%d viewer do_), 4 slow admin bodies in flight: %d saw another caller", viewerDo.Load(), wrong.Load())
	if w := atkZoneC(t, d); w != 0 {
		t.Errorf("viewers' calls wrote zone C's heater %d times", w)
	}
}

// TestAttackConsoleForgedCallerTicket: a client sends the internal
// Physd-Verified-Caller header itself, with guessed ticket forms (the
// process secret's shape with sequence numbers, other spellings, two
// values): an anonymous caller is still refused, and a viewer stays a
// viewer on the MCP tools and the approval routes.
func TestAttackConsoleForgedCallerTicket(t *testing.T) {
	t.Parallel()
	d, _ := consoleFixture(t)
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	id := pendingZoneC(t, op, "forge-1")
	// The console and MCP traffic before: the sequence numbers are small.
	for range 5 {
		d.request(t, "GET", "/status", "")
	}
	var guesses []string
	for seq := range 40 {
		s := fmt.Sprint(seq)
		guesses = append(guesses, s, "."+s, strings.Repeat("A", 22)+"."+s, "AAAAAAAAAAAAAAAAAAAAAA."+fmt.Sprintf("%x", seq))
	}
	guesses = append(guesses, "", "*", `{"id":"token:site_admin","role":"admin"}`, "token:site_admin")
	for i, g := range guesses {
		hdrName := []string{"Physd-Verified-Caller", "physd-verified-caller", "PHYSD-VERIFIED-CALLER"}[i%3]
		extra := http.Header{}
		extra[hdrName] = []string{g, g}
		if code, _, body := acRPC(t, d, "", extra, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": fmt.Sprintf("forge-anon-%d", i)}); code != http.StatusUnauthorized {
			t.Fatalf("anonymous with %s: %q: %d %.200s", hdrName, g, code, body)
		}
		code, r, body := acRPC(t, d, viewerToken, extra, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": fmt.Sprintf("forge-view-%d", i)})
		if code != 200 || r["permission"] != "permission_insufficient" {
			t.Fatalf("a viewer with %s: %q: %d %.300s", hdrName, g, code, body)
		}
		if i%16 == 0 {
			r := acDo(t, d, "POST", "/approvals/"+id, acOpts{auth: viewerToken, json: `{"decision":"approve"}`, header: extra})
			if r.code != http.StatusForbidden {
				t.Fatalf("a viewer approving with %s: %q: %d %s", hdrName, g, r.code, r.body)
			}
			if r := acDo(t, d, "GET", "/healthz", acOpts{header: extra}); strings.Contains(r.body, "device_id") {
				t.Fatalf("anonymous /healthz with %s: %q told the device id", hdrName, g)
			}
		}
	}
	// The stamp in a trailer of a chunked body.
	c, err := net.Dial("tcp", d.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"decision":"approve"}`
	fmt.Fprintf(c, "POST /approvals/%s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nTrailer: Physd-Verified-Caller\r\n"+
		"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\nPhysd-Verified-Caller: %s\r\n\r\n", id, d.addr, viewerToken, len(body), body, strings.Repeat("A", 22)+".1")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a viewer approving with the stamp in a trailer: %d", resp.StatusCode)
	}
	if st := approvalState(t, d, id); st != "pending" {
		t.Fatalf("after the forged stamps the approval is %s", st)
	}
	if w := atkZoneC(t, d); w != 0 {
		t.Fatalf("forged stamps wrote the heater %d times", w)
	}
}

// TestAttackConsoleSignInAsSomeoneElse: a browser signed in as the viewer
// opens /login, which offers to "sign in as someone else below", and does:
// the form it was given must work (its CSRF token must be the one the
// boundary checks for a browser with a session), and the new session is
// the admin's.
func TestAttackConsoleSignInAsSomeoneElse(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	v := mustSignIn(t, d, viewerToken)
	page := acDo(t, d, "GET", "/login", acOpts{cookies: v.cookies(), accept: "text/html"})
	m := acCSRFField.FindStringSubmatch(page.body)
	if page.code != 200 || m == nil || !strings.Contains(page.body, "sign in as someone else") {
		t.Fatalf("GET /login with a session: %d %.300s", page.code, page.body)
	}
	cookies := v.cookies()
	if pre := setCookie(page, "physd-csrf"); pre != "" {
		cookies["physd-csrf"] = pre
	}
	r := acDo(t, d, "POST", "/login", acOpts{cookies: cookies, form: url.Values{"csrf": {m[1]}, "token": {adminDemoToken}, "next": {"/"}}})
	id := setCookie(r, "physd-session")
	if r.code != http.StatusSeeOther || id == "" {
		t.Fatalf("signing in as someone else with the form /login gave: %d %.300s", r.code, r.body)
	}
	if p := acDo(t, d, "GET", "/", acOpts{cookies: map[string]string{"physd-session": id}, accept: "text/html"}); !strings.Contains(p.body, "(admin)") {
		t.Errorf("the new session is not the admin's")
	}
}

// TestAttackConsoleJWTSessionAfterReload: a console session opened with a
// JWT must end when a reload makes that JWT give another role (the
// provider's role_claim changed) or no role at all (the provider's key
// rotated, as after a leak): the session lives only while the credential
// it was opened with still gives the same role, like a policy token's.
func TestAttackConsoleJWTSessionAfterReload(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	oldKey, newKey := []byte(strings.Repeat("o", 40)), []byte(strings.Repeat("n", 40))
	sf := filepath.Join(dir, "hs256.secret")
	if err := os.WriteFile(sf, oldKey, 0o600); err != nil {
		t.Fatal(err)
	}
	pb, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	const tokens = "identity:\n  tokens:\n"
	if !strings.Contains(string(pb), tokens) {
		t.Fatal("the greenhouse policy changed: update this test")
	}
	provider := func(roleClaim string) string {
		return "identity:\n  providers:\n    - {type: jwt, issuer: \"" + atkIss1 + "\", audience: physd, role_claim: " + roleClaim + ", hs256_secret_file: " + sf + "}\n  tokens:\n"
	}
	pol := filepath.Join(dir, "policy.yml")
	if err := os.WriteFile(pol, []byte(strings.Replace(string(pb), tokens, provider("role"), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	// One JWT: an operator by its "role" claim, a viewer by "physd_role".
	alice := atkJWT(t, oldKey, atkIss1, jwt.MapClaims{"sub": "alice", "role": "operator", "physd_role": "viewer"})
	s := mustSignIn(t, d, alice)
	if p := acDo(t, d, "GET", "/", acOpts{cookies: s.cookies(), accept: "text/html"}).body; !strings.Contains(p, "(operator)") {
		t.Fatalf("alice's JWT session is not an operator's")
	}

	// The provider now reads the role from physd_role: alice's JWT is a viewer's.
	if err := os.WriteFile(pol, []byte(strings.Replace(string(pb), tokens, provider("physd_role"), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	hupAndWait(t, d, "policy reloaded")
	if code, _, _ := hsReq(t, d, "GET", "/approvals", "", "", "", "Bearer "+alice); code != http.StatusForbidden {
		t.Fatalf("alice's JWT as a bearer after the role_claim change: %d, want 403 (a viewer)", code)
	}
	if r := acDo(t, d, "GET", "/approvals", acOpts{cookies: s.cookies()}); r.code == 200 {
		t.Errorf("alice's operator session still lists the approvals after her JWT became a viewer's (the role_claim changed)")
	}
	if s.alive(t, d) {
		t.Error("alice's session outlived a reload that gives her JWT another role")
	}

	// Rotate the key: alice's JWT no longer verifies at all.
	s2 := mustSignIn(t, d, alice)
	if err := os.WriteFile(sf, newKey, 0o600); err != nil {
		t.Fatal(err)
	}
	hupAndWait(t, d, "policy reloaded")
	if code, _, _ := hsReq(t, d, "GET", "/status", "", "", "", "Bearer "+alice); code != http.StatusUnauthorized {
		t.Fatalf("alice's JWT after the key rotation: %d, want 401", code)
	}
	if s2.alive(t, d) {
		t.Error("a session opened with a JWT outlived the rotation of the key that signed it")
	}
	if r, _ := acSignIn(t, d, atkJWT(t, newKey, atkIss1, jwt.MapClaims{"sub": "alice", "physd_role": "viewer"}), ""); r.code != http.StatusSeeOther {
		t.Errorf("a JWT of the new key does not sign in: %d %.200s", r.code, r.body)
	}
}

// TestAttackConsoleApprovalHoldBinding: the operator asks for zone A's
// heater at 70 % held for 60 s (hold_s: its lease, after which the heater
// falls back to off); the console shows that request and the admin
// approves it. The operator then repeats the call with the same key but
// hold_s 3600: what runs must be what was approved — a 60 s hold, or
// nothing — never an hour of 70 % heat nobody approved.
func TestAttackConsoleApprovalHoldBinding(t *testing.T) {
	t.Parallel()
	d, _ := consoleFixture(t)
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	asked := map[string]any{"value": 70, "idempotency_key": "hold-1", "hold_s": 60}
	id := approvalID(t, structured(t, call(t, op, "do_heater_zone_a", asked)))
	admin := mustSignIn(t, d, adminDemoToken)
	page := acDo(t, d, "GET", "/", acOpts{cookies: admin.cookies(), accept: "text/html"}).body
	i := strings.Index(page, `id="approval-`+id+`"`)
	if i < 0 {
		t.Fatalf("the console does not show %s", id)
	}
	card := page[i:min(len(page), i+3000)]
	if !strings.Contains(card, "held for 60 s") {
		t.Errorf("the approval card does not show the 60 s hold asked for:\n%s", card)
	}
	if r := approveForm(t, d, admin, id, "approve"); r.code != http.StatusSeeOther {
		t.Fatalf("the admin's approval: %d %.300s", r.code, r.body)
	}
	res, err := op.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_a",
		Arguments: map[string]any{"value": 70, "idempotency_key": "hold-1", "hold_s": 3600}})
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		Status         string     `json:"status"`
		Code           string     `json:"code"`
		Timestamp      time.Time  `json:"timestamp"`
		LeaseExpiresAt *time.Time `json:"lease_expires_at"`
	}
	_ = json.Unmarshal([]byte(text(res)), &a)
	if a.Status == "success" && (a.LeaseExpiresAt == nil || a.LeaseExpiresAt.Sub(a.Timestamp) > 90*time.Second) {
		t.Errorf("an approval of 70 %% for 60 s ran with hold_s 3600: lease until %v (from %v): %s", a.LeaseExpiresAt, a.Timestamp, text(res))
	}
	t.Logf("the repeat with hold_s 3600: %s", text(res))
	if a.Status == "success" {
		return
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 0 {
		t.Fatalf("the refused repeat wrote the heater %d times", w)
	}
	// The call as approved runs, with the hold approved.
	asked["idempotency_key"] = "hold-2"
	id = approvalID(t, structured(t, call(t, op, "do_heater_zone_a", asked)))
	if r := approveForm(t, d, admin, id, "approve"); r.code != http.StatusSeeOther {
		t.Fatalf("the admin's second approval: %d %.300s", r.code, r.body)
	}
	l := doLease(t, op, "do_heater_zone_a", 70, "hold-2", 60)
	if l.LeaseExpiresAt == nil || l.LeaseExpiresAt.Sub(l.Timestamp) != 60*time.Second {
		t.Errorf("the approved call's lease: until %v from %v, want 60 s", l.LeaseExpiresAt, l.Timestamp)
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 1 {
		t.Errorf("zone A heater writes: %d, want 1", w)
	}
}
