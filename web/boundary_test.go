package web_test

import (
	"crypto/tls"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/internal/testpki"
	"github.com/physd/physd/web"
)

// route is one request to the surface.
type route struct {
	method, path, body string
}

func (r route) String() string { return r.method + " " + r.path }

// variant is how a request is dressed: its Host, Origin and credential.
type variant struct {
	name   string
	host   string // "loopback", "localhost", or a name
	origin string // "" none; "self" the request's own origin
	token  string
	ctype  string // Content-Type of a POST body (default application/json)
}

var (
	rebindHost    = variant{name: "rebinding Host", host: "evil.example", token: adminToken}
	rebindPage    = variant{name: "rebinding page (Origin = Host)", host: "evil.example", origin: "self", token: adminToken}
	foreignOrigin = variant{name: "foreign Origin", host: "localhost", origin: "http://evil.example", token: adminToken}
	noToken       = variant{name: "no token", host: "localhost"}
	badToken      = variant{name: "unknown token", host: "localhost", token: "guessed-token-000000"}
	viewer        = variant{name: "viewer", host: "localhost", token: viewerToken}
	operator      = variant{name: "operator", host: "localhost", token: operatorToken}
	admin         = variant{name: "admin", host: "localhost", token: adminToken}
	anonLoopback  = variant{name: "anonymous, 127.0.0.1", host: "loopback"}
	anonLocalhost = variant{name: "anonymous, localhost, same Origin", host: "localhost", origin: "self"}
	formPost      = variant{name: "form post", host: "localhost", ctype: "application/x-www-form-urlencoded"}
	adminText     = variant{name: "admin, text/plain body", host: "localhost", token: adminToken, ctype: "text/plain"}
)

const discover = `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`

