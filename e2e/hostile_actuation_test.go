package e2e

// Hostile and concurrent attacks on the do_ path, through MCP against the
// built binary (issue 10, "Must show"). Every test asserts the safe
// behaviour: exactly the allowed number of actuations reach the plant
// (counted by the simulator), answers follow the outcome vocabulary
// (success = applied and verified; failed = certainly nothing applied;
// partial = verified false with a code), and no answer invites a second
// actuation.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/gate/p0test"
	"github.com/physd/physd/manifest"
)

// hAnswer is a do_ answer with the fields the attacks look at.
type hAnswer struct {
	Status         string          `json:"status"`
	Permission     string          `json:"permission"`
	Code           string          `json:"code"`
	Details        string          `json:"details"`
	Reason         string          `json:"reason"`
	Verified       bool            `json:"verified"`
	AppliedValue   json.RawMessage `json:"applied_value"`
	RequestedValue json.RawMessage `json:"requested_value"`
	raw            string
	toolErr        string // non-empty: the call was a tool error with this text
}

func decodeDo(t *testing.T, res *mcp.CallToolResult, err error) hAnswer {
	t.Helper()
	if err != nil {
		return hAnswer{toolErr: "protocol error: " + err.Error()}
	}
	if res.IsError {
		return hAnswer{toolErr: text(res)}
	}
	var a hAnswer
	if err := json.Unmarshal([]byte(text(res)), &a); err != nil {
		t.Errorf("do_ answer is not JSON: %v: %q", err, text(res))
	}
	a.raw = text(res)
	return a
}

func doCall(t *testing.T, cs *mcp.ClientSession, tool string, args any) hAnswer {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	return decodeDo(t, res, err)
}

// inVocabulary checks the three-outcome vocabulary on one answer.
func inVocabulary(t *testing.T, what string, a hAnswer) {
	t.Helper()
	if a.toolErr != "" {
		return
	}
	switch {
	case a.Status == "success" && a.Verified:
	case a.Status == "failed" && !a.Verified:
	case a.Status == "partial" && !a.Verified && (a.Code == "outcome_unknown" || a.Code == "unverified" || a.Code == "mismatch") &&
		looksFirst(a.Reason):
	default:
		t.Errorf("%s: answer outside the outcome vocabulary: %s", what, a.raw)
	}
}

// readToolRE finds a read_ tool a reason names.
var readToolRE = regexp.MustCompile(`\bread_[a-z0-9_]+`)

// looksFirst: a partial answer tells the agent to look before acting
// again, with a tool that exists — a read_ tool of the greenhouse
// example, or can_do (whose candidate shows the current value). A do_
// capability alone has no read_ tool, so "read read_vent_zone_c" would be
// a dead end.
func looksFirst(reason string) bool {
	if !strings.Contains(reason, "before acting again") {
		return false
	}
	if strings.Contains(reason, "call can_do with {") {
		return true
	}
	m := readToolRE.FindString(reason)
	return m != "" && greenhouseTools()[m]
}

// greenhouseTools are the tools the greenhouse example serves.
func greenhouseTools() map[string]bool {
	m, err := manifest.Load(greenhouse)
	if err != nil {
		return nil
	}
	tools := map[string]bool{}
	for _, c := range m.Capabilities {
		tools[c.ToolName()] = true
	}
	return tools
}

// setFault injects a simulator fault, with a delay for "slow".
func (d *daemon) setFault(t *testing.T, point, mode string, delayMS int) {
	t.Helper()
	body := fmt.Sprintf(`{"point":%q,"mode":%q,"delay_ms":%d}`, point, mode, delayMS)
	if code, b := d.request(t, "POST", "/sim/plant/fault", body); code != http.StatusOK {
		t.Fatalf("fault %s %s: %d %s", point, mode, code, b)
	}
}

func (s simState) reads(point string) uint64 { return s.Stats.Points[point].Reads }

// waitSim polls the simulator until cond holds (at most 10 s).
func (d *daemon) waitSim(t *testing.T, what string, cond func(simState) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond(d.sim(t)) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// connectMRTR connects a 2026-07-28 client that declares elicitation but
// answers approval rounds by hand (the test plays the human and the attacker).
func connectMRTR(t *testing.T, d *daemon, token string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "physd-attack", Version: "1"}, &mcp.ClientOptions{
		Capabilities:   &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}},
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})
	hc := &http.Client{Transport: bearer{token, http.DefaultTransport}}
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url("/mcp"), HTTPClient: hc},
		&mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, d.stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// rawDo posts one 2026-07-28 tools/call whose arguments are the raw JSON
