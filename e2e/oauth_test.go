package e2e

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// The authorization server of these tests is zitadel/oidc's example
// OpenID provider (its op package, storage and login UI), run in this
// process. Its storage is wrapped where the example does what a resource
// server cannot use: it issues opaque tokens with the client as audience;
// here it issues RFC 9068 JWT access tokens whose audience is the RFC 8707
// resource the client asked for, with their scope claim, and with a
// signing key the test can rotate.

const (
	oauthResource   = "https://gw1.greenhouse.example/mcp"
	exampleIssuer   = "http://localhost:9998/"
	nativeClient    = "physd-e2e-native"
	nativeRedirect  = "http://localhost/callback"
	serviceClient   = "sid1" // the example storage's client_credentials client
	serviceSecret   = "verysecret"
	oauthReadScope  = "physd:read"
	oauthOperScope  = "physd:operate"
	protocol2026    = "2026-07-28"
	metadataMCPPath = "/.well-known/oauth-protected-resource/mcp"
)

var registerNative sync.Once

type resourceKey struct{}

// testAS is one running zitadel OP.
type testAS struct {
	srv    *httptest.Server
	issuer string
	st     *asStorage
}

func startAS(t *testing.T) *testAS {
	t.Helper()
	registerNative.Do(func() { storage.RegisterClients(storage.NativeClient(nativeClient, nativeRedirect)) })
	srv := httptest.NewUnstartedServer(nil)
	issuer := "http://" + srv.Listener.Addr().String() + "/"
	st := &asStorage{Storage: storage.NewStorage(storage.NewUserStore(issuer)), issuer: issuer, audiences: map[string]string{}, issued: map[string]issuedToken{}}
	st.rotate(t)
	// The example logs every request through slog's default logger, which
	// it replaces with the one given: a silent one keeps the test output
	// readable (no e2e code logs through slog's default).
	router := exampleop.SetupServer(issuer, st, slog.New(slog.DiscardHandler), false)
	// The example OP ignores RFC 8707's resource parameter; the storage
	// reads it from the request (authorize and token endpoints).
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		router.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resourceKey{}, r.Form.Get("resource"))))
	})
	srv.Start()
	t.Cleanup(srv.Close)
	return &testAS{srv: srv, issuer: issuer, st: st}
}

// asStorage is the example storage with JWT access tokens for the asked
// resource, a rotatable signing key and, on demand, tokens issued expired.
type asStorage struct {
	*storage.Storage
	issuer    string
	mu        sync.Mutex
	keys      []*asKey          // published; the last one signs
	audiences map[string]string // auth request id -> resource
	expired   atomic.Bool
	// opaque makes the clients get opaque (zitadel's encrypted id)
	// access tokens instead of JWTs: physd checks them by introspection.
	opaque atomic.Bool
	issued map[string]issuedToken // access token id -> what introspection tells
	lastID string
}

// issuedToken is what the storage answers an introspection with.
type issuedToken struct {
	aud, sub string
	scopes   []string
	exp      time.Time
}

// The resource server client: physd authenticates as it at the
// introspection endpoint (client_secret_basic).
const (
	introClient = "physd-introspect"
	introSecret = "introspection-secret"
)

func (s *asStorage) AuthorizeClientIDSecret(ctx context.Context, id, secret string) error {
	if id == introClient {
		if secret != introSecret {
			return errors.New("invalid secret")
		}
		return nil
	}
	return s.Storage.AuthorizeClientIDSecret(ctx, id, secret)
}

// SetIntrospectionFromToken answers RFC 7662 for the resource server
// client only (the example storage answers only a client in the token's
// audience and only for users, not service accounts): active with the
// token's audience (the RFC 8707 resource), subject, scope and expiry, or
// inactive (an error) when unknown, revoked or expired.
func (s *asStorage) SetIntrospectionFromToken(ctx context.Context, r *oidc.IntrospectionResponse, tokenID, subject, clientID string) error {
	if clientID != introClient {
		return errors.New("not the resource server")
	}
	s.mu.Lock()
	tok, ok := s.issued[tokenID]
	s.mu.Unlock()
	if !ok || tok.sub != subject || time.Now().After(tok.exp) {
		return errors.New("token is not active")
	}
	r.Issuer, r.Subject, r.Audience, r.Scope, r.ClientID = s.issuer, tok.sub, oidc.Audience{tok.aud}, tok.scopes, serviceClient
	r.Expiration = oidc.FromTime(tok.exp)
	return nil
}

