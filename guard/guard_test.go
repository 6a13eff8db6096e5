package guard_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

const man = `physmcp_version: "0.1"
device: {id: dev, type: t, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses: {plant: {type: sim}}
capabilities:
  - {name: vent, kind: do, description: vent opening, binding: {type: sim, bus: plant, point: zone_c.vent}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [vent]}
`

const pol = `physmcp_policy_version: "0.1"
time_windows:
  closed: {days: [mon, tue, wed, thu, fri, sat, sun], start: "00:00", end: "24:00", timezone: UTC}
emergency: {override_permission: admin, override_token_ttl_seconds: 300}
capabilities:
  do_vent:
    rules:
      - {type: permission, require: [operator]}
      - {type: time_window, deny_during: [closed]}
      - {type: range_guard, min: 0, max: 80, on_violation: deny}
gate:
  l0:
    deny: [{name: vent_wide, tool: do_vent, range: {arg: value, min: 70, max: 100}}]
    allow: [{name: vent, tool: do_vent, range: {arg: value, min: 0, max: 100}}]
`

func build(t testing.TB, policyText string) (*node.Node, *guard.Guard) {
	n, g, _ := buildIn(t, t.TempDir(), policyText)
	return n, g
}

// buildIn opens a node on dir; the returned func closes it (also run at
// cleanup, once).
func buildIn(t testing.TB, dir, policyText string) (*node.Node, *guard.Guard, func()) {
	t.Helper()
	m, err := manifest.Parse("m.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	var g *guard.Guard
	var ng node.Guard
	if policyText != "" {
		p, err := policy.Parse("p.yml", []byte(policyText), m)
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := gate.DecodeConfig(p.Gate)
		if err != nil {
			t.Fatal(err)
		}
		gt, err := gate.New(cfg, "test")
		if err != nil {
			t.Fatal(err)
		}
		g = guard.New(guard.Config{Policy: p, Gate: gt, State: st, DeviceID: "dev"})
		ng = g
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: ng})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeAll := func() { once.Do(func() { n.Close(context.Background()); al.Close(); st.Close() }) }
	t.Cleanup(closeAll)
	return n, g, closeAll
}

func vent(t testing.TB, n *node.Node, v int, key, role string) promcp.DoResult {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := n.Do(context.Background(), node.DoRequest{Tool: "do_vent", Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "x", Role: role}})
	if err != nil {
		t.Fatal(err)
	}
	var r promcp.DoResult
	json.Unmarshal(body, &r)
	return r
}

// TestEmergencyOverride: an admin lifts the time window for a bounded time;
// the override never lifts the role check, the range guard or a gate deny.
func TestEmergencyOverride(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, g := build(t, pol)
		if r := vent(t, n, 40, "k1", "operator"); r.Permission != promcp.PermPolicyDenied {
			t.Fatalf("closed window: %+v", r)
		}
		if _, err := g.StartOverride("ops", "operator", "storm", time.Minute); err == nil {
			t.Error("an operator started an override")
		}
		if _, err := g.StartOverride("boss", "admin", "", time.Minute); err == nil {
			t.Error("an override without a reason")
		}
		// The TTL is explicit: none, or more than the policy allows, is an
		// error that names the bound (not a silent maximum).
		for _, ttl := range []time.Duration{0, -time.Second, time.Hour} {
			if _, err := g.StartOverride("boss", "admin", "storm", ttl); err == nil || !strings.Contains(err.Error(), "1 to 300 seconds") {
				t.Errorf("ttl %s: %v", ttl, err)
			}
		}
		o, err := g.StartOverride("boss", "admin", "storm: vent the greenhouse", 5*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Until(o.Until); d != 5*time.Minute {
			t.Errorf("override lasts %s, want 5m", d)
		}
		r := vent(t, n, 40, "k2", "operator")
		if r.Status != promcp.StatusSuccess || !strings.Contains(r.Reason, "emergency override by boss") {
			t.Errorf("under override: %+v", r)
		}
		if r := vent(t, n, 40, "k3", "none"); r.Permission != promcp.PermPermissionInsufficient {
			t.Errorf("override lifted the role check: %+v", r)
		}
		if r := vent(t, n, 85, "k4", "operator"); r.Permission != promcp.PermOutOfRange {
			t.Errorf("override lifted the range guard: %+v", r)
		}
		if r := vent(t, n, 75, "k5", "operator"); r.Permission != promcp.PermPolicyDenied || r.Gate == nil || r.Gate.Decision != "deny" {
			t.Errorf("override lifted a gate deny: %+v", r)
		}
		time.Sleep(5*time.Minute + time.Second)
		if r := vent(t, n, 40, "k6", "operator"); r.Permission != promcp.PermPolicyDenied {
			t.Errorf("after the override expired: %+v", r)
		}
	})
}

