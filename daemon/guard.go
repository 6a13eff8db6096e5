package daemon

import (
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/oauth"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
)

// oauthKeys holds the OAuth authorization servers' metadata and keys for
// the life of the process: a reloaded policy keeps the keys the previous
// one fetched (an AS that is down at the reload locks nobody out).
var oauthKeys = oauth.NewPool(nil)

// LoadPolicy reads the policy and builds its gate; both are validated
// against the manifest, so `validate` and `run` refuse the same files.
func LoadPolicy(path string, m *manifest.Manifest, version string) (*policy.Policy, *gate.Gate, error) {
	pol, err := policy.Load(path, m)
	if err != nil {
		return nil, nil, err
	}
	// No fetch happens here: keys are fetched on the first token.
	oauthKeys.Attach(pol)
	var cfg gate.Config
	if pol.Gate != nil {
		// Its errors are positioned (path:line:col: gate.field: …).
		if cfg, err = gate.DecodeConfigFile(path, pol.Gate); err != nil {
			return nil, nil, err
		}
	} else if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	g, err := gate.New(cfg, version)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: gate: %w", path, err)
	}
	return pol, g, nil
}

// warnPolicy logs PolicyWarnings; the fleet endpoint's policy decides no
// do_ (the gateways' policies do), so its gate is not worth a warning.
func (d *Daemon) warnPolicy(pol *policy.Policy, g *gate.Gate) {
	if d.cfg.Fleet != nil {
		return
	}
	for _, w := range PolicyWarnings(pol, g) {
		d.log.Warn("policy", "warning", w)
	}
}

// PolicyWarnings are legal but probably unintended configurations.
func PolicyWarnings(pol *policy.Policy, g *gate.Gate) []string {
	var out []string
	cfg := g.Config()
	if len(cfg.L0.Allow) == 0 && !cfg.L1.Enabled {
		out = append(out, fmt.Sprintf("gate: no l0.allow rules and L1 is off: every do_ is grey and gets the fail_closed decision (%s)", cfg.FailClosed))
	}
	return out
}

// approvalKey is the HMAC key for approval round state: PHYSD_APPROVAL_KEY
// (hex, ≥ 32 bytes) so that pending approvals survive a restart, else a
// random per-process key (pending approvals then end with the process).
func approvalKey() ([]byte, error) {
	h := strings.TrimSpace(os.Getenv("PHYSD_APPROVAL_KEY"))
	if h == "" {
		return nil, nil
	}
	k, err := hex.DecodeString(h)
	if err != nil || len(k) < 32 {
		return nil, fmt.Errorf("PHYSD_APPROVAL_KEY must be at least 32 bytes of hex (64 hex characters)")
	}
	return k, nil
}

type nonceStore struct{ st *store.Store }

func (n nonceStore) Consume(nonce string, exp time.Time) (bool, error) {
	return n.st.ConsumeNonce(nonce, exp)
}

func newGuard(pol *policy.Policy, g *gate.Gate, st *store.Store, deviceID string, quorum policy.QuorumFunc) (*guard.Guard, *approval.Authority, error) {
	key, err := approvalKey()
	if err != nil {
		return nil, nil, err
	}
	inst, err := st.InstallationID()
	if err != nil {
		return nil, nil, fmt.Errorf("state database: installation id: %w", err)
	}
	gd := guard.New(guard.Config{Policy: pol, Gate: g, State: st, DeviceID: deviceID, Quorum: quorum})
	// People are compared under the policy in force (its identity.people).
	ap, err := approval.New(approval.Config{Key: key, TTL: approval.DefaultTTL, Nonces: nonceStore{st}, Same: gd.SamePerson, Installation: inst})
	if err != nil {
		return nil, nil, err
	}
	return gd, ap, nil
}
