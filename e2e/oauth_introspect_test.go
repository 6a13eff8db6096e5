package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// introspectionPolicy is oauthPolicy with RFC 7662 introspection for the
// AS's opaque tokens, physd authenticating as introClient.
func introspectionPolicy(t *testing.T, issuer string) string {
	t.Helper()
	p := oauthPolicy(t, issuer)
	secret := filepath.Join(t.TempDir(), "introspection.secret")
	if err := os.WriteFile(secret, []byte(introSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	line := "- issuer: " + issuer
	if !strings.Contains(string(b), line) {
		t.Fatalf("the policy has no %q", line)
	}
	out := strings.Replace(string(b), line, line+"\n        introspection: {client_id: "+introClient+", client_secret_file: "+secret+"}", 1)
	if err := os.WriteFile(p, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOAuthIntrospection: opaque access tokens of the real zitadel OP,
// checked by RFC 7662 introspection at its endpoint (physd authenticated
// as a resource-server client): a token is accepted with the role its
// scope maps to (read, do_ with physd:operate, 403 insufficient_scope
// without), the audit names its subject; a token for another resource, an
// unknown one and a revoked one are refused; with the AS down a token it
// accepted a moment ago is refused (there is no result cache: physd never
// accepts an opaque token it could not check).
func TestOAuthIntrospection(t *testing.T) {
	t.Parallel()
	as := startAS(t)
	as.st.opaque.Store(true)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", introspectionPolicy(t, as.issuer)}})
	post := func(tok string) (int, string) {
		r := bearerDo(t, "POST", d.url("/mcp"), tok, map[string]string{"Content-Type": "application/json"}, `{}`)
		return r.StatusCode, bodyOf(r)
	}

	readTok := as.clientCredentials(t, oauthResource, oauthReadScope)
	if strings.Count(readTok, ".") == 2 {
		t.Fatalf("the AS issued a JWT, not an opaque token: %s", readTok)
	}
	cs := connectAsPath(t, d, "/mcp", readTok)
	if res := call(t, cs, "read_temperature_zone_a", map[string]any{}); res.IsError {
		t.Errorf("read with an introspected token: %s", text(res))
	}
	// physd:read is a viewer: a do_ needing operator is 403 with the scope.
	call2026 := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": protocol2026, "Mcp-Method": "tools/call", "Mcp-Name": "do_heater_zone_c"}
	r := bearerDo(t, "POST", d.url("/mcp"), readTok, call2026,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"do_heater_zone_c","arguments":{"value":10,"idempotency_key":"intro-1"}}}`)
	if ch := challenge(t, r); r.StatusCode != 403 || ch["error"] != "insufficient_scope" || ch["scope"] != oauthOperScope {
		t.Errorf("do_ with an introspected read token: %d %v %s", r.StatusCode, ch, bodyOf(r))
	}

	operTok := as.clientCredentials(t, oauthResource, oauthReadScope, oauthOperScope)
	cs = connectAsPath(t, d, "/mcp", operTok)
	if res := structured(t, call(t, cs, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": "intro-2"})); res["status"] != "success" {
		t.Errorf("do_ with an introspected physd:operate token: %v", res)
	}
	waitAuditLine(t, d, "do", `"caller":"oauth:`+as.issuer+`/`+serviceClient+`"`)

	// Another resource's token: the AS vouches for it, physd refuses it.
	otherTok := as.clientCredentials(t, "https://other.example/mcp", oauthReadScope)
	if code, body := post(otherTok); code != 401 || strings.Contains(body, "other.example") {
		t.Errorf("an introspected token for another resource: %d %q", code, body)
	}
	// A token the AS never issued.
	if code, body := post("bm90LWEtdG9rZW4tZXZlcg"); code != 401 || !strings.Contains(body, "not active") {
		t.Errorf("an unknown opaque token: %d %q", code, body)
	}
	// Revoked: accepted, then inactive at the AS, then refused.
	revTok := as.clientCredentials(t, oauthResource, oauthReadScope)
	if code, body := post(revTok); code == 401 || code == 403 {
		t.Fatalf("a fresh token: %d %q", code, body)
	}
	as.st.revokeLast()
	if code, body := post(revTok); code != 401 || !strings.Contains(body, "not active") {
		t.Errorf("a revoked token: %d %q", code, body)
	}
	// The AS down: refused, not accepted unverified.
	if code, body := post(operTok); code == 401 || code == 403 {
		t.Fatalf("before the AS goes down: %d %q", code, body)
	}
	as.srv.Close()
	if code, body := post(operTok); code != 401 || !strings.Contains(body, "cannot be checked now") {
		t.Errorf("an opaque token with the AS down: %d %q", code, body)
	}
}
