package policy

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"

	"github.com/golang-jwt/jwt/v5"
)

// Principal is an authenticated HTTP caller.
type Principal struct {
	ID   string
	Role string
}

// ErrUnknownToken is returned for a bearer credential no identity accepts.
var ErrUnknownToken = errors.New("the bearer token is not known to this policy")

// Authenticate maps a bearer credential to a principal: a static token by
// its SHA-256, else a JWT from a configured issuer and audience.
func (id *Identity) Authenticate(bearer string) (Principal, error) {
	sum := sha256.Sum256([]byte(bearer))
	for _, t := range id.Tokens {
		if subtle.ConstantTimeCompare(sum[:], t.SHA256[:]) == 1 {
			return Principal{ID: "token:" + t.ID, Role: t.Role}, nil
		}
	}
	var lastErr error = ErrUnknownToken
	for _, p := range id.JWT {
		pr, err := p.verify(bearer)
		if err == nil {
			return pr, nil
		}
		lastErr = err
	}
	return Principal{}, lastErr
}

// Configured reports whether any credential is configured.
func (id *Identity) Configured() bool { return len(id.Tokens)+len(id.JWT) > 0 }

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
		return Principal{}, fmt.Errorf("JWT rejected: %w", err)
	}
	role, _ := claims[p.RoleClaim].(string)
	if RoleLevel(role) < 0 {
		return Principal{}, fmt.Errorf("JWT rejected: claim %q = %q is not a role (%v)", p.RoleClaim, role, Roles)
	}
	sub, _ := claims["sub"].(string)
	return Principal{ID: "jwt:" + p.Issuer + "/" + sub, Role: role}, nil
}
