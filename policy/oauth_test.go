package policy_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/physd/physd/policy"
)

const oauthIdentity = `  oauth:
    resource: https://gw1.plant.example/mcp
    site_resource: https://plant.example/mcp
    authorization_servers:
      - issuer: https://login.plant.example/
    scopes:
      physd:approve: supervisor
      physd:read: viewer
      physd:operate: operator
  people:
    - name: alice
      jwt: [{issuer: https://login.plant.example/, subject: alice}]
`

func TestOAuthParse(t *testing.T) {
	p, err := parseIdentity(t, oauthIdentity)
	if err != nil {
		t.Fatal(err)
	}
	o := p.Identity.OAuth
	if o == nil || o.Resource != "https://gw1.plant.example/mcp" || len(o.Servers) != 1 || o.ClockSkew != 30*time.Second {
		t.Fatalf("oauth: %+v", o)
	}
	if got := o.ScopeNames(); !slices.Equal(got, []string{"physd:read", "physd:operate", "physd:approve"}) {
		t.Errorf("scopes are not lowest role first: %v", got)
	}
	if !slices.Equal(o.Algorithms, []string{"RS256", "ES256"}) {
		t.Errorf("default algorithms: %v", o.Algorithms)
	}
	if r := o.RoleOf([]string{"openid", "physd:read", "physd:operate"}); r != "operator" {
		t.Errorf("role of read+operate = %s, want the highest, operator", r)
	}
	if r := o.RoleOf([]string{"openid"}); r != "none" {
		t.Errorf("role without a mapped scope = %s", r)
	}
	if s := o.ScopeFor("operator"); s != "physd:operate" {
		t.Errorf("scope for operator = %q", s)
	}
	if s := o.ScopeFor("admin"); s != "" {
		t.Errorf("scope for admin = %q, want none", s)
	}
	if got := o.Audiences("ops"); !slices.Equal(got, []string{"https://gw1.plant.example/mcp", "https://gw1.plant.example/mcp/ops", "https://plant.example/mcp"}) {
		t.Errorf("audiences of a view: %v", got)
	}
	if u := policy.MetadataURL(o.ResourceFor("ops")); u != "https://gw1.plant.example/.well-known/oauth-protected-resource/mcp/ops" {
		t.Errorf("metadata URL: %s", u)
	}
	if !p.Identity.Configured() {
		t.Error("an OAuth-only identity is not Configured: routes would be open")
	}
}

