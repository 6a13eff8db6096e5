package node_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

const testManifest = `physmcp_version: "0.1"
device: {id: test_node, type: greenhouse_controller, location: {zone: house}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18, tau_s: 60, heater_gain_c: 30}
      zone_b: {ambient_c: 12, initial_c: 18}
capabilities:
  - name: temperature_zone_a
    kind: read
    description: Air temperature in zone A.
    zone: zone_a
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: celsius
    range: {min: -10, max: 30}
    precision: 0.1
    semantic_tags: [temperature, air, zone_a]
    cache_ttl_ms: 2000
  - name: humidity_zone_b
    kind: read
    description: Humidity in zone B.
    zone: zone_b
    binding: {type: sim, bus: plant, point: zone_b.humidity}
    data_type: float
    unit: percent
    semantic_tags: [humidity, air, zone_b]
  - name: heater_zone_a
    kind: do
    description: Heater power in zone A.
    zone: zone_a
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heating, heater, temperature, zone_a]
    side_effects: [zone_a_temperature_change]
  - name: fan_zone_b
    kind: do
    description: Fan speed in zone B.
    zone: zone_b
    binding: {type: sim, bus: plant, point: zone_b.fan}
    data_type: int
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [fan, ventilation, humidity, cooling, zone_b]
`

type fixture struct {
	n     *node.Node
	plant *sim.Plant
	st    *store.Store
	al    *audit.Log
	dir   string
}

func open(t testing.TB, dir string) *fixture {
	t.Helper()
	n, st, al := openNode(t, dir, testManifest, node.Config{})
	f := &fixture{n: n, plant: n.Buses()["plant"].(*sim.Plant), st: st, al: al, dir: dir}
	t.Cleanup(f.close)
	return f
}

// openNode opens a node on the manifest src with its store and audit log
// in dir; cfg gives the rest (guard, remote). The caller closes them.
func openNode(t testing.TB, dir, src string, cfg node.Config) (*node.Node, *store.Store, *audit.Log) {
	t.Helper()
	m, err := manifest.Parse("test.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Manifest, cfg.Store, cfg.Audit = m, st, al
	n, err := node.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return n, st, al
}

func (f *fixture) close() {
	f.n.Close(context.Background())
	f.al.Close()
	f.st.Close()
}

func do(t testing.TB, n *node.Node, tool string, value any, key string) promcp.DoResult {
	t.Helper()
	raw, _ := json.Marshal(value)
	body, err := n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test"}})
	if err != nil {
		t.Fatalf("%s(%v): %v", tool, value, err)
	}
	var r promcp.DoResult
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestReadQualityOverTime walks one sensor through good → cached → stale →
// error, and a degraded value outside the physical range, on simulated time.
func TestReadQualityOverTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := open(t, t.TempDir())
		ctx := context.Background()
		read := func(maxAge time.Duration) promcp.Observation {
			o, err := f.n.Read(ctx, "read_temperature_zone_a", maxAge)
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		o := read(-1)
		if o.Quality != promcp.QualityGood || o.Cached || o.Value == nil {
			t.Fatalf("first read: %+v", o)
		}
		time.Sleep(1500 * time.Millisecond)
		if o2 := read(-1); !o2.Cached || o2.AgeMS != 1500 {
			t.Errorf("within cache_ttl_ms: %+v", o2)
		}
		if err := f.plant.SetFault("zone_a.temperature", sim.Fault{Mode: sim.FaultOffline}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second) // past the 2 s TTL
		if o3 := read(-1); o3.Quality != promcp.QualityStale || o3.Value != o.Value || !strings.Contains(o3.Reason, "offline") {
			t.Errorf("offline within the stale limit: %+v", o3)
		}
		time.Sleep(30 * time.Second) // past max(10×TTL, 30 s)
		if o4 := read(-1); o4.Quality != promcp.QualityError || o4.Value != nil {
			t.Errorf("offline past the stale limit: %+v", o4)
		}
		f.plant.ClearFaults()
		// Full heat drives the zone past the sensor's 30 °C range: degraded.
		do(t, f.n, "do_heater_zone_a", 100, "heat")
		time.Sleep(10 * time.Minute)
		if o5 := read(0); o5.Quality != promcp.QualityDegraded || !strings.Contains(o5.Reason, "outside") {
			t.Errorf("value beyond range: %+v", o5)
		}
	})
}

