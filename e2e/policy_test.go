package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var greenhousePolicy = repoPath("examples/greenhouse/physmcp.policy.yml")

const (
	operatorToken = "greenhouse-operator-demo-token"
	viewerToken   = "greenhouse-viewer-demo-token"
)

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

func connectAs(t *testing.T, d *daemon, version, token string, elicit func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *mcp.ClientSession {
	t.Helper()
	caps := &mcp.ClientCapabilities{}
	if elicit != nil {
		caps.Elicitation = &mcp.ElicitationCapabilities{}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: caps, ElicitationHandler: elicit})
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url("/mcp"), HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func accept(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	return &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}, nil
}

// TestPolicyOverHTTP: roles from bearer tokens, the approval round with a
// 2026-07-28 client that elicits, and the refusal for a legacy HTTP client
// that cannot be asked.
func TestPolicyOverHTTP(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	wall := connectAs(t, d, "2026-07-28", viewerToken, nil)
	r := structured(t, call(t, wall, "do_heater_zone_a", map[string]any{"value": 30, "idempotency_key": "viewer-1"}))
	if r["status"] != "failed" || r["permission"] != "permission_insufficient" {
		t.Errorf("viewer heater: %v", r)
	}
	// No token, or a wrong one, is refused at the door: the policy has
	// identities, so every route but /healthz and /readyz needs one.
	code, _ := rpc(t, d, "tools/list", "", nil)
	if code != http.StatusUnauthorized {
		t.Errorf("anonymous tools/list: %d, want 401", code)
	}
	bad := mcp.NewClient(&mcp.Implementation{Name: "x", Version: "1"}, nil)
	if _, err := bad.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url("/mcp"),
		HTTPClient: &http.Client{Transport: bearer{"not-a-token", http.DefaultTransport}}}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"}); err == nil {
		t.Error("an unknown bearer token was accepted")
	}

	op := connectAs(t, d, "2026-07-28", operatorToken, accept)
	r = structured(t, call(t, op, "do_heater_zone_a", map[string]any{"value": 30, "idempotency_key": "op-1"}))
	if r["status"] != "success" {
		t.Errorf("operator heater 30: %v", r)
	}
	// Zone C's range guard denies (not clamps) above 80.
	r = structured(t, call(t, op, "do_heater_zone_c", map[string]any{"value": 85, "idempotency_key": "op-2"}))
	if r["status"] != "failed" || r["permission"] != "out_of_range" {
		t.Errorf("heater_zone_c 85 (range_guard deny): %v", r)
	}
	// Refused by the gate's L0 deny rule, or, on Sunday nights, already by
	// the maintenance window (this test runs on the real clock; the
	// in-process battery pins both on a simulated one).
	r = structured(t, call(t, op, "do_irrigation_valve", map[string]any{"value": 95, "idempotency_key": "op-3"}))
	if g, _ := r["gate"].(map[string]any); r["status"] != "failed" || (g["decision"] != "deny" && r["details"] == nil) {
		t.Errorf("irrigation 95: %v", r)
	}
	if w := d.sim(t).writes("irrigation_a.command"); w != 0 {
		t.Errorf("gate-denied irrigation wrote %d times", w)
	}
	// The audit keeps the gate's decision with its fingerprint.
	b, _ := os.ReadFile(d.state + "/audit/audit.jsonl")
	if !strings.Contains(string(b), `"gate":{"decision":"allow","layer":"L0"`) || !strings.Contains(string(b), `"fingerprint":"sha256:`) {
		t.Errorf("audit lacks the gate decision:\n%s", b)
	}
	// Resources describe the policy and the gate.
	for _, uri := range []string{"physmcp://policy", "phocinae://policy/gate-approval"} {
		res, err := op.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
		if err != nil || !strings.Contains(res.Contents[0].Text, "{") {
			t.Errorf("%s: %v", uri, err)
		}
	}
}

// TestApprovalOverStdioBothEras: a 2026-07-28 client answers the MRTR
// round; a 2025-11-25 client gets elicitation/create on stdio.
func TestApprovalOverStdioBothEras(t *testing.T) {
	t.Parallel()
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			t.Parallel()
			asked := 0
			handler := func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
				asked++
				if !strings.Contains(req.Params.Message, "do_heater_zone_a") {
					t.Errorf("elicitation message: %s", req.Params.Message)
				}
				return accept(ctx, req)
			}
			cmd := exec.Command(physdBin, "run", "--manifest", greenhouse, "--policy", greenhousePolicy, "--state", t.TempDir(), "--stdio", "--stdio-role", "operator")
			cmd.Stderr = io.Discard
			c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, &mcp.ClientOptions{
				Capabilities: &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}, ElicitationHandler: handler})
			cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: era})
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			r := structured(t, call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "stdio-" + era}))
			if r["status"] != "success" || asked != 1 {
				t.Errorf("%s: asked %d times, result %v", era, asked, r)
			}
		})
	}
}

func TestLegacyHTTPClientCannotBeAsked(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	cs := connectAs(t, d, "2025-11-25", operatorToken, accept)
	r := structured(t, call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "legacy-1"}))
	if r["status"] != "failed" || r["permission"] != "requires_human_approval" {
		t.Errorf("legacy HTTP client: %v", r)
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 0 {
		t.Errorf("actuated without approval: %d writes", w)
	}
}

func TestValidatePolicyCLI(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(physdBin, "validate", "--policy", greenhousePolicy, greenhouse).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "physmcp.policy.yml: ok") {
		t.Errorf("validate with policy: %v %s", err, out)
	}
}
