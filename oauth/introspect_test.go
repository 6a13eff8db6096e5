package oauth_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/oauth"
	"github.com/physd/physd/policy"
)

// introAS answers metadata and RFC 7662 introspection from memory.
type introAS struct {
	mu     sync.Mutex
	answer map[string]any // the introspection answer; nil: 500
	down   bool
	asked  int
	authOK bool // the last request authenticated as physd-rs:s3cret
	token  string
}

func (a *introAS) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down {
		return nil, errors.New("connection refused")
	}
	reply := func(code int, body any) (*http.Response, error) {
		b, _ := json.Marshal(body)
		return &http.Response{StatusCode: code, Status: http.StatusText(code), Body: io.NopCloser(strings.NewReader(string(b))), Request: r}, nil
	}
	switch r.URL.String() {
	case "https://login.example/.well-known/oauth-authorization-server":
		return reply(200, map[string]any{"issuer": issuer, "jwks_uri": "https://login.example/keys", "introspection_endpoint": "https://login.example/introspect"})
	case "https://login.example/introspect":
		a.asked++
		id, secret, _ := r.BasicAuth()
		a.authOK = r.Method == http.MethodPost && id == "physd-rs" && secret == "s3cret"
		_ = r.ParseForm()
		a.token = r.PostForm.Get("token")
		if a.answer == nil {
			return reply(500, map[string]any{})
		}
		return reply(200, a.answer)
	}
	return reply(404, map[string]any{})
}

func (a *introAS) set(f func(*introAS)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

// TestIntrospection: an opaque token is introspected with the
// resource-server client's credentials; active with this resource gives
// the principal and the role of its scope; inactive, another resource
// (audited), expired, no subject, another issuer, an AS error and the AS
// down are refused, and every request asks again (no cache).
func TestIntrospection(t *testing.T) {
	as := &introAS{}
	cfg := config()
	cfg.Servers[0].Introspection = &policy.Introspection{ClientID: "physd-rs", ClientSecret: "s3cret"}
	v := oauth.NewPool(&http.Client{Transport: as}).Verifier(cfg)
	exp := time.Now().Add(5 * time.Minute).Unix()
	active := func(m map[string]any) map[string]any {
		out := map[string]any{"active": true, "iss": issuer, "sub": "svc", "aud": resource, "scope": "physd:operate", "exp": exp}
		for k, x := range m {
			if x == nil {
				delete(out, k)
			} else {
				out[k] = x
			}
		}
		return out
	}
	verify := func() (policy.Principal, error) {
		return v.Verify(context.Background(), "opaque-token-1", cfg.Audiences(""))
	}

	as.set(func(a *introAS) { a.answer = active(nil) })
	p, err := verify()
	if err != nil || p.ID != "oauth:"+issuer+"/svc" || p.Role != "operator" {
		t.Fatalf("an active token: %+v %v", p, err)
	}
	if !as.authOK || as.token != "opaque-token-1" {
		t.Errorf("the introspection request: authenticated %v, token %q", as.authOK, as.token)
	}
	if _, err := verify(); err != nil || as.asked != 2 {
		t.Errorf("a second request: %v, asked %d times (want 2: no cache)", err, as.asked)
	}

	for _, c := range []struct {
		name   string
		answer map[string]any
		public string
		audit  bool
	}{
		{"inactive", map[string]any{"active": false}, "not active", false},
		{"another resource", active(map[string]any{"aud": "https://other.example/mcp"}), "not accepted here", true},
		{"expired", active(map[string]any{"exp": time.Now().Add(-time.Hour).Unix()}), "expired", false},
		{"no exp", active(map[string]any{"exp": nil}), "no expiry", false},
		{"no subject", active(map[string]any{"sub": nil}), "no subject", false},
		{"another issuer", active(map[string]any{"iss": "https://evil.example/"}), "cannot be checked now", false},
		{"AS error", nil, "cannot be checked now", false},
	} {
		as.set(func(a *introAS) { a.answer = c.answer })
		_, err := verify()
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		if r := refusal(t, err); !strings.Contains(r.Public, c.public) || r.Audit != c.audit {
			t.Errorf("%s: refused %q (audit %v), want %q (audit %v)", c.name, r.Public, r.Audit, c.public, c.audit)
		}
	}
	as.set(func(a *introAS) { a.answer, a.down = active(nil), true })
	if _, err := verify(); err == nil || !strings.Contains(refusal(t, err).Public, "cannot be checked now") {
		t.Errorf("the AS down: %v", err)
	}
}