// text given (so the test can send what a Go map cannot: duplicate names,
// NaN, deep nesting).
func rawDo(t *testing.T, d *daemon, tool, rawArgs string) (int, map[string]any) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":` + jsonString(tool) + `,"arguments":` + rawArgs +
		`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	return post(t, d, "tools/call", tool, []byte(body))
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// rawOutcome classifies a raw tools/call response: "tool error", "rpc error",
// "http <code>", or the do_ status.
func rawOutcome(code int, m map[string]any) string {
	if code != http.StatusOK {
		return fmt.Sprintf("http %d", code)
	}
	if m["error"] != nil {
		return "rpc error"
	}
	res, _ := m["result"].(map[string]any)
	if res == nil {
		return "no result"
	}
	if res["isError"] == true {
		return "tool error"
	}
	sc, _ := res["structuredContent"].(map[string]any)
	return fmt.Sprint(sc["status"])
}

func (d *daemon) healthy(t *testing.T) {
	t.Helper()
	resp, err := http.Get(d.url("/healthz"))
	if err != nil {
		t.Fatalf("daemon unreachable: %v\n%s", err, d.stderr.String())
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
	if strings.Contains(d.stderr.String(), "panic") {
		t.Fatalf("daemon panicked:\n%s", d.stderr.String())
	}
}

func (d *daemon) totalWrites(t *testing.T) uint64 {
	var n uint64
	for _, p := range d.sim(t).Stats.Points {
		n += p.Writes
	}
	return n
}

// ---------------------------------------------------------------- concurrency

// TestHostileRateBurst50AcrossErasSlowGateSlowDevice: 50 concurrent
// distinct-key callers split over both protocol eras, a slow L1 gate
// (300 ms) and a slow device (each access 150 ms, so callers also queue for
// the device's turn): a 2/min rate lets exactly 2 reach the plant, a 10-min
// cooldown exactly 1, and every refusal is the limit's, with a retry time.
func TestHostileRateBurst50AcrossErasSlowGateSlowDevice(t *testing.T) {
	t.Parallel()
	p0 := p0test.New(t, p0test.Options{})
	p0.SetFault(p0test.Fault{Delay: 300 * time.Millisecond})
	pol := writePolicy(t, strings.Replace(gateSlowL1, "URL", p0.URL, 1))
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	modern, legacy := connectHTTP(t, d, "2026-07-28"), connectHTTP(t, d, "2025-11-25")
	d.setFault(t, "zone_b.fan", "slow", 150)
	d.setFault(t, "zone_c.vent", "slow", 150)

	run := func(tool string, n int, tag string) []hAnswer {
		out := make([]hAnswer, n)
		var wg sync.WaitGroup
		for i := range n {
			cs := modern
			if i%2 == 1 {
				cs = legacy
			}
			wg.Go(func() {
				out[i] = doCall(t, cs, tool, map[string]any{"value": 10 + i, "idempotency_key": fmt.Sprintf("%s-%02d", tag, i)})
			})
		}
		wg.Wait()
		return out
	}
	count := func(answers []hAnswer, refusal string) (ok, refused int) {
		for i, a := range answers {
			inVocabulary(t, fmt.Sprint(i), a)
			switch {
			case a.Status == "success":
				ok++
			case a.Status == "failed" && a.Permission == refusal && strings.Contains(a.Details, "retry_after_ms="):
				refused++
			default:
				t.Errorf("call %d: unexpected answer %s %s", i, a.raw, a.toolErr)
			}
		}
		return ok, refused
	}
	ok, refused := count(run("do_fan_zone_b", 50, "r50"), "rate_limited")
	if w := d.sim(t).writes("zone_b.fan"); ok != 2 || refused != 48 || w != 2 {
		t.Errorf("rate 2/min, 50 callers over two eras: %d success, %d rate_limited, %d plant writes; want 2, 48, 2", ok, refused, w)
	}
	ok, refused = count(run("do_vent_zone_c", 30, "c30"), "cooldown_active")
	if w := d.sim(t).writes("zone_c.vent"); ok != 1 || refused != 29 || w != 1 {
		t.Errorf("cooldown 10 min, 30 callers over two eras: %d success, %d cooldown_active, %d plant writes; want 1, 29, 1", ok, refused, w)
	}
	if len(p0.Requests()) < 3 {
		t.Errorf("the slow L1 gate was asked %d times: the attack did not exercise it", len(p0.Requests()))
	}
}

// TestHostileSameKeyConcurrentSameArgs: 30 concurrent calls with one key and
// the same value, over both eras, on a slow device: one actuation, and every
// caller gets the identical answer bytes.
func TestHostileSameKeyConcurrentSameArgs(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	modern, legacy := connectHTTP(t, d, "2026-07-28"), connectHTTP(t, d, "2025-11-25")
	d.setFault(t, "zone_b.fan", "slow", 200)
	out := make([]hAnswer, 30)
	var wg sync.WaitGroup
	for i := range out {
		cs := modern
		if i%2 == 1 {
			cs = legacy
		}
		wg.Go(func() {
			out[i] = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 42, "idempotency_key": "one-key"})
		})
	}
	wg.Wait()
	for i, a := range out {
		if a.toolErr != "" || a.raw != out[0].raw {
			t.Errorf("call %d: %s%s\nwant the same bytes as call 0: %s", i, a.raw, a.toolErr, out[0].raw)
		}
	}
	if out[0].Status != "success" {
		t.Errorf("first answer: %s", out[0].raw)
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("30 concurrent calls with one key wrote the fan %d times, want 1", w)
	}
}

// TestHostileSameKeyConcurrentDifferentArgs: 20 concurrent calls with one key
// and 20 different values: exactly one reaches the plant; the others are
// tool errors naming idempotency_key (one key names one operation).
func TestHostileSameKeyConcurrentDifferentArgs(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	modern, legacy := connectHTTP(t, d, "2026-07-28"), connectHTTP(t, d, "2025-11-25")
	d.setFault(t, "zone_b.fan", "slow", 100)
	out := make([]hAnswer, 20)
	var wg sync.WaitGroup
	for i := range out {
		cs := modern
		if i%2 == 1 {
			cs = legacy
		}
		wg.Go(func() {
			out[i] = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 20 + i, "idempotency_key": "contested"})
		})
	}
	wg.Wait()
	ok, errs := 0, 0
	for i, a := range out {
		switch {
		case a.Status == "success":
			ok++
		case strings.Contains(a.toolErr, "idempotency_key") && strings.Contains(a.toolErr, "different arguments"):
			errs++
		default:
			t.Errorf("call %d: %s%s", i, a.raw, a.toolErr)
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); ok != 1 || errs != 19 || w != 1 {
		t.Errorf("one key, 20 values at once: %d success, %d key errors, %d writes; want 1, 19, 1", ok, errs, w)
	}
	// The key is bound to its tool too.
	if a := doCall(t, modern, "do_vent_zone_c", map[string]any{"value": 20, "idempotency_key": "contested"}); !strings.Contains(a.toolErr, "idempotency_key") {
		t.Errorf("the fan's key reused for the vent: %s%s", a.raw, a.toolErr)
	}
	if w := d.sim(t).writes("zone_c.vent"); w != 0 {
		t.Errorf("a key of another tool moved the vent %d times", w)
	}
}

// TestHostileRetryAfterRefusalAndHangup: a refused key (device offline) may
// be retried once the device is back and then actuates exactly once; a
// caller that hangs up in the middle of an actuation does not stop it, and
// its retry gets the recorded answer without a second write.
func TestHostileRetryAfterRefusalAndHangup(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	d.fault(t, "zone_b.fan", "offline")
	a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 33, "idempotency_key": "retry-me"})
	if a.Status != "failed" || a.Permission != "source_unreachable" {
		t.Fatalf("offline fan: %s%s", a.raw, a.toolErr)
	}
	if s := d.sim(t); s.Signals["zone_b.fan"] != 0 {
		t.Errorf("a failed answer, but the fan moved to %v", s.Signals["zone_b.fan"])
	}
	d.fault(t, "zone_b.fan", "none")
	first := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 33, "idempotency_key": "retry-me"})
	again := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 33, "idempotency_key": "retry-me"})
	if first.Status != "success" || again.raw != first.raw {
		t.Errorf("retry after the device came back: %s / replay %s", first.raw, again.raw)
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("refusal + retry + replay: %d writes, want 1", w)
	}

	// Hang up in the middle of a slow actuation.
	d.setFault(t, "zone_b.fan", "slow", 800)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 66, "idempotency_key": "hangup"}})
	cancel()
	if err == nil {
		t.Log("the call finished before the client hung up (no hangup exercised)")
	}
	// The retry waits for the abandoned actuation (it holds the key) and
	// then gets its recorded answer.
	r := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 66, "idempotency_key": "hangup"})
	inVocabulary(t, "retry after hangup", r)
	if r.Status != "success" {
		t.Errorf("retry after hanging up: %s%s", r.raw, r.toolErr)
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 2 {
		t.Errorf("the retry after a hangup wrote again: %d writes, want 2", w)
	}
}

// TestHostileCancelWhileQueuedGivesSlotBack: with a 2/min rate and a slow
// device, a caller that hangs up (its HTTP connection closes) while waiting
// for the device's turn either gives its rate slot back (nothing written) or,
// if the server did not notice, actuates once under its key. Either way the
// plant sees exactly 2 writes in the minute and the quitter's key tells the
// truth on retry.
func TestHostileCancelWhileQueuedGivesSlotBack(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"sdk-client", "raw-http"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			d := startHTTP(t, daemonOpts{extra: []string{"--policy", writePolicy(t, gateL0)}})
			cs := connectHTTP(t, d, "2026-07-28")
			d.setFault(t, "zone_b.fan", "slow", 700)
			var first hAnswer
			var wg sync.WaitGroup
			wg.Go(func() {
				first = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 11, "idempotency_key": "holder"})
			})
			d.waitSim(t, "the first call's device step", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			if how == "sdk-client" {
				_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 12, "idempotency_key": "quitter"}})
				if err == nil {
					t.Log("queued call was not cancelled")
				}
			} else {
				body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":12,"idempotency_key":"quitter"},` +
					`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url("/mcp"), strings.NewReader(body))
				for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
					"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "do_fan_zone_b"} {
					req.Header.Set(k, v)
				}
				if resp, err := http.DefaultClient.Do(req); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			cancel()
			wg.Wait()
			if first.Status != "success" {
				t.Fatalf("first call: %s%s", first.raw, first.toolErr)
			}
			d.setFault(t, "zone_b.fan", "none", 0)
			// The quitter's key first: it waits for any actuation still holding it.
			q := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 12, "idempotency_key": "quitter"})
			second := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 13, "idempotency_key": "second"})
			third := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 14, "idempotency_key": "third"})
			t.Logf("quitter's key on retry: %s %s", q.Status, q.Permission)
			successes := 0
			for _, a := range []hAnswer{q, second, third} {
				inVocabulary(t, "after cancel", a)
				if a.Status == "success" {
					successes++
				} else if a.Permission != "rate_limited" {
					t.Errorf("unexpected answer: %s%s", a.raw, a.toolErr)
				}
			}
			if w := d.sim(t).writes("zone_b.fan"); w != 2 || successes != 1 {
				t.Errorf("2/min with a caller that hung up while queued: %d plant writes, %d successes after the first; want 2 writes, 1 success", w, successes)
			}
		})
	}
}

// TestHostileGoneCallerIsNotActuated: a caller whose HTTP connection closes
// while its do_ waits for the device's turn (another actuation of the same
// capability is under way) must not be actuated later: docs/design.md says
// a caller that gave up while waiting is released, with nothing touched.
// The check is deterministic: the same key with another value afterwards is
// refused as "different arguments" only if the abandoned call was run and
// recorded.
func TestHostileGoneCallerIsNotActuated(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	d.setFault(t, "zone_b.fan", "slow", 700)
	var wg sync.WaitGroup
	wg.Go(func() { doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 11, "idempotency_key": "holder"}) })
	d.waitSim(t, "the first call's device step", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":12,"idempotency_key":"gone"},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.url("/mcp"), strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "do_fan_zone_b"} {
		req.Header.Set(k, v)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the queued call answered before the client hung up: nothing exercised")
	}
	cancel()
	wg.Wait()
	d.setFault(t, "zone_b.fan", "none", 0)
	a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 13, "idempotency_key": "gone"})
	if strings.Contains(a.toolErr, "different arguments") {
		t.Errorf("a do_ whose caller hung up while it was queued for the device was actuated afterwards (value 12 reached the plant "+
			"after the client had gone; %d fan writes); want it released with nothing touched, as docs/design.md says", d.sim(t).writes("zone_b.fan"))
	}
}

// TestHostileSameKeyAcrossRestart: after a restart on the same state a key
// replays byte for byte and writes nothing; with other arguments it is a
// tool error; the rate history survives.
func TestHostileSameKeyAcrossRestart(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	pol := writePolicy(t, gateL0)
	d := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	cs := connectHTTP(t, d, "2026-07-28")
	a := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "survivor"})
	if a.Status != "success" {
		t.Fatalf("vent: %s%s", a.raw, a.toolErr)
	}
	d.stop(t)
	d2 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	for _, era := range eras {
		cs2 := connectHTTP(t, d2, era)
		if b := doCall(t, cs2, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "survivor"}); b.raw != a.raw {
			t.Errorf("%s replay after restart differs:\n%s\nwant\n%s%s", era, b.raw, a.raw, b.toolErr)
		}
		if b := doCall(t, cs2, "do_vent_zone_c", map[string]any{"value": 41, "idempotency_key": "survivor"}); !strings.Contains(b.toolErr, "idempotency_key") {
			t.Errorf("%s: the key with another value after restart: %s%s", era, b.raw, b.toolErr)
		}
		if b := doCall(t, cs2, "do_vent_zone_c", map[string]any{"value": 41, "idempotency_key": "fresh-" + era}); b.Permission != "cooldown_active" {
			t.Errorf("%s: a new key inside the cooldown after restart: %s%s", era, b.raw, b.toolErr)
		}
	}
	if w := d2.sim(t).writes("zone_c.vent"); w != 0 {
		t.Errorf("after restart the vent was written %d times", w)
	}
}

// TestHostileCapabilitiesRunInParallel: a capability stuck in a slow device
// step does not hold up another capability's actuation.
func TestHostileCapabilitiesRunInParallel(t *testing.T) {
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	d.setFault(t, "zone_b.fan", "slow", 1500)
	var wg sync.WaitGroup
	wg.Go(func() { doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 50, "idempotency_key": "slow-fan"}) })
	d.waitSim(t, "the fan's device step", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
	start := time.Now()
	a := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 50, "idempotency_key": "quick-vent"})
	if took := time.Since(start); a.Status != "success" || took > 1200*time.Millisecond {
		t.Errorf("vent while the fan is slow: %s in %v (want success well before the fan's 4.5 s)", a.raw, took)
	}
	wg.Wait()
}

// ---------------------------------------------------------------- hostile input

// TestHostileValuesKeysSourcesAndNames: values at the edges of JSON numbers,
// keys at the edges of the rules, sources and tool names of every shape.
// Each accepted call writes once and the plant shows the value; each
// rejected one writes nothing.
func TestHostileValuesKeysSourcesAndNames(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	key := func(s string) map[string]any { return map[string]any{"value": 30, "idempotency_key": s} }
	cases := []struct {
		name    string
		tool    string
		args    any // map, or json.RawMessage for exact number text
		want    string
		point   string
		applied float64
	}{
		// values: accepted
		{"negative zero float", "do_heater_zone_c", json.RawMessage(`{"value":-0,"idempotency_key":"v-nz-f"}`), "success", "zone_c.heater", 0},
		{"negative zero int", "do_fan_zone_b", json.RawMessage(`{"value":-0.0,"idempotency_key":"v-nz-i"}`), "success", "zone_b.fan", 0},
		{"exponent int", "do_fan_zone_b", json.RawMessage(`{"value":1E1,"idempotency_key":"v-exp"}`), "success", "zone_b.fan", 10},
		{"whole fraction int", "do_fan_zone_b", json.RawMessage(`{"value":12.000,"idempotency_key":"v-12.0"}`), "success", "zone_b.fan", 12},
		{"many decimals float", "do_heater_zone_c", json.RawMessage(`{"value":33.33333333333333333333333333,"idempotency_key":"v-dec"}`), "success", "zone_c.heater", 33.333333333333336},
		{"underflow float", "do_heater_zone_c", json.RawMessage(`{"value":1e-400,"idempotency_key":"v-under"}`), "success", "zone_c.heater", 0},
		// values: refused before anything moves
		{"2^53+1 int", "do_fan_zone_b", json.RawMessage(`{"value":9007199254740993,"idempotency_key":"v-53"}`), "failed", "zone_b.fan", 0},
		{"int64 max+1", "do_fan_zone_b", json.RawMessage(`{"value":9223372036854775808,"idempotency_key":"v-63"}`), "error:too large", "", 0},
		{"int64 min-1", "do_fan_zone_b", json.RawMessage(`{"value":-9223372036854775809,"idempotency_key":"v-63n"}`), "error:too large", "", 0},
		{"1.5e17 int", "do_fan_zone_b", json.RawMessage(`{"value":1.5e17,"idempotency_key":"v-e17"}`), "error:value", "", 0},
		{"tiny fraction int", "do_fan_zone_b", json.RawMessage(`{"value":50.0000000000001,"idempotency_key":"v-frac"}`), "error:whole", "", 0},
		{"1e308 float", "do_heater_zone_c", json.RawMessage(`{"value":1e308,"idempotency_key":"v-308"}`), "failed", "zone_c.heater", 0},
		{"-1e308 float", "do_heater_zone_c", json.RawMessage(`{"value":-1e308,"idempotency_key":"v-308n"}`), "failed", "zone_c.heater", 0},
		{"just above range", "do_heater_zone_c", json.RawMessage(`{"value":100.00000000001,"idempotency_key":"v-100+"}`), "failed", "zone_c.heater", 0},
		{"null value", "do_fan_zone_b", json.RawMessage(`{"value":null,"idempotency_key":"v-null"}`), "error:value", "", 0},
		{"array value", "do_fan_zone_b", json.RawMessage(`{"value":[50],"idempotency_key":"v-arr"}`), "error:value", "", 0},
		{"object value", "do_fan_zone_b", json.RawMessage(`{"value":{"value":50},"idempotency_key":"v-obj"}`), "error:value", "", 0},
		{"numeric string", "do_heater_zone_c", json.RawMessage(`{"value":"50","idempotency_key":"v-str"}`), "error:value", "", 0},
		{"bool for float", "do_heater_zone_c", json.RawMessage(`{"value":false,"idempotency_key":"v-bool"}`), "error:value", "", 0},
		// keys
		{"empty key", "do_fan_zone_b", key(""), "error:idempotency_key", "", 0},
		{"null key", "do_fan_zone_b", json.RawMessage(`{"value":30,"idempotency_key":null}`), "error:idempotency_key", "", 0},
		{"128-byte key", "do_fan_zone_b", key(strings.Repeat("k", 128)), "success", "zone_b.fan", 30},
		{"129-byte key", "do_fan_zone_b", key(strings.Repeat("k", 129)), "error:idempotency_key", "", 0},
		{"65 two-byte runes (130 bytes)", "do_fan_zone_b", key(strings.Repeat("ж", 65)), "error:idempotency_key", "", 0},
		{"unicode key", "do_fan_zone_b", map[string]any{"value": 31, "idempotency_key": "ключ-🔑-鍵"}, "success", "zone_b.fan", 31},
		{"tab in key", "do_fan_zone_b", key("a\tb"), "error:idempotency_key", "", 0},
		{"NUL in key", "do_fan_zone_b", key("a\x00b"), "error:idempotency_key", "", 0},
		{"DEL in key", "do_fan_zone_b", key("a\x7fb"), "error:idempotency_key", "", 0},
		{"line separator in key", "do_fan_zone_b", key("a\u2028b"), "error:idempotency_key", "", 0},
		{"NBSP in key", "do_fan_zone_b", key("a\u00a0b"), "error:idempotency_key", "", 0},
		{"key of a number", "do_fan_zone_b", json.RawMessage(`{"value":30,"idempotency_key":12345}`), "error:idempotency_key", "", 0},
		{"key of an object", "do_fan_zone_b", json.RawMessage(`{"value":30,"idempotency_key":{"k":1}}`), "error:idempotency_key", "", 0},
		{"injection-shaped key", "do_fan_zone_b", map[string]any{"value": 32, "idempotency_key": `'";DROP_TABLE_ledger;--../../etc/passwd`}, "success", "zone_b.fan", 32},
		// sources
		{"source number", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-num", "source": 7}, "error:source", "", 0},
		{"source array", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-arr", "source": []string{"gw_greenhouse_001"}}, "error:source", "", 0},
		{"source upper case", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-up", "source": "GW_GREENHOUSE_001"}, "error:source", "", 0},
		{"source with NUL", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-nul", "source": "gw_greenhouse_001\x00"}, "error:source", "", 0},
		{"source padded", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-pad", "source": " gw_greenhouse_001"}, "error:source", "", 0},
		{"source 1 MB", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "s-big", "source": strings.Repeat("g", 900_000)}, "error:source", "", 0},
		// unknown arguments
		{"extra force", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "x-1", "force": true}, "error:unknown", "", 0},
		{"extra approved", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "x-2", "approved": true}, "error:unknown", "", 0},
		{"extra max_age_ms on do_", "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "x-3", "max_age_ms": 0}, "error:unknown", "", 0},
	}
	var accepted int
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := d.sim(t)
			a := doCall(t, cs, c.tool, c.args)
			after := d.sim(t)
			inVocabulary(t, c.name, a)
			got := a.Status
			if a.toolErr != "" {
				got = "error"
			}
			want, sub, _ := strings.Cut(c.want, ":")
			if got != want || (sub != "" && !strings.Contains(a.toolErr, sub)) {
				t.Errorf("got %s %s%s; want %s", got, truncateText(a.raw), truncateText(a.toolErr), c.want)
			}
			var dw uint64
			for p := range after.Stats.Points {
				dw += after.writes(p) - before.writes(p)
			}
			switch {
			case want == "success":
				accepted++
				if dw != 1 || after.Signals[c.point] != c.applied {
					t.Errorf("accepted: %d writes, %s shows %v; want 1 write and %v", dw, c.point, after.Signals[c.point], c.applied)
				}
			case dw != 0:
				t.Errorf("refused or rejected, yet %d plant writes", dw)
			}
		})
	}
	// Wrong tool names never reach a tool.
	for _, name := range []string{"do_", "do_fan_zone_b ", "DO_FAN_ZONE_B", "do_temperature_zone_a", "read_fan_zone_b", "do_fan_zone_b\x00", "do_*", "../do_fan_zone_b"} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"value": 30, "idempotency_key": "n-" + name}})
		if err == nil && !res.IsError {
			t.Errorf("tool name %q was run: %s", name, text(res))
		}
	}
	if w := d.totalWrites(t); int(w) != accepted {
		t.Errorf("%d plant writes in all, want %d (one per accepted call)", w, accepted)
	}
	d.healthy(t)
}

