// Package approval is physd's one approval authority. A do_ that needs a
// human's approval gets it in one of two ways:
//
//   - a round: the caller's own MCP client asks its human to confirm
//     (elicitation); the round's requestState is signed here (round.go);
//   - a two-person rule: the call is registered as a pending request
//     (book.go), a second person with the approver role decides it on the
//     HTTP approvals route, and an approval signs a single-use grant
//     (grant.go) that the caller's repeated call redeems.
//
// Either is bound to exactly what was shown: the tool, the argument
// fingerprint, the idempotency key, the requesting person, an expiry, and
// the digest of the capability's definition (its manifest entry and
// binding, and the policy rules that apply to it; Digest). The do_ path
// (node) redeems approvals against the definition in force, in the same
// step that decides the call; a mismatch is ErrVoid and spends the
// approval. People are compared by their credentials (Party.Credentials),
// never by the formatted names the audit shows.
package approval

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/physd/physd/gate"
)

// Party is a person as the do_ path knows them: the name the audit shows,
// the role they authenticated to, and every credential they presented
// ("token:<id>", "jwt:<issuer>/<subject>", "cert:<name>",
// "certfp:<sha256 hex>", "stdio", ...).
type Party struct {
	ID          string   `json:"id"`
	Role        string   `json:"role,omitempty"`
	Credentials []string `json:"credentials"`
}

// Creds is p's credentials, or its ID when it carries none (a caller built
// by a test or an older component): a party is never credential-less.
func (p Party) Creds() []string {
	if len(p.Credentials) == 0 {
		return []string{p.ID}
	}
	return p.Credentials
}

// SameFunc reports whether two credential sets belong to one person.
type SameFunc func(a, b []string) bool

// ShareCredential is the SameFunc without a people list: one person when
// the two sets share any credential.
func ShareCredential(a, b []string) bool {
	for _, c := range a {
		if slices.Contains(b, c) {
			return true
		}
	}
	return false
}

// Call is the do_ call an approval is for, as the do_ path sees it now.
type Call struct {
	Tool   string
	Value  any // decoded per the capability's data type
	Key    string
	Caller Party
	// Definition is the Digest of the capability's definition in force.
	Definition string
	// HoldS is the lease the call asks for (hold_s; 0: the capability's
	// default). It is an argument of what is approved: without it in the
	// fingerprint, 70 % approved for a 60 s hold ran when repeated with
	// hold_s 3600, an hour nobody approved.
	HoldS int
}

// Fingerprint binds an approval to the call's arguments as the caller
// sent them (the gate's canonical form of the value, and hold_s when
// given: a call without one keeps the fingerprint it always had).
func (c Call) Fingerprint() string {
	args := map[string]any{"value": c.Value}
	if c.HoldS != 0 {
		args["hold_s"] = c.HoldS
	}
	_, fp := gate.Canonical(c.Tool, args)
	return fp
}