func (s *surface) do(t *testing.T, c *http.Client, r route, v variant) (int, string) {
	t.Helper()
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, s.srv.URL+r.path, body)
	if err != nil {
		t.Fatal(err)
	}
	port := s.srv.Listener.Addr().(interface{ String() string }).String()
	port = port[strings.LastIndex(port, ":"):]
	switch v.host {
	case "loopback":
	case "localhost":
		req.Host = "localhost" + port
	default:
		req.Host = v.host + port
	}
	switch v.origin {
	case "":
	case "self":
		scheme := "http://"
		if s.srv.TLS != nil {
			scheme = "https://"
		}
		req.Header.Set("Origin", scheme+req.Host)
	default:
		req.Header.Set("Origin", v.origin)
	}
	if v.token != "" {
		req.Header.Set("Authorization", "Bearer "+v.token)
	}
	if r.body != "" {
		ct := v.ctype
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if r.path == "/mcp" {
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "server/discover")
	}
	if c == nil {
		c = s.srv.Client()
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s as %s: %v", r, v.name, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// check runs a route × variant table and checks that a refused request
// changed nothing: no fault in the plant, no override in force.
func (s *surface) check(t *testing.T, c *http.Client, variants []variant, table []struct {
	r    route
	want []int
}) {
	t.Helper()
	for _, row := range table {
		if len(row.want) != len(variants) {
			t.Fatalf("%s: %d expectations for %d variants", row.r, len(row.want), len(variants))
		}
		for i, v := range variants {
			code, body := s.do(t, c, row.r, v)
			if code != row.want[i] {
				t.Errorf("%-28s as %-34s = %d, want %d: %.160s", row.r, v.name, code, row.want[i], strings.TrimSpace(body))
			}
			if code >= 400 && len(s.plant.Faults()) > 0 {
				t.Errorf("%s as %s was refused (%d) but installed a fault: %v", row.r, v.name, code, s.plant.Faults())
			}
			if code >= 400 && s.guard != nil && s.guard.ActiveOverride() != nil && row.r.method == http.MethodPost {
				t.Errorf("%s as %s was refused (%d) but started an override", row.r, v.name, code)
			}
			s.plant.ClearFaults()
			if s.guard != nil {
				s.guard.EndOverride()
			}
		}
	}
}

var (
	healthz       = route{"GET", "/healthz", ""}
	readyz        = route{"GET", "/readyz", ""}
	mcpDiscover   = route{"POST", "/mcp", discover}
	mcpGet        = route{"GET", "/mcp", ""}
	status        = route{"GET", "/status", ""}
	page          = route{"GET", "/", ""}
	metricsRoute  = route{"GET", "/metrics", ""}
	overrideGet   = route{"GET", "/emergency/override", ""}
	overrideStart = route{"POST", "/emergency/override", `{"reason":"frost night","ttl_s":60}`}
	overrideEnd   = route{"DELETE", "/emergency/override", ""}
	simState      = route{"GET", "/sim/plant/", ""}
	simFault      = route{"POST", "/sim/plant/fault", `{"point":"*","mode":"offline"}`}
	simClear      = route{"POST", "/sim/plant/clear", "{}"}
	unknown       = route{"GET", "/nope", ""}
	wrongMethod   = route{"POST", "/status", "{}"}
)

// TestBoundaryRouteByRoute: every route physd serves, with credentials
// configured (the greenhouse policy's tokens), against DNS rebinding, a
// foreign Origin, no or a wrong token, and each role.
func TestBoundaryRouteByRoute(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	variants := []variant{rebindHost, rebindPage, foreignOrigin, noToken, badToken, viewer, operator, admin, adminText}
	s.check(t, nil, variants, []struct {
		r    route
		want []int
	}{
		//              rebind rebindSO foreign none bad viewer operator admin admin-text
		{healthz, []int{403, 403, 403, 200, 200, 200, 200, 200, 200}},
		{readyz, []int{403, 403, 403, 200, 200, 200, 200, 200, 200}},
		{mcpDiscover, []int{403, 403, 403, 401, 401, 200, 200, 200, 415}},
		{mcpGet, []int{403, 403, 403, 401, 401, 405, 405, 405, 405}},
		{status, []int{403, 403, 403, 401, 401, 200, 200, 200, 200}},
		{page, []int{403, 403, 403, 401, 401, 200, 200, 200, 200}},
		{metricsRoute, []int{403, 403, 403, 401, 401, 200, 200, 200, 200}},
		{overrideGet, []int{403, 403, 403, 401, 401, 200, 200, 200, 200}},
		{overrideStart, []int{403, 403, 403, 401, 401, 403, 403, 200, 415}},
		{overrideEnd, []int{403, 403, 403, 401, 401, 403, 403, 200, 200}},
		{simState, []int{403, 403, 403, 401, 401, 200, 200, 200, 200}},
		{simFault, []int{403, 403, 403, 401, 401, 403, 200, 200, 415}},
		{simClear, []int{403, 403, 403, 401, 401, 403, 200, 200, 415}},
		{unknown, []int{403, 403, 403, 401, 401, 404, 404, 404, 404}},
		{wrongMethod, []int{403, 403, 403, 401, 401, 405, 405, 405, 415}},
		{approvalsList, []int{403, 403, 403, 401, 401, 403, 200, 200, 200}},
		{approvalsOne, []int{403, 403, 403, 401, 401, 403, 404, 404, 404}},
		{approvalsDecide, []int{403, 403, 403, 401, 401, 403, 404, 404, 415}},
	})
}

// The approvals routes (two-person rule).
var (
	approvalsList   = route{"GET", "/approvals", ""}
	approvalsOne    = route{"GET", "/approvals/0123456789abcdef0123456789abcdef", ""}
	approvalsDecide = route{"POST", "/approvals/0123456789abcdef0123456789abcdef", `{"decision":"approve"}`}
)

// TestBoundaryOpenLoopback: no credentials configured, loopback only: the
// routes are open to the local caller, but a rebinding page or a foreign
// origin reaches none of them, and no browser form can post.
func TestBoundaryOpenLoopback(t *testing.T) {
	s := newSurface(t, "", web.Options{}, nil)
	variants := []variant{rebindHost, rebindPage, foreignOrigin, anonLoopback, anonLocalhost, formPost}
	s.check(t, nil, variants, []struct {
		r    route
		want []int
	}{
		//              rebind rebindSO foreign 127.0.0.1 localhost form
		{healthz, []int{403, 403, 403, 200, 200, 200}},
		{readyz, []int{403, 403, 403, 200, 200, 200}},
		{mcpDiscover, []int{403, 403, 403, 200, 200, 415}},
		{status, []int{403, 403, 403, 200, 200, 200}},
		{page, []int{403, 403, 403, 200, 200, 200}},
		{metricsRoute, []int{403, 403, 403, 200, 200, 200}},
		{route{"GET", "/emergency/override", ""}, []int{403, 403, 403, 404, 404, 404}}, // no policy, no override
		{simState, []int{403, 403, 403, 200, 200, 200}},
		{simFault, []int{403, 403, 403, 200, 200, 415}},
		{simClear, []int{403, 403, 403, 200, 200, 415}},
		{unknown, []int{403, 403, 403, 404, 404, 404}},
		{approvalsList, []int{403, 403, 403, 404, 404, 404}}, // no policy, no approvals
	})
}

// TestBoundaryOffLoopback: listening off loopback (RequireCredentials)
// with only a transport token: its holder is a viewer everywhere, and
// nobody else gets past /healthz and /readyz.
func TestBoundaryOffLoopback(t *testing.T) {
	const transport = "transport-token-of-enough-length"
	s := newSurface(t, "", web.Options{RequireCredentials: true, AuthToken: transport, AllowedHosts: []string{"gw1.plant.example"}}, nil)
	holder := variant{name: "transport token", host: "localhost", token: transport}
	named := variant{name: "transport token, configured name", host: "gw1.plant.example", origin: "self", token: transport}
	variants := []variant{rebindHost, noToken, badToken, holder, named}
	s.check(t, nil, variants, []struct {
		r    route
		want []int
	}{
		//              rebind none bad holder named
		{healthz, []int{403, 200, 200, 200, 200}},
		{mcpDiscover, []int{403, 401, 401, 200, 200}},
		{status, []int{403, 401, 401, 200, 200}},
		{metricsRoute, []int{403, 401, 401, 200, 200}},
		{simState, []int{403, 401, 401, 200, 200}},
		{simFault, []int{403, 401, 401, 403, 403}},
		{unknown, []int{403, 401, 401, 404, 404}},
	})
}

// TestBoundaryHostForms: the Host check normalises case, ports, brackets
// and a trailing dot, and accepts an IP literal only for loopback or the
// address the connection arrived on.
func TestBoundaryHostForms(t *testing.T) {
	s := newSurface(t, "", web.Options{AllowedHosts: []string{"GW1.Plant.Example"}}, nil)
	for host, want := range map[string]int{
		"localhost": 200, "LOCALHOST": 200, "localhost.": 200, "127.0.0.1": 200, "127.0.0.2": 200, "[::1]": 200,
		"gw1.plant.example": 200, "gw1.plant.example.": 200,
		"evil.example": 403, "localhost.evil.example": 403, "evil.localhost": 403, "10.0.0.1": 403, "0.0.0.0": 403,
		"gw1.plant.example.evil.example": 403, "[::ffff:10.0.0.1]": 403,
	} {
		code, body := s.do(t, nil, healthz, variant{name: host, host: host})
		if code != want {
			t.Errorf("Host %s: %d, want %d: %.100s", host, code, want, body)
		}
	}
	// Without a port, and with a port that is not a number.
	for host, want := range map[string]int{"localhost": 200, "localhost:80x": 400} {
		req, _ := http.NewRequest("GET", s.srv.URL+"/healthz", nil)
		req.Host = host
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want && !(want == 400 && resp.StatusCode == 403) {
			t.Errorf("Host %q: %d, want %d", host, resp.StatusCode, want)
		}
	}
}

// TestBoundaryOriginForms: only the request's own origin passes; "null",
// another port or scheme, and two Origin headers are refused; a cross-site
// unsafe request without Origin (Sec-Fetch-Site) is refused too.
func TestBoundaryOriginForms(t *testing.T) {
	s := newSurface(t, "", web.Options{}, nil)
	_, port, _ := strings.Cut(strings.TrimPrefix(s.srv.URL, "http://"), ":")
	for _, c := range []struct {
		origins []string
		sfs     string
		want    int
	}{
		{[]string{"http://localhost:" + port}, "", 200},
		{[]string{"null"}, "", 403},
		{[]string{"http://localhost:1"}, "", 403},
		{[]string{"http://localhost:" + port + ".evil.example"}, "", 403},
		{[]string{"file://"}, "", 403},
		{[]string{"http://localhost:" + port, "http://evil.example"}, "", 403},
		{nil, "cross-site", 403},
		{nil, "same-site", 403},
		{nil, "same-origin", 200},
		{nil, "none", 200},
	} {
		req, _ := http.NewRequest("POST", s.srv.URL+"/sim/plant/clear", strings.NewReader("{}"))
		req.Host = "localhost:" + port
		req.Header.Set("Content-Type", "application/json")
		for _, o := range c.origins {
			req.Header.Add("Origin", o)
		}
		if c.sfs != "" {
			req.Header.Set("Sec-Fetch-Site", c.sfs)
		}
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Origin %q Sec-Fetch-Site %q: %d, want %d", c.origins, c.sfs, resp.StatusCode, c.want)
		}
	}
}

