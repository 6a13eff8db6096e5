package approval_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/approval"
)

var testKey = bytes.Repeat([]byte{7}, 32)

func authority(t *testing.T, same approval.SameFunc) *approval.Authority {
	t.Helper()
	a, err := approval.New(approval.Config{Key: testKey, Nonces: approval.NewMemoryNonces(), Same: same, Installation: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

var (
	alice = approval.Party{ID: "token:alice", Role: "operator", Credentials: []string{"token:alice"}}
	// aliceBoth is alice calling with her token and her certificate.
	aliceBoth = approval.Party{ID: "token:alice via cert:alice", Role: "operator", Credentials: []string{"token:alice", "cert:alice", "certfp:aa"}}
	aliceCert = approval.Party{ID: "cert:alice", Role: "supervisor", Credentials: []string{"cert:alice", "certfp:aa"}}
	bob       = approval.Party{ID: "token:bob", Role: "supervisor", Credentials: []string{"token:bob"}}
	carol     = approval.Party{ID: "token:carol", Role: "admin", Credentials: []string{"token:carol"}}
)

func call(caller approval.Party, value float64, def string) approval.Call {
	return approval.Call{Tool: "do_heat", Value: value, Key: "k1", Caller: caller, Definition: def}
}

func ask(c approval.Call) approval.Ask {
	return approval.Ask{Call: c, Source: "gw", ApproverRole: "supervisor", Reason: "always"}
}

// grantFor registers c and has approver approve it.
func grantFor(t *testing.T, a *approval.Authority, c approval.Call, approver approval.Party) (string, approval.Decision) {
	t.Helper()
	p, err := a.Register(ask(c))
	if err != nil {
		t.Fatal(err)
	}
	d, err := a.Decide(p.ID, approver, true, "ok", func(string) string { return c.Definition })
	if err != nil {
		t.Fatal(err)
	}
	return d.Grant, d
}

func TestGrantBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := authority(t, nil)
		c := call(alice, 30, "def1")
		tok, d := grantFor(t, a, c, bob)
		if d.State != approval.StateApproved || !approval.IsGrant(tok) {
			t.Fatalf("decision %+v", d)
		}
		// Another call, key, tool or person: mismatch, and the grant stays unused.
		for name, other := range map[string]approval.Call{
			"value":  call(alice, 31, "def1"),
			"key":    {Tool: "do_heat", Value: 30.0, Key: "k2", Caller: alice, Definition: "def1"},
			"tool":   {Tool: "do_cool", Value: 30.0, Key: "k1", Caller: alice, Definition: "def1"},
			"person": call(carol, 30, "def1"),
		} {
			if _, err := a.Redeem(tok, other); !errors.Is(err, approval.ErrMismatch) {
				t.Errorf("%s: %v", name, err)
			}
		}
		// The same person with another of her credentials may use it.
		g, err := a.Redeem(tok, call(aliceBoth, 30, "def1"))
		if err != nil || g.Approver.ID != "token:bob" || g.Approver.Role != "supervisor" || g.Definition != "def1" {
			t.Fatalf("redeem: %+v %v", g, err)
		}
		if _, err := a.Redeem(tok, c); !errors.Is(err, approval.ErrReplayed) {
			t.Errorf("replay: %v", err)
		}
		if _, ok := a.Get(d.ID); ok {
			t.Error("a redeemed request stays in the book")
		}
		// Expired.
		tok, _ = grantFor(t, a, call(alice, 30, "def1"), bob)
		time.Sleep(approval.DefaultTTL)
		if _, err := a.Redeem(tok, c); !errors.Is(err, approval.ErrExpired) {
			t.Errorf("expired: %v", err)
		}
	})
}

// TestGrantVoidOnAnotherDefinition: a grant redeemed against another
// definition is void and spent: the same grant never works afterwards,
// not even for the definition it was given for.
func TestGrantVoidOnAnotherDefinition(t *testing.T) {
	a := authority(t, nil)
	tok, _ := grantFor(t, a, call(alice, 30, "def1"), bob)
	if _, err := a.Redeem(tok, call(alice, 30, "def2")); !errors.Is(err, approval.ErrVoid) {
		t.Fatalf("another definition: %v", err)
	}
	if _, err := a.Redeem(tok, call(alice, 30, "def1")); !errors.Is(err, approval.ErrReplayed) {
		t.Fatalf("a void grant used again: %v", err)
	}
}