// TestConcurrentSameKey: many callers with one key cause one write and get
// one answer.
func TestConcurrentSameKey(t *testing.T) {
	f := open(t, t.TempDir())
	var wg sync.WaitGroup
	answers := make([]string, 16)
	for i := range answers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_fan_zone_b", Value: json.RawMessage("40"), IdempotencyKey: "same"})
			if err != nil {
				t.Error(err)
			}
			answers[i] = string(body)
		}()
	}
	wg.Wait()
	for _, a := range answers[1:] {
		if a != answers[0] {
			t.Fatalf("answers differ:\n%s\n%s", answers[0], a)
		}
	}
	if w := f.plant.Stats().Points["zone_b.fan"].Writes; w != 1 {
		t.Errorf("%d writes for one key", w)
	}
}

// TestStuckActuatorIsPartial: a write the device acknowledges but does not
// show is not success, and not failed either (the write may land later, or
// a local override may have reverted it): partial, code mismatch, with
// "read before acting again".
func TestStuckActuatorIsPartial(t *testing.T) {
	f := open(t, t.TempDir())
	if err := f.plant.SetFault("zone_a.heater", sim.Fault{Mode: sim.FaultStuck}); err != nil {
		t.Fatal(err)
	}
	r := do(t, f.n, "do_heater_zone_a", 55, "stuck-1")
	if r.Status != promcp.StatusPartial || r.Verified || r.Code != promcp.CodeMismatch ||
		!strings.Contains(r.Reason, "still shows the previous value") || !strings.Contains(r.Reason, "before acting again") {
		t.Errorf("stuck heater: %+v", r)
	}
	// The outcome is recorded: the same key replays it.
	if r2 := do(t, f.n, "do_heater_zone_a", 55, "stuck-1"); r2.Status != r.Status || r2.Timestamp != r.Timestamp {
		t.Errorf("replay of a recorded partial: %+v", r2)
	}
}

