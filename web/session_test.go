package web_test

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/web"
)

// The console's session layer attacked from outside, through HTTP only:
// the sign-in form, the physd-session cookie, the CSRF token and the
// boundary's Origin rules.

// browser is a cookie-keeping HTTP client that never follows redirects
// (each hop is checked) and sends what a browser sends: Origin on
// posts, Accept: text/html on navigations.
type browser struct {
	t       *testing.T
	base    string
	do      func(*http.Request) *http.Response
	cookies map[string]string
	last    []*http.Cookie // the Set-Cookie of the last answer
}

func newBrowser(t *testing.T, base string, do func(*http.Request) *http.Response) *browser {
	return &browser{t: t, base: base, do: do, cookies: map[string]string{}}
}

// serverBrowser talks to a listening server with client hc.
func serverBrowser(t *testing.T, base string, hc *http.Client) *browser {
	c := *hc
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return newBrowser(t, base, func(r *http.Request) *http.Response {
		resp, err := c.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	})
}

// handlerBrowser calls a handler in process (inside a synctest bubble).
func handlerBrowser(t *testing.T, h http.Handler) *browser {
	return newBrowser(t, "http://127.0.0.1", func(r *http.Request) *http.Response {
		r.RemoteAddr = "127.0.0.1:40000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Result()
	})
}

type answer struct {
	code int
	body string
	hdr  http.Header
}

func (b *browser) send(method, path string, form url.Values, hdr map[string]string) answer {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if method != http.MethodGet {
		req.Header.Set("Origin", b.base) // what a browser sends with a same-origin post
	}
	req.Header.Set("Accept", "text/html")
	for name, v := range b.cookies {
		req.AddCookie(&http.Cookie{Name: name, Value: v})
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp := b.do(req)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	b.last = resp.Cookies()
	for _, c := range b.last {
		if c.MaxAge < 0 {
			delete(b.cookies, c.Name)
		} else {
			b.cookies[c.Name] = c.Value
		}
	}
	return answer{resp.StatusCode, string(raw), resp.Header}
}

func (b *browser) get(path string) answer { return b.send(http.MethodGet, path, nil, nil) }

var csrfInPage = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of the page at path.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	a := b.get(path)
	m := csrfInPage.FindStringSubmatch(a.body)
	if m == nil {
		b.t.Fatalf("GET %s (%d) has no CSRF field:\n%.2000s", path, a.code, a.body)
	}
	return m[1]
}

// signIn posts the sign-in form with token.
func (b *browser) signIn(token string) answer {
	b.t.Helper()
	return b.send(http.MethodPost, "/login", url.Values{"csrf": {b.csrf("/login")}, "token": {token}, "next": {"/"}}, nil)
}

func (b *browser) mustSignIn(token string) {
	b.t.Helper()
	if a := b.signIn(token); a.code != http.StatusSeeOther || a.hdr.Get("Location") != "/" || b.cookies["physd-session"] == "" {
		b.t.Fatalf("sign-in: %d %s\n%.1500s", a.code, a.hdr.Get("Location"), a.body)
	}
}