func TestGrantTampered(t *testing.T) {
	a := authority(t, nil)
	tok, _ := grantFor(t, a, call(alice, 30, "def1"), bob)
	c := call(alice, 30, "def1")
	body := strings.TrimPrefix(tok, approval.GrantPrefix)
	p, m, _ := strings.Cut(body, ".")
	raw, _ := base64.RawURLEncoding.DecodeString(p)
	// Re-encoded payloads naming another approver or definition keep the old MAC.
	var g map[string]any
	json.Unmarshal(raw, &g)
	g["def"] = "def2"
	edited, _ := json.Marshal(g)
	other, err := approval.New(approval.Config{Key: bytes.Repeat([]byte{8}, 32), Nonces: approval.NewMemoryNonces(), Installation: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	otherTok, _ := grantFor(t, other, c, bob)
	round, _, _ := a.IssueRound(c, "policy")
	macBytes, _ := base64.RawURLEncoding.DecodeString(m)
	macBytes[3] ^= 1
	for name, bad := range map[string]string{
		"payload edited":   approval.GrantPrefix + base64.RawURLEncoding.EncodeToString(edited) + "." + m,
		"mac edited":       approval.GrantPrefix + p + "." + base64.RawURLEncoding.EncodeToString(macBytes),
		"other key":        otherTok,
		"a round's state":  round,
		"prefixed round":   approval.GrantPrefix + round,
		"empty":            "",
		"prefix only":      approval.GrantPrefix,
		"three parts":      tok + ".x",
		"trailing garbage": approval.GrantPrefix + base64.RawURLEncoding.EncodeToString(append(raw, []byte(` {}`)...)) + "." + m,
		"huge":             approval.GrantPrefix + strings.Repeat("a", 10000) + "." + m,
	} {
		if _, err := a.Redeem(bad, c); !errors.Is(err, approval.ErrTampered) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := a.Redeem(tok, c); err != nil {
		t.Errorf("the genuine grant after the tampered ones: %v", err)
	}
}

// TestSelfApprovalRefused: whatever credentials either side presented, a
// person never approves their own request; the people rule joins
// credentials that share nothing.
func TestSelfApprovalRefused(t *testing.T) {
	people := func(a, b []string) bool { // alice's token and her second token are one person
		in := func(s []string) bool {
			for _, c := range s {
				if c == "token:alice" || c == "token:alice-sup" {
					return true
				}
			}
			return false
		}
		return in(a) && in(b)
	}
	a := authority(t, people)
	aliceSup := approval.Party{ID: "token:alice-sup", Role: "supervisor", Credentials: []string{"token:alice-sup"}}
	for i, c := range []struct{ requester, approver approval.Party }{
		{aliceBoth, approval.Party{ID: "token:alice", Role: "supervisor", Credentials: []string{"token:alice"}}},
		{alice, approval.Party{ID: "token:alice via cert:alice", Role: "supervisor", Credentials: aliceBoth.Credentials}},
		{approval.Party{ID: "cert:alice", Role: "operator", Credentials: aliceCert.Credentials}, aliceCert},
		{alice, aliceSup},
	} {
		cl := approval.Call{Tool: "do_heat", Value: 30.0, Key: "self-" + string(rune('a'+i)), Caller: c.requester, Definition: "d"}
		p, err := a.Register(ask(cl))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Decide(p.ID, c.approver, true, "", nil); !errors.Is(err, approval.ErrSelf) {
			t.Errorf("%s approving %s: %v", c.approver.ID, c.requester.ID, err)
		}
		if r, _ := a.Get(p.ID); r.State != approval.StatePending {
			t.Errorf("after a refused self-approval the request is %s", r.State)
		}
		if _, err := a.Decide(p.ID, bob, true, "", nil); err != nil {
			t.Errorf("another person: %v", err)
		}
	}
}

// TestGrantSelfAtRedeem: a grant whose approver turned out to be the
// caller (the people list joined them after the approval) is refused when
// it is redeemed.
func TestGrantSelfAtRedeem(t *testing.T) {
	var joined atomic.Bool
	a := authority(t, func(x, y []string) bool { return joined.Load() })
	tok, _ := grantFor(t, a, call(alice, 30, "def1"), bob)
	joined.Store(true)
	if _, err := a.Redeem(tok, call(alice, 30, "def1")); !errors.Is(err, approval.ErrSelf) {
		t.Fatalf("redeem after the people list joined approver and caller: %v", err)
	}
}

func TestDecide(t *testing.T) {
	a := authority(t, nil)
	c := call(alice, 30, "def1")
	p, err := a.Register(ask(c))
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := a.Register(ask(c)); again.ID != p.ID {
		t.Error("the same call registered twice")
	}
	if _, err := a.Register(ask(call(alice, 40, "def1"))); err == nil {
		t.Error("the same key for another value was registered")
	}
	op := approval.Party{ID: "token:op", Role: "operator", Credentials: []string{"token:op"}}
	if _, err := a.Decide(p.ID, op, true, "", nil); !errors.Is(err, approval.ErrRole) {
		t.Errorf("an operator approving: %v", err)
	}
	if _, err := a.Decide("nope", bob, true, "", nil); !errors.Is(err, approval.ErrUnknown) {
		t.Errorf("unknown id: %v", err)
	}
	// The definition changed since the request: void, never approved.
	if _, err := a.Decide(p.ID, bob, true, "", func(string) string { return "def2" }); !errors.Is(err, approval.ErrVoid) {
		t.Errorf("a redefined capability approved: %v", err)
	}
	if _, err := a.Decide(p.ID, carol, true, "", nil); !errors.Is(err, approval.ErrDecided) {
		t.Errorf("a void request decided again: %v", err)
	}
	d, ok := a.Take(c)
	if !ok || d.State != approval.StateVoid || d.Grant != "" {
		t.Errorf("take: %+v %v", d, ok)
	}
	// Denied: the caller's repeat takes the denial once.
	p, _ = a.Register(ask(c))
	if _, err := a.Decide(p.ID, bob, false, "not now", nil); err != nil {
		t.Fatal(err)
	}
	if d, ok := a.Take(approval.Call{Tool: "do_heat", Value: 30.0, Key: "k1", Caller: carol}); ok {
		t.Errorf("another person took alice's decision: %+v", d)
	}
	if d, ok := a.Take(c); !ok || d.State != approval.StateDenied || d.Why != "not now" {
		t.Errorf("take denied: %+v %v", d, ok)
	}
	if _, ok := a.Take(c); ok {
		t.Error("a decision taken twice")
	}
}

func TestVoidChanged(t *testing.T) {
	a := authority(t, nil)
	pending, _ := a.Register(ask(call(alice, 30, "def1")))
	_, approved := grantFor(t, a, approval.Call{Tool: "do_heat", Value: 30.0, Key: "k2", Caller: alice, Definition: "def1"}, bob)
	kept, _ := a.Register(ask(approval.Call{Tool: "do_fan", Value: 30.0, Key: "k3", Caller: alice, Definition: "fan1"}))
	v := a.VoidChanged(func(tool string) string { return map[string]string{"do_heat": "def2", "do_fan": "fan1"}[tool] })
	if len(v) != 2 {
		t.Fatalf("voided %d", len(v))
	}
	for _, id := range []string{pending.ID, approved.ID} {
		if r, _ := a.Get(id); r.State != approval.StateVoid {
			t.Errorf("%s: %s", id, r.State)
		}
	}
	if r, _ := a.Get(kept.ID); r.State != approval.StatePending {
		t.Errorf("an unrelated request: %s", r.State)
	}
}

func TestRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := authority(t, nil)
		c := call(alice, 30, "def1")
		tok, exp, err := a.IssueRound(c, "L1")
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Until(exp); got != approval.DefaultTTL {
			t.Fatalf("expires in %v", got)
		}
		if _, err := a.RedeemRound(tok, call(carol, 30, "def1")); !errors.Is(err, approval.ErrMismatch) {
			t.Errorf("another person: %v", err)
		}
		if _, err := a.RedeemRound(tok, call(alice, 31, "def1")); !errors.Is(err, approval.ErrMismatch) {
			t.Errorf("another value: %v", err)
		}
		r, err := a.RedeemRound(tok, call(aliceBoth, 30, "def1"))
		if err != nil || r.Layer != "L1" {
			t.Fatalf("redeem: %+v %v", r, err)
		}
		if _, err := a.RedeemRound(tok, c); !errors.Is(err, approval.ErrReplayed) {
			t.Errorf("replay: %v", err)
		}
		tok, _, _ = a.IssueRound(c, "policy")
		if _, err := a.RedeemRound(tok, call(alice, 30, "def2")); !errors.Is(err, approval.ErrVoid) {
			t.Errorf("another definition: %v", err)
		}
		if _, err := a.RedeemRound(tok, c); !errors.Is(err, approval.ErrReplayed) {
			t.Errorf("a void round used again: %v", err)
		}
		tok, _, _ = a.IssueRound(c, "policy")
		time.Sleep(approval.DefaultTTL)
		if _, err := a.RedeemRound(tok, c); !errors.Is(err, approval.ErrExpired) {
			t.Errorf("expired: %v", err)
		}
		// A grant never verifies as a round.
		g, _ := grantFor(t, a, c, bob)
		if _, err := a.RedeemRound(strings.TrimPrefix(g, approval.GrantPrefix), c); !errors.Is(err, approval.ErrTampered) {
			t.Errorf("a grant as a round: %v", err)
		}
	})
}

