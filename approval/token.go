package approval

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// A token is base64url(JSON payload) "." base64url(HMAC-SHA256 over a
// context string and the encoded payload). The context keeps a round's
// state from ever verifying as a grant and the other way round.

func (a *Authority) mac(ctx, p string) []byte {
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(ctx))
	m.Write([]byte(p))
	return m.Sum(nil)
}

func (a *Authority) sign(ctx string, payload any) (string, error) {
	b, err := json.Marshal(payload)
	if err != nil {
		return "", err
	}
	p := base64.RawURLEncoding.EncodeToString(b)
	return p + "." + base64.RawURLEncoding.EncodeToString(a.mac(ctx, p)), nil
}

// open checks token's MAC (constant time) and decodes its payload into v,
// refusing unknown fields.
func (a *Authority) open(ctx, token string, v any) error {
	if len(token) == 0 || len(token) > maxTokenLen {
		return fmt.Errorf("%w: bad length", ErrTampered)
	}
	p, m, ok := strings.Cut(token, ".")
	if !ok || strings.Contains(m, ".") {
		return fmt.Errorf("%w: not payload.mac", ErrTampered)
	}
	sig, err := base64.RawURLEncoding.DecodeString(m)
	if err != nil || len(sig) != sha256.Size || !hmac.Equal(sig, a.mac(ctx, p)) {
		return fmt.Errorf("%w: MAC mismatch", ErrTampered)
	}
	payload, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return fmt.Errorf("%w: bad payload encoding", ErrTampered)
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil || dec.More() {
		return fmt.Errorf("%w: bad payload", ErrTampered)
	}
	return nil
}

// times checks an issued-at and an expiry against now.
func times(iat, exp int64) error {
	now := time.Now()
	if !now.Before(time.Unix(exp, 0)) {
		return fmt.Errorf("%w: expired at %s", ErrExpired, time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	if time.Unix(iat, 0).After(now.Add(Skew)) {
		return fmt.Errorf("%w: issued in the future", ErrExpired)
	}
	return nil
}

func nonce() (string, error) {
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return "", fmt.Errorf("approval: nonce: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(n[:]), nil
}

// spend consumes a nonce once; a second use is ErrReplayed.
func (a *Authority) spend(n string, exp int64) error {
	fresh, err := a.nonces.Consume(n, time.Unix(exp, 0))
	if err != nil {
		return fmt.Errorf("approval: nonce store: %w", err)
	}
	if !fresh {
		return ErrReplayed
	}
	return nil
}