// TestHostileArgumentNameVariants: JSON object names are exact. A second
// "value" spelled Value, VALUE or repeated must not be what moves the plant
// while the first one is what a proxy, an audit reader or a policy filter
// sees; physd must reject the call (the schema says additionalProperties:
// false and names "value" and "idempotency_key" exactly).
func TestHostileArgumentNameVariants(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	for i, args := range []string{
		`{"Value":95,"idempotency_key":"case-1"}`,
		`{"VALUE":95,"IDEMPOTENCY_KEY":"case-2"}`,
		`{"value":10,"Value":95,"idempotency_key":"case-3"}`,
		`{"value":10,"value":95,"idempotency_key":"case-4"}`,
		`{"value":10,"idempotency_key":"case-5","idempotency_key":"case-5b"}`,
		`{"value":10,"idempotency_key":"case-6","Source":"battery_gw_01"}`,
	} {
		code, m := rawDo(t, d, "do_heater_zone_c", args)
		if o := rawOutcome(code, m); o != "tool error" && o != "rpc error" && !strings.HasPrefix(o, "http 4") {
			t.Errorf("case %d %s: %s (the plant heater now shows %v); want a tool error naming the argument",
				i+1, args, o, d.sim(t).Signals["zone_c.heater"])
		}
	}
	if w := d.sim(t).writes("zone_c.heater"); w != 0 {
		t.Errorf("argument names outside the schema moved the heater %d times", w)
	}
}

// TestHostileRawPayloads: malformed and oversized requests never crash the
// daemon or move anything: NaN/Infinity literals, deep nesting, a body over
// 1 MiB sent chunked (no Content-Length), thousands of arguments.
func TestHostileRawPayloads(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	for _, v := range []string{"NaN", "-NaN", "Infinity", "+1", "0x10", "01", ".5", "1.", "--1", "1e", `"\u0000"`} {
		code, m := rawDo(t, d, "do_fan_zone_b", `{"value":`+v+`,"idempotency_key":"raw-`+v+`"}`)
		if o := rawOutcome(code, m); o == "success" || o == "partial" {
			t.Errorf("value %s: %s", v, o)
		}
	}
	deep := strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)
	code, m := rawDo(t, d, "do_fan_zone_b", `{"value":`+deep+`,"idempotency_key":"deep"}`)
	if o := rawOutcome(code, m); o == "success" || o == "partial" {
		t.Errorf("deeply nested value: %s", o)
	}
	deepObj := strings.Repeat(`{"a":`, 50_000) + "1" + strings.Repeat("}", 50_000)
	code, m = rawDo(t, d, "do_fan_zone_b", `{"value":30,"idempotency_key":"deep-obj","extra":`+deepObj+`}`)
	if o := rawOutcome(code, m); o == "success" || o == "partial" {
		t.Errorf("deeply nested extra argument: %s", o)
	}
	var many strings.Builder
	many.WriteString(`{"value":30,"idempotency_key":"many"`)
	for i := range 20_000 {
		fmt.Fprintf(&many, `,"a%d":%d`, i, i)
	}
	many.WriteString("}")
	code, m = rawDo(t, d, "do_fan_zone_b", many.String())
	if o := rawOutcome(code, m); o == "success" || o == "partial" {
		t.Errorf("20 000 arguments: %s", o)
	}
	// 3 MiB chunked: the size guard cannot rely on Content-Length.
	pr, pw := io.Pipe()
	go func() {
		pw.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":30,"idempotency_key":"chunked","pad":"`))
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 48 {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		pw.Write([]byte(`"}}}`))
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, d.url("/mcp"), pr)
	req.ContentLength = -1
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "do_fan_zone_b"} {
		req.Header.Set(k, v)
	}
	if resp, err := http.DefaultClient.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Errorf("3 MiB chunked body: HTTP %d, want 413", resp.StatusCode)
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("raw hostile payloads moved the plant %d times", w)
	}
	d.healthy(t)
}

// TestHostileCanDoJunk: can_do with junk never crashes, never moves
// anything, and its dry run never consumes a rate slot.
func TestHostileCanDoJunk(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writePolicy(t, gateL0)}})
	cs := connectHTTP(t, d, "2026-07-28")
	intents := []any{
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "value": "max"}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "value": 1e308}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "value": map[string]any{"$gt": 0}}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "value": []any{1, 2}}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "location": strings.Repeat("z", 500_000)}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{strings.Repeat("fan", 10)}, "target": "\x00\x01"}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}}, "scope": []string{"do_fan_zone_b", "../../etc", ""}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}}, "ttl": -5},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}}, "ttl": 1e300},
		map[string]any{"intent": map[string]any{"semantic_tags": make([]string, 5000)}},
		map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "action": "set; reboot"}},
		map[string]any{"query": map[string]any{"x": 1}},
		map[string]any{"intent": "heat"},
		[]any{"intent"},
	}
	for i, in := range intents {
		for range 2 { // twice: a dry run must not count
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: in})
			if err != nil {
				t.Errorf("can_do %d: protocol error %v", i, err)
			} else if !res.IsError {
				var rep struct {
					Feasible   bool `json:"feasible"`
					Candidates []struct {
						Tool       string `json:"tool"`
						Permission string `json:"permission"`
					} `json:"candidates"`
				}
				json.Unmarshal([]byte(text(res)), &rep)
				_ = rep
			}
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("can_do moved the plant %d times", w)
	}
	// The 2/min fan still has both slots after 28 dry runs.
	for i := range 2 {
		if a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 40 + i, "idempotency_key": fmt.Sprint("after-cando-", i)}); a.Status != "success" {
			t.Errorf("real call %d after can_do junk: %s%s", i, a.raw, a.toolErr)
		}
	}
	d.healthy(t)
}

// TestHostileReadArgs: max_age_ms of every shape on read_ (a read never moves
// anything; a bad value is a tool error naming it).
func TestHostileReadArgs(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	for _, v := range []string{"-1", "-9223372036854775808", "9223372036854775808", "1e30", "1.5", `"0"`, "null", "[]", "{}", "true"} {
		code, m := rawDo(t, d, "read_temperature_zone_a", `{"max_age_ms":`+v+`}`)
		o := rawOutcome(code, m)
		res, _ := m["result"].(map[string]any)
		if v == "null" {
			continue // null is "not given"
		}
		if o != "tool error" {
			t.Errorf("max_age_ms %s: %s %v", v, o, res)
		}
	}
	for _, v := range []string{"0", "86400000", "9223372036854775807"} {
		code, m := rawDo(t, d, "read_temperature_zone_a", `{"max_age_ms":`+v+`}`)
		if o := rawOutcome(code, m); o == "tool error" || strings.HasPrefix(o, "http") {
			t.Errorf("max_age_ms %s: %s", v, o)
		}
	}
	d.healthy(t)
}

// TestHostileManifestLimitsWithoutPolicy: the manifest declares
// do_heater_zone_a's cooldown_ms (10 s), rate_limit (30/hour) and
// requires_permission (operator). Without a policy file, these are not
// enforced (documented in policy.note). A safety engineer reading the
// manifest expects them to hold regardless.
func TestHostileManifestLimitsWithoutPolicy(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	first := doCall(t, cs, "do_heater_zone_a", map[string]any{"value": 20, "idempotency_key": "np-1"})
	second := doCall(t, cs, "do_heater_zone_a", map[string]any{"value": 25, "idempotency_key": "np-2"})
	if w := d.sim(t).writes("zone_a.heater"); w > 1 {
		t.Errorf("manifest cooldown_ms 10000 and requires_permission operator on do_heater_zone_a: an anonymous caller actuated it %d times within a second "+
			"(first %s %s, second %s %s); want the second refused with cooldown_active (and the first refused without the operator role)",
			w, first.Status, first.Permission, second.Status, second.Permission)
	}
}

// ---------------------------------------------------------------- outcome vocabulary

// startOutcomeRig starts a daemon without policy and returns it with a client
// and the fan's initial plant value.
func startOutcomeRig(t *testing.T) (*daemon, *mcp.ClientSession) {
	d := startHTTP(t, daemonOpts{})
	return d, connectHTTP(t, d, "2026-07-28")
}

// asyncDo starts a do_ and returns a channel with its answer.
func asyncDo(t *testing.T, cs *mcp.ClientSession, tool string, value int, key string) <-chan hAnswer {
	ch := make(chan hAnswer, 1)
	go func() { ch <- doCall(t, cs, tool, map[string]any{"value": value, "idempotency_key": key}) }()
	return ch
}

// TestHostileOutcomeWriteTimesOut: the device answers the previous-value
// read, then stops answering in time: the write times out (nothing lands in
// the simulator) and the verifying read too. The answer must be partial /
// outcome_unknown, never success and never failed (the physd side cannot
// know the write did not land), and a retry with the key writes nothing.
func TestHostileOutcomeWriteTimesOut(t *testing.T) {
	t.Parallel()
	d, cs := startOutcomeRig(t)
	d.setFault(t, "zone_b.fan", "slow", 1000)
	ch := asyncDo(t, cs, "do_fan_zone_b", 70, "timeout")
	d.waitSim(t, "the previous-value read", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
	d.setFault(t, "zone_b.fan", "slow", 6000)
	a := <-ch
	inVocabulary(t, "write timeout", a)
	if a.Status != "partial" || a.Code != "outcome_unknown" || a.Verified {
		t.Errorf("write timed out: %s%s; want partial, outcome_unknown, verified false", a.raw, a.toolErr)
	}
	d.setFault(t, "zone_b.fan", "none", 0)
	w := d.sim(t).writes("zone_b.fan")
	if r := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "timeout"}); r.raw != a.raw {
		t.Errorf("retry with the key: %s%s; want the recorded answer", r.raw, r.toolErr)
	}
	if w2 := d.sim(t).writes("zone_b.fan"); w2 != w {
		t.Errorf("retry of an outcome_unknown key wrote again (%d -> %d)", w, w2)
	}
}

// TestHostileOutcomeReadBackLost: the write lands, then the device stops
// answering in time: partial / unverified (not success, not failed).
func TestHostileOutcomeReadBackLost(t *testing.T) {
	t.Parallel()
	d, cs := startOutcomeRig(t)
	d.setFault(t, "zone_b.fan", "slow", 1000)
	ch := asyncDo(t, cs, "do_fan_zone_b", 70, "rb-lost")
	d.waitSim(t, "the write", func(s simState) bool { return s.writes("zone_b.fan") >= 1 })
	d.setFault(t, "zone_b.fan", "slow", 6000)
	a := <-ch
	inVocabulary(t, "read-back lost", a)
	if a.Status != "partial" || a.Code != "unverified" || a.Verified {
		t.Errorf("read-back lost: %s%s; want partial, unverified", a.raw, a.toolErr)
	}
	d.setFault(t, "zone_b.fan", "none", 0)
	if v := d.sim(t).Signals["zone_b.fan"]; v != 70 {
		t.Errorf("the write should have landed (plant shows %v)", v)
	}
}

// TestHostileOutcomeStuckActuator: a stuck actuator acknowledges and does not
// move: partial / mismatch, and its rate slot is kept (it may move later).
func TestHostileOutcomeStuckActuator(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writePolicy(t, gateL0)}})
	cs := connectHTTP(t, d, "2026-07-28")
	d.fault(t, "zone_c.vent", "stuck")
	a := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 60, "idempotency_key": "stuck"})
	inVocabulary(t, "stuck", a)
	if a.Status != "partial" || a.Code != "mismatch" || a.Verified {
		t.Errorf("stuck vent: %s%s; want partial, mismatch", a.raw, a.toolErr)
	}
	d.fault(t, "zone_c.vent", "none")
	if b := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 60, "idempotency_key": "stuck-again"}); b.Permission != "cooldown_active" {
		t.Errorf("after a partial the cooldown must hold (the write may have landed): %s%s", b.raw, b.toolErr)
	}
}

