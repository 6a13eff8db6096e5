package gate

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

var testKey = bytes.Repeat([]byte{7}, 32)

func mustApprovals(t *testing.T, key []byte, ttl time.Duration) *Approvals {
	t.Helper()
	a, err := NewApprovals(key, ttl, NewMemoryNonces())
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestApprovalsAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := mustApprovals(t, testKey, 0)
		_, fp := Canonical("do_set_valve", map[string]any{"id": "v3", "open": true})
		tok, exp, err := a.Issue(fp, "do_set_valve", "agent-1", LayerL1)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Until(exp); got != 10*time.Minute {
			t.Fatalf("expires in %v", got)
		}
		time.Sleep(9 * time.Minute)
		c, err := a.VerifyClaims(tok, fp, "do_set_valve", "agent-1")
		if err != nil {
			t.Fatalf("verify: %v", err)
		}
		if c.Layer != LayerL1 || c.V != 1 || len(c.Nonce) != 22 {
			t.Fatalf("claims %+v", c)
		}
		// payload shape
		p, _, _ := strings.Cut(tok, ".")
		raw, _ := base64.RawURLEncoding.DecodeString(p)
		var m map[string]any
		json.Unmarshal(raw, &m)
		for _, k := range []string{"v", "fp", "tool", "caller", "layer", "iat", "exp", "nonce"} {
			if _, ok := m[k]; !ok {
				t.Errorf("payload lacks %s: %s", k, raw)
			}
		}
	})
}

func TestApprovalsErrors(t *testing.T) {
	a := mustApprovals(t, testKey, 0)
	fp := "sha256:" + strings.Repeat("ab", 32)
	issue := func() string {
		tok, _, err := a.Issue(fp, "do_x", "agent", LayerFailClosed)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	// tampered: flip a payload byte, a MAC byte, other key, garbage
	tok := issue()
	p, m, _ := strings.Cut(tok, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(p)
	forged := bytes.Replace(raw, []byte(`"do_x"`), []byte(`"do_y"`), 1)
	other := mustApprovals(t, bytes.Repeat([]byte{8}, 32), 0)
	otherTok, _, _ := other.Issue(fp, "do_x", "agent", LayerL1)
	macBytes, _ := base64.RawURLEncoding.DecodeString(m)
	macBytes[0] ^= 1
	for name, bad := range map[string]string{
		"payload edited": base64.RawURLEncoding.EncodeToString(forged) + "." + m,
		"mac edited":     p + "." + base64.RawURLEncoding.EncodeToString(macBytes),
		"other key":      otherTok,
		"empty":          "",
		"no dot":         p,
		"three parts":    tok + ".x",
		"garbage":        "!!!.???",
		"huge":           strings.Repeat("a", 5000) + "." + m,
	} {
		if err := a.Verify(bad, fp, "do_x", "agent"); !errors.Is(err, ErrApprovalTampered) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// mismatch: other fingerprint, tool, caller
	for name, args := range map[string][3]string{
		"fingerprint": {"sha256:" + strings.Repeat("cd", 32), "do_x", "agent"},
		"tool":        {fp, "do_y", "agent"},
		"caller":      {fp, "do_x", "someone-else"},
	} {
		if err := a.Verify(issue(), args[0], args[1], args[2]); !errors.Is(err, ErrApprovalMismatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// replay
	tok = issue()
	if err := a.Verify(tok, fp, "do_x", "agent"); err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(tok, fp, "do_x", "agent"); !errors.Is(err, ErrApprovalReplayed) {
		t.Fatalf("replay: %v", err)
	}
	// a mismatched attempt does not burn the nonce
	tok = issue()
	if err := a.Verify(tok, fp, "do_x", "mallory"); !errors.Is(err, ErrApprovalMismatch) {
		t.Fatal(err)
	}
	if err := a.Verify(tok, fp, "do_x", "agent"); err != nil {
		t.Fatalf("after mismatch: %v", err)
	}
	// distinct sentinels
	all := []error{ErrApprovalTampered, ErrApprovalExpired, ErrApprovalMismatch, ErrApprovalReplayed}
	for i := range all {
		for j := range all {
			if i != j && errors.Is(all[i], all[j]) {
				t.Fatal("sentinels overlap")
			}
		}
	}
}

func TestApprovalsExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := mustApprovals(t, testKey, 0)
		tok, exp, _ := a.Issue("sha256:x", "do_x", "c", LayerL1)
		time.Sleep(time.Until(exp))
		if err := a.Verify(tok, "sha256:x", "do_x", "c"); !errors.Is(err, ErrApprovalExpired) {
			t.Fatalf("at exp: %v", err)
		}
		short := mustApprovals(t, testKey, 5*time.Second)
		tok, _, _ = short.Issue("sha256:x", "do_x", "c", LayerL1)
		time.Sleep(4 * time.Second)
		if err := short.Verify(tok, "sha256:x", "do_x", "c"); err != nil {
			t.Fatalf("before exp: %v", err)
		}
		tok, _, _ = short.Issue("sha256:x", "do_x", "c", LayerL1)
		time.Sleep(6 * time.Second)
		if err := short.Verify(tok, "sha256:x", "do_x", "c"); !errors.Is(err, ErrApprovalExpired) {
			t.Fatalf("after exp: %v", err)
		}
	})
}

// TestApprovalsFutureIat: a token issued more than 30 s in the future (a
// clock jump back, or a second node with a skewed clock) is refused.
func TestApprovalsFutureIat(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := mustApprovals(t, testKey, time.Hour)
		// forge a correctly signed token with iat = now+60s
		now := time.Now()
		for _, skew := range []time.Duration{20 * time.Second, 60 * time.Second} {
			c := Claims{V: 1, Fingerprint: "fp", Tool: "do_x", Caller: "c", Layer: LayerL1,
				IssuedAt: now.Add(skew).Unix(), ExpiresAt: now.Add(time.Hour).Unix(), Nonce: "n" + skew.String()}
			payload, _ := json.Marshal(c)
			p := base64.RawURLEncoding.EncodeToString(payload)
			tok := p + "." + base64.RawURLEncoding.EncodeToString(a.mac(p))
			err := a.Verify(tok, "fp", "do_x", "c")
			if skew > ApprovalSkew && !errors.Is(err, ErrApprovalExpired) || skew <= ApprovalSkew && err != nil {
				t.Fatalf("skew %v: %v", skew, err)
			}
		}
		// version 2 is refused even with a valid MAC
		c := Claims{V: 2, Fingerprint: "fp", Tool: "do_x", Caller: "c", IssuedAt: now.Unix(), ExpiresAt: now.Add(time.Hour).Unix(), Nonce: "v2"}
		payload, _ := json.Marshal(c)
		p := base64.RawURLEncoding.EncodeToString(payload)
		if err := a.Verify(p+"."+base64.RawURLEncoding.EncodeToString(a.mac(p)), "fp", "do_x", "c"); !errors.Is(err, ErrApprovalTampered) {
			t.Fatalf("version: %v", err)
		}
	})
}

