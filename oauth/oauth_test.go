package oauth_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"

	"github.com/physd/physd/oauth"
	"github.com/physd/physd/policy"
)

const (
	issuer   = "https://login.example/"
	resource = "https://gw1.example/mcp"
)

// fakeAS is an authorization server's metadata and JWKS served from
// memory (an http.RoundTripper), so that the tests run inside a synctest
// bubble: no socket, and time is the bubble's.
type fakeAS struct {
	mu      sync.Mutex
	keys    map[string]*rsa.PrivateKey // published, by kid
	down    bool
	hang    bool // answer nothing until the request's deadline
	oidc    bool // only OpenID Connect discovery (RFC 8414's path is 404)
	metaIss string
	jwks    int // JWKS fetches
}

func newFakeAS(t *testing.T, kids ...string) *fakeAS {
	a := &fakeAS{keys: map[string]*rsa.PrivateKey{}, metaIss: issuer}
	for _, k := range kids {
		a.addKey(t, k)
	}
	return a
}

func (a *fakeAS) addKey(t *testing.T, kid string) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.keys[kid] = k
	a.mu.Unlock()
	return k
}

func (a *fakeAS) set(f func(*fakeAS)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(a)
}

func (a *fakeAS) RoundTrip(r *http.Request) (*http.Response, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.hang {
		a.mu.Unlock()
		<-r.Context().Done()
		a.mu.Lock()
		return nil, r.Context().Err()
	}
	if a.down {
		return nil, errors.New("connection refused")
	}
	var body any
	switch r.URL.String() {
	case "https://login.example/.well-known/oauth-authorization-server":
		if a.oidc {
			return &http.Response{StatusCode: 404, Status: "404 Not Found", Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
		}
		body = map[string]any{"issuer": a.metaIss, "jwks_uri": "https://login.example/keys"}
	case "https://login.example/.well-known/openid-configuration":
		body = map[string]any{"issuer": a.metaIss, "jwks_uri": "https://login.example/keys"}
	case "https://login.example/keys":
		a.jwks++
		set := jose.JSONWebKeySet{}
		for kid, k := range a.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: &k.PublicKey, KeyID: kid, Algorithm: "RS256", Use: "sig"})
		}
		body = set
	default:
		return &http.Response{StatusCode: 404, Status: "404 Not Found", Body: io.NopCloser(strings.NewReader("")), Request: r}, nil
	}
	b, _ := json.Marshal(body)
	return &http.Response{StatusCode: 200, Status: "200 OK", Body: io.NopCloser(strings.NewReader(string(b))), Request: r}, nil
}

func (a *fakeAS) fetches() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.jwks
}

func config() *policy.OAuth {
	return &policy.OAuth{Resource: resource, Servers: []policy.AuthServer{{Issuer: issuer}}, Algorithms: []string{"RS256", "ES256"},
		ClockSkew: 30 * time.Second, Scopes: []policy.ScopeRole{{Scope: "physd:read", Role: "viewer"}, {Scope: "physd:operate", Role: "operator"}}}
}

func verifier(as *fakeAS) *oauth.Verifier {
	return oauth.NewPool(&http.Client{Transport: as}).Verifier(config())
}

type claims struct {
	josejwt.Claims
	Scope string `json:"scope,omitempty"`
}

func token(t *testing.T, key *rsa.PrivateKey, kid string, c claims) string {
	t.Helper()
	opts := (&jose.SignerOptions{}).WithType("at+jwt")
	if kid != "" {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.RS256, Key: key}, opts)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := josejwt.Signed(s).Claims(c).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func good(scope string) claims {
	now := time.Now()
	return claims{Claims: josejwt.Claims{Issuer: issuer, Subject: "alice", Audience: josejwt.Audience{resource},
		Expiry: josejwt.NewNumericDate(now.Add(5 * time.Minute)), NotBefore: josejwt.NewNumericDate(now), IssuedAt: josejwt.NewNumericDate(now)}, Scope: scope}
}

