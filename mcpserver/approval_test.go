package mcpserver_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
)

func example(name string) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "examples", "greenhouse", name)
}

type rig struct {
	cs          *mcp.ClientSession
	plant       *sim.Plant
	srv         *mcpserver.Server
	n           *node.Node
	listChanged chan struct{} // one value per tools/list_changed received
	progress    func(*mcp.ProgressNotificationParams)
}

// newRig serves the greenhouse with its policy to an in-memory MCP client
// on 2026-07-28 (a stdio-like connection whose caller has the operator
// role). elicit says whether the client declares elicitation.
func newRig(t *testing.T, elicit bool) *rig { return newRigAs(t, elicit, "operator") }

func newRigAs(t *testing.T, elicit bool, role string) *rig {
	t.Helper()
	return newRigPolicy(t, elicit, role, example("physmcp.policy.yml"))
}

// newRigPolicy is newRigAs with another policy file for the greenhouse.
func newRigPolicy(t *testing.T, elicit bool, role, policyPath string) *rig {
	t.Helper()
	return newRigFull(t, elicit, mcpserver.Options{StdioRole: role}, "2026-07-28", policyPath)
}

// newRigWith connects a client (2025-11-25 era, which receives
// tools/list_changed without a subscription) over stdio-like in-memory
// transports to the greenhouse with its policy and opts.
func newRigWith(t *testing.T, opts mcpserver.Options) *rig {
	t.Helper()
	return newRigFull(t, false, opts, "2025-11-25", example("physmcp.policy.yml"))
}

func newRigOpts(t *testing.T, elicit bool, opts mcpserver.Options) *rig {
	t.Helper()
	return newRigFull(t, elicit, opts, "2026-07-28", example("physmcp.policy.yml"))
}

func newRigFull(t *testing.T, elicit bool, opts mcpserver.Options, era, policyPath string) *rig {
	t.Helper()
	tr := testrig.Open(t, example("physmcp.manifest.yml"), testrig.ReadFile(t, policyPath), nil)
	n, gd, al := tr.Node, tr.Guard, tr.Audit
	opts.Guard, opts.Audit = gd, al
	srv := mcpserver.New(n, opts)
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	caps := &mcp.ClientCapabilities{}
	if elicit {
		caps.Elicitation = &mcp.ElicitationCapabilities{}
	}
	listChanged := make(chan struct{}, 16)
	r := &rig{listChanged: listChanged}
	c := mcp.NewClient(&mcp.Implementation{Name: "approver", Version: "1"}, &mcp.ClientOptions{
		Capabilities: caps, MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if r.progress != nil {
				r.progress(req.Params)
			}
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case listChanged <- struct{}{}:
			default:
			}
		}})
	cs, err := c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
	})
	r.cs, r.plant, r.srv, r.n = cs, tr.Plant, srv, n
	return r
}

func (r *rig) call(t *testing.T, p *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	res, err := r.cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return res
}

func (r *rig) writes() uint64 { return r.plant.Stats().Points["zone_a.heater"].Writes }

// allWrites counts writes to every point of the plant.
func (r *rig) allWrites() uint64 { return r.plant.Stats().Writes }

func out(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.NeedsInput() || res.IsError {
		t.Fatalf("want a complete result, got needsInput=%v isError=%v %v", res.NeedsInput(), res.IsError, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}

// heat70 needs approval: the policy asks a human above 60 %.
func heat70(key string) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: "do_heater_zone_a", Arguments: map[string]any{"value": 70, "idempotency_key": key}}
}

func answer(round *mcp.CallToolResult, p *mcp.CallToolParams, action string, confirm bool) *mcp.CallToolParams {
	retry := *p
	retry.RequestState = round.RequestState
	content := map[string]any{}
	if action == "accept" {
		content["confirm"] = confirm
	}
	retry.InputResponses = mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: action, Content: content}}
	return &retry
}

func TestApprovalRound(t *testing.T) {
	synctest.Test(t, approvalRound)
}