// TestPartialNamesAToolThatExists: a partial answer's "look before acting
// again" names a tool the agent can call. do_heater_zone_a has no
// read_heater_zone_a, so it names can_do with an intent that, sent as
// given, lists do_heater_zone_a with the device's current value.
func TestPartialNamesAToolThatExists(t *testing.T) {
	f := open(t, t.TempDir())
	if err := f.plant.SetFault("zone_a.heater", sim.Fault{Mode: sim.FaultStuck}); err != nil {
		t.Fatal(err)
	}
	r := do(t, f.n, "do_heater_zone_a", 55, "stuck-2")
	if r.Status != promcp.StatusPartial || strings.Contains(r.Reason, "read_heater_zone_a") {
		t.Fatalf("stuck heater: %+v; want partial naming no read_heater_zone_a (there is none)", r)
	}
	i := strings.Index(r.Reason, "call can_do with ")
	if i < 0 {
		t.Fatalf("reason %q: want it to name can_do", r.Reason)
	}
	rest := r.Reason[i+len("call can_do with "):]
	var req promcp.CanDoRequest
	if err := json.NewDecoder(strings.NewReader(rest)).Decode(&req); err != nil {
		t.Fatalf("the can_do arguments in %q do not parse: %v", rest, err)
	}
	rep, err := f.n.CanDo(context.Background(), req, node.Caller{ID: "test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Candidates {
		if c.Capability == "do_heater_zone_a" {
			if c.CurrentState == nil || c.CurrentState.Value == nil {
				t.Fatalf("candidate %+v: want the current value", c)
			}
			if v, _ := c.CurrentState.Value.(float64); v == 55 {
				t.Fatalf("current_state %v: the stuck heater does not hold 55", c.CurrentState.Value)
			}
			return
		}
	}
	t.Fatalf("can_do %+v: no candidate do_heater_zone_a in %+v", req, rep.Candidates)
}

// TestRefusalsAreNotRecorded: a refusal actuated nothing, so the same key
// may be used again once the cause is gone.
func TestRefusalsAreNotRecorded(t *testing.T) {
	f := open(t, t.TempDir())
	f.plant.SetFault("zone_b.fan", sim.Fault{Mode: sim.FaultOffline})
	if r := do(t, f.n, "do_fan_zone_b", 30, "retry-me"); r.Status != promcp.StatusFailed || r.Permission != promcp.PermSourceUnreachable {
		t.Fatalf("offline fan: %+v", r)
	}
	f.plant.ClearFaults()
	if r := do(t, f.n, "do_fan_zone_b", 30, "retry-me"); r.Status != promcp.StatusSuccess || !r.Verified {
		t.Errorf("retry after the device came back: %+v", r)
	}
	if r := do(t, f.n, "do_fan_zone_b", 300, "too-much"); r.Permission != promcp.PermOutOfRange || r.Status != promcp.StatusFailed {
		t.Errorf("out of range: %+v", r)
	}
}

// TestRecoveryOfInterruptedActuation: a stop between "device may be
// touched" and "outcome recorded" is resolved at start, never re-actuated,
// and never answered failed when the write may have landed.
func TestRecoveryOfInterruptedActuation(t *testing.T) {
	dir := t.TempDir()
	// The state a kill leaves: pending keys; for one of them the answer
	// reached the audit trail (the reply was on its way).
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"audited": "70", "lost": "70", "zero": "0"} {
		st.Begin(store.LedgerEntry{Key: k, Tool: "do_fan_zone_b", ArgsHash: hashOf(t, v), Created: time.Now(),
			Pending: json.RawMessage(`{"value":` + v + `}`)}, nil)
	}
	st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	answer := `{"status":"success","idempotency_key":"audited","applied_value":70,"audit":{"seq":1}}`
	al.Append(&audit.Record{Event: "do", Tool: "do_fan_zone_b", IdempotencyKey: "audited", Status: "success", Answer: json.RawMessage(answer)})
	al.Close()

	f := open(t, dir)
	if pending, _ := f.st.PendingEntries(); len(pending) != 0 {
		t.Fatalf("%d entries still pending after recovery", len(pending))
	}
	if e, _ := f.st.Lookup("audited"); e == nil || string(e.Response) != answer {
		t.Errorf("audited actuation recovered as %s, want the audited answer byte for byte", e.Response)
	}
	var got promcp.DoResult
	// The restarted plant shows 0, not 70: the write may never have been
	// sent, or landed and was changed since. Unknown, not failed.
	e, _ := f.st.Lookup("lost")
	json.Unmarshal(e.Response, &got)
	if got.Status != promcp.StatusPartial || got.Code != promcp.CodeOutcomeUnknown || got.Verified || !strings.Contains(got.Reason, "physd stopped") {
		t.Errorf("interrupted actuation recovered as %+v", got)
	}
	// The device shows the requested value: that much is verified.
	e, _ = f.st.Lookup("zero")
	got = promcp.DoResult{}
	json.Unmarshal(e.Response, &got)
	if got.Status != promcp.StatusSuccess || !got.Verified {
		t.Errorf("interrupted actuation whose value shows recovered as %+v", got)
	}
	if w := f.plant.Stats().Points["zone_b.fan"].Writes; w != 0 {
		t.Errorf("recovery wrote %d times", w)
	}
	// A retry with the key returns the recovered answer and writes nothing.
	if r := do(t, f.n, "do_fan_zone_b", 70, "lost"); r.Status != promcp.StatusPartial {
		t.Errorf("retry after recovery: %+v", r)
	}
	if w := f.plant.Stats().Points["zone_b.fan"].Writes; w != 0 {
		t.Errorf("a retry of a recovered key wrote %d times", w)
	}
}