func refusal(t *testing.T, err error) *policy.OAuthRefusal {
	t.Helper()
	var r *policy.OAuthRefusal
	if !errors.As(err, &r) {
		t.Fatalf("error %v is not an OAuthRefusal", err)
	}
	return r
}

func TestVerifyClaims(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		v := verifier(as)
		k := as.keys["k1"]
		ctx := context.Background()
		pr, err := v.Verify(ctx, token(t, k, "k1", good("openid physd:read physd:operate")), []string{resource})
		if err != nil || pr.Role != "operator" || pr.ID != "oauth:"+issuer+"/alice" || pr.Credentials[0] != policy.JWTCredential(issuer, "alice") {
			t.Fatalf("good token: %+v %v", pr, err)
		}
		if pr, err := v.Verify(ctx, token(t, k, "k1", good("openid")), []string{resource}); err != nil || pr.Role != "none" {
			t.Errorf("a token without a mapped scope: %+v %v", pr, err)
		}

		other := good("physd:read")
		other.Audience = josejwt.Audience{"https://other.example/mcp"}
		r := refusal(t, func() error { _, err := v.Verify(ctx, token(t, k, "k1", other), []string{resource}); return err }())
		if !r.Audit || strings.Contains(r.Public, "other.example") || !strings.Contains(r.Detail, "other.example") {
			t.Errorf("wrong audience: %+v (the reason belongs in the audit, not the answer)", r)
		}

		for name, c := range map[string]func(*claims){
			"expired":      func(c *claims) { c.Expiry = josejwt.NewNumericDate(time.Now().Add(-31 * time.Second)) },
			"no expiry":    func(c *claims) { c.Expiry = nil },
			"not yet":      func(c *claims) { c.NotBefore = josejwt.NewNumericDate(time.Now().Add(time.Minute)) },
			"no subject":   func(c *claims) { c.Subject = "" },
			"other issuer": func(c *claims) { c.Issuer = "https://evil.example/" },
		} {
			cl := good("physd:read")
			c(&cl)
			if _, err := v.Verify(ctx, token(t, k, "k1", cl), []string{resource}); err == nil || refusal(t, err).Audit {
				t.Errorf("%s: accepted or audited: %v", name, err)
			}
		}
		// Within the skew is still valid.
		cl := good("physd:read")
		cl.Expiry = josejwt.NewNumericDate(time.Now().Add(-20 * time.Second))
		if _, err := v.Verify(ctx, token(t, k, "k1", cl), []string{resource}); err != nil {
			t.Errorf("expired 20 s ago with 30 s skew: %v", err)
		}
		// A key the AS never published, HS256 and alg none are refused.
		if _, err := v.Verify(ctx, token(t, as.addKeyUnpublished(t), "k1", good("physd:read")), []string{resource}); err == nil {
			t.Error("a token signed by another key under a known kid was accepted")
		}
		hs, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte(strings.Repeat("s", 32))}, nil)
		raw, _ := josejwt.Signed(hs).Claims(good("physd:read")).Serialize()
		if _, err := v.Verify(ctx, raw, []string{resource}); err == nil {
			t.Error("an HS256 token was accepted")
		}
		none := "eyJhbGciOiJub25lIn0." + strings.Split(raw, ".")[1] + "."
		if _, err := v.Verify(ctx, none, []string{resource}); err == nil {
			t.Error("an unsigned token was accepted")
		}
	})
}

func (a *fakeAS) addKeyUnpublished(t *testing.T) *rsa.PrivateKey {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestRotatedKeyAcceptedAfterRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		v := verifier(as)
		ctx := context.Background()
		if _, err := v.Verify(ctx, token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource}); err != nil {
			t.Fatal(err)
		}
		k2 := as.addKey(t, "k2")
		if _, err := v.Verify(ctx, token(t, k2, "k2", good("physd:read")), []string{resource}); err != nil {
			t.Fatalf("rotated key: %v", err)
		}
		if n := as.fetches(); n != 2 {
			t.Errorf("%d JWKS fetches, want 2 (first use, then the unknown kid)", n)
		}
		// A token without kid is tried against every key.
		if _, err := v.Verify(ctx, token(t, k2, "", good("physd:read")), []string{resource}); err != nil {
			t.Errorf("token without kid: %v", err)
		}
	})
}