// TestConsoleSignInAndOut: a browser without a credential is sent to the
// sign-in page; a wrong token is refused there, a right one opens a
// session whose cookie is HttpOnly, SameSite=Strict, host-wide and bounded,
// and holds no token; the console then shows who is signed in and live
// values; sign-out ends the session on the server, so a copy of the cookie
// is worth nothing afterwards.
func TestConsoleSignInAndOut(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	b := serverBrowser(t, s.srv.URL, s.srv.Client())

	if a := b.get("/"); a.code != http.StatusSeeOther || a.hdr.Get("Location") != "/login?next=%2F" {
		t.Fatalf("GET / without a credential: %d %q", a.code, a.hdr.Get("Location"))
	}
	// An API client still gets the 401 it can act on.
	if a := b.send(http.MethodGet, "/status", nil, map[string]string{"Accept": "application/json"}); a.code != http.StatusUnauthorized {
		t.Fatalf("GET /status without a credential: %d", a.code)
	}
	a := b.get("/login?next=/")
	if a.code != 200 || !strings.Contains(a.body, `<label for="token">Access token</label>`) || !strings.Contains(a.hdr.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("sign-in page: %d %s", a.code, a.body)
	}
	if a := b.signIn("greenhouse-wrong-token"); a.code != http.StatusUnauthorized || !strings.Contains(a.body, "not known to this policy") || b.cookies["physd-session"] != "" {
		t.Fatalf("a wrong token: %d (session %q)\n%s", a.code, b.cookies["physd-session"], a.body)
	}
	b.mustSignIn(operatorToken)
	var sc *http.Cookie
	for _, c := range b.last {
		if c.Name == "physd-session" {
			sc = c
		}
	}
	if sc == nil || !sc.HttpOnly || sc.SameSite != http.SameSiteStrictMode || sc.Path != "/" || sc.Secure || sc.MaxAge != int(web.SessionLifetime.Seconds()) ||
		len(sc.Value) < 43 || strings.Contains(sc.Value, operatorToken) || sc.Domain != "" {
		t.Fatalf("session cookie: %+v", sc)
	}
	a = b.get("/")
	if a.code != 200 || !strings.Contains(a.body, "Signed in as <strong>token:operator_console</strong> (operator)") || strings.Contains(a.body, operatorToken) {
		t.Fatalf("console: %d\n%.3000s", a.code, a.body)
	}
	// Nobody read the temperatures; the console reads them itself.
	live := b.send(http.MethodGet, "/console/live", nil, map[string]string{"Accept": "application/json"})
	if live.code != 200 || !regexp.MustCompile(`"tool":"read_temperature_zone_a","display":"1\d(\.\d+)?","unit":"celsius","quality":"good"`).MatchString(live.body) {
		t.Fatalf("/console/live: %d %s", live.code, live.body)
	}
	stolen := b.cookies["physd-session"]
	csrf := b.csrf("/")
	if a := b.send(http.MethodPost, "/logout", url.Values{"csrf": {csrf}}, nil); a.code != http.StatusSeeOther || b.cookies["physd-session"] != "" {
		t.Fatalf("sign-out: %d, cookie %q", a.code, b.cookies["physd-session"])
	}
	b.cookies["physd-session"] = stolen
	if a := b.get("/"); a.code != http.StatusSeeOther {
		t.Fatalf("the cookie of a signed-out session still opens the console: %d", a.code)
	}
}