func TestNewApprovalsValidation(t *testing.T) {
	if _, err := NewApprovals(make([]byte, 16), 0, NewMemoryNonces()); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := NewApprovals(nil, -time.Second, NewMemoryNonces()); err == nil {
		t.Fatal("negative ttl accepted")
	}
	if _, err := NewApprovals(nil, 0, nil); err == nil {
		t.Fatal("nil nonce store accepted")
	}
	a, err := NewApprovals(nil, 0, NewMemoryNonces())
	if err != nil || a.TTL() != 10*time.Minute {
		t.Fatal(err)
	}
	b, _ := NewApprovals(nil, 0, NewMemoryNonces())
	tok, _, _ := a.Issue("fp", "do_x", "c", LayerL1)
	if err := b.Verify(tok, "fp", "do_x", "c"); !errors.Is(err, ErrApprovalTampered) {
		t.Fatal("random per-process keys collide")
	}
}

type failingNonces struct{}

func (failingNonces) Consume(string, time.Time) (bool, error) { return false, errors.New("disk full") }

func TestApprovalsNonceStoreError(t *testing.T) {
	a, _ := NewApprovals(testKey, 0, failingNonces{})
	tok, _, _ := a.Issue("fp", "do_x", "c", LayerL1)
	if err := a.Verify(tok, "fp", "do_x", "c"); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("store error must refuse: %v", err)
	}
}

func TestApprovalsConcurrentReplay(t *testing.T) {
	a := mustApprovals(t, testKey, 0)
	tok, _, _ := a.Issue("fp", "do_x", "c", LayerL1)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for range 32 {
		wg.Go(func() {
			if a.Verify(tok, "fp", "do_x", "c") == nil {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if ok != 1 {
		t.Fatalf("%d verifications succeeded, want exactly 1", ok)
	}
}

func TestMemoryNoncesPurge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewMemoryNonces().(*memoryNonces)
		for i := range 200 {
			n.Consume(string(rune('a'+i%26))+time.Duration(i).String(), time.Now().Add(time.Minute))
		}
		time.Sleep(2 * time.Minute)
		for i := range 64 {
			n.Consume("later"+time.Duration(i).String(), time.Now().Add(time.Minute))
		}
		if len(n.seen) > 64 {
			t.Fatalf("expired nonces kept: %d", len(n.seen))
		}
	})
}
