package policy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/golang-jwt/jwt/v5"
)

// Principal is an authenticated HTTP caller: the name the audit shows,
// its role, and the credential it proved (Credentials: one for a token or
// a JWT, two for a certificate: its mapped name and its fingerprint).
type Principal struct {
	ID          string
	Role        string
	Credentials []string
}

// Credential names. A person is compared by these, never by Principal.ID:
// two callers are one person when they share any credential, or when
// identity.people lists their credentials under one name (SamePerson).

// TokenCredential names a policy token by its id.
func TokenCredential(id string) string { return "token:" + id }

// JWTCredential names a JWT subject of an issuer. Both are escaped, so no
// issuer and subject of one person spell another's ("https://idp/a" + "b"
// is not "https://idp" + "a/b").
func JWTCredential(issuer, subject string) string {
	return "jwt:" + url.QueryEscape(issuer) + "/" + url.QueryEscape(subject)
}

// jwtIssuerOf is the issuer of a JWTCredential.
func jwtIssuerOf(credential string) (string, bool) {
	rest, ok := strings.CutPrefix(credential, "jwt:")
	if !ok {
		return "", false
	}
	esc, _, ok := strings.Cut(rest, "/")
	if !ok {
		return "", false
	}
	iss, err := url.QueryUnescape(esc)
	return iss, err == nil
}

// CertCredential names a client certificate by the name an mtls rule
// matched (its CN or SAN).
func CertCredential(name string) string { return "cert:" + name }

// CertFingerprintCredential names a client certificate by the lower-case
// hex SHA-256 of its DER.
func CertFingerprintCredential(hexSum string) string { return "certfp:" + hexSum }

// CertFingerprint is the CertFingerprintCredential of c.
func CertFingerprint(c *x509.Certificate) string {
	sum := sha256.Sum256(c.Raw)
	return CertFingerprintCredential(hex.EncodeToString(sum[:]))
}

// Person is an identity.people entry: the credentials that are one
// person's.
type Person struct {
	Name        string
	Credentials []string
}

// PersonCredential names a person of identity.people.
func PersonCredential(name string) string { return "person:" + name }

// PeopleOf returns the people of identity.people that own any of creds.
func (id *Identity) PeopleOf(creds []string) []string {
	var out []string
	for _, p := range id.People {
		for _, c := range p.Credentials {
			if slices.Contains(creds, c) {
				out = append(out, p.Name)
				break
			}
		}
	}
	return out
}

// SamePerson reports whether two credential sets are one person under this
// policy: they share a credential, or identity.people lists a credential
// of each under the same person.
func (id *Identity) SamePerson(a, b []string) bool {
	for _, c := range a {
		if slices.Contains(b, c) {
			return true
		}
	}
	pa := id.PeopleOf(a)
	for _, p := range id.PeopleOf(b) {
		if slices.Contains(pa, p) {
			return true
		}
	}
	return false
}

// certNamed reports whether an mtls rule maps the certificate name (a CN
// or SAN value).
func (id *Identity) certNamed(name string) bool {
	for _, p := range id.MTLS {
		for _, r := range p.Clients {
			if r.CN == name || r.SAN == name {
				return true
			}
		}
	}
	return false
}

// ErrUnknownToken is returned for a bearer credential no identity accepts.
var ErrUnknownToken = errors.New("the bearer token is not known to this policy")

// ErrUnmappedCert is returned for a verified client certificate that no
// identity.providers entry of type mtls maps to a role.
var ErrUnmappedCert = errors.New("the client certificate is not mapped to a role by this policy")

// errRoleClaim marks a JWT whose signature and claims verified but whose
// role claim names no role, or whose subject is missing: as specific as an
// expired token.
var errRoleClaim = errors.New("role claim")

// Authenticate maps a bearer credential to a principal: a static token by
// its SHA-256, else a JWT from a configured issuer and audience, else an
// OAuth access token for this gateway's resource (AuthenticateAt). When
// no provider accepts a JWT, the error is the most specific one any
// provider gave (expired, wrong audience or issuer, bad signature), not
// the last.
func (id *Identity) Authenticate(bearer string) (Principal, error) {
	return id.AuthenticateAt(context.Background(), bearer, "")
}