// hashOf obtains the ledger hash physd uses for do_fan_zone_b=value by
// asking a scratch node, keeping the test independent of the hash's layout.
func hashOf(t *testing.T, value string) string {
	t.Helper()
	f := open(t, t.TempDir())
	f.plant.SetFault("zone_b.fan", sim.Fault{Mode: sim.FaultStuck}) // any recorded outcome will do
	raw := json.RawMessage(value)
	if _, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_fan_zone_b", Value: raw, IdempotencyKey: "probe"}); err != nil {
		t.Fatal(err)
	}
	e, err := f.st.Lookup("probe")
	if err != nil || e == nil {
		t.Fatal(err)
	}
	return e.ArgsHash
}

func TestCanDoMatching(t *testing.T) {
	f := open(t, t.TempDir())
	cases := []struct {
		intent   promcp.Intent
		top      string
		minConf  float64
		feasible bool
		blocked  promcp.Permission
		unroute  string
	}{
		{promcp.Intent{SemanticTags: []string{"heating"}, Action: "increase", Location: "zone_a"}, "do_heater_zone_a", 0.9, true, "", ""},
		{promcp.Intent{SemanticTags: []string{"heaters"}, Target: "temperature", Location: "zone_a"}, "do_heater_zone_a", 0.7, true, "", ""},
		{promcp.Intent{SemanticTags: []string{"temperature"}, Action: "read", Location: "zone_a"}, "read_temperature_zone_a", 0.9, true, "", ""},
		{promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 50.0, Location: "zone_b"}, "do_fan_zone_b", 0.9, true, "", ""},
		{promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 500.0, Location: "zone_b"}, "", 0, false, promcp.PermOutOfRange, ""},
		{promcp.Intent{SemanticTags: []string{"heating"}, Action: "increase", Location: "zone_z"}, "", 0, false, "", promcp.UnroutableRequirementsUnmet},
		{promcp.Intent{SemanticTags: []string{"plasma"}}, "", 0, false, "", promcp.UnroutableNoProducer},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(c.intent), func(t *testing.T) {
			rep, err := f.n.CanDo(context.Background(), promcp.CanDoRequest{Intent: &c.intent}, node.Caller{})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Feasible != c.feasible {
				t.Errorf("feasible = %v: %+v", rep.Feasible, rep)
			}
			if c.top != "" && (len(rep.Candidates) == 0 || rep.Candidates[0].Capability != c.top || rep.Candidates[0].Confidence < c.minConf) {
				t.Errorf("top candidate: %+v", rep.Candidates)
			}
			for _, cand := range rep.Candidates {
				if cand.ValidUntil.IsZero() || cand.Source != "test_node" {
					t.Errorf("candidate without valid_until or source: %+v", cand)
				}
			}
			if c.blocked != "" && (len(rep.Blocked) == 0 || rep.Blocked[0].Permission != c.blocked) {
				t.Errorf("blocked: %+v", rep.Blocked)
			}
			if c.unroute != "" && (len(rep.Unroutable) == 0 || rep.Unroutable[0].Reason != c.unroute) {
				t.Errorf("unroutable: %+v", rep.Unroutable)
			}
			if rep.Feasible && len(rep.Unroutable) > 0 {
				t.Errorf("feasible with unroutable entries")
			}
			if !rep.Feasible && len(rep.Blocked) == 0 && len(rep.Unroutable) == 0 {
				t.Errorf("infeasible without an explanation")
			}
		})
	}
	// A heater already at 100 % cannot increase.
	do(t, f.n, "do_heater_zone_a", 100, "max")
	rep, _ := f.n.CanDo(context.Background(), promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"heating"}, Action: "increase", Location: "zone_a"}}, node.Caller{})
	if rep.Feasible || len(rep.Blocked) == 0 || !strings.Contains(rep.Blocked[0].Reason, "maximum") {
		t.Errorf("increase at max: %+v", rep)
	}
}
