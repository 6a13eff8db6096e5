package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/internal/testpki"
)

// sitePKI is a test CA with a server certificate for localhost and client
// certificates, written to files physd reads.
type sitePKI struct {
	dir                string
	ca                 *testpki.CA
	caFile             string
	certFile, keyFile  string
	operator, viewer   tls.Certificate // mapped by mtlsPolicy
	stranger, outsider tls.Certificate // unmapped; from another CA
}

func newSitePKI(t *testing.T) *sitePKI {
	t.Helper()
	p := &sitePKI{dir: t.TempDir()}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var err error
	p.ca, err = testpki.NewCA("greenhouse site CA")
	must(err)
	p.caFile = filepath.Join(p.dir, "ca.pem")
	must(p.ca.WriteFile(p.caFile))
	srv, err := p.ca.Server()
	must(err)
	p.certFile, p.keyFile, err = srv.WriteFiles(p.dir, "server")
	must(err)
	issue := func(ca *testpki.CA, s testpki.Spec) tls.Certificate {
		s.Client = true
		l, err := ca.Issue(s)
		must(err)
		c, err := l.TLS()
		must(err)
		return c
	}
	p.operator = issue(p.ca, testpki.Spec{CN: "ops-console"})
	p.viewer = issue(p.ca, testpki.Spec{CN: "display", DNS: []string{"wall.greenhouse.example"}})
	p.stranger = issue(p.ca, testpki.Spec{CN: "stranger"})
	other, err := testpki.NewCA("someone else's CA")
	must(err)
	p.outsider = issue(other, testpki.Spec{CN: "ops-console"})
	return p
}