func approvalRound(t *testing.T) {
	r := newRig(t, true)
	p := heat70("approve-1")
	round := r.call(t, p)
	if !round.NeedsInput() || round.RequestState == "" {
		t.Fatalf("want an approval round, got %+v", round)
	}
	el, _ := round.InputRequests["approval"].(*mcp.ElicitParams)
	if el == nil {
		t.Fatalf("no elicitation in %v", round.InputRequests)
	}
	for _, want := range []string{"do_heater_zone_a", "gw_greenhouse_001", "Value: 70 percent", "zone_a_temperature_change", "above 60"} {
		if !strings.Contains(el.Message, want) {
			t.Errorf("elicitation message lacks %q:\n%s", want, el.Message)
		}
	}
	if r.writes() != 0 {
		t.Fatal("actuated before approval")
	}
	res := out(t, r.call(t, answer(round, p, "accept", true)))
	gateNote, _ := res["gate"].(map[string]any)
	if res["status"] != "success" || res["applied_value"] != 70.0 || gateNote["layer"] != "human_confirm" {
		t.Errorf("approved call: %v", res)
	}
	if r.writes() != 1 {
		t.Errorf("%d writes after one approval", r.writes())
	}
	// Replaying the same approval for another operation never executes
	// (after the heater's 15 s cooldown, so only the approval decides).
	time.Sleep(20 * time.Second)
	p2 := heat70("approve-2")
	again := r.call(t, answer(round, p2, "accept", true))
	if !again.NeedsInput() {
		t.Errorf("a replayed approval must start a fresh round, got %v", again.Content)
	}
	if r.writes() != 1 {
		t.Errorf("replayed approval actuated: %d writes", r.writes())
	}
}

func TestApprovalDeclinedOrCancelled(t *testing.T) {
	for _, c := range []struct {
		action  string
		confirm bool
	}{{"decline", false}, {"cancel", false}, {"accept", false}} {
		t.Run(c.action, func(t *testing.T) {
			r := newRig(t, true)
			p := heat70("no-" + c.action)
			round := r.call(t, p)
			res := out(t, r.call(t, answer(round, p, c.action, c.confirm)))
			if res["status"] != "failed" || res["permission"] != "requires_human_approval" {
				t.Errorf("%s: %v", c.action, res)
			}
			if r.writes() != 0 {
				t.Errorf("%s actuated", c.action)
			}
		})
	}
}

func TestApprovalTamperedStateStartsOver(t *testing.T) {
	r := newRig(t, true)
	p := heat70("tamper")
	round := r.call(t, p)
	retry := answer(round, p, "accept", true)
	b := []byte(retry.RequestState)
	b[len(b)/3] ^= 1
	retry.RequestState = string(b)
	res := r.call(t, retry)
	if !res.NeedsInput() {
		t.Errorf("tampered state: want a fresh round, got %v", res.Content)
	}
	if el, _ := res.InputRequests["approval"].(*mcp.ElicitParams); el == nil || !strings.Contains(el.Message, "could not be used") {
		t.Errorf("the fresh round should say why: %+v", res.InputRequests)
	}
	// An approval for 70 does not carry over to 75.
	other := heat70("tamper")
	other.Arguments = map[string]any{"value": 75, "idempotency_key": "tamper-75"}
	res = r.call(t, answer(round, other, "accept", true))
	if !res.NeedsInput() || r.writes() != 0 {
		t.Errorf("approval reused for another value: needsInput=%v writes=%d", res.NeedsInput(), r.writes())
	}
}

func TestApprovalExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRig(t, true)
		p := heat70("late")
		round := r.call(t, p)
		time.Sleep(11 * time.Minute)
		res := r.call(t, answer(round, p, "accept", true))
		if !res.NeedsInput() || r.writes() != 0 {
			t.Errorf("expired approval: needsInput=%v writes=%d", res.NeedsInput(), r.writes())
		}
	})
}

func TestNoElicitationGetsRefusalWithReason(t *testing.T) {
	r := newRig(t, false)
	res := out(t, r.call(t, heat70("plain")))
	if res["status"] != "failed" || res["permission"] != "requires_human_approval" || !strings.Contains(res["reason"].(string), "approv") {
		t.Errorf("client without elicitation: %v", res)
	}
	if r.writes() != 0 {
		t.Error("actuated without approval")
	}
	// can_do says the same before anyone tries.
	rep := out(t, r.call(t, &mcp.CallToolParams{Name: "can_do", Arguments: map[string]any{"intent": map[string]any{
		"semantic_tags": []string{"heating"}, "action": "set", "value": 70, "location": "zone_a"}}}))
	cands, _ := rep["candidates"].([]any)
	if len(cands) == 0 || cands[0].(map[string]any)["permission"] != "requires_human_approval" || rep["feasible"] != false {
		t.Errorf("can_do for an approval-gated value: %v", rep)
	}
}
