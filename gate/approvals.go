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
	"sync"
	"time"
)

// Approval errors. Every one of them means: do not execute.
var (
	ErrApprovalTampered = errors.New("gate approval: requestState is malformed or its MAC does not verify")
	ErrApprovalExpired  = errors.New("gate approval: requestState has expired (or is not yet valid)")
	ErrApprovalMismatch = errors.New("gate approval: requestState was issued for a different call (fingerprint, tool or caller)")
	ErrApprovalReplayed = errors.New("gate approval: requestState was already used")
)

const (
	approvalVersion = 1
	approvalMACCtx  = "physd-gate/v1."
	// DefaultApprovalTTL is how long an ask stays approvable (B6: 10 min).
	DefaultApprovalTTL = 10 * time.Minute
	// MaxApprovalTTL bounds the configurable TTL.
	MaxApprovalTTL = 24 * time.Hour
	// ApprovalSkew is the tolerated clock skew on iat.
	ApprovalSkew = 30 * time.Second
	// maxTokenLen bounds the work done on an attacker-supplied token.
	maxTokenLen = 4096
)

// NonceStore remembers consumed nonces until they expire. Consume returns
// fresh=false when the nonce was already consumed. The daemon backs it with
// bbolt so a replay is refused across restarts.
type NonceStore interface {
	Consume(nonce string, exp time.Time) (fresh bool, err error)
}

// Claims is the signed content of an approval token (MRTR requestState).
type Claims struct {
	V           int    `json:"v"`
	Fingerprint string `json:"fp"`
	Tool        string `json:"tool"`
	Caller      string `json:"caller"`
	Layer       Layer  `json:"layer"`
	IssuedAt    int64  `json:"iat"`
	ExpiresAt   int64  `json:"exp"`
	Nonce       string `json:"nonce"`
}

// Approvals issues and verifies the HMAC-SHA256, expiring, single-use
// requestState of an ask (research B6).
type Approvals struct {
	key    []byte
	ttl    time.Duration
	nonces NonceStore
}

// NewApprovals builds the approval issuer. key must be at least 32 bytes;
// nil generates a random per-process key (pending asks then do not survive a
// restart, which is fail-safe). ttl 0 means 10 minutes.
func NewApprovals(key []byte, ttl time.Duration, nonces NonceStore) (*Approvals, error) {
	if nonces == nil {
		return nil, errors.New("gate approvals: a NonceStore is required (NewMemoryNonces for tests and stdio)")
	}
	if key == nil {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("gate approvals: generating a key: %w", err)
		}
	} else if len(key) < 32 {
		return nil, fmt.Errorf("gate approvals: the HMAC key has %d bytes; use at least 32 random bytes", len(key))
	} else {
		key = append([]byte(nil), key...)
	}
	switch {
	case ttl == 0:
		ttl = DefaultApprovalTTL
	case ttl < time.Second || ttl > MaxApprovalTTL:
		return nil, fmt.Errorf("gate approvals: ttl %v is out of range; use 1s..24h (default 10m)", ttl)
	}
	return &Approvals{key: key, ttl: ttl, nonces: nonces}, nil
}

// TTL returns the approval lifetime.
func (a *Approvals) TTL() time.Duration { return a.ttl }

// Issue signs a requestState for an ask of the call with this fingerprint,
// tool and caller.
func (a *Approvals) Issue(fingerprint, tool, caller string, layer Layer) (token string, exp time.Time, err error) {
	if fingerprint == "" || tool == "" {
		return "", time.Time{}, errors.New("gate approvals: fingerprint and tool are required")
	}
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", time.Time{}, fmt.Errorf("gate approvals: nonce: %w", err)
	}
	now := time.Now()
	exp = now.Add(a.ttl).Truncate(time.Second)
	c := Claims{V: approvalVersion, Fingerprint: fingerprint, Tool: tool, Caller: caller, Layer: layer,
		IssuedAt: now.Unix(), ExpiresAt: exp.Unix(), Nonce: base64.RawURLEncoding.EncodeToString(n[:])}
	payload, err := json.Marshal(c)
	if err != nil {
		return "", time.Time{}, err
	}
	p := base64.RawURLEncoding.EncodeToString(payload)
	return p + "." + base64.RawURLEncoding.EncodeToString(a.mac(p)), exp, nil
}

func (a *Approvals) mac(p string) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(approvalMACCtx))
	m.Write([]byte(p))
	return m.Sum(nil)
}

// Verify checks a requestState echoed by the client for the retried call:
// parse, constant-time MAC, version, expiry (≤30 s skew on iat), the
// fingerprint+tool+caller binding, then consumes the nonce (a replay fails).
// nil means a human may now turn this ask into allow; re-run L0 first.
func (a *Approvals) Verify(token, fingerprint, tool, caller string) error {
	_, err := a.VerifyClaims(token, fingerprint, tool, caller)
	return err
}

// VerifyClaims is Verify that also returns the verified claims.
func (a *Approvals) VerifyClaims(token, fingerprint, tool, caller string) (Claims, error) {
	var c Claims
	// 1. parse
	if len(token) == 0 || len(token) > maxTokenLen {
		return c, fmt.Errorf("%w: bad length", ErrApprovalTampered)
	}
	p, m, ok := strings.Cut(token, ".")
	if !ok || strings.Contains(m, ".") {
		return c, fmt.Errorf("%w: not payload.mac", ErrApprovalTampered)
	}
	sig, err := base64.RawURLEncoding.DecodeString(m)
	if err != nil || len(sig) != sha256.Size {
		return c, fmt.Errorf("%w: bad MAC encoding", ErrApprovalTampered)
	}
	// 2. MAC, constant time
	if !hmac.Equal(sig, a.mac(p)) {
		return c, fmt.Errorf("%w: MAC mismatch", ErrApprovalTampered)
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return c, fmt.Errorf("%w: bad payload encoding", ErrApprovalTampered)
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("%w: bad payload", ErrApprovalTampered)
	}
	// 3. version
	if c.V != approvalVersion {
		return c, fmt.Errorf("%w: unsupported version %d", ErrApprovalTampered, c.V)
	}
	// 4. expiry
	now := time.Now()
	if !now.Before(time.Unix(c.ExpiresAt, 0)) {
		return c, fmt.Errorf("%w: expired at %s", ErrApprovalExpired, time.Unix(c.ExpiresAt, 0).UTC().Format(time.RFC3339))
	}
	if time.Unix(c.IssuedAt, 0).After(now.Add(ApprovalSkew)) {
		return c, fmt.Errorf("%w: issued in the future", ErrApprovalExpired)
	}
	// 5. binding
	if c.Fingerprint != fingerprint || c.Tool != tool || c.Caller != caller {
		return c, ErrApprovalMismatch
	}
	if c.Nonce == "" {
		return c, fmt.Errorf("%w: no nonce", ErrApprovalTampered)
	}
	// 6. single use
	fresh, err := a.nonces.Consume(c.Nonce, time.Unix(c.ExpiresAt, 0))
	if err != nil {
		return c, fmt.Errorf("gate approval: nonce store: %w", err)
	}
	if !fresh {
		return c, ErrApprovalReplayed
	}
	return c, nil
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