// TestHostileOutcomeOfflineMidway: the device goes offline during the
// previous-value read (nothing written: failed, signal unchanged) or during
// the read-back (written: partial).
func TestHostileOutcomeOfflineMidway(t *testing.T) {
	t.Parallel()
	d, cs := startOutcomeRig(t)
	d.setFault(t, "zone_b.fan", "slow", 800)
	ch := asyncDo(t, cs, "do_fan_zone_b", 55, "off-prev")
	d.waitSim(t, "the previous-value read", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
	d.fault(t, "zone_b.fan", "offline")
	a := <-ch
	inVocabulary(t, "offline during previous read", a)
	s := d.sim(t)
	if a.Status != "failed" || s.writes("zone_b.fan") != 0 || s.Signals["zone_b.fan"] != 0 {
		t.Errorf("offline during the previous read: %s%s; writes %d, plant %v; want failed and nothing written", a.raw, a.toolErr, s.writes("zone_b.fan"), s.Signals["zone_b.fan"])
	}
	// Offline during the write: the simulator says nothing was applied.
	d.setFault(t, "zone_b.fan", "slow", 800)
	ch = asyncDo(t, cs, "do_fan_zone_b", 56, "off-write")
	d.waitSim(t, "the write", func(s simState) bool { return s.writes("zone_b.fan") >= 1 })
	d.fault(t, "zone_b.fan", "offline")
	a = <-ch
	inVocabulary(t, "offline during write", a)
	d.fault(t, "zone_b.fan", "none")
	if v := d.sim(t).Signals["zone_b.fan"]; a.Status == "failed" && v != 0 {
		t.Errorf("failed, yet the fan shows %v", v)
	} else if a.Status == "success" {
		t.Errorf("offline during the write answered success: %s", a.raw)
	}
	// Offline during the read-back: the write landed.
	d.setFault(t, "zone_b.fan", "slow", 800)
	w0 := d.sim(t).writes("zone_b.fan")
	ch = asyncDo(t, cs, "do_fan_zone_b", 57, "off-rb")
	d.waitSim(t, "the write", func(s simState) bool { return s.writes("zone_b.fan") > w0 })
	r0 := d.sim(t).reads("zone_b.fan")
	d.waitSim(t, "the read-back", func(s simState) bool { return s.reads("zone_b.fan") > r0 })
	d.fault(t, "zone_b.fan", "offline")
	a = <-ch
	inVocabulary(t, "offline during read-back", a)
	d.fault(t, "zone_b.fan", "none")
	if v := d.sim(t).Signals["zone_b.fan"]; v == 57 && a.Status == "failed" {
		t.Errorf("the fan moved to 57 but the answer is failed: %s", a.raw)
	} else if a.Status == "success" && v != 57 {
		t.Errorf("success, yet the fan shows %v", v)
	}
}

// TestHostileAuditUnwritable: an audit trail that cannot be written
// (/dev/full) must stop every actuation: the daemon refuses to start, or
// answers do_ failed with audit_unavailable, and nothing moves.
func TestHostileAuditUnwritable(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	if err := os.MkdirAll(filepath.Join(state, "audit"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/full", filepath.Join(state, "audit", "audit.jsonl")); err != nil {
		t.Skip("no symlink:", err)
	}
	cmd := []string{"run", "--manifest", greenhouse, "--state", state, "--http", "127.0.0.1:0", "--sim-control"}
	d := &daemon{stderr: &syncBuffer{}, done: make(chan error, 1), state: state}
	d.cmd = exec.Command(physdBin, cmd...)
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && !strings.Contains(d.stderr.String(), `"msg":"ready"`) {
		select {
		case err := <-d.done:
			t.Logf("physd refused to start on an unwritable audit (held): %v\n%s", err, d.stderr.String())
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	d.addr = d.stderr.logValue(t, "listening", "addr")
	cs := connectHTTP(t, d, "2026-07-28")
	for i := range 3 {
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 20 + i, "idempotency_key": fmt.Sprint("noaudit-", i)})
		if i > 0 && (a.Status != "failed" || a.Code != "audit_unavailable") {
			t.Errorf("do_ %d with an unwritable audit: %s%s; want failed, audit_unavailable", i, a.raw, a.toolErr)
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); w > 1 {
		t.Errorf("%d actuations with no audit trail", w)
	}
}

// ---------------------------------------------------------------- approval

const approvalPolicy = `physmcp_policy_version: "0.1"
identity:
  tokens:
    - {id: operator_console, sha256: d44723fb54413f57fbf393e54ead396013e587a55f29ae10d8565e39e2d6189d, role: operator}
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
capabilities:
  do_fan_zone_b:
    rules:
      - {type: approval, when: always}
  do_vent_zone_c:
    rules:
      - {type: approval, when: above, above: 50}
gate:
  fail_closed: deny
  l0:
    deny:
      - {name: vent_wide, tool: do_vent_zone_c, range: {arg: value, min: 95, max: 100}}
    allow:
      - {name: fan, tool: do_fan_zone_b}
      - {name: vent, tool: do_vent_zone_c}
`

func writeApprovalPolicy(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "approval.policy.yml")
	if err := os.WriteFile(p, []byte(approvalPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func approvalRoundFor(t *testing.T, cs *mcp.ClientSession, tool string, value int, key string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"value": value, "idempotency_key": key}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.NeedsInput() || res.RequestState == "" {
		t.Fatalf("want an approval round for %s=%d, got %s", tool, value, text(res))
	}
	return res
}

func answerRound(state string, tool string, value any, key string, resp mcp.InputResponseMap) *mcp.CallToolParams {
	return &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"value": value, "idempotency_key": key},
		RequestState: state, InputResponses: resp}
}

func confirm() mcp.InputResponseMap {
	return mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}}
}

// TestHostileApprovalReplayedConcurrently: one accepted approval state sent
// 12 times at once under 12 keys runs exactly once.
func TestHostileApprovalReplayedConcurrently(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writeApprovalPolicy(t)}})
	cs := connectMRTR(t, d, operatorToken)
	round := approvalRoundFor(t, cs, "do_fan_zone_b", 44, "ap-0")
	var ran atomic.Int32
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Go(func() {
			res, err := cs.CallTool(context.Background(), answerRound(round.RequestState, "do_fan_zone_b", 44, fmt.Sprint("ap-", i), confirm()))
			if err == nil && !res.NeedsInput() && !res.IsError && strings.Contains(text(res), `"status":"success"`) {
				ran.Add(1)
			}
		})
	}
	wg.Wait()
	if w := d.sim(t).writes("zone_b.fan"); ran.Load() != 1 || w != 1 {
		t.Errorf("one approval replayed 12 times at once: %d successes, %d writes; want 1, 1", ran.Load(), w)
	}
}

// TestHostileApprovalMisuse: an approval answered for another value, by
// another caller, with a tampered or forged state, or with junk answers never
// executes; each gets a fresh round (or a refusal), and the daemon stays up.
func TestHostileApprovalMisuse(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writeApprovalPolicy(t)}})
	op := connectMRTR(t, d, operatorToken)
	admin := connectMRTR(t, d, adminDemoToken)
	round := approvalRoundFor(t, op, "do_vent_zone_c", 70, "m-1")
	st := round.RequestState
	flip := func(i int) string {
		b := []byte(st)
		b[i] ^= 0x01
		return string(b)
	}
	p, mac, _ := strings.Cut(st, ".")
	other := approvalRoundFor(t, op, "do_vent_zone_c", 60, "m-2").RequestState
	op2, mac2, _ := strings.Cut(other, ".")
	_ = op2
	attempts := []struct {
		name string
		cs   *mcp.ClientSession
		p    *mcp.CallToolParams
	}{
		{"another value", op, answerRound(st, "do_vent_zone_c", 71, "m-1", confirm())},
		{"another value, other key", op, answerRound(st, "do_vent_zone_c", 90, "m-x", confirm())},
		{"value above a deny rule", op, answerRound(st, "do_vent_zone_c", 99, "m-1", confirm())},
		{"another tool", op, answerRound(st, "do_fan_zone_b", 70, "m-1", confirm())},
		{"another caller", admin, answerRound(st, "do_vent_zone_c", 70, "m-1", confirm())},
		{"flipped payload bit", op, answerRound(flip(len(p)/2), "do_vent_zone_c", 70, "m-1", confirm())},
		{"flipped MAC bit", op, answerRound(flip(len(st)-3), "do_vent_zone_c", 70, "m-1", confirm())},
		{"MAC of another round", op, answerRound(p+"."+mac2, "do_vent_zone_c", 70, "m-1", confirm())},
		{"payload only", op, answerRound(p, "do_vent_zone_c", 70, "m-1", confirm())},
		{"MAC only", op, answerRound("."+mac, "do_vent_zone_c", 70, "m-1", confirm())},
		{"three parts", op, answerRound(st+"."+mac, "do_vent_zone_c", 70, "m-1", confirm())},
		{"huge state", op, answerRound(strings.Repeat("A", 200_000)+"."+mac, "do_vent_zone_c", 70, "m-1", confirm())},
		{"confirm as string", op, answerRound(st, "do_vent_zone_c", 70, "m-1", mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": "true"}}})},
		{"confirm 1", op, answerRound(st, "do_vent_zone_c", 70, "m-1", mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": 1}}})},
		{"unknown action", op, answerRound(st, "do_vent_zone_c", 70, "m-1", mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "ACCEPT", Content: map[string]any{"confirm": true}}})},
		{"answer under another name", op, answerRound(st, "do_vent_zone_c", 70, "m-1", mcp.InputResponseMap{"approve": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"confirm": true}}})},
		{"answer without state", op, answerRound("", "do_vent_zone_c", 70, "m-1", confirm())},
	}
	for _, a := range attempts {
		res, err := a.cs.CallTool(context.Background(), a.p)
		if err == nil && !res.NeedsInput() && !res.IsError && strings.Contains(text(res), `"status":"success"`) {
			t.Errorf("%s: executed: %s", a.name, text(res))
		}
	}
	if w := d.sim(t).writes("zone_c.vent"); w != 0 {
		t.Errorf("misused approvals moved the vent %d times", w)
	}
	// The genuine approval, if not consumed by an attempt above, is still single-use.
	fresh := approvalRoundFor(t, op, "do_vent_zone_c", 70, "m-3")
	ok := 0
	for i := range 3 {
		res, err := op.CallTool(context.Background(), answerRound(fresh.RequestState, "do_vent_zone_c", 70, fmt.Sprint("m-3-", i), confirm()))
		if err == nil && strings.Contains(text(res), `"status":"success"`) {
			ok++
		}
	}
	if w := d.sim(t).writes("zone_c.vent"); ok != 1 || w != 1 {
		t.Errorf("a genuine approval used 3 times: %d successes, %d writes; want 1, 1", ok, w)
	}
	d.healthy(t)
}

// TestHostileApprovalAcrossRestart: with PHYSD_APPROVAL_KEY an approval
// survives a restart, once; the replay after a second restart is refused.
// Without the key, an old state never executes.
func TestHostileApprovalAcrossRestart(t *testing.T) {
	t.Setenv("PHYSD_APPROVAL_KEY", strings.Repeat("ab", 32))
	state := t.TempDir()
	pol := writeApprovalPolicy(t)
	d := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	round := approvalRoundFor(t, connectMRTR(t, d, operatorToken), "do_fan_zone_b", 45, "rs-1")
	d.stop(t)
	d2 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	r, err := connectMRTR(t, d2, operatorToken).CallTool(context.Background(), answerRound(round.RequestState, "do_fan_zone_b", 45, "rs-1", confirm()))
	if err != nil || !strings.Contains(text(r), `"status":"success"`) {
		t.Errorf("an approval issued before a restart (same PHYSD_APPROVAL_KEY): %v %s", err, text(r))
	}
	d2.stop(t)
	d3 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	r, err = connectMRTR(t, d3, operatorToken).CallTool(context.Background(), answerRound(round.RequestState, "do_fan_zone_b", 45, "rs-2", confirm()))
	if err == nil && strings.Contains(text(r), `"status":"success"`) {
		t.Errorf("an approval replayed after a restart executed again: %s", text(r))
	}
	if w := d3.sim(t).writes("zone_b.fan"); w != 0 {
		t.Errorf("replay after restart moved the fan %d times", w)
	}
	// Another key: a state from a daemon with a different approval key never executes.
	t.Setenv("PHYSD_APPROVAL_KEY", strings.Repeat("cd", 32))
	d3.stop(t)
	d4 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	round4 := approvalRoundFor(t, connectMRTR(t, d4, operatorToken), "do_fan_zone_b", 46, "rs-3")
	_ = round4
	r, err = connectMRTR(t, d4, operatorToken).CallTool(context.Background(), answerRound(round.RequestState, "do_fan_zone_b", 45, "rs-4", confirm()))
	if err == nil && strings.Contains(text(r), `"status":"success"`) {
		t.Errorf("a state signed with another key executed: %s", text(r))
	}
	if w := d4.sim(t).writes("zone_b.fan"); w != 0 {
		t.Errorf("foreign-key state moved the fan %d times", w)
	}
}

// ---------------------------------------------------------------- guards and dry runs

const clampPolicy = `physmcp_policy_version: "0.1"
capabilities:
  do_vent_zone_c:
    rules:
      - {type: range_guard, min: 10, max: 90, on_violation: clamp}
  do_fan_zone_b:
    rules:
      - {type: range_guard, min: 10, max: 90, on_violation: warn}
  do_heater_zone_c:
    rules:
      - {type: range_guard, min: 0, max: 50, on_violation: clamp}
gate:
  fail_closed: deny
  l0:
    deny:
      - {name: heater_hot, tool: do_heater_zone_c, range: {arg: value, min: 70, max: 100}}
    allow:
      - {name: vent, tool: do_vent_zone_c}
      - {name: fan, tool: do_fan_zone_b}
      - {name: heater, tool: do_heater_zone_c}
`

// TestHostileClampAndWarnKeepTheirNotes: the gate judges the value as
// requested (a clamp cannot launder a value an L0 deny rule forbids), a
// clamped or warned answer keeps clamped_to=/warn= in details next to the
// driver's notes, and the plant gets the clamped value.
func TestHostileClampAndWarnKeepTheirNotes(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "clamp.policy.yml")
	if err := os.WriteFile(p, []byte(clampPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p}})
	cs := connectHTTP(t, d, "2026-07-28")
	a := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 95, "idempotency_key": "clamp-vent"})
	if a.Status != "success" || string(a.AppliedValue) != "90" || !strings.Contains(a.Details, "clamped_to=90") {
		t.Errorf("vent 95 clamped to 90: %s%s", a.raw, a.toolErr)
	}
	if v := d.sim(t).Signals["zone_c.vent"]; v != 90 {
		t.Errorf("vent shows %v, want the clamped 90", v)
	}
	a = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 95, "idempotency_key": "warn-fan"})
	if a.Status != "success" || !strings.Contains(a.Details, "warn=outside_range") {
		t.Errorf("fan 95 warned: %s%s", a.raw, a.toolErr)
	}
	a = doCall(t, cs, "do_heater_zone_c", map[string]any{"value": 75, "idempotency_key": "launder"})
	if a.Status != "failed" || a.Permission != "policy_denied" || d.sim(t).writes("zone_c.heater") != 0 {
		t.Errorf("heater 75 (L0 deny 70..100, clamp to 50): %s%s; want the gate's deny on the requested value", a.raw, a.toolErr)
	}
	a = doCall(t, cs, "do_heater_zone_c", map[string]any{"value": 60, "idempotency_key": "clamp-heater"})
	if a.Status != "success" || string(a.AppliedValue) != "50" || !strings.Contains(a.Details, "clamped_to=50") {
		t.Errorf("heater 60 clamped to 50: %s%s", a.raw, a.toolErr)
	}
}