// revoke forgets the last access token issued (the example storage's own
// revocation answers only the client of an authorization code token).
func (s *asStorage) revokeLast() {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.issued, s.lastID)
}

type asKey struct {
	id  string
	key *rsa.PrivateKey
}

func (k *asKey) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *asKey) Algorithm() jose.SignatureAlgorithm          { return jose.RS256 }
func (k *asKey) Key() any                                    { return k.key }
func (k *asKey) ID() string                                  { return k.id }
func (k *asKey) Use() string                                 { return "sig" }

type asPublicKey struct{ *asKey }

func (k asPublicKey) Key() any { return &k.key.PublicKey }

// rotate adds a new signing key; the old ones stay published.
func (s *asStorage) rotate(t *testing.T) string {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	id := fmt.Sprintf("key%d", len(s.keys)+1)
	s.keys = append(s.keys, &asKey{id: id, key: k})
	return id
}

func (s *asStorage) SigningKey(context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[len(s.keys)-1], nil
}

func (s *asStorage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *asStorage) KeySet(context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]op.Key, len(s.keys))
	for i, k := range s.keys {
		out[i] = asPublicKey{k}
	}
	return out, nil
}

// jwtClient issues JWT access tokens (opaque ones when opaque) and allows
// physd's scopes.
type jwtClient struct {
	op.Client
	opaque bool
}

func (c jwtClient) AccessTokenType() op.AccessTokenType {
	if c.opaque {
		return op.AccessTokenTypeBearer
	}
	return op.AccessTokenTypeJWT
}
func (c jwtClient) IsScopeAllowed(s string) bool {
	return strings.HasPrefix(s, "physd:") || c.Client.IsScopeAllowed(s)
}

func (s *asStorage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	c, err := s.Storage.GetClientByClientID(ctx, id)
	if err != nil {
		return nil, err
	}
	return jwtClient{c, s.opaque.Load()}, nil
}

func (s *asStorage) ClientCredentials(ctx context.Context, id, secret string) (op.Client, error) {
	c, err := s.Storage.ClientCredentials(ctx, id, secret)
	if err != nil {
		return nil, err
	}
	return jwtClient{c, s.opaque.Load()}, nil
}

func resourceOf(ctx context.Context) string {
	r, _ := ctx.Value(resourceKey{}).(string)
	return r
}

func (s *asStorage) ClientCredentialsTokenRequest(ctx context.Context, id string, scopes []string) (op.TokenRequest, error) {
	return &oidc.JWTTokenRequest{Subject: id, Audience: []string{resourceOf(ctx)}, Scopes: scopes}, nil
}

func (s *asStorage) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, user string) (op.AuthRequest, error) {
	ar, err := s.Storage.CreateAuthRequest(ctx, req, user)
	if err == nil {
		s.mu.Lock()
		s.audiences[ar.GetID()] = resourceOf(ctx)
		s.mu.Unlock()
	}
	return ar, err
}

// audienced is an auth request whose audience is the resource it asked for.
type audienced struct {
	op.AuthRequest
	aud string
}

func (a audienced) GetAudience() []string { return []string{a.aud} }

func (s *asStorage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	ar, err := s.Storage.AuthRequestByCode(ctx, code)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return audienced{ar, s.audiences[ar.GetID()]}, nil
}

// GetPrivateClaimsFromScopes adds RFC 9068's scope claim, which zitadel's
// op leaves to the storage (the example storage adds none).
func (s *asStorage) GetPrivateClaimsFromScopes(ctx context.Context, user, client string, scopes []string) (map[string]any, error) {
	c, err := s.Storage.GetPrivateClaimsFromScopes(ctx, user, client, scopes)
	if c == nil {
		c = map[string]any{}
	}
	c["scope"] = strings.Join(scopes, " ")
	return c, err
}

func (s *asStorage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	id, exp, err := s.Storage.CreateAccessToken(ctx, req)
	if s.expired.Load() {
		exp = time.Now().Add(-10 * time.Minute) // beyond physd's 30 s skew
	}
	if err == nil {
		s.mu.Lock()
		s.issued[id] = issuedToken{aud: resourceOf(ctx), sub: req.GetSubject(), scopes: req.GetScopes(), exp: exp}
		s.lastID = id
		s.mu.Unlock()
	}
	return id, exp, err
}