// TestConsoleSessionAttacks: forged cookies, CSRF tokens missing, wrong
// or of another session, cross-origin and cross-site posts, forms to
// routes that take only JSON, and a cookie that disagrees with an
// Authorization header.
func TestConsoleSessionAttacks(t *testing.T) {
	s := newSurface(t, twoPersonPolicy(t), web.Options{}, nil)
	op := serverBrowser(t, s.srv.URL, s.srv.Client())
	op.mustSignIn(operatorToken)
	opCSRF := op.csrf("/")
	other := serverBrowser(t, s.srv.URL, s.srv.Client())
	other.mustSignIn(supBToken)
	otherCSRF := other.csrf("/")
	if opCSRF == otherCSRF {
		t.Fatal("two sessions share a CSRF token")
	}

	forged := serverBrowser(t, s.srv.URL, s.srv.Client())
	for _, v := range []string{"x", strings.Repeat("A", 43), op.cookies["physd-session"] + "A", strings.ToLower(op.cookies["physd-session"])} {
		forged.cookies["physd-session"] = v
		if a := forged.send(http.MethodGet, "/status", nil, map[string]string{"Accept": "application/json"}); a.code != http.StatusUnauthorized {
			t.Errorf("forged cookie %q: %d", v, a.code)
		}
	}

	// A decision on an unknown request reaches the handler (404) only with
	// the session's own token.
	post := func(b *browser, form url.Values, hdr map[string]string) answer {
		return b.send(http.MethodPost, "/console/approvals/nope", form, hdr)
	}
	for _, c := range []struct {
		name string
		form url.Values
		hdr  map[string]string
		want int
	}{
		{"no token", url.Values{"decision": {"approve"}}, nil, 403},
		{"a wrong token", url.Values{"decision": {"approve"}, "csrf": {"wrong"}}, nil, 403},
		{"another session's token", url.Values{"decision": {"approve"}, "csrf": {otherCSRF}}, nil, 403},
		{"the token in the header", url.Values{"decision": {"approve"}}, map[string]string{"X-CSRF-Token": opCSRF}, 404},
		{"the session's token", url.Values{"decision": {"approve"}, "csrf": {opCSRF}}, nil, 404},
		{"another origin", url.Values{"decision": {"approve"}, "csrf": {opCSRF}}, map[string]string{"Origin": "http://evil.example"}, 403},
		{"a null origin", url.Values{"decision": {"approve"}, "csrf": {opCSRF}}, map[string]string{"Origin": "null"}, 403},
		{"cross-site without Origin", url.Values{"decision": {"approve"}, "csrf": {opCSRF}}, map[string]string{"Origin": "", "Sec-Fetch-Site": "cross-site"}, 403},
	} {
		if a := post(op, c.form, c.hdr); a.code != c.want {
			t.Errorf("%s: %d, want %d: %.300s", c.name, a.code, c.want, a.body)
		}
	}
	// A JSON write with the session cookie needs the token too.
	json := func(path, body, token string) int {
		hdr := map[string]string{"Content-Type": "application/json", "X-CSRF-Token": token}
		req, _ := http.NewRequest(http.MethodPost, s.srv.URL+path, strings.NewReader(body))
		req.Header.Set("Origin", s.srv.URL)
		for k, v := range hdr {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		req.AddCookie(&http.Cookie{Name: "physd-session", Value: op.cookies["physd-session"]})
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if c := json("/approvals/nope", `{"decision":"approve"}`, ""); c != 403 {
		t.Errorf("JSON approval with the session cookie and no CSRF token: %d", c)
	}
	if c := json("/approvals/nope", `{"decision":"approve"}`, opCSRF); c != 404 {
		t.Errorf("JSON approval with the session's CSRF token: %d", c)
	}
	// Forms go only to the console's routes.
	if a := op.send(http.MethodPost, "/sim/plant/fault", url.Values{"csrf": {opCSRF}, "point": {"zone_a.heater"}, "mode": {"offline"}}, nil); a.code != http.StatusUnsupportedMediaType {
		t.Errorf("a form to a JSON route: %d", a.code)
	}
	// The sign-in form itself needs the page's token.
	if a := forged.send(http.MethodPost, "/login", url.Values{"token": {operatorToken}}, nil); a.code != 403 {
		t.Errorf("sign-in without the form's token: %d", a.code)
	}

	// An Authorization header decides alone: the operator's cookie raises
	// no viewer token, nor rescues a bad one.
	for _, c := range []struct {
		auth string
		want int
	}{{"Bearer " + viewerToken, 403}, {"Bearer nope", 401}, {"Basic eDp5", 401}} {
		if a := op.send(http.MethodGet, "/approvals", nil, map[string]string{"Authorization": c.auth, "Accept": "application/json"}); a.code != c.want {
			t.Errorf("operator cookie with %s: %d, want %d", c.auth, a.code, c.want)
		}
	}
	if a := op.send(http.MethodGet, "/approvals", nil, map[string]string{"Accept": "application/json"}); a.code != 200 {
		t.Errorf("the operator's session alone: %d", a.code)
	}
}

// TestConsoleSessionFollowsThePolicy: a reload that removes the token,
// gives its id another hash, or demotes it ends the session at once; the
// session never comes back when the token does.
func TestConsoleSessionFollowsThePolicy(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	m, err := manifest.Load(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	reload := func(text string) {
		p, err := policy.Parse("policy.yml", []byte(text), m)
		if err != nil {
			t.Fatal(err)
		}
		s.guard.Reload(p, s.guard.Gate())
	}
	opLine := "    - {id: operator_console, sha256: " + policy.TokenHash(operatorToken) + ", role: operator}\n"
	orig := greenhousePolicy(t)
	if !strings.Contains(orig, opLine) {
		t.Fatal("the greenhouse policy changed: update this test")
	}
	for _, c := range []struct{ name, policy string }{
		{"token removed", strings.Replace(orig, opLine, "", 1)},
		{"same id, another token", strings.Replace(orig, opLine, "    - {id: operator_console, sha256: "+policy.TokenHash("a-new-operator-token")+", role: operator}\n", 1)},
		{"demoted", strings.Replace(orig, opLine, "    - {id: operator_console, sha256: "+policy.TokenHash(operatorToken)+", role: viewer}\n", 1)},
		{"promoted", strings.Replace(orig, opLine, "    - {id: operator_console, sha256: "+policy.TokenHash(operatorToken)+", role: admin}\n", 1)},
	} {
		reload(orig)
		b := serverBrowser(t, s.srv.URL, s.srv.Client())
		b.mustSignIn(operatorToken)
		if a := b.get("/"); a.code != 200 {
			t.Fatalf("%s: console before the reload: %d", c.name, a.code)
		}
		reload(c.policy)
		if a := b.get("/"); a.code != http.StatusSeeOther {
			t.Errorf("%s: the session survived the reload: %d", c.name, a.code)
		}
		reload(orig)
		if a := b.get("/"); a.code != http.StatusSeeOther {
			t.Errorf("%s: the session came back with the token: %d", c.name, a.code)
		}
	}
}

// handlerRig is the greenhouse with a policy behind web.Server's handler,
// with no listener: it runs inside a synctest bubble.
func handlerRig(t *testing.T, policyText string) http.Handler {
	t.Helper()
	tr := testrig.Open(t, example("physmcp.manifest.yml"), policyText, nil)
	n, gd, al := tr.Node, tr.Guard, tr.Audit
	ms := mcpserver.New(n, mcpserver.Options{Guard: gd, Audit: al})
	return web.New(ms, web.Options{Guard: gd, Audit: al}).Handler()
}

// TestConsoleSessionExpiry: a session ends an hour after its last use and
// eight hours after its sign-in however busy it is (fake clock).
func TestConsoleSessionExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := handlerBrowser(t, handlerRig(t, greenhousePolicy(t)))
		b.mustSignIn(operatorToken)
		time.Sleep(web.SessionIdle - time.Second)
		if a := b.get("/status"); a.code != 200 {
			t.Fatalf("used within the idle limit: %d", a.code)
		}
		time.Sleep(web.SessionIdle)
		if a := b.get("/status"); a.code != http.StatusSeeOther {
			t.Fatalf("idle for an hour: %d", a.code)
		}

		b.mustSignIn(operatorToken)
		start := time.Now()
		for time.Since(start) < web.SessionLifetime-web.SessionIdle {
			time.Sleep(web.SessionIdle / 2)
			if a := b.get("/status"); a.code != 200 {
				t.Fatalf("a busy session ended after %v: %d", time.Since(start), a.code)
			}
		}
		time.Sleep(web.SessionLifetime - time.Since(start))
		if a := b.get("/status"); a.code != http.StatusSeeOther {
			t.Fatalf("a session outlived its %v: %d", web.SessionLifetime, a.code)
		}
	})
}

