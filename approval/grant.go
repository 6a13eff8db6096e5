package approval

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// A grant is another person's approval of one exact call under a
// two-person rule, signed when the approver decides (Decide) and redeemed
// once by the caller's repeated call (Redeem).

const (
	grantVersion = 2
	grantMACCtx  = "physd-grant/v2."
	// GrantPrefix starts every grant, so a grant is never mistaken for a
	// round's requestState.
	GrantPrefix = "grant."
)

// Grant is the signed content of a grant.
type Grant struct {
	V            int    `json:"v"`
	Installation string `json:"inst"` // the gateway state that issued it
	ID           string `json:"id"`   // the request it answers
	Fingerprint  string `json:"fp"`
	Tool         string `json:"tool"`
	Key          string `json:"key"`
	Caller       Party  `json:"caller"`
	Approver     Party  `json:"approver"`
	// Definition is the digest of the definition the approver was shown.
	Definition string `json:"def"`
	IssuedAt   int64  `json:"iat"`
	ExpiresAt  int64  `json:"exp"`
	Nonce      string `json:"nonce"`
}

// issueGrant signs g; version, times and nonce are filled in.
func (a *Authority) issueGrant(g Grant) (string, time.Time, error) {
	if g.Fingerprint == "" || g.Tool == "" || g.Key == "" || g.Definition == "" || len(g.Approver.Creds()) == 0 {
		return "", time.Time{}, errors.New("approval: a grant needs the fingerprint, tool, key, definition and approver")
	}
	n, err := nonce()
	if err != nil {
		return "", time.Time{}, err
	}
	now := time.Now()
	exp := now.Add(a.ttl).Truncate(time.Second)
	g.V, g.Installation, g.IssuedAt, g.ExpiresAt, g.Nonce = grantVersion, a.inst, now.Unix(), exp.Unix(), n
	tok, err := a.sign(grantMACCtx, g)
	return GrantPrefix + tok, exp, err
}

// IsGrant reports whether a requestState is (shaped as) a grant.
func IsGrant(token string) bool { return strings.HasPrefix(token, GrantPrefix) }

// Redeem checks a grant for the call being made, in this order: MAC,
// version, the installation that issued it, expiry; the binding to this exact call (tool, value, key) and
// to the person who asked (the same person as the grant's caller); an
// approver who is not that person (under the policy in force too); then it
// spends the grant's nonce (a second use is ErrReplayed) and removes its
// request from the book; last the definition: a grant given for another
// definition than c.Definition is ErrVoid, and spent. The guard then
// checks the approver's role against the policy in force.
func (a *Authority) Redeem(token string, c Call) (Grant, error) {
	var g Grant
	if !IsGrant(token) {
		return g, fmt.Errorf("%w: not a grant", ErrTampered)
	}
	if err := a.open(grantMACCtx, strings.TrimPrefix(token, GrantPrefix), &g); err != nil {
		return g, err
	}
	if g.V != grantVersion || g.Nonce == "" {
		return g, fmt.Errorf("%w: unsupported version %d", ErrTampered, g.V)
	}
	if g.Installation != a.inst {
		return g, ErrElsewhere
	}
	if err := times(g.IssuedAt, g.ExpiresAt); err != nil {
		return g, err
	}
	if g.Fingerprint != c.Fingerprint() || g.Tool != c.Tool || g.Key != c.Key || !a.SamePerson(g.Caller, c.Caller) {
		return g, ErrMismatch
	}
	if a.SamePerson(g.Approver, c.Caller) || a.SamePerson(g.Approver, g.Caller) {
		return g, ErrSelf
	}
	if err := a.spend("grant:"+g.Nonce, g.ExpiresAt); err != nil {
		return g, err
	}
	a.mu.Lock()
	delete(a.byID, g.ID)
	a.mu.Unlock()
	if g.Definition != c.Definition {
		return g, ErrVoid
	}
	return g, nil
}