func TestASDownCachedKeysStillVerify(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		v := verifier(as)
		ctx := context.Background()
		if _, err := v.Verify(ctx, token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource}); err != nil {
			t.Fatal(err)
		}
		as.set(func(a *fakeAS) { a.down = true })
		// Hours later the cache is due for a refresh, which fails: the
		// cached key still verifies.
		time.Sleep(2 * time.Hour)
		if _, err := v.Verify(ctx, token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource}); err != nil {
			t.Errorf("cached key while the AS is down: %v", err)
		}
		k2 := as.addKey(t, "k2")
		_, err := v.Verify(ctx, token(t, k2, "k2", good("physd:read")), []string{resource})
		if r := refusal(t, err); !strings.Contains(r.Public, "signing key is not known") {
			t.Errorf("unknown kid while the AS is down: %+v", r)
		}
		// The AS back: the next unknown kid refreshes (after the failure
		// backoff) and verifies.
		as.set(func(a *fakeAS) { a.down = false })
		time.Sleep(10 * time.Second)
		if _, err := v.Verify(ctx, token(t, k2, "k2", good("physd:read")), []string{resource}); err != nil {
			t.Errorf("after the AS came back: %v", err)
		}
	})
}

func TestNoKeysEverRefusesEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		as.down = true
		v := verifier(as)
		_, err := v.Verify(context.Background(), token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource})
		if r := refusal(t, err); !strings.Contains(r.Public, "cannot be fetched") {
			t.Errorf("AS down before any fetch: %+v", r)
		}
	})
}

func TestUnknownKidRefreshesAreRateLimited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		v := verifier(as)
		ctx := context.Background()
		k := as.keys["k1"]
		if _, err := v.Verify(ctx, token(t, k, "k1", good("physd:read")), []string{resource}); err != nil {
			t.Fatal(err)
		}
		for i := range 10 {
			v.Verify(ctx, token(t, k, "made-up-"+string(rune('a'+i)), good("physd:read")), []string{resource})
		}
		if n := as.fetches(); n != 1+3 {
			t.Errorf("%d JWKS fetches after 10 made-up kids, want 4 (first use + a burst of 3)", n)
		}
		time.Sleep(time.Minute)
		v.Verify(ctx, token(t, k, "made-up-z", good("physd:read")), []string{resource})
		v.Verify(ctx, token(t, k, "made-up-y", good("physd:read")), []string{resource})
		if n := as.fetches(); n != 5 {
			t.Errorf("%d JWKS fetches a minute later, want 5 (one per minute)", n)
		}
	})
}

func TestFetchBoundedByDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		as.hang = true
		v := verifier(as)
		start := time.Now()
		_, err := v.Verify(context.Background(), token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource})
		if took := time.Since(start); err == nil || took != oauth.FetchTimeout {
			t.Errorf("a hanging AS: %v after %s, want a refusal after %s", err, took, oauth.FetchTimeout)
		}
	})
}

func TestDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		as := newFakeAS(t, "k1")
		as.oidc = true
		if _, err := verifier(as).Verify(context.Background(), token(t, as.keys["k1"], "k1", good("physd:read")), []string{resource}); err != nil {
			t.Errorf("OpenID Connect discovery after RFC 8414's 404: %v", err)
		}
		as2 := newFakeAS(t, "k1")
		as2.metaIss = "https://evil.example/"
		_, err := verifier(as2).Verify(context.Background(), token(t, as2.keys["k1"], "k1", good("physd:read")), []string{resource})
		if err == nil || !strings.Contains(refusal(t, err).Detail, "names issuer") {
			t.Errorf("metadata of another issuer: %v", err)
		}
	})
}