// TestForgedCallerStampIsIgnored: a client that sends the boundary's
// internal caller header claiming admin is still the viewer its token
// says, on the HTTP routes and in the MCP tools.
func TestForgedCallerStampIsIgnored(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	forged := `eyJJRCI6ImFkbWluIiwiUm9sZSI6ImFkbWluIiwiVHJhbnNwb3J0IjoiaHR0cCJ9.AAAA`
	hc := &http.Client{Transport: bearerRT{map[string]string{"Authorization": "Bearer " + viewerToken, "Physd-Verified-Caller": forged}, http.DefaultTransport}}
	o := heaterC(t, connectMCP(t, s.srv.URL, hc), "forged-1")
	if o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Errorf("a viewer with a forged caller stamp actuated: %v", o)
	}
	if w := s.plant.Stats().Points["zone_c.heater"].Writes; w != 0 {
		t.Errorf("the heater was written %d times", w)
	}
	req, _ := http.NewRequest("POST", s.srv.URL+"/sim/plant/clear", strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Physd-Verified-Caller", forged)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a forged caller stamp without a token: %d, want 401", resp.StatusCode)
	}
}

// TestClientCertificateRoles: with mTLS, a verified client certificate the
// policy maps gets its role on every route and in the tools; an unmapped
// one needs a token; a certificate and a token must agree.
func TestClientCertificateRoles(t *testing.T) {
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
	mtls := "  providers:\n    - type: mtls\n      clients:\n        - {cn: ops-console, role: operator}\n        - {san: wall.plant.example, role: viewer}\n"
	pol := strings.Replace(greenhousePolicy(t), "\nemergency:", mtls+"\nemergency:", 1)
	s := newSurface(t, pol, web.Options{}, &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{sc},
		ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven})
	client := func(spec *testpki.Spec) *http.Client {
		cfg := &tls.Config{RootCAs: ca.Pool()}
		if spec != nil {
			l, err := ca.Issue(*spec)
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
	ops := client(&testpki.Spec{CN: "ops-console", Client: true})
	wall := client(&testpki.Spec{CN: "display", DNS: []string{"wall.plant.example"}, Client: true})
	stranger := client(&testpki.Spec{CN: "stranger", Client: true})
	none := client(nil)
	for _, c := range []struct {
		name   string
		hc     *http.Client
		v      variant
		r      route
		want   int
		reason string
	}{
		{"operator certificate", ops, noToken, simFault, 200, ""},
		{"operator certificate", ops, noToken, status, 200, ""},
		{"viewer certificate (SAN)", wall, noToken, status, 200, ""},
		{"viewer certificate (SAN)", wall, noToken, simFault, 403, "needs the operator role"},
		{"unmapped certificate", stranger, noToken, status, 401, "not mapped to a role"},
		{"unmapped certificate with a token", stranger, viewer, status, 200, ""},
		{"unmapped certificate with a token", stranger, viewer, simFault, 403, "needs the operator role"},
		{"no certificate", none, noToken, status, 401, ""},
		{"no certificate, token", none, operator, simFault, 200, ""},
		{"certificate and token agree", ops, operator, simFault, 200, ""},
		{"certificate and token disagree", ops, admin, overrideStart, 403, "disagree"},
		{"certificate and token disagree", wall, operator, simFault, 403, "disagree"},
		{"certificate, bad token", ops, badToken, status, 401, ""},
	} {
		code, body := s.do(t, c.hc, c.r, c.v)
		if code != c.want || !strings.Contains(body, c.reason) {
			t.Errorf("%s, %s, %s = %d %q; want %d mentioning %q", c.name, c.v.name, c.r, code, strings.TrimSpace(body), c.want, c.reason)
		}
		s.plant.ClearFaults()
		s.guard.EndOverride()
	}

	// In the tools: the operator certificate may heat zone C, the viewer
	// certificate may not; the audit names the certificate.
	o := heaterC(t, connectMCP(t, s.srv.URL, ops), "cert-ops-1")
	if o["status"] != "success" {
		t.Errorf("operator certificate: do_heater_zone_c: %v", o)
	}
	o = heaterC(t, connectMCP(t, s.srv.URL, wall), "cert-wall-1")
	if o["permission"] != "permission_insufficient" {
		t.Errorf("viewer certificate: do_heater_zone_c: %v", o)
	}
	b, err := os.ReadFile(s.audit)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "cert:ops-console") {
		t.Errorf("the audit does not name the certificate:\n%s", b)
	}
}