// TestConsoleSignInThrottle: after five wrong tokens from one address the
// form refuses even the right one for a while (429 with Retry-After), the
// wait doubling with each further failure; once the wait is over the
// right token signs in.
func TestConsoleSignInThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := handlerBrowser(t, handlerRig(t, greenhousePolicy(t)))
		for i := range 5 {
			if a := b.signIn(fmt.Sprintf("guess-%d", i)); a.code != http.StatusUnauthorized {
				t.Fatalf("guess %d: %d", i, a.code)
			}
		}
		if a := b.signIn("guess-5"); a.code != http.StatusUnauthorized || a.hdr.Get("Retry-After") != "1" {
			t.Fatalf("the sixth guess: %d, Retry-After %q", a.code, a.hdr.Get("Retry-After"))
		}
		if a := b.signIn(operatorToken); a.code != http.StatusTooManyRequests || !strings.Contains(a.body, "too many failed sign-ins") {
			t.Fatalf("the right token while throttled: %d %s", a.code, a.body)
		}
		time.Sleep(time.Second)
		if a := b.signIn("guess-6"); a.code != http.StatusUnauthorized || a.hdr.Get("Retry-After") != "2" {
			t.Fatalf("the seventh guess: %d, Retry-After %q", a.code, a.hdr.Get("Retry-After"))
		}
		time.Sleep(2 * time.Second)
		b.mustSignIn(operatorToken)
	})
}

