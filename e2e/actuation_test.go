package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/gate/p0test"
)

// ratePolicy limits do_fan_zone_b to 2 per minute and makes do_vent_zone_c
// cool down for 10 minutes; GATE is replaced by the gate under test.
const ratePolicy = `physmcp_policy_version: "0.1"
capabilities:
  do_fan_zone_b:
    rules:
      - {type: rate, max: "2/min"}
  do_vent_zone_c:
    rules:
      - {type: cooldown, ms: 600000}
gate:
GATE
`

// gateL0 lets both tools through L0 (no model involved).
const gateL0 = `  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
      - {name: vent, tool: do_vent_zone_c}`

// gateSlowL1 leaves both tools grey, so every call asks the P0 service at
// URL, which answers "allow" after 300 ms.
const gateSlowL1 = `  fail_closed: deny
  l1: {enabled: true, server: "URL", timeout_ms: 3000}`

func writePolicy(t *testing.T, gate string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "physmcp.policy.yml")
	if err := os.WriteFile(p, []byte(strings.Replace(ratePolicy, "GATE", gate, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

type doAnswer struct {
	Status     string `json:"status"`
	Permission string `json:"permission"`
	Code       string `json:"code"`
	Details    string `json:"details"`
	Reason     string `json:"reason"`
	Verified   bool   `json:"verified"`
}

// burst sends n do_ calls with distinct keys at once and returns the answers.
func burst(t *testing.T, cs *mcp.ClientSession, tool string, n int, tag string) []doAnswer {
	t.Helper()
	out := make([]doAnswer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool,
				Arguments: map[string]any{"value": 20 + i, "idempotency_key": fmt.Sprintf("%s-%02d", tag, i)}})
			if err != nil || res.IsError {
				t.Errorf("%s call %d: %v %s", tool, i, err, text(res))
				return
			}
			if err := json.Unmarshal([]byte(text(res)), &out[i]); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	return out
}

// tally counts the answers by status/permission and checks that every
// refusal is the limit's, with a retry time.
func tally(t *testing.T, answers []doAnswer, refusal string) (ok, refused int) {
	t.Helper()
	for _, a := range answers {
		switch {
		case a.Status == "success" && a.Verified:
			ok++
		case a.Status == "failed" && a.Permission == refusal && strings.Contains(a.Details, "retry_after_ms="):
			refused++
		default:
			t.Errorf("unexpected answer: %+v", a)
		}
	}
	return ok, refused
}

// TestConcurrentCallersCannotBypassRateOrCooldown: with many concurrent
// callers and a slow decision step (an L1 gate that answers after 300 ms),
// a rate of 2/min lets exactly 2 actuations reach the plant, and a 10-minute
// cooldown exactly 1 — with L0 only too, and again after a restart on the
// same state directory.
func TestConcurrentCallersCannotBypassRateOrCooldown(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"l0", "slow-l1"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			gate := gateL0
			var p0 *p0test.Server
			if mode == "slow-l1" {
				p0 = p0test.New(t, p0test.Options{})
				p0.SetFault(p0test.Fault{Delay: 300 * time.Millisecond})
				gate = strings.Replace(gateSlowL1, "URL", p0.URL, 1)
			}
			pol := writePolicy(t, gate)
			state := t.TempDir()
			d := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
			cs := connectHTTP(t, d, "2026-07-28")

			ok, refused := tally(t, burst(t, cs, "do_fan_zone_b", 20, "rate"), "rate_limited")
			if w := d.sim(t).writes("zone_b.fan"); ok != 2 || refused != 18 || w != 2 {
				t.Errorf("rate 2/min, 20 concurrent callers: %d succeeded, %d rate_limited, %d writes; want 2, 18, 2", ok, refused, w)
			}
			ok, refused = tally(t, burst(t, cs, "do_vent_zone_c", 16, "cool"), "cooldown_active")
			if w := d.sim(t).writes("zone_c.vent"); ok != 1 || refused != 15 || w != 1 {
				t.Errorf("cooldown 10 min, 16 concurrent callers: %d succeeded, %d refused, %d writes; want 1, 15, 1", ok, refused, w)
			}
			if p0 != nil && len(p0.Requests()) < 3 {
				t.Errorf("the slow L1 gate was asked %d times: the test did not exercise it", len(p0.Requests()))
			}

			// The limits hold across a restart on the same state.
			d.stop(t)
			d2 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
			cs2 := connectHTTP(t, d2, "2026-07-28")
			ok, refused = tally(t, burst(t, cs2, "do_fan_zone_b", 20, "again"), "rate_limited")
			if w := d2.sim(t).writes("zone_b.fan"); ok != 0 || refused != 20 || w != 0 {
				t.Errorf("after a restart within the minute: %d succeeded, %d refused, %d writes; want 0, 20, 0", ok, refused, w)
			}
			ok, refused = tally(t, burst(t, cs2, "do_vent_zone_c", 4, "again"), "cooldown_active")
			if w := d2.sim(t).writes("zone_c.vent"); ok != 0 || refused != 4 || w != 0 {
				t.Errorf("cooldown after a restart: %d succeeded, %d refused, %d writes", ok, refused, w)
			}
		})
	}
}

// TestRefusalsDoNotConsumeQuota: a call that touched nothing (the device
// unreachable before the write) gives its rate slot back.
func TestRefusalsDoNotConsumeQuota(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writePolicy(t, gateL0)}})
	cs := connectHTTP(t, d, "2026-07-28")
	d.fault(t, "zone_b.fan", "offline")
	for i := range 3 {
		r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": fmt.Sprint("down-", i)}))
		if r["status"] != "failed" || r["permission"] != "source_unreachable" {
			t.Fatalf("offline fan: %v", r)
		}
	}
	d.fault(t, "zone_b.fan", "none")
	for i := range 2 {
		if r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 30 + i, "idempotency_key": fmt.Sprint("up-", i)})); r["status"] != "success" {
			t.Errorf("after the device came back, call %d: %v", i, r)
		}
	}
	if r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": "third"})); r["permission"] != "rate_limited" {
		t.Errorf("third real actuation in the minute: %v", r)
	}
}

// TestSourceOfAnotherGatewayMovesNothing: without a mesh, a source that is
// not this gateway (another gateway's id, or junk) is a tool error and the
// local actuator does not move.
func TestSourceOfAnotherGatewayMovesNothing(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	for _, src := range []string{"battery_gw_01", "battery_gw_01;reboot", "../gw_greenhouse_001"} {
		res := call(t, cs, "do_fan_zone_b", map[string]any{"value": 55, "idempotency_key": "src-" + src, "source": src})
		if !res.IsError || !strings.Contains(text(res), "source") {
			t.Errorf("source %q: %s", src, text(res))
		}
		if res := call(t, cs, "read_humidity_zone_b", map[string]any{"source": src}); !res.IsError {
			t.Errorf("read with source %q: %s", src, text(res))
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 0 {
		t.Errorf("a call for another gateway moved the local fan %d times", w)
	}
	// Its own id is accepted.
	if r := structured(t, call(t, cs, "do_fan_zone_b", map[string]any{"value": 55, "idempotency_key": "own", "source": "gw_greenhouse_001"})); r["status"] != "success" {
		t.Errorf("own source: %v", r)
	}
}