// AuthenticateAt is Authenticate at the MCP endpoint of a view ("" for
// every other route): an OAuth token must have been issued for that
// endpoint's resource (OAuth.Audiences). A JWT whose issuer is an
// identity.oauth authorization server is an OAuth token; an opaque token
// is one when an authorization server introspects.
func (id *Identity) AuthenticateAt(ctx context.Context, bearer, view string) (Principal, error) {
	return id.authenticate(ctx, bearer, func() []string { return id.OAuth.Audiences(view) })
}

// AuthenticateFleet is Authenticate for a call the fleet endpoint (physd
// fleet) forwarded over NATS: an OAuth token may also be for the policy's
// fleet_resource (OAuth.FleetAudiences).
func (id *Identity) AuthenticateFleet(ctx context.Context, bearer string) (Principal, error) {
	return id.authenticate(ctx, bearer, func() []string { return id.OAuth.FleetAudiences() })
}

func (id *Identity) authenticate(ctx context.Context, bearer string, audiences func() []string) (Principal, error) {
	sum := sha256.Sum256([]byte(bearer))
	for _, t := range id.Tokens {
		if subtle.ConstantTimeCompare(sum[:], t.SHA256[:]) == 1 {
			return Principal{ID: "token:" + t.ID, Role: t.Role, Credentials: []string{TokenCredential(t.ID)}}, nil
		}
	}
	isJWT := strings.Count(bearer, ".") == 2
	if id.OAuth != nil && ((isJWT && id.OAuth.issuer(unverifiedIssuer(bearer))) || (!isJWT && id.OAuth.introspects())) {
		if id.OAuth.Verifier == nil {
			return Principal{}, &OAuthRefusal{Public: "OAuth access tokens are not checked by this process", Detail: "identity.oauth has no verifier"}
		}
		return id.OAuth.Verifier.Verify(ctx, bearer, audiences())
	}
	if len(id.JWT) == 0 || !isJWT {
		return Principal{}, ErrUnknownToken
	}
	return id.authenticateJWT(bearer)
}

// Configured reports whether any credential is configured.
func (id *Identity) Configured() bool {
	return len(id.Tokens)+len(id.JWT)+len(id.MTLS) > 0 || id.OAuth != nil
}

// authenticateJWT tries every provider and keeps the error of the one that
// got furthest with the token: a provider whose key verified the signature
// knows the real reason (expired, audience); one whose issuer matches knows
// the signature is bad; the others only know the token is not theirs.
func (id *Identity) authenticateJWT(raw string) (Principal, error) {
	iss := unverifiedIssuer(raw)
	var best error
	bestRank := -1
	for i := range id.JWT {
		p := &id.JWT[i]
		pr, err := p.verify(raw)
		if err == nil {
			return pr, nil
		}
		rank := 1
		switch {
		case errors.Is(err, jwt.ErrTokenInvalidClaims), errors.Is(err, errRoleClaim):
			rank = 3
		case iss != "" && iss == p.Issuer:
			rank = 2
		}
		if rank > bestRank {
			best, bestRank = err, rank
		}
	}
	if bestRank == 1 && iss != "" {
		// Not the list of trusted issuers: the caller is not authenticated.
		return Principal{}, fmt.Errorf("JWT rejected: issuer %q is not trusted by this policy", iss)
	}
	return Principal{}, best
}

// JWTProviderOf is the fingerprint of the provider that verifies raw now
// (the one authenticateJWT takes), or "" when none does. A console session
// opened with a JWT keeps it, never the JWT, and lives only while
// TrustsJWTProvider still finds it: a reload that rotates the provider's
// key, or changes its audience or role claim, changes what the JWT proves
// and so ends the session.
func (id *Identity) JWTProviderOf(raw string) string {
	for i := range id.JWT {
		if _, err := id.JWT[i].verify(raw); err == nil {
			return id.JWT[i].fingerprint()
		}
	}
	return ""
}

// TrustsJWTProvider reports whether a provider of fingerprint fp (see
// JWTProviderOf) is configured.
func (id *Identity) TrustsJWTProvider(fp string) bool {
	return fp != "" && slices.ContainsFunc(id.JWT, func(p JWTProvider) bool { return p.fingerprint() == fp })
}