// TestConsoleConcurrentSessions: many browsers of three people sign in,
// use the console and sign out at once (run with -race); every
// signed-out cookie is dead afterwards and no person holds more than
// eight sessions.
func TestConsoleConcurrentSessions(t *testing.T) {
	s := newSurface(t, twoPersonPolicy(t), web.Options{}, nil)
	tokens := []string{operatorToken, supAToken, supBToken}
	var wg sync.WaitGroup
	dead := make(chan string, 60)
	kept := make(chan *browser, 60)
	for i := range 60 {
		wg.Go(func() {
			b := serverBrowser(t, s.srv.URL, s.srv.Client())
			b.mustSignIn(tokens[i%3])
			id := b.cookies["physd-session"]
			if a := b.send(http.MethodGet, "/console/live", nil, map[string]string{"Accept": "application/json"}); a.code != 200 && a.code != http.StatusUnauthorized {
				t.Errorf("live: %d", a.code) // 401: evicted by the same person's ninth sign-in
			}
			if i%2 == 0 {
				kept <- b
				return
			}
			if m := csrfInPage.FindStringSubmatch(b.get("/").body); m != nil {
				b.send(http.MethodPost, "/logout", url.Values{"csrf": {m[1]}}, nil)
			} else {
				b.send(http.MethodPost, "/logout", url.Values{}, nil) // evicted already: nothing to end
			}
			dead <- id
		})
	}
	wg.Wait()
	close(dead)
	close(kept)
	probe := serverBrowser(t, s.srv.URL, s.srv.Client())
	for id := range dead {
		probe.cookies["physd-session"] = id
		if a := probe.get("/status"); a.code != http.StatusSeeOther {
			t.Errorf("a signed-out session answers %d", a.code)
		}
	}
	live := map[int]int{}
	i := 0
	for b := range kept {
		if a := b.get("/status"); a.code == 200 {
			live[i%3]++
		}
		i++
	}
	for p, n := range live {
		if n > 8 {
			t.Errorf("person %d holds %d live sessions", p, n)
		}
	}
}

// TestConsoleCertificateSession: over TLS the cookie is Secure; a
// certificate signs in without a token, and its session is worth nothing
// from a connection without that certificate.
func TestConsoleCertificateSession(t *testing.T) {
	ca, err := testpki.NewCA("site CA")
	if err != nil {
		t.Fatal(err)
	}
	srvCert, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	sc, err := srvCert.TLS()
	if err != nil {
		t.Fatal(err)
	}
	mtls := "  providers:\n    - type: mtls\n      clients:\n        - {cn: ops-console, role: operator}\n"
	pol := strings.Replace(greenhousePolicy(t), "\nemergency:", mtls+"\nemergency:", 1)
	s := newSurface(t, pol, web.Options{}, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{sc},
		ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven})
	client := func(withCert bool) *http.Client {
		cfg := &tls.Config{RootCAs: ca.Pool()}
		if withCert {
			l, err := ca.Issue(testpki.Spec{CN: "ops-console", Client: true})
			if err != nil {
				t.Fatal(err)
			}
			c, err := l.TLS()
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	}
	b := serverBrowser(t, s.srv.URL, client(true))
	if a := b.get("/login"); !strings.Contains(a.body, "Sign in with the client certificate cert:ops-console (operator)") {
		t.Fatalf("the sign-in page does not offer the certificate:\n%s", a.body)
	}
	b.mustSignIn("")
	for _, c := range b.last {
		if c.Name == "physd-session" && !c.Secure {
			t.Errorf("session cookie over TLS without Secure: %+v", c)
		}
	}
	if a := b.get("/"); a.code != 200 || !strings.Contains(a.body, "Signed in as <strong>cert:ops-console</strong> (operator)") {
		t.Fatalf("console: %d", a.code)
	}
	thief := serverBrowser(t, s.srv.URL, client(false))
	thief.cookies["physd-session"] = b.cookies["physd-session"]
	if a := thief.get("/"); a.code != http.StatusSeeOther {
		t.Errorf("the certificate's session from a connection without it: %d", a.code)
	}
	// The thief's attempt ended the session (a session is bound to its
	// proof, and a failed check deletes it); the certificate alone still
	// authenticates its holder, without a session.
	if a := b.get("/"); a.code != 200 || strings.Contains(a.body, "Signed in as") || !strings.Contains(a.body, "<strong>cert:ops-console</strong> (operator)") {
		t.Errorf("the certificate's holder after a replay from elsewhere: %d\n%.1500s", a.code, a.body)
	}
}
