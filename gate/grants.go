package gate

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrGrantSelf refuses a grant whose approver is the caller it approves.
var ErrGrantSelf = errors.New("gate approval: the approver is the caller; this rule needs another person")

const (
	grantVersion = 1
	grantMACCtx  = "physd-grant/v1."
	// GrantPrefix starts every grant token, so a grant is never mistaken
	// for an elicitation round's requestState.
	GrantPrefix = "grant."
)

// Grant is the signed content of another person's approval of one exact
// call (a two-person rule): the call (tool, argument fingerprint,
// idempotency key, caller), the approver and its role, the expiry and a
// single-use nonce.
type Grant struct {
	V            int    `json:"v"`
	ID           string `json:"id"` // the approval request it answers
	Fingerprint  string `json:"fp"`
	Tool         string `json:"tool"`
	Key          string `json:"key"`
	Caller       string `json:"caller"`
	Approver     string `json:"approver"`
	ApproverRole string `json:"approver_role"`
	IssuedAt     int64  `json:"iat"`
	ExpiresAt    int64  `json:"exp"`
	Nonce        string `json:"nonce"`
}

// IssueGrant signs g (version, times and nonce are filled in); the grant
// is valid for the approvals' TTL from now.
func (a *Approvals) IssueGrant(g Grant) (token string, exp time.Time, err error) {
	if g.Fingerprint == "" || g.Tool == "" || g.Key == "" || g.Approver == "" {
		return "", time.Time{}, errors.New("gate approvals: a grant needs the fingerprint, tool, key and approver")
	}
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", time.Time{}, fmt.Errorf("gate approvals: nonce: %w", err)
	}
	now := time.Now()
	exp = now.Add(a.ttl).Truncate(time.Second)
	g.V, g.IssuedAt, g.ExpiresAt, g.Nonce = grantVersion, now.Unix(), exp.Unix(), base64.RawURLEncoding.EncodeToString(n[:])
	payload, err := json.Marshal(g)
	if err != nil {
		return "", time.Time{}, err
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return GrantPrefix + p + "." + base64.RawURLEncoding.EncodeToString(a.grantMAC(p)), exp, nil
}

func (a *Approvals) grantMAC(p string) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(grantMACCtx))
	m.Write([]byte(p))
	return m.Sum(nil)
}

// VerifyGrant checks a grant for the call being made: MAC (constant
// time), version, expiry, the binding to this exact call (fingerprint,
// tool, idempotency key, caller), an approver other than the caller, and
// then consumes its nonce (a second use fails). It returns the grant; the
// guard then checks the approver's role against the policy in force.
func (a *Approvals) VerifyGrant(token, fingerprint, tool, key, caller string) (Grant, error) {
	var g Grant
	if len(token) > maxTokenLen || !strings.HasPrefix(token, GrantPrefix) {
		return g, fmt.Errorf("%w: not a grant", ErrApprovalTampered)
	}
	p, m, ok := strings.Cut(strings.TrimPrefix(token, GrantPrefix), ".")
	if !ok || strings.Contains(m, ".") {
		return g, fmt.Errorf("%w: not payload.mac", ErrApprovalTampered)
	}
	sig, err := base64.RawURLEncoding.DecodeString(m)
	if err != nil || len(sig) != sha256.Size || !hmac.Equal(sig, a.grantMAC(p)) {
		return g, fmt.Errorf("%w: MAC mismatch", ErrApprovalTampered)
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return g, fmt.Errorf("%w: bad payload encoding", ErrApprovalTampered)
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil || g.V != grantVersion || g.Nonce == "" {
		return g, fmt.Errorf("%w: bad payload", ErrApprovalTampered)
	}
	now := time.Now()
	if !now.Before(time.Unix(g.ExpiresAt, 0)) {
		return g, fmt.Errorf("%w: expired at %s", ErrApprovalExpired, time.Unix(g.ExpiresAt, 0).UTC().Format(time.RFC3339))
	}
	if time.Unix(g.IssuedAt, 0).After(now.Add(ApprovalSkew)) {
		return g, fmt.Errorf("%w: issued in the future", ErrApprovalExpired)
	}
	if g.Fingerprint != fingerprint || g.Tool != tool || g.Key != key || g.Caller != caller {
		return g, ErrApprovalMismatch
	}
	if g.Approver == g.Caller {
		return g, ErrGrantSelf
	}
	fresh, err := a.nonces.Consume("grant:"+g.Nonce, time.Unix(g.ExpiresAt, 0))
	if err != nil {
		return g, fmt.Errorf("gate approval: nonce store: %w", err)
	}
	if !fresh {
		return g, ErrApprovalReplayed
	}
	return g, nil
}