// TestHostileDryRunAgreesWithDeadL1: with L1 enabled but its P0 service
// down, can_do must say what do_ then does (fail_closed deny: blocked; ask:
// requires_human_approval), and never report an allowed candidate.
func TestHostileDryRunAgreesWithDeadL1(t *testing.T) {
	t.Parallel()
	for _, fc := range []string{"deny", "ask"} {
		t.Run(fc, func(t *testing.T) {
			t.Parallel()
			pol := filepath.Join(t.TempDir(), "deadl1.policy.yml")
			os.WriteFile(pol, []byte(`physmcp_policy_version: "0.1"
gate:
  fail_closed: `+fc+`
  l1: {enabled: true, server: "http://127.0.0.1:1", timeout_ms: 500}
`), 0o600)
			d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
			cs := connectHTTP(t, d, "2026-07-28")
			res := call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "action": "set", "value": 40, "location": "zone_b"}})
			var rep struct {
				Feasible   bool `json:"feasible"`
				Candidates []struct {
					Tool       string `json:"capability"`
					Permission string `json:"permission"`
				} `json:"candidates"`
				Blocked []struct {
					Tool string `json:"capability"`
				} `json:"blocked"`
			}
			json.Unmarshal([]byte(text(res)), &rep)
			a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": "dead-l1"})
			dry := "absent"
			for _, c := range rep.Candidates {
				if c.Tool == "do_fan_zone_b" {
					dry = c.Permission
				}
			}
			for _, b := range rep.Blocked {
				if b.Tool == "do_fan_zone_b" {
					dry = "blocked"
				}
			}
			want := map[string]string{"deny": "blocked", "ask": "requires_human_approval"}[fc]
			if rep.Feasible || dry != want || a.Status != "failed" || d.sim(t).writes("zone_b.fan") != 0 {
				t.Errorf("fail_closed %s, L1 down: can_do says %s (feasible %v), do_ says %s/%s; want can_do %s and do_ failed",
					fc, dry, rep.Feasible, a.Status, a.Permission, want)
			}
		})
	}
}

// TestHostileKillBetweenWriteAndAnswer: SIGKILL while the write is on its
// way; after the restart, the key's answer is partial (outcome unknown) or
// success, never failed, and the retry does not write again.
func TestHostileKillBetweenWriteAndAnswer(t *testing.T) {
	t.Parallel()
	for _, at := range []string{"previous-read", "write", "read-back"} {
		t.Run(at, func(t *testing.T) {
			t.Parallel()
			state := t.TempDir()
			d := startHTTP(t, daemonOpts{state: state})
			cs := connectHTTP(t, d, "2026-07-28")
			d.setFault(t, "zone_b.fan", "slow", 1500)
			go func() {
				cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 70, "idempotency_key": "killed"}})
			}()
			switch at {
			case "previous-read":
				d.waitSim(t, at, func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
			case "write":
				d.waitSim(t, at, func(s simState) bool { return s.writes("zone_b.fan") >= 1 })
			case "read-back":
				d.waitSim(t, at, func(s simState) bool { return s.reads("zone_b.fan") >= 2 })
			}
			d.cmd.Process.Kill()
			<-d.done
			d2 := startHTTP(t, daemonOpts{state: state})
			cs2 := connectHTTP(t, d2, "2026-07-28")
			a := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "killed"})
			inVocabulary(t, "after the kill", a)
			if a.toolErr != "" || a.Status == "failed" {
				t.Errorf("killed during the %s: retry answers %s%s; want partial/outcome_unknown (or success), never failed", at, a.raw, a.toolErr)
			}
			if w := d2.sim(t).writes("zone_b.fan"); w != 0 {
				t.Errorf("the retry after the kill wrote %d times", w)
			}
			if b := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 71, "idempotency_key": "killed"}); !strings.Contains(b.toolErr, "idempotency_key") {
				t.Errorf("the killed key with another value: %s%s", b.raw, b.toolErr)
			}
		})
	}
}

// rawDoAt is rawDo on another MCP path (a view).
func rawDoAt(t *testing.T, d *daemon, path, tool, rawArgs string) (int, map[string]any) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":` + jsonString(tool) + `,"arguments":` + rawArgs +
		`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest(http.MethodPost, d.url(path), strings.NewReader(body))
	for k, v := range map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": tool} {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

// TestHostileViewsDoNotActuateOutside: through a view, a do_ outside it is a
// tool error and nothing moves, whatever the path's spelling. (A path that
// cleans to /mcp, such as /mcp/observe/.., reaches the unfiltered endpoint,
// which the same caller may use anyway: a view is not a grant.)
func TestHostileViewsDoNotActuateOutside(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	for _, c := range []struct{ path, tool string }{
		{"/mcp/observe", "do_fan_zone_b"},
		{"/mcp/observe", "do_heater_zone_a"},
		{"/mcp/zone_a", "do_fan_zone_b"},
		{"/mcp/water", "do_heater_zone_c"},
		{"/mcp/observe/", "do_fan_zone_b"},
		{"/mcp/observe%2F..", "do_fan_zone_b"},
		{"/mcp/OBSERVE", "do_fan_zone_b"},
		{"/mcp//observe", "do_fan_zone_b"},
		{"/mcp/observe?view=", "do_fan_zone_b"},
	} {
		code, m := rawDoAt(t, d, c.path, c.tool, `{"value":30,"idempotency_key":"view-`+c.tool+`"}`)
		if o := rawOutcome(code, m); o == "success" || o == "partial" || o == "failed" {
			// failed would still be a judged call; only a tool error or a refused route keeps the view's promise
			t.Errorf("%s %s: %s", c.path, c.tool, o)
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("calls outside a view moved the plant %d times", w)
	}
	// Inside the view the call runs.
	code, m := rawDoAt(t, d, "/mcp/zone_a", "do_irrigation_valve", `{"value":30,"idempotency_key":"view-in"}`)
	if o := rawOutcome(code, m); o != "success" {
		t.Errorf("irrigation inside zone_a: %s %v", o, m)
	}
}

const approvalRatePolicy = `physmcp_policy_version: "0.1"
identity:
  tokens:
    - {id: operator_console, sha256: d44723fb54413f57fbf393e54ead396013e587a55f29ae10d8565e39e2d6189d, role: operator}
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
capabilities:
  do_fan_zone_b:
    rules:
      - {type: rate, max: "2/min"}
      - {type: approval, when: always}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
`

// TestHostileApprovedBurstRespectsRate: 20 approval rounds, then all 20
// confirmed at once: the rate (2/min) still lets exactly 2 reach the plant;
// an approval never lifts a rate.
func TestHostileApprovedBurstRespectsRate(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "p.yml")
	os.WriteFile(p, []byte(approvalRatePolicy), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p}})
	cs := connectMRTR(t, d, operatorToken)
	states := make([]string, 20)
	for i := range states {
		states[i] = approvalRoundFor(t, cs, "do_fan_zone_b", 30+i, fmt.Sprint("ab-", i)).RequestState
	}
	out := make([]hAnswer, 20)
	var wg sync.WaitGroup
	for i := range states {
		wg.Go(func() {
			res, err := cs.CallTool(context.Background(), answerRound(states[i], "do_fan_zone_b", 30+i, fmt.Sprint("ab-", i), confirm()))
			if err == nil && res.NeedsInput() {
				out[i] = hAnswer{toolErr: "another round"}
				return
			}
			out[i] = decodeDo(t, res, err)
		})
	}
	wg.Wait()
	ok := 0
	for i, a := range out {
		inVocabulary(t, fmt.Sprint(i), a)
		if a.Status == "success" {
			ok++
		} else if a.Permission != "rate_limited" {
			t.Errorf("approved call %d: %s%s", i, a.raw, a.toolErr)
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); ok != 2 || w != 2 {
		t.Errorf("20 approved calls at once on a 2/min tool: %d successes, %d writes; want 2, 2", ok, w)
	}
}

// TestHostileReloadDuringBurstKeepsHistory: SIGHUP in the middle of a burst
// keeps the rate history: 2/min stays 2 writes across reloads; a reload to
// 3/min allows exactly one more.
func TestHostileReloadDuringBurstKeepsHistory(t *testing.T) {
	t.Parallel()
	pol := writePolicy(t, gateL0)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	cs := connectHTTP(t, d, "2026-07-28")
	reloads := func() int { return strings.Count(d.stderr.String(), `"msg":"policy reloaded"`) }
	var wg sync.WaitGroup
	wg.Go(func() { burst(t, cs, "do_fan_zone_b", 20, "hup-a") })
	wg.Go(func() {
		for range 3 {
			d.cmd.Process.Signal(syscall.SIGHUP)
			time.Sleep(20 * time.Millisecond)
		}
	})
	wg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for reloads() < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	burst(t, cs, "do_fan_zone_b", 10, "hup-b")
	if w := d.sim(t).writes("zone_b.fan"); w != 2 {
		t.Errorf("2/min across reloads: %d writes, want 2", w)
	}
	b, _ := os.ReadFile(pol)
	os.WriteFile(pol, []byte(strings.Replace(string(b), `max: "2/min"`, `max: "3/min"`, 1)), 0o600)
	n := reloads()
	d.cmd.Process.Signal(syscall.SIGHUP)
	for reloads() == n && time.Now().Before(deadline.Add(10*time.Second)) {
		time.Sleep(10 * time.Millisecond)
	}
	burst(t, cs, "do_fan_zone_b", 10, "hup-c")
	if w := d.sim(t).writes("zone_b.fan"); w != 3 {
		t.Errorf("after a reload to 3/min: %d writes, want 3", w)
	}
}

// TestHostileSameKeyAcrossStdioAndHTTP: one daemon serving stdio (legacy
// era) and HTTP (modern era); one key sent on both at once, many times:
// one write, one answer.
func TestHostileSameKeyAcrossStdioAndHTTP(t *testing.T) {
	t.Parallel()
	stdio, d := startStdio(t, "2025-11-25", daemonOpts{})
	d.stderr.logValue(t, "ready", "ready")
	httpcs := connectHTTP(t, d, "2026-07-28")
	d.setFault(t, "zone_b.fan", "slow", 150)
	out := make([]hAnswer, 16)
	var wg sync.WaitGroup
	for i := range out {
		cs := stdio
		if i%2 == 1 {
			cs = httpcs
		}
		wg.Go(func() {
			out[i] = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 64, "idempotency_key": "both-ways"})
		})
	}
	wg.Wait()
	for i, a := range out {
		if a.toolErr != "" || a.raw != out[0].raw {
			t.Errorf("call %d: %s%s; want the bytes of call 0: %s", i, a.raw, a.toolErr, out[0].raw)
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("one key over stdio and HTTP at once: %d writes, want 1", w)
	}
}

// TestHostileReplayToAnotherCaller: a key an operator used for the heater,
// sent by a viewer (who may not run the heater) with the same arguments,
// must not hand the viewer a "success" for an actuation the viewer is not
// allowed to make (nor reveal the operator's answer); nothing moves either way.
func TestHostileReplayToAnotherCaller(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	viewer := connectAs(t, d, "2026-07-28", viewerToken, nil)
	a := doCall(t, op, "do_heater_zone_a", map[string]any{"value": 30, "idempotency_key": "op-secret-key"})
	if a.Status != "success" {
		t.Fatalf("operator heater: %s%s", a.raw, a.toolErr)
	}
	v := doCall(t, viewer, "do_heater_zone_a", map[string]any{"value": 30, "idempotency_key": "op-secret-key"})
	if w := d.sim(t).writes("zone_a.heater"); w != 1 {
		t.Fatalf("the viewer's replay moved the heater: %d writes", w)
	}
	if v.Status == "success" {
		t.Errorf("a viewer (no operator role) replaying the operator's key gets the operator's answer, status success: %s; "+
			"want permission_insufficient (the role is checked before the ledger answers)", truncateText(v.raw))
	}
}

// TestHostileTwoActuatorsOnOnePoint: two do_ capabilities bound to one
// device point make the per-capability rate, cooldown and one-device-step
// rules per alias, not per device: a 2/min rate on one is bypassed through
// the other. physd validate must refuse (or at least warn about) a point
// written by two actuators.
func TestHostileTwoActuatorsOnOnePoint(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	alias := `  - name: fan_zone_b_boost
    kind: do
    description: The same zone B circulation fan, a boost alias (percent).
    zone: zone_b
    binding: {type: sim, bus: plant, point: zone_b.fan}
    data_type: int
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [fan, zone_b]
    timeout_ms: 2000

