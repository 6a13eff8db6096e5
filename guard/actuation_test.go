package guard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// buildWith opens a node whose guard asks quorum (nil: standalone).
func buildWith(t *testing.T, policyText string, quorum policy.QuorumFunc) (*node.Node, *sim.Plant) {
	t.Helper()
	dir := t.TempDir()
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
	g := guard.New(guard.Config{Policy: p, Gate: gt, State: st, DeviceID: "dev", Quorum: quorum})
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: g})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()); al.Close(); st.Close() })
	return n, n.Buses()["plant"].(*sim.Plant)
}

func ventWrites(p *sim.Plant) uint64 { return p.Stats().Points["zone_c.vent"].Writes }

// TestSlowDecisionsCannotLetConcurrentCallersPast: the rate slot is taken
// before the slow quorum step, so 20 callers that all wait 300 ms for
// their quorum get exactly the 2 actuations a 2/min limit allows; a call
// the quorum refuses gives its slot back.
func TestSlowDecisionsCannotLetConcurrentCallersPast(t *testing.T) {
	const p = `physmcp_policy_version: "0.1"
capabilities:
  do_vent: {rules: [{type: rate, max: "2/min"}, {type: quorum, min_peers: 2}]}
gate: {l0: {allow: [{name: vent, tool: do_vent}]}}
`
	synctest.Test(t, func(t *testing.T) {
		var alive atomic.Int64
		alive.Store(2)
		slowQuorum := func(ctx context.Context, need int) int {
			time.Sleep(300 * time.Millisecond)
			return int(alive.Load())
		}
		n, plant := buildWith(t, p, slowQuorum)
		var wg sync.WaitGroup
		var ok, limited atomic.Int64
		for i := range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				switch r := vent(t, n, 10+i, fmt.Sprint("c-", i), ""); {
				case r.Status == promcp.StatusSuccess:
					ok.Add(1)
				case r.Permission == promcp.PermRateLimited:
					limited.Add(1)
				default:
					t.Errorf("unexpected: %+v", r)
				}
			}()
		}
		wg.Wait()
		if ok.Load() != 2 || limited.Load() != 18 || ventWrites(plant) != 2 {
			t.Errorf("%d succeeded, %d rate_limited, %d writes; want 2, 18, 2", ok.Load(), limited.Load(), ventWrites(plant))
		}
		// A minute later the window is free; a quorum refusal gives the
		// slot back, so both following calls still get through.
		time.Sleep(time.Minute)
		alive.Store(1)
		if r := vent(t, n, 50, "no-quorum", ""); r.Permission != promcp.PermPartitionNoQuorum {
			t.Fatalf("without quorum: %+v", r)
		}
		alive.Store(2)
		for i := range 2 {
			if r := vent(t, n, 51+i, fmt.Sprint("after-", i), ""); r.Status != promcp.StatusSuccess {
				t.Errorf("call %d after a quorum refusal: %+v", i, r)
			}
		}
	})
}

// TestClampAppliesAfterTheGate: the gate judges the value as requested, so
// an L0 rule for a dangerous value sees the dangerous value (95 is refused,
// not silently run as 60); a value the gate allows is then clamped, and the
// answer keeps every guard's note in details.
func TestClampAppliesAfterTheGate(t *testing.T) {
	const p = `physmcp_policy_version: "0.1"
capabilities:
  do_vent: {rules: [{type: range_guard, min: 0, max: 60, on_violation: clamp}]}
gate:
  l0:
    deny: [{name: vent_dangerous, tool: do_vent, range: {arg: value, min: 90, max: 100}}]
    allow: [{name: vent, tool: do_vent, range: {arg: value, min: 0, max: 89}}]
`
	n, plant := buildWith(t, p, nil)
	r := vent(t, n, 95, "danger", "")
	if r.Status != promcp.StatusFailed || r.Permission != promcp.PermPolicyDenied || r.Gate == nil || r.Gate.Decision != "deny" || ventWrites(plant) != 0 {
		t.Errorf("95 against an L0 deny above 90: %+v", r)
	}
	r = vent(t, n, 70, "clamped", "")
	if r.Status != promcp.StatusSuccess || r.AppliedValue != 60.0 || !strings.Contains(r.Details, "clamped_to=60") || r.Policy.Decision != "clamped" {
		t.Errorf("70 clamped to 60: %+v", r)
	}
	const warn = `physmcp_policy_version: "0.1"
capabilities:
  do_vent: {rules: [{type: range_guard, min: 10, max: 60, on_violation: warn}]}
gate: {l0: {allow: [{name: vent, tool: do_vent}]}}
`
	n, _ = buildWith(t, warn, nil)
	if r := vent(t, n, 70, "warned", ""); r.Status != promcp.StatusSuccess || !strings.Contains(r.Details, "warn=outside_range") || r.Policy.Decision != "warned" {
		t.Errorf("warned: %+v", r)
	}
}

// TestApprovalRefusalSaysItOnce: a call that needs approval from a client
// that cannot be asked is refused with the reason once and a decision that
// matches the permission.
func TestApprovalRefusalSaysItOnce(t *testing.T) {
	const p = `physmcp_policy_version: "0.1"
capabilities:
  do_vent: {rules: [{type: approval, when: always}]}
gate: {l0: {allow: [{name: vent, tool: do_vent}]}}
`
	n, plant := buildWith(t, p, nil)
	raw, _ := json.Marshal(30)
	_, err := n.Do(context.Background(), node.DoRequest{Tool: "do_vent", Value: raw, IdempotencyKey: "ask"})
	var ar *node.ApprovalRequired
	if !errors.As(err, &ar) {
		t.Fatalf("want an approval round, got %v", err)
	}
	var r promcp.DoResult
	json.Unmarshal(ar.Body, &r)
	const why = "always needs a human's approval"
	if r.Permission != promcp.PermRequiresHumanApproval || r.Policy.Decision != "approval_required" || strings.Count(r.Reason, why) != 1 {
		t.Errorf("approval refusal: decision %q, reason %q", r.Policy.Decision, r.Reason)
	}
	if ventWrites(plant) != 0 {
		t.Error("an unapproved call wrote")
	}
}