// mtlsPolicy is the greenhouse policy plus an mtls provider that maps the
// operator and viewer certificates.
func (p *sitePKI) mtlsPolicy(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	mtls := "  providers:\n    - type: mtls\n      clients:\n        - {cn: ops-console, role: operator}\n        - {san: wall.greenhouse.example, role: viewer}\n"
	path := filepath.Join(p.dir, "policy.yml")
	if err := os.WriteFile(path, []byte(strings.Replace(string(b), "\nemergency:", mtls+"\nemergency:", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// client is an HTTPS client that trusts the site CA, with an optional
// client certificate (sent even when the server does not list its CA) and
// bearer token.
func (p *sitePKI) client(cert *tls.Certificate, token string) *http.Client {
	cfg := &tls.Config{RootCAs: p.ca.Pool()}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	var rt http.RoundTripper = &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
	if token != "" {
		rt = bearer{token, rt}
	}
	return &http.Client{Transport: rt}
}

func connectWith(t *testing.T, url string, hc *http.Client) (*mcp.ClientSession, error) {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e-tls", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func httpsGet(t *testing.T, hc *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestTLSAndClientCertificates drives the built binary over HTTPS with the
// go-sdk client: a client certificate the policy maps is that role in the
// tools and on the routes; a token works without a certificate; no
// credential, an unmapped certificate and another CA's certificate do not.
func TestTLSAndClientCertificates(t *testing.T) {
	t.Parallel()
	p := newSitePKI(t)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p.mtlsPolicy(t),
		"--tls-cert", p.certFile, "--tls-key", p.keyFile, "--tls-client-ca", p.caFile}})
	if u := d.stderr.logValue(t, "listening", "mcp"); !strings.HasPrefix(u, "https://") {
		t.Errorf("listening on %s, want https", u)
	}
	base := "https://" + d.addr
	heat := func(cs *mcp.ClientSession, key string) map[string]any {
		return structured(t, call(t, cs, "do_heater_zone_c", map[string]any{"value": 20, "idempotency_key": key}))
	}

	ops, err := connectWith(t, base+"/mcp", p.client(&p.operator, ""))
	if err != nil {
		t.Fatalf("operator certificate: %v\n%s", err, d.stderr.String())
	}
	if r := heat(ops, "tls-ops-1"); r["status"] != "success" {
		t.Errorf("operator certificate, do_heater_zone_c: %v", r)
	}
	wall, err := connectWith(t, base+"/mcp", p.client(&p.viewer, ""))
	if err != nil {
		t.Fatalf("viewer certificate: %v", err)
	}
	if r := heat(wall, "tls-wall-1"); r["status"] != "failed" || r["permission"] != "permission_insufficient" {
		t.Errorf("viewer certificate, do_heater_zone_c: %v", r)
	}
	tok, err := connectWith(t, base+"/mcp", p.client(nil, operatorToken))
	if err != nil {
		t.Fatalf("operator token over TLS: %v", err)
	}
	if r := heat(tok, "tls-token-1"); r["status"] != "success" {
		t.Errorf("operator token, do_heater_zone_c: %v", r)
	}
	for name, hc := range map[string]*http.Client{
		"no credential":          p.client(nil, ""),
		"unmapped certificate":   p.client(&p.stranger, ""),
		"certificate, bad token": p.client(&p.operator, "not-a-token"),
	} {
		if _, err := connectWith(t, base+"/mcp", hc); err == nil || !strings.Contains(err.Error(), "Unauthorized") {
			t.Errorf("%s: connect: %v, want Unauthorized", name, err)
		}
	}
	if _, err := p.client(&p.outsider, "").Get(base + "/healthz"); err == nil {
		t.Error("a certificate from another CA passed the TLS handshake")
	}

	// The routes: the viewer certificate reads /status, cannot inject
	// faults; the operator certificate can; an admin token that disagrees
	// with the operator certificate is refused.
	if code, body := httpsGet(t, p.client(&p.viewer, ""), base+"/status"); code != 200 || !strings.Contains(body, `"device_id"`) {
		t.Errorf("viewer certificate /status: %d %.100s", code, body)
	}
	post := func(hc *http.Client, path, body string) int {
		resp, err := hc.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(p.client(&p.viewer, ""), "/sim/plant/clear", "{}"); code != 403 {
		t.Errorf("viewer certificate POST /sim/plant/clear: %d, want 403", code)
	}
	if code := post(p.client(&p.operator, ""), "/sim/plant/clear", "{}"); code != 200 {
		t.Errorf("operator certificate POST /sim/plant/clear: %d, want 200", code)
	}
	if code := post(p.client(&p.operator, adminDemoToken), "/emergency/override", `{"reason":"x","ttl_s":5}`); code != 403 {
		t.Errorf("operator certificate with an admin token: %d, want 403", code)
	}

	// Plain HTTP on the TLS port gets nothing, and the audit names the
	// certificate that actuated.
	if code, _ := get(t, "http://"+d.addr+"/healthz"); code != http.StatusBadRequest {
		t.Errorf("plain HTTP to the TLS port: %d, want 400", code)
	}
	b, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
	if !strings.Contains(string(b), "cert:ops-console") {
		t.Errorf("the audit does not name the client certificate:\n%s", b)
	}
}

// TestTLSReloadOnSIGHUP: SIGHUP swaps the certificate for new connections
// while the listener and an open connection stay up; a bad certificate is
// refused and the running one stays.
func TestTLSReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	p := newSitePKI(t)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy, "--tls-cert", p.certFile, "--tls-key", p.keyFile}})
	url := "https://" + d.addr + "/healthz"
	serial := func(hc *http.Client) (string, bool) {
		t.Helper()
		reused := false
		req, _ := http.NewRequest("GET", url, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.Text(16), reused
	}
	kept := p.client(nil, "")
	first, _ := serial(kept)

	renewed, err := p.ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := renewed.WriteFiles(p.dir, "server"); err != nil {
		t.Fatal(err)
	}
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.logValue(t, "TLS certificate reloaded", "serial")
	d.stderr.logValue(t, "policy reloaded", "policy") // one SIGHUP reloads both
	if s, _ := serial(p.client(nil, "")); s != renewed.Cert.SerialNumber.Text(16) || s == first {
		t.Errorf("a new connection after the reload sees %s, want the renewed %s", s, renewed.Cert.SerialNumber.Text(16))
	}
	if s, reused := serial(kept); !reused || s != first {
		t.Errorf("the open connection: reused=%v serial %s; want it kept, still on %s", reused, s, first)
	}

	os.WriteFile(p.certFile, []byte("not a certificate"), 0o600)
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.logValue(t, "TLS reload rejected; the running certificate stays in force", "err")
	if s, _ := serial(p.client(nil, "")); s != renewed.Cert.SerialNumber.Text(16) {
		t.Errorf("after a rejected reload: %s, want %s", s, renewed.Cert.SerialNumber.Text(16))
	}
}