const benchPolicy = `physmcp_policy_version: "0.1"
time_windows:
  never: {days: [sun], start: "03:00", end: "03:01", timezone: Pacific/Kiritimati}
capabilities:
  do_vent:
    rules:
      - {type: permission, require: [operator]}
      - {type: time_window, deny_during: [never]}
      - {type: range_guard, min: 0, max: 80, on_violation: clamp}
gate:
  l0:
    deny: [{name: vent_wide, tool: do_vent, range: {arg: value, min: 90, max: 100}}]
    allow: [{name: vent, tool: do_vent, range: {arg: value, min: 0, max: 89}}]
`

// BenchmarkDoWithPolicyAndGate and BenchmarkDoWithoutPolicy measure the
// whole do_ path (read, write, read-back, two ledger fsyncs and an audit
// fsync) with and without the policy and the L0 gate; their difference is
// the safety layer's cost.
func BenchmarkDoWithPolicyAndGate(b *testing.B) { benchDo(b, benchPolicy) }
func BenchmarkDoWithoutPolicy(b *testing.B)     { benchDo(b, "") }

func benchDo(b *testing.B, p string) {
	n, _ := build(b, p)
	i := 0
	for b.Loop() {
		i++
		if r := vent(b, n, i%80, "bench-"+itoa(i), "operator"); r.Status != promcp.StatusSuccess {
			b.Fatalf("%+v", r)
		}
	}
}

func itoa(i int) string {
	b, _ := json.Marshal(i)
	return string(b)
}

// TestRateSurvivesRestart: the rate history is committed with each
// actuation, so a restarted daemon still refuses the call over the limit.
func TestRateSurvivesRestart(t *testing.T) {
	const p = `physmcp_policy_version: "0.1"
capabilities:
  do_vent: {rules: [{type: rate, max: "2/hour"}, {type: permission, require: [operator]}]}
gate: {l0: {allow: [{name: vent, tool: do_vent}]}}
`
	dir := t.TempDir()
	n, _, stop := buildIn(t, dir, p)
	vent(t, n, 10, "a", "operator")
	vent(t, n, 20, "b", "operator")
	stop()
	n2, _, _ := buildIn(t, dir, p)
	if r := vent(t, n2, 30, "c", "operator"); r.Permission != promcp.PermRateLimited {
		t.Errorf("after restart: %+v", r)
	}
}