// TestPublicRoutesTellNoSecrets: with credentials required, /healthz and
// /readyz answer everyone, but the device id, version and the readiness
// errors (which name devices and addresses) only to a viewer.
func TestPublicRoutesTellNoSecrets(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	s.plant.SetFault("*", sim.Fault{Mode: sim.FaultOffline})
	for _, c := range []struct {
		v        variant
		detailed bool
	}{{noToken, false}, {badToken, false}, {viewer, true}} {
		_, health := s.do(t, nil, healthz, c.v)
		code, ready := s.do(t, nil, readyz, c.v)
		if got := strings.Contains(health, "gw_greenhouse_001"); got != c.detailed {
			t.Errorf("/healthz as %s names the device: %v: %s", c.v.name, got, health)
		}
		if code != http.StatusServiceUnavailable || !strings.Contains(ready, `"bus:plant"`) {
			t.Errorf("/readyz as %s: %d %s", c.v.name, code, ready)
		}
		if got := !strings.Contains(ready, "details need the viewer role"); got != c.detailed {
			t.Errorf("/readyz as %s shows the errors: %v: %s", c.v.name, got, ready)
		}
	}
}

// TestAuthorizationHeaderForms: the scheme is case-insensitive (RFC 9110);
// Basic, an empty token or two Authorization headers are refused.
func TestAuthorizationHeaderForms(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), web.Options{}, nil)
	for _, c := range []struct {
		values []string
		want   int
	}{
		{[]string{"Bearer " + viewerToken}, 200},
		{[]string{"bearer " + viewerToken}, 200},
		{[]string{"Basic dXNlcjpwYXNz"}, 401},
		{[]string{"Bearer "}, 401},
		{[]string{"Bearer"}, 401},
		{[]string{"Bearer " + viewerToken, "Bearer " + adminToken}, 401},
	} {
		req, _ := http.NewRequest("GET", s.srv.URL+"/status", nil)
		for _, v := range c.values {
			req.Header.Add("Authorization", v)
		}
		resp, err := s.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.values, resp.StatusCode, c.want)
		}
		if c.want == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), `Bearer realm="physd"`) {
			t.Errorf("Authorization %q: WWW-Authenticate %q", c.values, resp.Header.Get("WWW-Authenticate"))
		}
	}
}