audit:`
	m := filepath.Join(t.TempDir(), "alias.yml")
	os.WriteFile(m, []byte(strings.Replace(string(b), "\naudit:", "\n"+alias, 1)), 0o600)
	out, _ := exec.Command(physdBin, "validate", m).CombinedOutput()
	if !strings.Contains(string(out), "zone_b.fan") {
		t.Errorf("physd validate accepts two actuators on the point zone_b.fan without a word:\n%s", out)
	}
	// And run refuses to start with it: no alias can pass the fan's limits.
	run := exec.Command(physdBin, "run", "--manifest", m, "--state", t.TempDir(), "--http", "127.0.0.1:0")
	out, err = run.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "zone_b.fan") {
		t.Errorf("physd run with two actuators on one point: err %v\n%s", err, out)
	}
}

// TestHostileShutdownWithQueuedCalls: SIGTERM while one actuation is in its
// device step and five more wait for their turn: the running one finishes,
// none of the queued ones touches the device, and after a restart their keys
// are free (nothing was recorded) while the finished one replays.
// With a grace period shorter than the device step, the bus must not be
// closed under the actuation: the next start resolves the key (partial or
// success, never failed).
func TestHostileShutdownWithQueuedCalls(t *testing.T) {
	for _, grace := range []string{"10s", "300ms"} {
		t.Run("grace="+grace, func(t *testing.T) {
			state := t.TempDir()
			d := startHTTP(t, daemonOpts{state: state, extra: []string{"--shutdown-grace", grace}})
			cs := connectHTTP(t, d, "2026-07-28")
			d.setFault(t, "zone_b.fan", "slow", 600)
			answers := make([]hAnswer, 6)
			var wg sync.WaitGroup
			wg.Go(func() {
				answers[0] = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "sd-0"})
			})
			d.waitSim(t, "the first device step", func(s simState) bool { return s.reads("zone_b.fan") >= 1 })
			for i := 1; i < 6; i++ {
				wg.Go(func() {
					answers[i] = doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 70 + i, "idempotency_key": fmt.Sprint("sd-", i)})
				})
			}
			time.Sleep(100 * time.Millisecond) // let the five queue behind the first
			writesBefore := d.sim(t).writes("zone_b.fan")
			d.cmd.Process.Signal(syscall.SIGTERM)
			wg.Wait()
			select {
			case <-d.done:
			case <-time.After(20 * time.Second):
				t.Fatal("physd did not exit")
			}
			for i, a := range answers {
				inVocabulary(t, fmt.Sprint("sd-", i), a)
				if i > 0 && (a.Status == "success" || a.Status == "partial") {
					t.Errorf("queued call %d (decided before SIGTERM, waiting for the device) started its device step after shutdown began and answered %s %s "+
						"(applied %s); want it refused (failed, code shutting_down) with nothing written: no new actuation starts after shutdown begins",
						i, a.Status, a.Code, a.AppliedValue)
				}
			}
			t.Logf("writes before SIGTERM %d; answers: %q %q", writesBefore, answers[0].Status+answers[0].toolErr, answers[1].Status+answers[1].Code+answers[1].toolErr)
			d2 := startHTTP(t, daemonOpts{state: state})
			cs2 := connectHTTP(t, d2, "2026-07-28")
			r0 := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 70, "idempotency_key": "sd-0"})
			inVocabulary(t, "sd-0 after restart", r0)
			if r0.Status == "failed" || r0.toolErr != "" {
				t.Errorf("the in-flight key after the restart: %s%s; want success or partial", r0.raw, r0.toolErr)
			}
			if answers[0].raw != "" && r0.raw != answers[0].raw {
				t.Errorf("the in-flight key was answered %s before the stop but %s after", answers[0].raw, r0.raw)
			}
			if w := d2.sim(t).writes("zone_b.fan"); w != 0 {
				t.Errorf("the replay after restart wrote %d times", w)
			}
			// A queued key committed nothing: it runs now, once.
			r1 := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 71, "idempotency_key": "sd-1"})
			if r1.Status != "success" {
				t.Errorf("a queued key after restart: %s%s", r1.raw, r1.toolErr)
			}
		})
	}
}

const overridePolicy = `physmcp_policy_version: "0.1"
time_windows:
  day:   {days: [mon, tue, wed, thu, fri, sat, sun], start: "00:00", end: "23:59", timezone: UTC}
  night: {days: [mon, tue, wed, thu, fri, sat, sun], start: "23:00", end: "01:00", timezone: UTC}
identity:
  tokens:
    - {id: wall_display, sha256: 4a6c683b39708a1b1785f4dc5070fc32893b1eabc5c41c9634a5070f63640dfb, role: viewer}
    - {id: operator_console, sha256: d44723fb54413f57fbf393e54ead396013e587a55f29ae10d8565e39e2d6189d, role: operator}
    - {id: site_admin, sha256: b52aa8aa128a1e000ac3c35f0b7b16dee3a2baa5950139e03447d04d7689ea0f, role: admin}
emergency: {override_permission: admin, override_token_ttl_seconds: 900, audit_all_overrides: true}
capabilities:
  do_vent_zone_c:
    rules:
      - {type: permission, require: [operator]}
      - {type: time_window, deny_during: [day, night]}
      - {type: range_guard, min: 0, max: 50, on_violation: deny}
      - {type: cooldown, ms: 600000}
gate:
  fail_closed: deny
  l0:
    deny:
      - {name: vent_shut, tool: do_vent_zone_c, range: {arg: value, min: 0, max: 5}}
    allow:
      - {name: vent, tool: do_vent_zone_c}
`

// TestHostileEmergencyOverrideLiftsOnlyWindows: an admin's override lifts
// the (always active) deny window and nothing else: not the role, range,
// gate deny or cooldown; bad TTLs and non-admin callers are refused.
func TestHostileEmergencyOverrideLiftsOnlyWindows(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "ov.yml")
	os.WriteFile(p, []byte(overridePolicy), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p}})
	op := connectAs(t, d, "2026-07-28", operatorToken, nil)
	viewer := connectAs(t, d, "2026-07-28", viewerToken, nil)
	if a := doCall(t, op, "do_vent_zone_c", map[string]any{"value": 30, "idempotency_key": "ov-0"}); a.Permission != "policy_denied" {
		t.Fatalf("inside the deny window: %s%s", a.raw, a.toolErr)
	}
	postAs := func(token, body string) int {
		req, _ := http.NewRequest(http.MethodPost, d.url("/emergency/override"), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct{ token, body string }{
		{operatorToken, `{"reason":"fire","ttl_s":60}`},
		{viewerToken, `{"reason":"fire","ttl_s":60}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":0}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":-5}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":901}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":9223372037}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":1e3}`},
		{adminDemoToken, `{"reason":"   ","ttl_s":60}`},
		{adminDemoToken, `{"reason":"fire","ttl_s":60,"lifts":["cooldown"]}`},
	} {
		if code := postAs(c.token, c.body); code == http.StatusOK {
			t.Errorf("override %s by %s accepted", c.body, c.token[:20])
		}
	}
	if a := doCall(t, op, "do_vent_zone_c", map[string]any{"value": 30, "idempotency_key": "ov-1"}); a.Permission != "policy_denied" {
		t.Fatalf("refused overrides still lifted the window: %s%s", a.raw, a.toolErr)
	}
	if code := postAs(adminDemoToken, `{"reason":"smoke in zone C","ttl_s":120}`); code != http.StatusOK {
		t.Fatalf("admin override: %d", code)
	}
	checks := []struct {
		cs   *mcp.ClientSession
		v    int
		want string
	}{
		{viewer, 30, "permission_insufficient"},
		{op, 60, "out_of_range"},
		{op, 3, "policy_denied"},
		{op, 30, "allowed"},
		{op, 31, "cooldown_active"},
	}
	for i, c := range checks {
		a := doCall(t, c.cs, "do_vent_zone_c", map[string]any{"value": c.v, "idempotency_key": fmt.Sprint("ov-x-", i)})
		if a.Permission != c.want {
			t.Errorf("during the override, value %d: %s %s%s; want %s", c.v, a.Status, a.Permission, a.toolErr, c.want)
		}
	}
	if w := d.sim(t).writes("zone_c.vent"); w != 1 {
		t.Errorf("%d vent writes during the override, want 1", w)
	}
}

// TestHostileLateRefusalsGiveSlotsBack: refusals that come after the rate
// slot was reserved (an L0 gate deny, an approval the client cannot give,
// a device unreachable before the write), sent concurrently, give every
// slot back: the two real actuations of the minute still happen.
func TestHostileLateRefusalsGiveSlotsBack(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "late.yml")
	os.WriteFile(p, []byte(`physmcp_policy_version: "0.1"
capabilities:
  do_fan_zone_b:
    rules:
      - {type: rate, max: "2/min"}
      - {type: approval, when: above, above: 80}
gate:
  fail_closed: deny
  l0:
    deny:
      - {name: fan_max, tool: do_fan_zone_b, range: {arg: value, min: 90, max: 100}}
    allow:
      - {name: fan, tool: do_fan_zone_b}
`), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", p}})
	cs := connectHTTP(t, d, "2026-07-28")
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Go(func() {
			doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 95, "idempotency_key": fmt.Sprint("late-deny-", i)})
		})
		wg.Go(func() {
			doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 85, "idempotency_key": fmt.Sprint("late-ask-", i)})
		})
	}
	wg.Wait()
	d.fault(t, "zone_b.fan", "offline")
	for i := range 10 {
		wg.Go(func() {
			doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": fmt.Sprint("late-off-", i)})
		})
	}
	wg.Wait()
	d.fault(t, "zone_b.fan", "none")
	ok := 0
	for i := range 3 {
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 30 + i, "idempotency_key": fmt.Sprint("late-real-", i)})
		if a.Status == "success" {
			ok++
		} else if i < 2 {
			t.Errorf("real actuation %d after 30 late refusals: %s", i, a.raw)
		}
	}
	if w := d.sim(t).writes("zone_b.fan"); ok != 2 || w != 2 {
		t.Errorf("%d successes, %d writes; want 2 and 2", ok, w)
	}
}

// TestHostileApprovalRefusalIsCoherent: a client that cannot be asked gets
// one refusal whose parts agree: permission requires_human_approval,
// policy.decision approval_required (not "allowed"), the reason once, and
// can_do says the same before the call. Over both eras.
func TestHostileApprovalRefusalIsCoherent(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	for _, era := range eras {
		cs := connectAs(t, d, era, operatorToken, nil)
		res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "coherent-" + era})
		var r struct {
			Status     string `json:"status"`
			Permission string `json:"permission"`
			Reason     string `json:"reason"`
			Policy     struct {
				Decision string `json:"decision"`
			} `json:"policy"`
		}
		json.Unmarshal([]byte(text(res)), &r)
		if r.Status != "failed" || r.Permission != "requires_human_approval" || r.Policy.Decision == "allowed" {
			t.Errorf("%s: %s", era, text(res))
		}
		if why := "values above 60"; strings.Count(r.Reason, why) != 1 {
			t.Errorf("%s: the reason says %q %d times: %s", era, why, strings.Count(r.Reason, why), r.Reason)
		}
	}
	if w := d.sim(t).writes("zone_a.heater"); w != 0 {
		t.Errorf("%d heater writes without approval", w)
	}
}

// TestHostileKillMidActuationKeepsQuota: a SIGKILL while an actuation is in
// its device step must not hand its rate or cooldown slot back: after the
// restart the limits count it (the write may have landed).
func TestHostileKillMidActuationKeepsQuota(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	pol := writePolicy(t, gateL0)
	d := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	cs := connectHTTP(t, d, "2026-07-28")
	if a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 20, "idempotency_key": "q-1"}); a.Status != "success" {
		t.Fatalf("first fan call: %s", a.raw)
	}
	d.setFault(t, "zone_b.fan", "slow", 1500)
	d.setFault(t, "zone_c.vent", "slow", 1500)
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 21, "idempotency_key": "q-2"}})
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_vent_zone_c", Arguments: map[string]any{"value": 21, "idempotency_key": "q-v"}})
	d.waitSim(t, "both writes", func(s simState) bool { return s.writes("zone_b.fan") >= 2 && s.writes("zone_c.vent") >= 1 })
	d.cmd.Process.Kill()
	<-d.done
	d2 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	cs2 := connectHTTP(t, d2, "2026-07-28")
	if a := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 22, "idempotency_key": "q-3"}); a.Permission != "rate_limited" {
		t.Errorf("third fan actuation in the minute, after a kill mid-actuation: %s %s%s; want rate_limited", a.Status, a.Permission, a.toolErr)
	}
	if a := doCall(t, cs2, "do_vent_zone_c", map[string]any{"value": 22, "idempotency_key": "q-v2"}); a.Permission != "cooldown_active" {
		t.Errorf("vent inside its cooldown, after a kill mid-actuation: %s %s%s; want cooldown_active", a.Status, a.Permission, a.toolErr)
	}
	// The restart's only writes are the drives of the greenhouse's
	// start_after_crash outputs to safe (heater_zone_a, irrigation_valve).
	s := d2.sim(t)
	if w := d2.totalWrites(t) - s.writes("zone_a.heater") - s.writes("irrigation_a.command"); w != 0 {
		t.Errorf("%d writes after the restart besides the safe states", w)
	}
	if got := safeAudit(t, state); got["start_after_crash/success"] != 2 {
		t.Errorf("start_after_crash safe states after the kill: %v; want 2 verified", got)
	}
}

// TestHostileOutcomeNoisyAndPlantWideSlow: a noisy read-back is never called
// verified unless it shows the value; a plant-wide delay beyond the timeout
// fails before anything is written.
func TestHostileOutcomeNoisyAndPlantWideSlow(t *testing.T) {
	t.Parallel()
	d, cs := startOutcomeRig(t)
	if code, b := d.request(t, "POST", "/sim/plant/fault", `{"point":"zone_b.fan","mode":"noisy","noise":4}`); code != http.StatusOK {
		t.Fatalf("noisy: %d %s", code, b)
	}
	for i := range 5 {
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 40 + i, "idempotency_key": fmt.Sprint("noisy-", i)})
		inVocabulary(t, "noisy", a)
		if a.Status == "success" && string(a.AppliedValue) != fmt.Sprint(40+i) {
			t.Errorf("noisy read-back called verified: %s", a.raw)
		}
		if a.Status == "failed" {
			t.Errorf("noisy fan, the write landed, answer failed: %s", a.raw)
		}
	}
	d.fault(t, "zone_b.fan", "none")
	w := d.sim(t).writes("zone_c.vent")
	d.setFault(t, "*", "slow", 2500)
	a := doCall(t, cs, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "all-slow"})
	d.setFault(t, "*", "none", 0)
	inVocabulary(t, "plant-wide slow", a)
	if a.Status != "failed" || d.sim(t).writes("zone_c.vent") != w {
		t.Errorf("plant 2.5 s slow (timeout 2 s): %s; want failed before any write", a.raw)
	}
}