// clientCredentials gets a token by the client_credentials grant, with
// golang.org/x/oauth2 as a client would.
func (a *testAS) clientCredentials(t *testing.T, resource string, scopes ...string) string {
	t.Helper()
	cc := clientcredentials.Config{ClientID: serviceClient, ClientSecret: serviceSecret, TokenURL: a.issuer + "oauth/token",
		Scopes: scopes, EndpointParams: url.Values{"resource": {resource}}, AuthStyle: oauth2.AuthStyleInHeader}
	tok, err := cc.Token(context.Background())
	if err != nil {
		t.Fatalf("client_credentials: %v", err)
	}
	return tok.AccessToken
}

// rawClientCredentials is clientCredentials without x/oauth2, whose
// parser refuses the expires_in zitadel computes for an already expired
// token (a negative number as an unsigned one).
func (a *testAS) rawClientCredentials(t *testing.T, resource, scope string) string {
	t.Helper()
	req, _ := http.NewRequest("POST", a.issuer+"oauth/token", strings.NewReader(url.Values{"grant_type": {"client_credentials"}, "scope": {scope}, "resource": {resource}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(serviceClient, serviceSecret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.AccessToken == "" {
		t.Fatalf("client_credentials: %d %v", resp.StatusCode, err)
	}
	return body.AccessToken
}

var hiddenID = regexp.MustCompile(`name="id" value="([^"]+)"`)

// authorizationCode runs the authorization code flow with PKCE as an MCP
// client would: the authorize endpoint (with RFC 8707's resource), the
// example OP's login form (its test user), the redirect with the code,
// and the code exchange with the verifier.
func (a *testAS) authorizationCode(t *testing.T, resource string, scopes ...string) string {
	t.Helper()
	ctx := context.Background()
	cfg := oauth2.Config{ClientID: nativeClient, RedirectURL: nativeRedirect, Scopes: append([]string{"openid"}, scopes...),
		Endpoint: oauth2.Endpoint{AuthURL: a.issuer + "auth", TokenURL: a.issuer + "oauth/token", AuthStyle: oauth2.AuthStyleInParams}}
	verifier := oauth2.GenerateVerifier()
	authURL := cfg.AuthCodeURL("st4te", oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", resource))
	// A browser: follows the OP's redirects, stops at the client's.
	var code string
	browser := &http.Client{CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		if strings.HasPrefix(req.URL.String(), nativeRedirect) {
			code = req.URL.Query().Get("code")
			if req.URL.Query().Get("state") != "st4te" {
				t.Errorf("state %q", req.URL.Query().Get("state"))
			}
			return http.ErrUseLastResponse
		}
		return nil
	}}
	resp, err := browser.Get(authURL)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := hiddenID.FindSubmatch(page)
	if m == nil {
		t.Fatalf("no login form at %s: %d %s", resp.Request.URL, resp.StatusCode, page)
	}
	user := "test-user@" + strings.Split(strings.TrimPrefix(a.issuer, "http://"), ":")[0]
	resp, err = browser.PostForm(a.issuer+"login/username", url.Values{"username": {user}, "password": {"verysecure"}, "id": {string(m[1])}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code == "" {
		t.Fatalf("no code after login: %d at %s", resp.StatusCode, resp.Request.URL)
	}
	tok, err := cfg.Exchange(ctx, code, oauth2.VerifierOption(verifier), oauth2.SetAuthURLParam("resource", resource))
	if err != nil {
		t.Fatalf("code exchange: %v", err)
	}
	return tok.AccessToken
}

// oauthPolicy is examples/oauth's policy with the test AS's issuer.
func oauthPolicy(t *testing.T, issuer string) string {
	t.Helper()
	b, err := os.ReadFile(repoPath("examples/oauth/physmcp.policy.yml"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), exampleIssuer) {
		t.Fatalf("examples/oauth/physmcp.policy.yml no longer names %s", exampleIssuer)
	}
	p := filepath.Join(t.TempDir(), "physmcp.policy.yml")
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), exampleIssuer, issuer)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// bearerDo sends an HTTP request with a bearer token.
func bearerDo(t *testing.T, method, u, token string, hdr map[string]string, body string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, u, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func bodyOf(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

// challenge parses the response's WWW-Authenticate with go-sdk's parser.
func challenge(t *testing.T, r *http.Response) map[string]string {
	t.Helper()
	cs, err := oauthex.ParseWWWAuthenticate(r.Header.Values("WWW-Authenticate"))
	if err != nil || len(cs) != 1 || cs[0].Scheme != "bearer" {
		t.Fatalf("WWW-Authenticate %q: %v %+v", r.Header.Values("WWW-Authenticate"), cs, err)
	}
	return cs[0].Params
}

// TestOAuthResourceServer: physd behind a real zitadel OP. Metadata, the
// 401 challenge, tokens by client_credentials and by authorization code
// with PKCE through an MCP client, and the refusals: another audience
// (audited, not told), expired, another issuer, a missing scope (403 with
// the scope to ask for), a token in the query string.
func TestOAuthResourceServer(t *testing.T) {
	t.Parallel()
	as := startAS(t)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", oauthPolicy(t, as.issuer)}})

	// RFC 9728 metadata, path-suffixed for /mcp and a view, and the root.
	for path, res := range map[string]string{metadataMCPPath: oauthResource, metadataMCPPath + "/zone_a": oauthResource + "/zone_a",
		"/.well-known/oauth-protected-resource": oauthResource} {
		r := bearerDo(t, "GET", d.url(path), "", nil, "")
		var meta oauthex.ProtectedResourceMetadata
		if err := json.Unmarshal([]byte(bodyOf(r)), &meta); r.StatusCode != 200 || err != nil {
			t.Fatalf("%s: %d %v", path, r.StatusCode, err)
		}
		if meta.Resource != res || len(meta.AuthorizationServers) != 1 || meta.AuthorizationServers[0] != as.issuer ||
			strings.Join(meta.ScopesSupported, " ") != "physd:read physd:operate physd:approve" || strings.Join(meta.BearerMethodsSupported, ",") != "header" {
			t.Errorf("%s: %+v", path, meta)
		}
	}
	// The AS's own metadata is where the resource metadata points.
	var asm oauthex.AuthServerMeta
	r := bearerDo(t, "GET", as.issuer+".well-known/openid-configuration", "", nil, "")
	if json.Unmarshal([]byte(bodyOf(r)), &asm); asm.Issuer != as.issuer {
		t.Fatalf("AS metadata: %+v", asm)
	}

	// 401 without a token: where to find the metadata, and what to ask for.
	r = bearerDo(t, "POST", d.url("/mcp"), "", map[string]string{"Content-Type": "application/json"}, `{}`)
	ch := challenge(t, r)
	if r.StatusCode != 401 || ch["resource_metadata"] != "https://gw1.greenhouse.example"+metadataMCPPath || ch["scope"] != oauthReadScope || ch["error"] != "" {
		t.Errorf("401 challenge: %d %v", r.StatusCode, ch)
	}
	r = bearerDo(t, "POST", d.url("/mcp/zone_a"), "", map[string]string{"Content-Type": "application/json"}, `{}`)
	if ch := challenge(t, r); ch["resource_metadata"] != "https://gw1.greenhouse.example"+metadataMCPPath+"/zone_a" {
		t.Errorf("a view's 401 points at %v", ch)
	}

	// client_credentials: a physd:read token reads over MCP.
	readTok := as.clientCredentials(t, oauthResource, oauthReadScope)
	cs := connectAsPath(t, d, "/mcp", readTok)
	if res := call(t, cs, "read_temperature_zone_a", map[string]any{}); res.IsError {
		t.Errorf("read with a client_credentials token: %s", text(res))
	}

	// Missing scope: do_heater_zone_c needs operator; the 403 names the
	// scope to ask for.
	call2026 := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"Mcp-Protocol-Version": protocol2026, "Mcp-Method": "tools/call", "Mcp-Name": "do_heater_zone_c"}
	r = bearerDo(t, "POST", d.url("/mcp"), readTok, call2026,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"do_heater_zone_c","arguments":{"value":10,"idempotency_key":"oauth-1"}}}`)
	ch = challenge(t, r)
	if r.StatusCode != 403 || ch["error"] != "insufficient_scope" || ch["scope"] != oauthOperScope || ch["resource_metadata"] == "" {
		t.Errorf("do_ with a read token: %d %v %s", r.StatusCode, ch, bodyOf(r))
	}

	// authorization_code + PKCE: the test user with physd:operate actuates.
	operTok := as.authorizationCode(t, oauthResource, oauthReadScope, oauthOperScope)
	cs = connectAsPath(t, d, "/mcp", operTok)
	res := structured(t, call(t, cs, "do_heater_zone_c", map[string]any{"value": 10, "idempotency_key": "oauth-code-1"}))
	if res["status"] != "success" {
		t.Errorf("do_ with an authorization code token: %v", res)
	}
	// Its audit line names the user as issuer + subject.
	trail, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
	if !strings.Contains(string(trail), `"caller":"oauth:`+as.issuer+`/id1"`) {
		t.Errorf("the do_ audit line does not name the OAuth subject:\n%s", trail)
	}

	// A token for another resource: 401, the reason in the audit only.
	otherTok := as.clientCredentials(t, "https://other.example/mcp", oauthReadScope)
	r = bearerDo(t, "POST", d.url("/mcp"), otherTok, map[string]string{"Content-Type": "application/json"}, `{}`)
	if body := bodyOf(r); r.StatusCode != 401 || challenge(t, r)["error"] != "invalid_token" || strings.Contains(body, "other.example") {
		t.Errorf("a token for another resource: %d %q", r.StatusCode, body)
	}
	waitAuditLine(t, d, "auth_refused", "other.example")

	// A token for one view is not a token for the gateway.
	viewTok := as.clientCredentials(t, oauthResource+"/zone_a", oauthReadScope)
	if r := bearerDo(t, "POST", d.url("/mcp"), viewTok, map[string]string{"Content-Type": "application/json"}, `{}`); r.StatusCode != 401 {
		t.Errorf("a view's token at /mcp: %d", r.StatusCode)
	}
	connectAsPath(t, d, "/mcp/zone_a", viewTok)

	// Expired.
	as.st.expired.Store(true)
	expTok := as.rawClientCredentials(t, oauthResource, oauthReadScope)
	as.st.expired.Store(false)
	r = bearerDo(t, "POST", d.url("/mcp"), expTok, map[string]string{"Content-Type": "application/json"}, `{}`)
	if body := bodyOf(r); r.StatusCode != 401 || !strings.Contains(body, "expired") {
		t.Errorf("an expired token: %d %q", r.StatusCode, body)
	}

	// Another issuer (a second OP): not trusted.
	evil := startAS(t)
	evilTok := evil.clientCredentials(t, oauthResource, oauthReadScope)
	if r := bearerDo(t, "POST", d.url("/mcp"), evilTok, map[string]string{"Content-Type": "application/json"}, `{}`); r.StatusCode != 401 {
		t.Errorf("a token of another issuer: %d %s", r.StatusCode, bodyOf(r))
	}

	// A token in the query string is refused even when it is valid.
	if r := bearerDo(t, "GET", d.url("/status?access_token="+url.QueryEscape(readTok)), "", nil, ""); r.StatusCode != 400 || challenge(t, r)["error"] != "invalid_request" {
		t.Errorf("token in the query string: %d", r.StatusCode)
	}
	// Static tokens still work beside OAuth.
	if code, _ := d.request(t, "GET", "/status", ""); code != 200 {
		t.Errorf("the static admin token: %d", code)
	}
}

// waitAuditLine waits for an audit line of event that contains s.
func waitAuditLine(t *testing.T, d *daemon, event, s string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"event":"`+event+`"`) && strings.Contains(line, s) {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	b, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
	t.Errorf("no %s audit line with %q:\n%s", event, s, b)
}

// TestOAuthKeyRotationAndASDown: a token signed by a rotated-in key is
// accepted after physd refetches the JWKS; with the AS down, tokens of
// cached keys still verify and a token of a key physd never fetched is
// refused.
func TestOAuthKeyRotationAndASDown(t *testing.T) {
	t.Parallel()
	as := startAS(t)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", oauthPolicy(t, as.issuer)}})
	post := func(tok string) *http.Response {
		return bearerDo(t, "POST", d.url("/mcp"), tok, map[string]string{"Content-Type": "application/json"}, `{}`)
	}
	// A POST {} is not MCP: a token physd accepts gets past the boundary
	// (400 from the MCP endpoint), one it refuses gets 401.
	accepted := func(r *http.Response) bool { return r.StatusCode != 401 && r.StatusCode != 403 }

	first := as.clientCredentials(t, oauthResource, oauthReadScope)
	if r := post(first); !accepted(r) {
		t.Fatalf("first key: %d %s", r.StatusCode, bodyOf(r))
	}
	kid := as.st.rotate(t)
	rotated := as.clientCredentials(t, oauthResource, oauthReadScope)
	if h := jwtKid(t, rotated); h != kid {
		t.Fatalf("the rotated token's kid is %q, want %q", h, kid)
	}
	if r := post(rotated); !accepted(r) {
		t.Errorf("a token of the rotated-in key: %d %s", r.StatusCode, bodyOf(r))
	}
	// A key physd never saw, then the AS goes down.
	unseen := as.st.rotate(t)
	unseenTok := as.clientCredentials(t, oauthResource, oauthReadScope)
	as.srv.Close()
	for _, tok := range []string{first, rotated} {
		if r := post(tok); !accepted(r) {
			t.Errorf("a cached key with the AS down: %d %s", r.StatusCode, bodyOf(r))
		}
	}
	r := post(unseenTok)
	if body := bodyOf(r); r.StatusCode != 401 || !strings.Contains(body, "signing key is not known") {
		t.Errorf("kid %s with the AS down: %d %q", unseen, r.StatusCode, body)
	}
}

func jwtKid(t *testing.T, raw string) string {
	t.Helper()
	h, _, _ := strings.Cut(raw, ".")
	b, err := base64.RawURLEncoding.DecodeString(h)
	var hdr struct {
		Kid string `json:"kid"`
	}
	if err != nil || json.Unmarshal(b, &hdr) != nil {
		t.Fatalf("token header %q: %v", h, err)
	}
	return hdr.Kid
}

// TestOAuthConsoleSession: an operator's OAuth access token signs in to the
// console like a policy token, and the session follows the policy: a reload
// that maps the token's scope to a lower role ends it (the session keeps
// the token's issuer and scopes, never the token), and so does one that
// drops the authorization server.
func TestOAuthConsoleSession(t *testing.T) {
	t.Parallel()
	as := startAS(t)
	pol := oauthPolicy(t, as.issuer)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	orig, err := os.ReadFile(pol)
	if err != nil {
		t.Fatal(err)
	}
	rewrite := func(old, new string) {
		t.Helper()
		if !strings.Contains(string(orig), old) {
			t.Fatalf("examples/oauth/physmcp.policy.yml no longer has %q", old)
		}
		if err := os.WriteFile(pol, []byte(strings.Replace(string(orig), old, new, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		hupAndWait(t, d, "policy reloaded")
	}
	operTok := as.clientCredentials(t, oauthResource, oauthOperScope)

	s := mustSignIn(t, d, operTok)
	if p := acDo(t, d, "GET", "/", acOpts{cookies: s.cookies(), accept: "text/html"}).body; !strings.Contains(p, "(operator)") {
		t.Fatalf("the OAuth token's session is not an operator's:\n%.600s", p)
	}
	if r := acDo(t, d, "GET", "/approvals", acOpts{cookies: s.cookies()}); r.code != 200 {
		t.Fatalf("the operator's OAuth session lists no approvals: %d %.200s", r.code, r.body)
	}
	rewrite("physd:operate: operator", "physd:operate: viewer")
	if r := acDo(t, d, "GET", "/approvals", acOpts{cookies: s.cookies()}); r.code == 200 {
		t.Error("the session still lists the approvals after physd:operate was mapped to viewer")
	}
	if s.alive(t, d) {
		t.Error("an OAuth session outlived a reload that gives its scopes another role")
	}

	rewrite("", "") // the original policy back
	s = mustSignIn(t, d, operTok)
	rewrite("      - issuer: "+as.issuer, "      - issuer: "+as.issuer+"other/")
	if s.alive(t, d) {
		t.Error("an OAuth session outlived a reload that no longer trusts its authorization server")
	}
}