func TestOAuthParseErrors(t *testing.T) {
	t.Setenv("PHYSD_TEST_EMPTY", "")
	_, err := parseIdentity(t, `  oauth:
    resource: http://gw1.plant.example/mcp#x
    site_resource: https://gw1.plant.example/mcp?a=b
    authorization_servers:
      - issuer: https://login.example
      - {issuer: https://login.example, introspection: {client_secret_env: PHYSD_TEST_EMPTY}}
      - {metadata_url: https://login.example/m}
    algorithms: [RS256, HS256, ES265]
    clock_skew_seconds: 3600
    scopes:
      "physd read": viewer
      physd:operate: root
      physd:none: none
    colour: blue
  providers:
    - {type: oauth2}
`)
	if err == nil {
		t.Fatal("bad identity.oauth accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		"p.yml:4:15: identity.oauth.resource:", "uses http off loopback",
		"p.yml:5:20: identity.oauth.site_resource:", "has a query",
		"p.yml:8:18:", `duplicate issuer "https://login.example"`,
		"identity.oauth.authorization_servers[1].introspection.client_id: required",
		"PHYSD_TEST_EMPTY is not set",
		"identity.oauth.authorization_servers[2].issuer: required",
		"p.yml:10:25:", `algorithm "HS256" is not accepted; fix: use an asymmetric algorithm`,
		`algorithm "ES265" is not accepted; fix: did you mean "ES256"`,
		"p.yml:11:25: identity.oauth.clock_skew_seconds: 3600 is out of range",
		`"physd read" is not a scope`,
		`unknown role "root"`, "identity.oauth.scopes.physd:none: grants no role",
		"colour", "OAuth 2.1 authorization servers are configured under identity.oauth",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
	_, err = parseIdentity(t, "  oauth: {resource: https://gw/mcp}\n")
	for _, want := range []string{"identity.oauth.authorization_servers: required", "identity.oauth.scopes: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("errors lack %q: %v", want, err)
		}
	}
}

// fakeVerifier records what the identity asks it.
type fakeVerifier struct {
	token     string
	audiences []string
}

func (f *fakeVerifier) Verify(_ context.Context, token string, audiences []string) (policy.Principal, error) {
	f.token, f.audiences = token, audiences
	if token == "opaque" {
		return policy.Principal{}, &policy.OAuthRefusal{Public: "not active"}
	}
	return policy.Principal{ID: "oauth:x", Role: "viewer"}, nil
}

func TestOAuthAuthenticateRoutesTokens(t *testing.T) {
	p, err := parseIdentity(t, oauthIdentity+`  tokens: [{id: wall, sha256: `+policy.TokenHash("wall-display-token")+`, role: viewer}]
`)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVerifier{}
	p.Identity.OAuth.Verifier = f
	// A JWT of the AS goes to the verifier, with the view's audiences.
	tok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("https://login.plant.example/", "x", "", time.Hour))
	if _, err := p.Identity.AuthenticateAt(context.Background(), tok, "ops"); err != nil || f.token != tok || len(f.audiences) != 3 {
		t.Errorf("an AS's JWT did not reach the verifier: %v %+v", err, f)
	}
	// Another issuer's JWT does not.
	f.token = ""
	other := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("https://evil.example/", "x", "", time.Hour))
	if _, err := p.Identity.Authenticate(other); !errors.Is(err, policy.ErrUnknownToken) || f.token != "" {
		t.Errorf("a JWT of an unknown issuer: %v (verifier saw %q)", err, f.token)
	}
	// Static tokens still work; an opaque token without introspection is
	// unknown.
	if pr, err := p.Identity.Authenticate("wall-display-token"); err != nil || pr.Role != "viewer" {
		t.Errorf("static token: %+v %v", pr, err)
	}
	if _, err := p.Identity.Authenticate("opaque"); !errors.Is(err, policy.ErrUnknownToken) || f.token == "opaque" {
		t.Errorf("opaque token without introspection: %v", err)
	}
	// The OAuth subject is a credential of a person, and its role is in
	// the token (not re-derivable from the policy).
	pr := p.Identity.OAuth.Principal("https://login.plant.example/", "alice", []string{"physd:operate"})
	if got := p.Identity.PeopleOf(pr.Credentials); !slices.Equal(got, []string{"alice"}) || pr.Role != "operator" {
		t.Errorf("OAuth principal %+v is person %v", pr, got)
	}
	if _, known := p.Identity.CurrentRoleOf(pr.Credentials); known {
		t.Error("an OAuth credential's role was re-derived from the policy")
	}
}

// TestOAuthFleetResource: a token for the fleet endpoint's resource is
// asked for only on calls the fleet forwarded (AuthenticateFleet), never
// at the gateway's own endpoint; fleet_resource is checked like the others.
func TestOAuthFleetResource(t *testing.T) {
	p, err := parseIdentity(t, strings.Replace(oauthIdentity, "    site_resource: https://plant.example/mcp\n",
		"    site_resource: https://plant.example/mcp\n    fleet_resource: https://fleet.example/mcp\n", 1))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVerifier{}
	p.Identity.OAuth.Verifier = f
	tok := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, claims("https://login.plant.example/", "x", "", time.Hour))
	if _, err := p.Identity.AuthenticateAt(context.Background(), tok, ""); err != nil || slices.Contains(f.audiences, "https://fleet.example/mcp") {
		t.Errorf("the gateway's own endpoint accepts the fleet's audience: %v %v", err, f.audiences)
	}
	if _, err := p.Identity.AuthenticateFleet(context.Background(), tok); err != nil ||
		!slices.Equal(f.audiences, []string{"https://gw1.plant.example/mcp", "https://plant.example/mcp", "https://fleet.example/mcp"}) {
		t.Errorf("a call through the fleet: %v, audiences %v", err, f.audiences)
	}
	_, err = parseIdentity(t, strings.Replace(oauthIdentity, "    site_resource: https://plant.example/mcp\n",
		"    site_resource: https://plant.example/mcp\n    fleet_resource: https://plant.example/mcp\n", 1))
	if err == nil || !strings.Contains(err.Error(), "identity.oauth.fleet_resource: the same as resource or site_resource") {
		t.Errorf("fleet_resource = site_resource: %v", err)
	}
}