// fingerprint digests everything that decides what a JWT of p proves:
// issuer, audience, role claim and key.
func (p *JWTProvider) fingerprint() string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(p.Issuer), []byte(p.Audience), []byte(p.RoleClaim), p.HS256Key} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	if p.RS256Key != nil {
		fmt.Fprintf(h, "rsa:%d:%x", p.RS256Key.E, p.RS256Key.N.Bytes())
	}
	return hex.EncodeToString(h.Sum(nil))
}

// unverifiedIssuer reads the iss claim without checking anything: it only
// picks which provider's error to report, never whom to trust.
func unverifiedIssuer(raw string) string {
	claims := jwt.MapClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(raw, claims); err != nil {
		return ""
	}
	iss, _ := claims["iss"].(string)
	return iss
}

func (p *JWTProvider) verify(raw string) (Principal, error) {
	algs := []string{}
	if p.HS256Key != nil {
		algs = append(algs, "HS256")
	}
	if p.RS256Key != nil {
		algs = append(algs, "RS256")
	}
	claims := jwt.MapClaims{}
	_, err := jwt.ParseWithClaims(raw, claims, func(t *jwt.Token) (any, error) {
		switch t.Method.Alg() {
		case "HS256":
			return p.HS256Key, nil
		case "RS256":
			return p.RS256Key, nil
		}
		return nil, fmt.Errorf("algorithm %s not accepted", t.Method.Alg())
	}, jwt.WithValidMethods(algs), jwt.WithIssuer(p.Issuer), jwt.WithAudience(p.Audience),
		jwt.WithExpirationRequired(), jwt.WithLeeway(30e9))
	if err != nil {
		return Principal{}, fmt.Errorf("JWT rejected by issuer %s: %w", p.Issuer, err)
	}
	role, _ := claims[p.RoleClaim].(string)
	if RoleLevel(role) < 0 {
		return Principal{}, fmt.Errorf("JWT rejected by issuer %s: claim %q = %q is not a role (%v): %w", p.Issuer, p.RoleClaim, role, Roles, errRoleClaim)
	}
	// The subject tells people apart (the two-person rule, the caller a
	// grant is bound to): a token without one names nobody.
	sub, _ := claims["sub"].(string)
	if strings.TrimSpace(sub) == "" {
		return Principal{}, fmt.Errorf("JWT rejected by issuer %s: no sub claim (a non-empty string): physd tells people apart by issuer and subject; issue the token with the user's subject: %w", p.Issuer, errRoleClaim)
	}
	return Principal{ID: "jwt:" + p.Issuer + "/" + sub, Role: role, Credentials: []string{JWTCredential(p.Issuer, sub)}}, nil
}

// MTLSProvider maps client certificates, already verified by the TLS
// listener (--tls-client-ca), to roles: an identity.providers entry of
// type mtls.
type MTLSProvider struct {
	// CAPath and CA, when set, narrow the provider to certificates that
	// also chain to this CA (the listener may trust several).
	CAPath  string
	CA      *x509.CertPool
	Clients []CertRule
}

// CertRule gives a role to the certificates whose subject CN, or one of
// whose subject alternative names (DNS, URI, email or IP), equals the
// rule's value. Exactly one of CN and SAN is set.
type CertRule struct {
	CN   string
	SAN  string
	Role string
}

// AuthenticateCert maps a verified client certificate chain (leaf first)
// to a principal: the first rule of the first provider that matches wins.
func (id *Identity) AuthenticateCert(chain []*x509.Certificate) (Principal, error) {
	if len(chain) == 0 {
		return Principal{}, errors.New("no client certificate")
	}
	leaf := chain[0]
	for _, p := range id.MTLS {
		if p.CA != nil && !p.anchors(chain) {
			continue
		}
		for _, r := range p.Clients {
			if name, ok := r.match(leaf); ok {
				// The role is the first matching rule's; the person is every
				// name any rule maps this certificate by, and its fingerprint
				// (identity.people may list it by any of them).
				pr := Principal{ID: "cert:" + name, Role: r.Role, Credentials: []string{CertCredential(name)}}
				for _, q := range id.MTLS {
					if q.CA != nil && !q.anchors(chain) {
						continue
					}
					for _, r2 := range q.Clients {
						if n2, ok := r2.match(leaf); ok && !slices.Contains(pr.Credentials, CertCredential(n2)) {
							pr.Credentials = append(pr.Credentials, CertCredential(n2))
						}
					}
				}
				pr.Credentials = append(pr.Credentials, CertFingerprint(leaf))
				return pr, nil
			}
		}
	}
	return Principal{}, fmt.Errorf("%w: %s", ErrUnmappedCert, DescribeCert(leaf))
}