// Digest is the definition an approval binds to: the gateway that owns
// the capability (gateways that share PHYSD_APPROVAL_KEY never accept each
// other's approvals), the capability's manifest entry with its binding
// (node's capSum) and the policy rules that apply to its tool. Any change
// of one voids what was approved.
func Digest(device, capability, rules string) string {
	h := sha256.New()
	h.Write([]byte("physd-approval-definition/v1\x00"))
	h.Write([]byte(device))
	h.Write([]byte{0})
	h.Write([]byte(capability))
	h.Write([]byte{0})
	h.Write([]byte(rules))
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Errors. Every one of them means: do not execute.
var (
	ErrTampered = errors.New("approval: the token is malformed or its MAC does not verify")
	ErrExpired  = errors.New("approval: the token has expired (or is not yet valid)")
	ErrMismatch = errors.New("approval: the token was issued for a different call (tool, value, idempotency_key or caller)")
	// ErrElsewhere: the token was issued by another gateway (or this one
	// before its state directory was replaced).
	ErrElsewhere = errors.New("approval: the token was issued by another gateway installation")
	ErrReplayed  = errors.New("approval: the token was already used")
	ErrSelf      = errors.New("approval: the approver is the caller; this rule needs another person")
	// ErrVoid: the capability's definition (binding, range, unit, the
	// policy rules that apply) is not the one the approval was given for.
	// The approval is spent.
	ErrVoid = errors.New("approval: the capability's definition changed since it was approved")
)

const (
	// DefaultTTL is how long an ask or a grant stays usable.
	DefaultTTL = 10 * time.Minute
	// MaxTTL bounds the configurable TTL.
	MaxTTL = 24 * time.Hour
	// Skew is the tolerated clock skew on a token's issue time.
	Skew = 30 * time.Second
	// maxTokenLen bounds the work done on an attacker-supplied token.
	maxTokenLen = 8192
)

// NonceStore remembers consumed nonces until they expire. Consume returns
// fresh=false when the nonce was already consumed. The daemon backs it with
// bbolt so a replay is refused across restarts.
type NonceStore interface {
	Consume(nonce string, exp time.Time) (fresh bool, err error)
}

// Config builds an Authority.
type Config struct {
	// Key signs rounds and grants: at least 32 bytes; nil generates a
	// random per-process key (nothing approved survives a restart, which
	// is fail-safe).
	Key []byte
	// TTL of asks and grants; 0 means DefaultTTL.
	TTL    time.Duration
	Nonces NonceStore
	// Same says whether two credential sets are one person under the
	// policy in force (its identity.people); nil: only a shared
	// credential makes one person.
	Same SameFunc
	// Installation identifies this gateway's state (store.InstallationID):
	// every round and grant names it, and only this installation redeems
	// them, so gateways sharing a key and a manifest never accept each
	// other's approvals (their nonces are not shared). "" is refused.
	Installation string
}

// Authority issues, books and redeems approvals.
type Authority struct {
	key    []byte
	ttl    time.Duration
	nonces NonceStore
	same   SameFunc
	inst   string

	mu   sync.Mutex
	byID map[string]*Request
}

// New builds the authority.
func New(c Config) (*Authority, error) {
	if c.Nonces == nil {
		return nil, errors.New("approval: a NonceStore is required (NewMemoryNonces for tests and stdio)")
	}
	key := c.Key
	switch {
	case key == nil:
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("approval: generating a key: %w", err)
		}
	case len(key) < 32:
		return nil, fmt.Errorf("approval: the HMAC key has %d bytes; use at least 32 random bytes", len(key))
	default:
		key = slices.Clone(key)
	}
	ttl := c.TTL
	switch {
	case ttl == 0:
		ttl = DefaultTTL
	case ttl < time.Second || ttl > MaxTTL:
		return nil, fmt.Errorf("approval: ttl %v is out of range; use 1s..24h (default 10m)", ttl)
	}
	if c.Installation == "" {
		return nil, errors.New("approval: an installation id is required (store.InstallationID)")
	}
	return &Authority{key: key, ttl: ttl, nonces: c.Nonces, same: c.Same, inst: c.Installation, byID: map[string]*Request{}}, nil
}

// TTL returns the lifetime of asks and grants.
func (a *Authority) TTL() time.Duration { return a.ttl }

// SamePerson reports whether two parties are one person: they share a
// credential (whatever Config.Same says), or the policy in force joins
// them (Config.Same, its people list).
func (a *Authority) SamePerson(x, y Party) bool {
	cx, cy := x.Creds(), y.Creds()
	return ShareCredential(cx, cy) || a.same != nil && a.same(cx, cy)
}

// memoryNonces is the in-process NonceStore.
type memoryNonces struct {
	mu   sync.Mutex
	seen map[string]time.Time
	n    int
}

// NewMemoryNonces returns an in-memory NonceStore (tests and stdio). Entries
// are dropped after they expire; an expired token is refused before its
// nonce is looked up, so dropping them is safe.
func NewMemoryNonces() NonceStore { return &memoryNonces{seen: map[string]time.Time{}} }

func (m *memoryNonces) Consume(nonce string, exp time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.n++; m.n%64 == 0 {
		for k, e := range m.seen {
			if now.After(e) {
				delete(m.seen, k)
			}
		}
	}
	if _, used := m.seen[nonce]; used {
		return false, nil
	}
	m.seen[nonce] = exp
	return true, nil
}
