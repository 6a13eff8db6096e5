package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	josejwt "github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/physd/physd/policy"
)

// Pool keeps one authServer per issuer for the life of the process, so
// that a policy reload keeps the keys it had (and a reload while the AS is
// down does not lock every OAuth caller out).
type Pool struct {
	client  *http.Client
	mu      sync.Mutex
	servers map[string]*authServer // by issuer + " " + metadata URL
}

// NewPool returns a pool that fetches with c (nil: a client whose every
// request is bounded by FetchTimeout).
func NewPool(c *http.Client) *Pool {
	if c == nil {
		c = &http.Client{Timeout: FetchTimeout}
	}
	return &Pool{client: c, servers: map[string]*authServer{}}
}

func (p *Pool) server(as policy.AuthServer) *authServer {
	p.mu.Lock()
	defer p.mu.Unlock()
	key := as.Issuer + " " + as.MetadataURL
	s := p.servers[key]
	if s == nil {
		s = newAuthServer(as.Issuer, as.MetadataURL, p.client)
		p.servers[key] = s
	}
	return s
}

// Verifier checks access tokens under one policy's identity.oauth. It is
// a policy.OAuthVerifier.
type Verifier struct {
	cfg     *policy.OAuth
	algs    []jose.SignatureAlgorithm
	servers map[string]*authServer // by issuer
	intro   map[string]*policy.Introspection
	client  *http.Client
}

// Verifier returns the verifier of cfg, sharing the pool's key caches.
func (p *Pool) Verifier(cfg *policy.OAuth) *Verifier {
	v := &Verifier{cfg: cfg, servers: map[string]*authServer{}, intro: map[string]*policy.Introspection{}, client: p.client}
	for _, a := range cfg.Algorithms {
		v.algs = append(v.algs, jose.SignatureAlgorithm(a))
	}
	for _, as := range cfg.Servers {
		v.servers[as.Issuer] = p.server(as)
		if as.Introspection != nil {
			v.intro[as.Issuer] = as.Introspection
		}
	}
	return v
}

// Attach gives pol's identity.oauth, if any, a verifier from the pool.
func (p *Pool) Attach(pol *policy.Policy) {
	if o := pol.Identity.OAuth; o != nil {
		o.Verifier = p.Verifier(o)
	}
}

// accessClaims are the claims of an RFC 9068 JWT access token physd reads.
type accessClaims struct {
	josejwt.Claims
	Scope    string  `json:"scope"`
	Scp      scpList `json:"scp"` // some authorization servers list scopes here
	ClientID string  `json:"client_id"`
}

// scpList is a scp claim: a list, or one space-delimited string.
type scpList []string

func (s *scpList) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*s = strings.Fields(one)
		return nil
	}
	return json.Unmarshal(b, (*[]string)(s))
}

func (c *accessClaims) scopes() []string { return append(strings.Fields(c.Scope), c.Scp...) }

// refuse builds the refusal the caller sees (public) and the log sees.
func refuse(public, format string, args ...any) *policy.OAuthRefusal {
	return &policy.OAuthRefusal{Public: public, Detail: fmt.Sprintf(format, args...)}
}

// Verify checks token for one of audiences: a JWT by its issuer's keys,
// an opaque token by introspection.
func (v *Verifier) Verify(ctx context.Context, token string, audiences []string) (policy.Principal, error) {
	if strings.Count(token, ".") != 2 {
		return v.introspect(ctx, token, audiences)
	}
	tok, err := josejwt.ParseSigned(token, v.algs)
	if err != nil {
		return policy.Principal{}, refuse("the access token is not a JWT signed with an accepted algorithm", "%v (accepted: %v)", err, v.cfg.Algorithms)
	}
	var unverified accessClaims
	if err := tok.UnsafeClaimsWithoutVerification(&unverified); err != nil {
		return policy.Principal{}, refuse("the access token's claims do not decode", "%v", err)
	}
	as := v.servers[unverified.Issuer]
	if as == nil {
		return policy.Principal{}, refuse("the access token is not accepted here", "issuer %q is not an authorization server of this policy", unverified.Issuer)
	}
	c, err := v.verifySignature(ctx, as, tok)
	if err != nil {
		return policy.Principal{}, err
	}
	return v.check(c.Issuer, c.Subject, c.Audience, c.Expiry, c.NotBefore, c.scopes(), audiences)
}

// verifySignature finds the key that signed tok among the AS's keys and
// returns the verified claims.
func (v *Verifier) verifySignature(ctx context.Context, as *authServer, tok *josejwt.JSONWebToken) (*accessClaims, error) {
	h := tok.Headers[0]
	keys, err := as.candidates(ctx, h.KeyID, h.Algorithm)
	if err != nil {
		public := "the access token's signing key is not known"
		if !errors.Is(err, errUnknownKey) {
			public = "the authorization server's keys cannot be fetched"
		}
		return nil, refuse(public, "issuer %s, kid %q: %v", as.issuer, h.KeyID, err)
	}
	for _, k := range keys {
		var c accessClaims
		if tok.Claims(k.Key, &c) == nil {
			return &c, nil
		}
	}
	return nil, refuse("the access token's signature does not verify", "issuer %s, kid %q, alg %s: no key of the JWKS verifies it", as.issuer, h.KeyID, h.Algorithm)
}

// check applies the claim rules shared by JWTs and introspection answers:
// audience, time and subject.
func (v *Verifier) check(iss, sub string, aud []string, exp, nbf *josejwt.NumericDate, scopes, audiences []string) (policy.Principal, error) {
	now, skew := time.Now(), v.cfg.ClockSkew
	if !matchesAny(aud, audiences) {
		r := refuse("the access token is not accepted here", "issuer %s, subject %q: audience %q is not this endpoint's resource (accepted: %q)", iss, sub, aud, audiences)
		// A token a trusted AS issued for another resource: the audit
		// keeps who tried (its signature or the AS vouched for it).
		r.Audit = true
		return policy.Principal{}, r
	}
	if exp == nil {
		return policy.Principal{}, refuse("the access token has no expiry", "issuer %s, subject %q: no exp claim", iss, sub)
	}
	if now.After(exp.Time().Add(skew)) {
		return policy.Principal{}, refuse("the access token is expired", "issuer %s, subject %q: expired at %s (skew %s)", iss, sub, exp.Time().UTC().Format(time.RFC3339), skew)
	}
	if nbf != nil && now.Add(skew).Before(nbf.Time()) {
		return policy.Principal{}, refuse("the access token is not valid yet", "issuer %s, subject %q: not before %s (skew %s)", iss, sub, nbf.Time().UTC().Format(time.RFC3339), skew)
	}
	if strings.TrimSpace(sub) == "" {
		return policy.Principal{}, refuse("the access token names no subject", "issuer %s: no sub claim; physd tells people apart by issuer and subject", iss)
	}
	return v.cfg.Principal(iss, sub, scopes), nil
}

// matchesAny reports whether the token's audience names one of the
// accepted resources (go-sdk's RFC 3986 comparison, trailing slash
// tolerated).
func matchesAny(aud, accepted []string) bool {
	for _, a := range accepted {
		if oauthex.MatchesResource(aud, a) {
			return true
		}
	}
	return false
}