// TestConcurrentRedeem: many callers racing with one grant: exactly one
// redeems it.
func TestConcurrentRedeem(t *testing.T) {
	a := authority(t, nil)
	c := call(alice, 30, "def1")
	tok, _ := grantFor(t, a, c, bob)
	var ok atomic.Int32
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if _, err := a.Redeem(tok, c); err == nil {
				ok.Add(1)
			} else if !errors.Is(err, approval.ErrReplayed) {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ok.Load() != 1 {
		t.Fatalf("%d redemptions of one grant", ok.Load())
	}
}

func TestNewValidation(t *testing.T) {
	for name, c := range map[string]approval.Config{
		"short key":       {Key: []byte("short"), Nonces: approval.NewMemoryNonces(), Installation: "i"},
		"no installation": {Key: testKey, Nonces: approval.NewMemoryNonces()},
		"no nonces":       {Key: testKey},
		"tiny ttl":        {Key: testKey, TTL: time.Millisecond, Nonces: approval.NewMemoryNonces()},
		"huge ttl":        {Key: testKey, TTL: 48 * time.Hour, Nonces: approval.NewMemoryNonces()},
	} {
		if _, err := approval.New(c); err == nil {
			t.Errorf("%s accepted", name)
		}
	}
}

type failingNonces struct{}

func (failingNonces) Consume(string, time.Time) (bool, error) { return false, errors.New("disk full") }

func TestNonceStoreErrorRefuses(t *testing.T) {
	a, err := approval.New(approval.Config{Key: testKey, Nonces: failingNonces{}, Installation: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := grantFor(t, a, call(alice, 30, "def1"), bob)
	if _, err := a.Redeem(tok, call(alice, 30, "def1")); err == nil {
		t.Fatal("a grant redeemed without recording its nonce")
	}
}

// TestAnotherInstallation: a gateway with the same key (and so the same
// MAC) never redeems another installation's grant or round.
func TestAnotherInstallation(t *testing.T) {
	a := authority(t, nil)
	b, err := approval.New(approval.Config{Key: testKey, Nonces: approval.NewMemoryNonces(), Installation: "gw-b"})
	if err != nil {
		t.Fatal(err)
	}
	c := call(alice, 30, "def1")
	tok, _ := grantFor(t, a, c, bob)
	if _, err := b.Redeem(tok, c); !errors.Is(err, approval.ErrElsewhere) {
		t.Errorf("grant at another installation: %v", err)
	}
	round, _, _ := a.IssueRound(c, "policy")
	if _, err := b.RedeemRound(round, c); !errors.Is(err, approval.ErrElsewhere) {
		t.Errorf("round at another installation: %v", err)
	}
	if _, err := a.Redeem(tok, c); err != nil {
		t.Errorf("at its own installation: %v", err)
	}
}
