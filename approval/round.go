package approval

import (
	"errors"
	"fmt"
	"time"
)

// A round is the caller's own confirmation of one call (MCP elicitation,
// the MRTR requestState): the rule lets the caller approve itself, and its
// client's human confirms. The state is signed, expiring, single use, and
// bound to the call, the caller and the definition shown.

const (
	roundVersion = 2
	roundMACCtx  = "physd-round/v2."
)

// Round is the signed content of a round's requestState.
type Round struct {
	V            int      `json:"v"`
	Installation string   `json:"inst"`
	Fingerprint  string   `json:"fp"`
	Tool         string   `json:"tool"`
	Caller       []string `json:"caller"` // the caller's credentials
	Layer        string   `json:"layer"`  // what asked: policy, L0, L1
	Definition   string   `json:"def"`
	IssuedAt     int64    `json:"iat"`
	ExpiresAt    int64    `json:"exp"`
	Nonce        string   `json:"nonce"`
}

// IssueRound signs the requestState of a round asking the caller to
// confirm c; layer says what asked.
func (a *Authority) IssueRound(c Call, layer string) (token string, exp time.Time, err error) {
	if c.Tool == "" || c.Definition == "" {
		return "", time.Time{}, errors.New("approval: a round needs the tool and the definition")
	}
	n, err := nonce()
	if err != nil {
		return "", time.Time{}, err
	}
	now := time.Now()
	exp = now.Add(a.ttl).Truncate(time.Second)
	token, err = a.sign(roundMACCtx, Round{V: roundVersion, Installation: a.inst, Fingerprint: c.Fingerprint(), Tool: c.Tool, Caller: c.Caller.Creds(), Layer: layer,
		Definition: c.Definition, IssuedAt: now.Unix(), ExpiresAt: exp.Unix(), Nonce: n})
	return token, exp, err
}

// RedeemRound checks a round's requestState echoed with the retried call:
// MAC, version, expiry, the binding to this call (tool, value, the same
// person), then spends its nonce, then compares the definition (ErrVoid:
// spent, never executed). nil: the caller's confirmation may turn this
// ask into allow.
func (a *Authority) RedeemRound(token string, c Call) (Round, error) {
	var r Round
	if err := a.open(roundMACCtx, token, &r); err != nil {
		return r, err
	}
	if r.V != roundVersion || r.Nonce == "" {
		return r, fmt.Errorf("%w: unsupported version %d", ErrTampered, r.V)
	}
	if r.Installation != a.inst {
		return r, ErrElsewhere
	}
	if err := times(r.IssuedAt, r.ExpiresAt); err != nil {
		return r, err
	}
	if r.Fingerprint != c.Fingerprint() || r.Tool != c.Tool || !a.SamePerson(Party{Credentials: r.Caller}, c.Caller) {
		return r, ErrMismatch
	}
	if err := a.spend("round:"+r.Nonce, r.ExpiresAt); err != nil {
		return r, err
	}
	if r.Definition != c.Definition {
		return r, ErrVoid
	}
	return r, nil
}