// TestHostileKeyMarkupOnStatusPage: a key is free text within its rules (no
// spaces or control characters), so it may be markup; the status page that
// lists recent do_ answers must escape it.
func TestHostileKeyMarkupOnStatusPage(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	for _, k := range []string{`<svg/onload=alert(1)>`, `"><script>alert(1)</script>`, `</textarea><iframe/src=//evil>`} {
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": k})
		if a.toolErr != "" {
			continue
		}
	}
	_, page := d.request(t, "GET", "/", "")
	if !strings.Contains(string(page), "svg/onload") {
		t.Logf("the status page does not show the keys at all (nothing to escape)")
	}
	// The page draws its own charts as inline <svg>: look for the keys' markup.
	for _, bad := range []string{"<svg/onload", "<script>alert", "<iframe"} {
		if strings.Contains(string(page), bad) {
			t.Errorf("the status page carries %q unescaped", bad)
		}
	}
}

// TestHostileHeaderBodyToolMismatch: a 2026-07-28 request names its tool
// twice, in the Mcp-Name header (which gateways route and authorise on
// without parsing the body) and in params.name. A request whose header says
// a read_ tool while the body runs a do_ must be refused, as must a body
// that names the tool twice (JSON duplicate or case variant).
func TestHostileHeaderBodyToolMismatch(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	send := func(header, params string) string {
		body := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":` + params + `}`
		code, m := post(t, d, "tools/call", header, []byte(body))
		return rawOutcome(code, m)
	}
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	args := `"arguments":{"value":30,"idempotency_key":"hdr-%d"}`
	for i, c := range []struct{ header, params string }{
		{"read_temperature_zone_a", `{"name":"do_fan_zone_b",` + fmt.Sprintf(args, 1) + `,` + meta + `}`},
		{"do_vent_zone_c", `{"name":"do_fan_zone_b",` + fmt.Sprintf(args, 2) + `,` + meta + `}`},
		{"read_temperature_zone_a", `{"name":"read_temperature_zone_a","name":"do_fan_zone_b",` + fmt.Sprintf(args, 3) + `,` + meta + `}`},
		{"read_temperature_zone_a", `{"name":"read_temperature_zone_a","Name":"do_fan_zone_b",` + fmt.Sprintf(args, 4) + `,` + meta + `}`},
	} {
		if o := send(c.header, c.params); o == "success" || o == "partial" {
			t.Errorf("case %d: Mcp-Name %q, body %s: %s", i+1, c.header, c.params, o)
		}
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("requests whose Mcp-Name header named another tool moved the plant %d times", w)
	}
	// Baseline: header and body agree, the call runs.
	if o := send("do_fan_zone_b", `{"name":"do_fan_zone_b",`+fmt.Sprintf(args, 9)+`,`+meta+`}`); o != "success" {
		t.Errorf("baseline: %s", o)
	}
}

// TestHostileDiskFullMidRun: the disk stops accepting writes while physd
// runs (RLIMIT_FSIZE: EFBIG, as on a full SD card), first for the audit
// trail, or first for the ledger database. The actuation that finds out is
// answered truthfully; every later do_ is refused with nothing written
// (failed/audit_unavailable, or a tool error that says nothing moved); and
// /readyz reports the component that cannot write.
func TestHostileDiskFullMidRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name      string
		limit     int
		component string
	}{{"audit-first", 160_000, "audit"}, {"ledger-first", 160_000, "store"}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			diskFull(t, c.limit, c.component)
		})
	}
}

func diskFull(t *testing.T, limit int, component string) {
	state := t.TempDir()
	args := []string{"--fsize=" + fmt.Sprint(limit), "--", physdBin, "run", "--manifest", greenhouse, "--state", state, "--http", "127.0.0.1:0", "--sim-control"}
	d := &daemon{cmd: exec.Command("prlimit", args...), state: state, stderr: &syncBuffer{}, done: make(chan error, 1)}
	d.cmd.Stderr = d.stderr
	if err := d.cmd.Start(); err != nil {
		t.Skip("prlimit:", err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	t.Cleanup(func() { d.stop(t) })
	d.addr = d.stderr.logValue(t, "listening", "addr")
	d.stderr.logValue(t, "ready", "ready")
	cs := connectHTTP(t, d, "2026-07-28")
	var failedAt = -1
	pad := strings.Repeat("k", 100)
	for i := range 2000 {
		// Refusals (out of range) are audited but not ledgered: they fill the audit only.
		value, want := i%100, "success"
		if component == "audit" {
			value, want = 1000+i, "failed"
		}
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": value, "idempotency_key": fmt.Sprint(pad, i)})
		inVocabulary(t, "disk filling", a)
		if a.toolErr != "" || a.Status != want || strings.Contains(a.Reason, "audit") || !strings.Contains(a.raw, `"audit":{"seq"`) {
			failedAt = i
			t.Logf("call %d: %s%s", i, truncateText(a.raw), a.toolErr)
			break
		}
	}
	if failedAt < 0 {
		t.Fatal("the disk never filled up")
	}
	w := d.sim(t).writes("zone_b.fan")
	for i := range 3 {
		a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 50 + i, "idempotency_key": fmt.Sprint("after-full-", i)})
		refused := (a.Status == "failed" && a.Code == "audit_unavailable") || (a.toolErr != "" && !strings.Contains(a.toolErr, "unknown"))
		if !refused {
			t.Errorf("do_ after the %s filled up: status %s (reason: %s)%s; want it refused with nothing written "+
				"(the small audit_check probe fits in the last bytes, so auditReady says the audit works, the plant moves, and the do_'s own audit line fails)",
				component, a.Status, a.Reason, a.toolErr)
		}
	}
	if w2 := d.sim(t).writes("zone_b.fan"); w2 != w {
		t.Errorf("%d actuations with a full disk", w2-w)
		b, _ := os.ReadFile(filepath.Join(d.state, "audit", "audit.jsonl"))
		t.Logf("audit file: %d bytes; last 600: %q", len(b), b[max(0, len(b)-600):])
	}
	resp, err := http.Get(d.url("/readyz"))
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var rd struct {
			Checks []struct {
				Name string `json:"name"`
				OK   bool   `json:"ok"`
			} `json:"checks"`
		}
		json.Unmarshal(b, &rd)
		// RLIMIT_FSIZE limits every file of the process: the audit's
		// headroom check may name the limit before the ledger hits it.
		reported := false
		for _, ch := range rd.Checks {
			if (ch.Name == component || ch.Name == "audit") && !ch.OK {
				reported = true
			}
		}
		if resp.StatusCode != http.StatusServiceUnavailable || !reported {
			t.Errorf("/readyz while the %s cannot be written and every do_ is refused: %d %s; want 503 naming %s", component, resp.StatusCode, b, component)
		}
	}
}

// TestHostileMeshRoutedConcurrency: do_ calls for gw_zone_b's fan sent at
// once through gw_zone_a (routed) and to gw_zone_b directly share the
// owner's ledger and limits: one key actuates once across both doors; a
// 2/min rate gives exactly 2 writes; sources that are not the owner move
// nothing.
func TestHostileMeshRoutedConcurrency(t *testing.T) {
	dir := t.TempDir()
	pol := filepath.Join(dir, "b.policy.yml")
	os.WriteFile(pol, []byte(`physmcp_policy_version: "0.1"
capabilities:
  do_fan_zone_b:
    rules:
      - {type: rate, max: "2/min"}
gate:
  fail_closed: deny
  l0:
    allow:
      - {name: fan, tool: do_fan_zone_b}
`), 0o600)
	start := func(n, ip string, extra ...string) *daemon {
		args := append([]string{"run", "--manifest", repoPath("examples/mesh-3node/node_" + n + ".yml"), "--state", dir + "/" + n, "--http", ip + ":0", "--sim-control"}, extra...)
		d := &daemon{cmd: exec.Command(physdBin, args...), state: dir + "/" + n, stderr: &syncBuffer{}, done: make(chan error, 1)}
		d.cmd.Stderr = d.stderr
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { d.done <- d.cmd.Wait() }()
		t.Cleanup(func() { d.stop(t) })
		d.addr = d.stderr.logValue(t, "listening", "addr")
		d.stderr.logValue(t, "mesh joined", "node")
		return d
	}
	b := start("b", "127.0.0.3", "--policy", pol)
	a := start("a", "127.0.0.2")
	csA, csB := connectHTTP(t, a, "2026-07-28"), connectHTTP(t, b, "2025-11-25")
	deadline := time.Now().Add(20 * time.Second)
	for listTools(t, csA)["do_fan_zone_b"] == nil {
		if time.Now().After(deadline) {
			t.Fatal("gw_zone_a never listed gw_zone_b's fan")
		}
		time.Sleep(200 * time.Millisecond)
	}
	b.setFault(t, "zone_b.fan", "slow", 100)
	for _, src := range []string{"gw_zone_b;reboot", "gw_zone_c", "gw_zone_a", "GW_ZONE_B", ""} {
		args := map[string]any{"value": 33, "idempotency_key": "src-" + src}
		if src != "" {
			args["source"] = src
		}
		if r := doCall(t, csA, "do_fan_zone_b", args); r.Status == "success" || r.Status == "partial" {
			t.Errorf("source %q through gw_zone_a: %s", src, r.raw)
		}
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 0 {
		t.Fatalf("bad sources moved gw_zone_b's fan %d times", w)
	}
	// One key through both doors at once.
	out := make([]hAnswer, 12)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			if i%2 == 0 {
				out[i] = doCall(t, csA, "do_fan_zone_b", map[string]any{"value": 44, "idempotency_key": "two-doors", "source": "gw_zone_b"})
			} else {
				out[i] = doCall(t, csB, "do_fan_zone_b", map[string]any{"value": 44, "idempotency_key": "two-doors"})
			}
		})
	}
	wg.Wait()
	for i, o := range out {
		if o.Status != "success" || o.raw != out[1].raw {
			t.Errorf("two doors, call %d: %s%s\nwant the owner's answer, byte for byte: %s", i, o.raw, o.toolErr, out[1].raw)
		}
	}
	if w := b.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("one key through gw_zone_a and gw_zone_b at once: %d writes, want 1", w)
	}
	// Distinct keys through both doors: the owner's 2/min leaves one more.
	for i := range 16 {
		wg.Go(func() {
			if i%2 == 0 {
				doCall(t, csA, "do_fan_zone_b", map[string]any{"value": 10 + i, "idempotency_key": fmt.Sprint("mesh-burst-", i), "source": "gw_zone_b"})
			} else {
				doCall(t, csB, "do_fan_zone_b", map[string]any{"value": 10 + i, "idempotency_key": fmt.Sprint("mesh-burst-", i)})
			}
		})
	}
	wg.Wait()
	if w := b.sim(t).writes("zone_b.fan"); w != 2 {
		t.Errorf("2/min on the owner, 16 callers through two gateways: %d writes, want 2", w)
	}
}

// TestHostileDeclineAfterTheKeyActuated: two approval rounds for one key;
// the first is accepted (the fan moves, the key records success), then the
// second is declined. The decline must not answer "failed: nothing was
// actuated" for a key whose operation was applied: the key's answer is the
// recorded one (or a tool error), never a contradicting failed.
func TestHostileDeclineAfterTheKeyActuated(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", writeApprovalPolicy(t)}})
	cs := connectMRTR(t, d, operatorToken)
	r1 := approvalRoundFor(t, cs, "do_fan_zone_b", 47, "dual")
	r2 := approvalRoundFor(t, cs, "do_fan_zone_b", 47, "dual")
	res, err := cs.CallTool(context.Background(), answerRound(r1.RequestState, "do_fan_zone_b", 47, "dual", confirm()))
	first := decodeDo(t, res, err)
	if first.Status != "success" {
		t.Fatalf("accepted round: %s%s", first.raw, first.toolErr)
	}
	decline := mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "decline"}}
	res, err = cs.CallTool(context.Background(), answerRound(r2.RequestState, "do_fan_zone_b", 47, "dual", decline))
	second := decodeDo(t, res, err)
	if second.Status == "failed" {
		t.Errorf("key \"dual\" was applied (success, the fan shows %v) but the declined second round answers for the same key: failed, %q; "+
			"want the recorded answer (or a tool error)", d.sim(t).Signals["zone_b.fan"], second.Reason)
	}
	if w := d.sim(t).writes("zone_b.fan"); w != 1 {
		t.Errorf("%d writes, want 1", w)
	}
}

// TestHostileSlowDeviceReadsAndCanDo: with every device slow (3 s, beyond
// the 2 s timeout), can_do still answers within its budget, and 10
// concurrent fresh reads of one capability share one device read.
func TestHostileSlowDeviceReadsAndCanDo(t *testing.T) {
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	d.setFault(t, "zone_b.humidity", "slow", 1000)
	r0 := d.sim(t).reads("zone_b.humidity")
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() { call(t, cs, "read_humidity_zone_b", map[string]any{"max_age_ms": 0}) })
	}
	wg.Wait()
	if n := d.sim(t).reads("zone_b.humidity") - r0; n > 2 {
		t.Errorf("10 concurrent fresh reads cost %d device reads, want 1 (single flight)", n)
	}
	d.setFault(t, "*", "slow", 3000)
	start := time.Now()
	call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "action": "set", "value": 40, "location": "zone_b"}})
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("can_do with every device 3 s slow took %v; its observations have a 150 ms budget", took)
	}
	d.setFault(t, "*", "none", 0)
}