// anchors reports whether the chain verifies against the provider's own CA.
func (p *MTLSProvider) anchors(chain []*x509.Certificate) bool {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: p.CA, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

func (r CertRule) match(c *x509.Certificate) (string, bool) {
	if r.CN != "" {
		return r.CN, c.Subject.CommonName == r.CN
	}
	for _, d := range c.DNSNames {
		if strings.EqualFold(d, r.SAN) {
			return r.SAN, true
		}
	}
	for _, e := range c.EmailAddresses {
		if e == r.SAN {
			return r.SAN, true
		}
	}
	for _, u := range c.URIs {
		if u.String() == r.SAN {
			return r.SAN, true
		}
	}
	if ip := net.ParseIP(r.SAN); ip != nil {
		for _, a := range c.IPAddresses {
			if a.Equal(ip) {
				return r.SAN, true
			}
		}
	}
	return "", false
}

// DescribeCert names a certificate for an error message or a log line:
// its subject CN, SANs and serial.
func DescribeCert(c *x509.Certificate) string {
	var sans []string
	sans = append(sans, c.DNSNames...)
	sans = append(sans, c.EmailAddresses...)
	for _, u := range c.URIs {
		sans = append(sans, u.String())
	}
	for _, ip := range c.IPAddresses {
		sans = append(sans, ip.String())
	}
	return fmt.Sprintf("CN=%q SAN=[%s] serial %s", c.Subject.CommonName, strings.Join(sans, " "), c.SerialNumber.Text(16))
}

// CurrentRole is the role this policy gives the principal id now: a token
// by its id, a certificate by the name a rule matched (the highest such
// rule's role). known is false for a principal whose role cannot be
// re-derived without its credential (a JWT: the role is in its claims), and
// role is "" for a token or certificate name this policy no longer has. A
// grant issued under an older policy is judged by this, not by the role it
// recorded (a reload that demotes or removes an approver ends its grants).
func (id *Identity) CurrentRole(principal string) (role string, known bool) {
	switch {
	case strings.HasPrefix(principal, "certfp:"):
		return "", false
	case strings.HasPrefix(principal, "jwt:"):
		// The role is in the token's claims; but an issuer this policy no
		// longer trusts gives none.
		iss, ok := jwtIssuerOf(principal)
		if ok && (slices.ContainsFunc(id.JWT, func(p JWTProvider) bool { return p.Issuer == iss }) || id.OAuth.issuer(iss)) {
			return "", false
		}
		return "", true
	case strings.HasPrefix(principal, "token:"):
		name := strings.TrimPrefix(principal, "token:")
		for _, t := range id.Tokens {
			if t.ID == name {
				return t.Role, true
			}
		}
		return "", true
	case strings.HasPrefix(principal, "cert:"):
		name := strings.TrimPrefix(principal, "cert:")
		for _, p := range id.MTLS {
			for _, r := range p.Clients {
				if (r.CN == name || r.SAN == name) && RoleLevel(r.Role) > RoleLevel(role) {
					role = r.Role
				}
			}
		}
		return role, true
	}
	return "", false
}

// CurrentRoleOf is the role this policy gives a person who presented
// creds, now: the least of what each credential it can re-derive gives
// (a token or certificate name it no longer has gives none). known is
// false when none can be re-derived (a JWT only: its role is in its
// claims).
func (id *Identity) CurrentRoleOf(creds []string) (role string, known bool) {
	for _, c := range creds {
		r, k := id.CurrentRole(c)
		if !k {
			continue
		}
		if !known || RoleLevel(r) < RoleLevel(role) {
			role = r
		}
		known = true
	}
	return role, known
}