// BenchmarkGuardEvaluate is the safety layer's own CPU cost per do_: the
// policy rules and the L0 gate (its persistence rides on the ledger's
// fsync, so this is the whole overhead).
func BenchmarkGuardEvaluate(b *testing.B) {
	m, _ := manifest.Parse("m.yml", []byte(man))
	p, err := policy.Parse("p.yml", []byte(benchPolicy), m)
	if err != nil {
		b.Fatal(err)
	}
	cfg, _ := gate.DecodeConfig(p.Gate)
	gt, _ := gate.New(cfg, "bench")
	g := guard.New(guard.Config{Policy: p, Gate: gt, DeviceID: "dev"})
	a := node.Action{Capability: m.Capabilities[0], Tool: "do_vent", Value: int64(40), Caller: node.Caller{ID: "x", Role: "operator"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		a.Now = time.Now()
		if v := g.Evaluate(ctx, a, false); v.Permission != promcp.PermAllowed {
			b.Fatal(v)
		}
	}
}

// TestTwoPersonRuleInTheGuard: whoever the MCP layer says approved, the
// guard lets a two-person call through only with another identity that
// holds the approver role (defence in depth behind the approvals route).
func TestTwoPersonRuleInTheGuard(t *testing.T) {
	_, g := build(t, `physmcp_policy_version: "0.1"
capabilities:
  do_vent:
    rules:
      - {type: approval, when: always, approver_role: supervisor, self_approval: false}
identity:
  tokens:
    - {id: a, sha256: 1111111111111111111111111111111111111111111111111111111111111111, role: supervisor}
    - {id: b, sha256: 2222222222222222222222222222222222222222222222222222222222222222, role: supervisor}
    - {id: root, sha256: 3333333333333333333333333333333333333333333333333333333333333333, role: admin}
    - {id: op, sha256: 4444444444444444444444444444444444444444444444444444444444444444, role: operator}
gate:
  l0:
    allow: [{name: vent, tool: do_vent}]
`)
	caller := node.Caller{ID: "token:a", Role: "supervisor"}
	for _, c := range []struct {
		name string
		by   node.Caller
		want promcp.Permission
	}{
		{"unapproved", node.Caller{}, promcp.PermRequiresHumanApproval},
		{"the caller itself", caller, promcp.PermRequiresHumanApproval},
		{"an operator", node.Caller{ID: "token:op", Role: "operator"}, promcp.PermRequiresHumanApproval},
		{"another supervisor", node.Caller{ID: "token:b", Role: "supervisor"}, promcp.PermAllowed},
		{"an admin", node.Caller{ID: "token:root", Role: "admin"}, promcp.PermAllowed},
		// One person with two credentials is still the caller.
		{"the caller with another credential too", node.Caller{ID: "token:b via cert:x", Role: "supervisor", Credentials: []string{"token:b", "token:a"}}, promcp.PermRequiresHumanApproval},
		// The grant's recorded role is not what counts: the policy in force is.
		{"a token the policy no longer has", node.Caller{ID: "token:gone", Role: "admin"}, promcp.PermRequiresHumanApproval},
		{"an operator the grant called admin", node.Caller{ID: "token:op", Role: "admin"}, promcp.PermRequiresHumanApproval},
	} {
		v := g.Evaluate(context.Background(), node.Action{Tool: "do_vent", Value: int64(10), Caller: caller, Now: time.Now(),
			Approved: c.by.ID != "", ApprovedBy: c.by, CapabilitySum: "cap", ApprovedFor: approval.Digest("dev", "cap", g.RulesDigest("do_vent"))}, true)
		if v.Permission != c.want {
			t.Errorf("%s: %s (%s)", c.name, v.Permission, v.Reason)
		}
		if c.want != promcp.PermAllowed && (v.Approver == nil || v.Approver.Role != "supervisor" || v.Approver.CallerMay) {
			t.Errorf("%s: approver rule %+v", c.name, v.Approver)
		}
	}
	// Another person's approval, given for other rules (a policy reload
	// between its redemption and this decision), approves nothing.
	v := g.Evaluate(context.Background(), node.Action{Tool: "do_vent", Value: int64(10), Caller: caller, Now: time.Now(),
		Approved: true, ApprovedBy: node.Caller{ID: "token:b", Role: "supervisor"}, CapabilitySum: "cap", ApprovedFor: approval.Digest("dev", "cap", "other rules")}, true)
	if v.Permission != promcp.PermRequiresHumanApproval {
		t.Errorf("an approval for other rules: %s", v.Permission)
	}
}