// TestHostileReleasedSlotsStayReleasedAcrossRestart: slots given back by
// device refusals (unreachable before the write, begun then released) do
// not come back after a restart; the begun-and-kept one does.
func TestHostileReleasedSlotsStayReleasedAcrossRestart(t *testing.T) {
	t.Parallel()
	state := t.TempDir()
	pol := writePolicy(t, gateL0)
	d := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	cs := connectHTTP(t, d, "2026-07-28")
	if a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 20, "idempotency_key": "rel-ok"}); a.Status != "success" {
		t.Fatalf("first: %s", a.raw)
	}
	d.fault(t, "zone_b.fan", "offline")
	for i := range 5 {
		if a := doCall(t, cs, "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": fmt.Sprint("rel-off-", i)}); a.Permission != "source_unreachable" {
			t.Fatalf("offline: %s", a.raw)
		}
	}
	d.stop(t)
	d2 := startHTTP(t, daemonOpts{state: state, extra: []string{"--policy", pol}})
	cs2 := connectHTTP(t, d2, "2026-07-28")
	if a := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 21, "idempotency_key": "rel-2"}); a.Status != "success" {
		t.Errorf("second real actuation after 5 released refusals and a restart: %s", a.raw)
	}
	if a := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 22, "idempotency_key": "rel-3"}); a.Permission != "rate_limited" {
		t.Errorf("third real actuation: %s", a.raw)
	}
	// The refused keys committed nothing: they may run now (and are rate limited).
	if a := doCall(t, cs2, "do_fan_zone_b", map[string]any{"value": 30, "idempotency_key": "rel-off-0"}); a.Permission != "rate_limited" {
		t.Errorf("a released key after restart: %s%s", a.raw, a.toolErr)
	}
}

// hostileModbusManifest is a one-unit Modbus TCP device at ADDR: an int pump speed
// (holding register 40002) and an enum mode (40003).
const hostileModbusManifest = `physmcp_version: "0.1"
device: {id: gw_modbus_attack, type: boiler_controller, location: {zone: boiler_room}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}], mesh: {enabled: false}}
buses:
  boiler: {type: modbus_tcp, address: "ADDR", timeout_ms: 300, down_after: 100, retry_backoff_ms: 100, max_backoff_ms: 200}
capabilities:
  - name: pump_speed
    kind: do
    description: Circulation pump speed in percent.
    binding: {type: modbus, bus: boiler, address: "slave=1:reg=40002", data_type: uint16}
    data_type: int
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [pump]
    timeout_ms: 300
  - name: operating_mode
    kind: do
    description: Operating mode of the boiler controller.
    binding: {type: modbus, bus: boiler, address: "slave=1:reg=40003", enum_map: {off: 0, heating: 1, hot_water: 2}}
    data_type: enum
    enum_values: [off, heating, hot_water]
    semantic_tags: [mode]
    timeout_ms: 300
audit: {enabled: true, retention_days: 30}
`

// TestHostileModbusOutcomes: the outcome vocabulary on a Modbus TCP device
// that refuses, fails, loses replies and read-backs, and enum values of
// every wrong shape.
func TestHostileModbusOutcomes(t *testing.T) {
	t.Parallel()
	bank := modbustest.NewBank(16)
	srv, err := modbustest.StartTCP("127.0.0.1:0", bank)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	m := filepath.Join(t.TempDir(), "modbus.yml")
	os.WriteFile(m, []byte(strings.Replace(hostileModbusManifest, "ADDR", srv.Addr, 1)), 0o600)
	d := startHTTP(t, daemonOpts{manifest: m})
	cs := connectHTTP(t, d, "2026-07-28")
	pump := func() uint16 { return bank.Holding(1, 1, 1)[0] }
	var wroteOnce atomic.Bool
	type fault struct {
		name      string
		delay     func(modbustest.Request) time.Duration
		fault     func(modbustest.Request) error
		want      []string // acceptable status/code
		mustApply int      // -1: no claim; 0: the register must be unchanged; 1: changed
	}
	isWrite := func(r modbustest.Request) bool { return r.Write && r.Addr == 1 }
	cases := []fault{
		{"clean", nil, nil, []string{"success/"}, 1},
		{"write refused, illegal value", nil, func(r modbustest.Request) error {
			if isWrite(r) {
				return modbustest.IllegalDataValue
			}
			return nil
		}, []string{"failed/illegal_data_value"}, 0},
		{"write answered device failure", nil, func(r modbustest.Request) error {
			if isWrite(r) {
				return modbustest.DeviceFailure
			}
			return nil
			// Exception 04 and a read-back that shows the previous value:
			// the device answered and nothing changed (issue 11: an
			// exception is failed with its code); the register check below
			// holds the answer to it.
		}, []string{"failed/server_device_failure", "partial/outcome_unknown", "partial/mismatch"}, 0},
		{"write reply lost (applied late)", func(r modbustest.Request) time.Duration {
			if isWrite(r) {
				return 800 * time.Millisecond
			}
			return 0
		}, nil, []string{"partial/outcome_unknown", "success/"}, -1},
		{"read-back lost", func(r modbustest.Request) time.Duration {
			if isWrite(r) {
				wroteOnce.Store(true)
			} else if r.Addr == 1 && wroteOnce.Load() {
				return 800 * time.Millisecond
			}
			return 0
		}, nil, []string{"partial/unverified"}, 1},
		{"previous read lost", func(r modbustest.Request) time.Duration {
			if !r.Write && r.Addr == 1 {
				return 800 * time.Millisecond
			}
			return 0
		}, nil, []string{"failed/device_offline"}, 0},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			wroteOnce.Store(false)
			bank.SetDelay(c.delay)
			bank.SetFault(c.fault)
			before := pump()
			v := 10 + 7*i
			a := doCall(t, cs, "do_pump_speed", map[string]any{"value": v, "idempotency_key": fmt.Sprint("mb-", i)})
			bank.SetDelay(nil)
			bank.SetFault(nil)
			time.Sleep(900 * time.Millisecond) // a late write lands before the register is compared
			inVocabulary(t, c.name, a)
			got := a.Status + "/" + a.Code
			ok := false
			for _, w := range c.want {
				ok = ok || got == w
			}
			if !ok {
				t.Errorf("%s: answered %s (%s); want one of %v", c.name, got, a.raw+a.toolErr, c.want)
			}
			after := pump()
			switch {
			case a.Status == "failed" && after != before:
				t.Errorf("%s: failed, but the register went %d -> %d", c.name, before, after)
			case a.Status == "success" && int(after) != v:
				t.Errorf("%s: success, but the register shows %d", c.name, after)
			case c.mustApply == 1 && int(after) != v:
				t.Errorf("%s: the write should have landed (register %d)", c.name, after)
			}
		})
	}
	// Enum values of every wrong shape never reach the register.
	bank.ResetCount()
	for _, v := range []any{"OFF", "Off", " off", "heating ", "", "hot-water", 1, 0, true, nil, []string{"off"}, "off\x00", "оff" /* Cyrillic o */} {
		a := doCall(t, cs, "do_operating_mode", map[string]any{"value": v, "idempotency_key": fmt.Sprintf("enum-%q", fmt.Sprint(v))})
		if a.toolErr == "" {
			t.Errorf("enum value %#v accepted: %s", v, a.raw)
		}
	}
	for _, r := range bank.Requests() {
		if r.Write {
			t.Errorf("a bad enum value wrote the device: %+v", r)
		}
	}
	if a := doCall(t, cs, "do_operating_mode", map[string]any{"value": "hot_water", "idempotency_key": "enum-ok"}); a.Status != "success" || bank.Holding(1, 2, 1)[0] != 2 {
		t.Errorf("enum hot_water: %s%s (register %d)", a.raw, a.toolErr, bank.Holding(1, 2, 1)[0])
	}
}

// TestHostileBatchesAndEnvelopes: JSON-RPC batches, duplicate ids and odd
// envelopes never smuggle a do_ past the Mcp-Method/Mcp-Name headers.
func TestHostileBatchesAndEnvelopes(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
	do := func(id int, key string) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":30,"idempotency_key":%q},%s}}`, id, key, meta)
	}
	read := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_temperature_zone_a","arguments":{},` + meta + `}}`
	for i, c := range []struct{ method, name, body string }{
		{"tools/call", "read_temperature_zone_a", "[" + read + "," + do(2, "batch-1") + "]"},
		{"tools/call", "do_fan_zone_b", "[" + do(1, "batch-2") + "," + do(1, "batch-3") + "]"},
		{"tools/list", "", do(1, "batch-4")},
		{"tools/call", "read_temperature_zone_a", `{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":30,"idempotency_key":"batch-5"},` + meta + `}}`},
		{"ping", "", `{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"do_fan_zone_b","arguments":{"value":30,"idempotency_key":"batch-6"},` + meta + `}}`},
	} {
		code, m := post(t, d, c.method, c.name, []byte(c.body))
		t.Logf("case %d: HTTP %d %v", i+1, code, truncateText(fmt.Sprint(m)))
	}
	if w := d.totalWrites(t); w != 0 {
		t.Errorf("batches and odd envelopes moved the plant %d times", w)
	}
	d.healthy(t)
}

// TestHostileMixedBattery250: 250 requests at once over both eras — valid
// do_ calls on four tools (some keys sent three times), hostile arguments,
// reads and can_do — against a plant with a slow fan: every valid key
// actuates exactly once and its copies get identical bytes, every hostile
// call is a tool error, and nothing else moves.
func TestHostileMixedBattery250(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	modern, legacy := connectHTTP(t, d, "2026-07-28"), connectHTTP(t, d, "2025-11-25")
	d.setFault(t, "zone_b.fan", "slow", 30)
	tools := []string{"do_fan_zone_b", "do_vent_zone_c", "do_heater_zone_c", "do_irrigation_valve"}
	points := map[string]string{"do_fan_zone_b": "zone_b.fan", "do_vent_zone_c": "zone_c.vent", "do_heater_zone_c": "zone_c.heater", "do_irrigation_valve": "irrigation_a.command"}
	type job struct {
		tool string
		args any
		kind string // valid | hostile | other
		key  string
	}
	var jobs []job
	keysPerTool := map[string]int{}
	for i := range 60 {
		tool := tools[i%4]
		key := fmt.Sprintf("bat-%s-%d", tool, i)
		keysPerTool[tool]++
		n := 1
		if i%5 == 0 {
			n = 3
		}
		for range n {
			jobs = append(jobs, job{tool, map[string]any{"value": 5 + i, "idempotency_key": key}, "valid", key})
		}
	}
	hostile := []any{
		map[string]any{"value": "x", "idempotency_key": "h"},
		map[string]any{"value": 1e308, "idempotency_key": "h"},
		map[string]any{"value": 10},
		map[string]any{"value": 10, "idempotency_key": "h", "source": "elsewhere"},
		map[string]any{"value": 10, "idempotency_key": "h h"},
		map[string]any{"value": []any{1}, "idempotency_key": "h"},
		map[string]any{"value": 10, "idempotency_key": "h", "extra": 1},
	}
	for i := len(jobs); len(jobs) < 200; i++ {
		jobs = append(jobs, job{tools[i%4], hostile[i%len(hostile)], "hostile", ""})
	}
	for len(jobs) < 250 {
		if len(jobs)%2 == 0 {
			jobs = append(jobs, job{"read_humidity_zone_b", map[string]any{"max_age_ms": 0}, "other", ""})
		} else {
			jobs = append(jobs, job{"can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"fan"}, "action": "set", "value": 40}}, "other", ""})
		}
	}
	// "1e308" is a refusal (failed, out_of_range), not a tool error.
	results := make([]hAnswer, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		cs := modern
		if i%2 == 1 {
			cs = legacy
		}
		wg.Go(func() { results[i] = doCall(t, cs, j.tool, j.args) })
	}
	wg.Wait()
	byKey := map[string]string{}
	for i, j := range jobs {
		a := results[i]
		switch j.kind {
		case "valid":
			if a.Status != "success" {
				t.Errorf("valid %s %v: %s%s", j.tool, j.args, a.raw, a.toolErr)
			}
			if prev, ok := byKey[j.key]; ok && prev != a.raw {
				t.Errorf("key %s answered differently:\n%s\n%s", j.key, prev, a.raw)
			}
			byKey[j.key] = a.raw
		case "hostile":
			if a.toolErr == "" && !(a.Status == "failed" && a.Permission == "out_of_range") {
				t.Errorf("hostile %s %v: %s", j.tool, j.args, a.raw)
			}
			if strings.HasPrefix(a.toolErr, "protocol error") {
				t.Errorf("hostile %s %v: %s", j.tool, j.args, a.toolErr)
			}
		case "other":
			if strings.HasPrefix(a.toolErr, "protocol error") {
				t.Errorf("%s: %s", j.tool, a.toolErr)
			}
		}
	}
	s := d.sim(t)
	for tool, n := range keysPerTool {
		if w := s.writes(points[tool]); int(w) != n {
			t.Errorf("%s: %d writes for %d distinct keys", tool, w, n)
		}
	}
	d.healthy(t)
}

// TestLooksFirstIsNotVacuous: the outcome check above refuses the old dead
// end (a read_ tool the example does not serve) and a reason that names no
// tool, and takes a real read_ tool or can_do.
func TestLooksFirstIsNotVacuous(t *testing.T) {
	t.Parallel()
	for reason, want := range map[string]bool{
		"… Read read_vent_zone_c before acting again: …":                               false,
		"… before acting again.":                                                       false,
		"… Read read_temperature_zone_a before acting again: …":                        true,
		`… Look before acting again: call can_do with {"intent":{"semantic_tags":[]}}`: true,
	} {
		if got := looksFirst(reason); got != want {
			t.Errorf("looksFirst(%q) = %v, want %v", reason, got, want)
		}
	}
}
