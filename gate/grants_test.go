package gate

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestGrants(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := mustApprovals(t, testKey, 0)
		_, fp := Canonical("do_heat", map[string]any{"value": 30.0})
		g := Grant{ID: "p1", Fingerprint: fp, Tool: "do_heat", Key: "k1", Caller: "token:a", Approver: "token:b", ApproverRole: "supervisor"}
		tok, _, err := a.IssueGrant(g)
		if err != nil {
			t.Fatal(err)
		}
		// Any other call, caller or key: mismatch (and the grant stays unused).
		_, other := Canonical("do_heat", map[string]any{"value": 31.0})
		for _, c := range [][4]string{{other, "do_heat", "k1", "token:a"}, {fp, "do_cool", "k1", "token:a"}, {fp, "do_heat", "k2", "token:a"}, {fp, "do_heat", "k1", "token:b"}} {
			if _, err := a.VerifyGrant(tok, c[0], c[1], c[2], c[3]); !errors.Is(err, ErrApprovalMismatch) {
				t.Errorf("%v: %v", c, err)
			}
		}
		// Tampered: a flipped MAC byte, a re-signed payload naming another approver, an elicitation state.
		b := []byte(tok)
		b[len(b)-3] ^= 1
		payload, _ := json.Marshal(Grant{V: 1, ID: "p1", Fingerprint: fp, Tool: "do_heat", Key: "k1", Caller: "token:a", Approver: "token:c", IssuedAt: time.Now().Unix(), ExpiresAt: time.Now().Add(time.Minute).Unix(), Nonce: "n"})
		_, mac, _ := strings.Cut(strings.TrimPrefix(tok, GrantPrefix), ".")
		swapped := GrantPrefix + base64.RawURLEncoding.EncodeToString(payload) + "." + mac
		state, _, _ := a.Issue(fp, "do_heat", "token:a", LayerL0)
		for _, bad := range []string{string(b), swapped, state, GrantPrefix + state, ""} {
			if _, err := a.VerifyGrant(bad, fp, "do_heat", "k1", "token:a"); !errors.Is(err, ErrApprovalTampered) {
				t.Errorf("tampered %q: %v", bad, err)
			}
		}
		// Once, then replayed.
		got, err := a.VerifyGrant(tok, fp, "do_heat", "k1", "token:a")
		if err != nil || got.Approver != "token:b" || got.ApproverRole != "supervisor" {
			t.Fatalf("verify: %+v %v", got, err)
		}
		if _, err := a.VerifyGrant(tok, fp, "do_heat", "k1", "token:a"); !errors.Is(err, ErrApprovalReplayed) {
			t.Errorf("replay: %v", err)
		}
		// Expired.
		tok, _, _ = a.IssueGrant(g)
		time.Sleep(10 * time.Minute)
		if _, err := a.VerifyGrant(tok, fp, "do_heat", "k1", "token:a"); !errors.Is(err, ErrApprovalExpired) {
			t.Errorf("expired: %v", err)
		}
		// The caller as its own approver.
		self := g
		self.Approver = "token:a"
		tok, _, _ = a.IssueGrant(self)
		if _, err := a.VerifyGrant(tok, fp, "do_heat", "k1", "token:a"); !errors.Is(err, ErrGrantSelf) {
			t.Errorf("self: %v", err)
		}
	})
}