// TestPlainHTTPOffLoopback: a token on a network listener without TLS is
// refused, naming both fixes; --insecure-plain-http allows it with a
// warning; TLS flags that cannot work are refused at start.
func TestPlainHTTPOffLoopback(t *testing.T) {
	t.Parallel()
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("transport-token-of-enough-length\n"), 0o600)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(physdBin, append([]string{"run", "--manifest", greenhouse, "--state", t.TempDir()}, args...)...).CombinedOutput()
		if err == nil {
			t.Errorf("physd %v started", args)
		}
		return string(out)
	}
	out := run("--http", "0.0.0.0:0", "--allow-remote", "--auth-token-file", tok)
	for _, want := range []string{"plain HTTP would carry bearer tokens", "--tls-cert FILE --tls-key FILE", "--insecure-plain-http"} {
		if !strings.Contains(out, want) {
			t.Errorf("plain HTTP off loopback: the error lacks %q:\n%s", want, out)
		}
	}
	p := newSitePKI(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", p.certFile}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-client-ca", p.caFile}, "--tls-client-ca needs --tls-cert and --tls-key"},
		{[]string{"--tls-cert", p.certFile, "--tls-key", p.keyFile, "--tls-client-ca", p.caFile}, "no policy maps them to roles"},
		{[]string{"--tls-cert", p.certFile, "--tls-key", p.keyFile, "--insecure-plain-http"}, "contradicts"},
		{[]string{"--policy", p.mtlsPolicy(t)}, "pass --tls-client-ca FILE"},
		{[]string{"--tls-cert", p.keyFile, "--tls-key", p.certFile}, "--tls-cert"},
	} {
		if out := run(append([]string{"--http", "127.0.0.1:0"}, c.args...)...); !strings.Contains(out, c.want) {
			t.Errorf("%v: the error lacks %q:\n%s", c.args, c.want, out)
		}
	}

	// With the explicit flag it serves, warns, and still wants the token
	// on every route but /healthz.
	d := startHTTP(t, daemonOpts{extra: []string{"--http", "0.0.0.0:0", "--allow-remote", "--auth-token-file", tok, "--insecure-plain-http"}})
	d.stderr.logValue(t, "plain HTTP on a non-loopback address (--insecure-plain-http): bearer tokens and every value cross the network in the clear; "+
		"use --tls-cert/--tls-key unless a TLS-terminating proxy or an isolated network protects this link", "addr")
	_, port, _ := net.SplitHostPort(d.addr)
	local := "http://127.0.0.1:" + port
	if code, _ := get(t, local+"/healthz"); code != 200 {
		t.Errorf("/healthz: %d", code)
	}
	for _, path := range []string{"/status", "/metrics", "/", "/sim/plant/"} {
		if code, _ := get(t, local+path); code != http.StatusUnauthorized {
			t.Errorf("%s without a token off loopback: %d, want 401", path, code)
		}
	}
	d.addr, d.token = "127.0.0.1:"+port, "transport-token-of-enough-length"
	if code, body := d.request(t, "GET", "/status", ""); code != 200 {
		t.Errorf("/status with the token: %d %s", code, body)
	}
}

// TestHostileRequestsAgainstTheBinary: the boundary as the built daemon
// wires it, with a policy and the simulator controls: a DNS-rebinding page
// (Origin equal to its Host) reaches neither the status nor the fault
// controls nor the override, even with a valid token.
func TestHostileRequestsAgainstTheBinary(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	for _, c := range []struct {
		method, path, body, host, origin, ctype string
		want                                    int
	}{
		{"GET", "/status", "", "evil.example", "http://evil.example", "", 403},
		{"GET", "/", "", "evil.example", "", "", 403},
		{"POST", "/sim/plant/fault", `{"point":"*","mode":"stuck"}`, "evil.example", "http://evil.example", "application/json", 403},
		{"POST", "/emergency/override", `{"reason":"x"}`, "evil.example", "http://evil.example", "application/json", 403},
		{"POST", "/sim/plant/fault", `{"point":"*","mode":"stuck"}`, "", "http://evil.example", "application/json", 403},
		{"POST", "/sim/plant/fault", `{"point":"*","mode":"stuck"}`, "", "", "text/plain", 415},
		{"POST", "/mcp", `{}`, "", "null", "application/json", 403},
	} {
		req, _ := http.NewRequest(c.method, d.url(c.path), strings.NewReader(c.body))
		if c.host != "" {
			req.Host = c.host
		}
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		if c.ctype != "" {
			req.Header.Set("Content-Type", c.ctype)
		}
		req.Header.Set("Authorization", "Bearer "+adminDemoToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %s Host %q Origin %q: %d, want %d", c.method, c.path, c.host, c.origin, resp.StatusCode, c.want)
		}
	}
	var faults struct {
		Faults map[string]any `json:"faults"`
	}
	_, b := d.request(t, "GET", "/sim/plant/", "")
	if err := json.Unmarshal(b, &faults); err != nil || len(faults.Faults) != 0 {
		t.Errorf("hostile requests left faults: %s %v", b, err)
	}
}
