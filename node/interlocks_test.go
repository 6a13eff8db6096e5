package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
)

// panel is a fake device whose points the test sets: reads return the
// value (or fail while the point is marked failing), writes set it.
type panel struct {
	mu   sync.Mutex
	v    map[string]float64
	fail map[string]bool
}

var thePanel = &panel{v: map[string]float64{}, fail: map[string]bool{}}

func (p *panel) set(point string, v float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.v[point] = v
}

func (p *panel) get(point string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.v[point]
}

func (p *panel) failing(point string, f bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[point] = f
}

func init() {
	drivers.Register("panel", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return panelBus{}, nil })
}

type panelBus struct{}

func (panelBus) Point(c *manifest.Capability) (drivers.Point, error) {
	return panelPoint(c.Binding.Address), nil
}
func (panelBus) Health() error { return nil }
func (panelBus) Close() error  { return nil }

type panelPoint string

func (p panelPoint) Read(context.Context) (drivers.Reading, error) {
	thePanel.mu.Lock()
	defer thePanel.mu.Unlock()
	if thePanel.fail[string(p)] {
		return drivers.Reading{}, fmt.Errorf("%w: %s does not answer", drivers.ErrTimeout, p)
	}
	return drivers.Reading{Value: thePanel.v[string(p)]}, nil
}

func (p panelPoint) Write(_ context.Context, v any) error {
	f, _ := v.(float64)
	thePanel.set(string(p), f)
	return nil
}

const panelManifest = `physmcp_version: "0.1"
device: {id: panel_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  dev: {type: panel}
capabilities:
  - {name: tank, kind: read, description: Rain tank level., binding: {type: virtual, bus: dev, address: tank}, data_type: float, unit: percent, range: {min: 0, max: 100}, poll_ms: 100, semantic_tags: [tank]}
  - {name: vent, kind: read, description: Vent position., binding: {type: virtual, bus: dev, address: vent}, data_type: float, unit: percent, range: {min: 0, max: 100}, poll_ms: 100, semantic_tags: [vent]}
  - {name: temp, kind: read, description: Air temperature., binding: {type: virtual, bus: dev, address: temp}, data_type: float, unit: celsius, range: {min: -20, max: 80}, poll_ms: 100, semantic_tags: [temp]}
  - name: valve
    kind: do
    description: Irrigation valve.
    binding: {type: virtual, bus: dev, address: valve}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [valve, irrigation]
    safe: {value: 0, on: [interlock_trip]}
  - name: heater
    kind: do
    description: Heater.
    binding: {type: virtual, bus: dev, address: heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater, heating]
    safe: {value: 0, on: [interlock_trip]}
`

const panelPolicy = `physmcp_policy_version: "0.1"
interlocks:
  - name: tank_low
    kind: permissive
    tool: do_valve
    applies_above: 0
    requires: {read: read_tank, above: 10}
  - name: vent_open
    kind: interlock
    tool: do_heater
    while: {read: read_vent, above: 80}
    max: 20
  - name: overtemp
    kind: trip
    while: {read: read_temp, above: 35}
    safe: [do_heater]
`

// lockGuard is NoPolicy with the policy's interlocks.
type lockGuard struct {
	node.NoPolicy
	set *interlock.Set
}

func (g lockGuard) Interlocks() *interlock.Set { return g.set }

type panelFixture struct {
	n  *node.Node
	al *audit.Log
}

func openPanel(t *testing.T, tank, vent, temp float64) *panelFixture {
	t.Helper()
	return openPanelWith(t, panelManifest, panelPolicy, nil, map[string]float64{"tank": tank, "vent": vent, "temp": temp})
}

// openPanelWith opens a node on the panel with a manifest, a policy (its
// interlocks), a mesh (nil: none) and the panel's starting values.
func openPanelWith(t *testing.T, man, pol string, remote node.Remote, values map[string]float64) *panelFixture {
	t.Helper()
	thePanel.mu.Lock()
	thePanel.v = values
	thePanel.fail = map[string]bool{}
	thePanel.mu.Unlock()
	m, err := manifest.Parse("panel.yml", []byte(man))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("panel.policy.yml", []byte(pol), m)
	if err != nil {
		t.Fatal(err)
	}
	cfg := node.Config{Guard: lockGuard{set: interlock.NewSet(p.Interlocks)}}
	if remote != nil {
		cfg.Remote = remote
	}
	n, st, al := openNode(t, t.TempDir(), man, cfg)
	t.Cleanup(func() {
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	return &panelFixture{n: n, al: al}
}

func (f *panelFixture) do(t *testing.T, tool string, v float64, key string) promcp.DoResult {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := f.n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "agent"}})
	if err != nil {
		t.Fatalf("%s(%v): %v", tool, v, err)
	}
	var r promcp.DoResult
	_ = json.Unmarshal(body, &r)
	return r
}

// canDo is can_do for tag with value: "allowed", or the blocked code.
func (f *panelFixture) canDo(t *testing.T, tag string, v float64) string {
	t.Helper()
	rep, err := f.n.CanDo(context.Background(), promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{tag}, Action: "set", Value: v}}, node.Caller{ID: "agent"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Candidates {
		if c.Kind == manifest.KindDo {
			return string(c.Permission)
		}
	}
	for _, b := range rep.Blocked {
		return b.Code
	}
	return "none"
}

func refusedBy(r promcp.DoResult, rule string) bool {
	return r.Status == promcp.StatusFailed && r.Code == interlock.Code && strings.Contains(r.Details, "rule="+rule)
}

// TestPermissive: the valve opens only while the tank is above 10; the
// refusal names the rule and the reading; when the tank drops the open
// valve closes within one observation.
func TestPermissive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openPanel(t, 5, 0, 20)
		time.Sleep(150 * time.Millisecond) // the first polls
		r := f.do(t, "do_valve", 50, "v1")
		if !refusedBy(r, "tank_low") || !strings.Contains(r.Reason, "read_tank is 5 (good") || thePanel.get("valve") != 0 {
			t.Fatalf("valve with the tank at 5: %+v", r)
		}
		if r := f.do(t, "do_valve", 0, "v2"); r.Status != promcp.StatusSuccess {
			t.Fatalf("the safe value is always allowed: %+v", r)
		}
		thePanel.set("tank", 20)
		time.Sleep(100 * time.Millisecond)
		if r := f.do(t, "do_valve", 50, "v3"); r.Status != promcp.StatusSuccess {
			t.Fatalf("valve with the tank at 20: %+v", r)
		}
		thePanel.set("tank", 8)
		time.Sleep(100 * time.Millisecond) // one poll
		synctest.Wait()
		if v := thePanel.get("valve"); v != 0 {
			t.Fatalf("one observation after the tank fell to 8 the valve is %v; want 0", v)
		}
		st := f.n.SafeStatusOf("do_valve")
		if st.State != node.SafeReached || st.Event != manifest.SafeOnInterlockTrip || !strings.Contains(st.Reason, "tank_low") {
			t.Fatalf("safe status: %+v", st)
		}
	})
}

// TestInterlockBound: the heater is held at most 20 while the vent is open
// beyond 80; when the vent opens with the heater above 20, the heater
// goes safe.
func TestInterlockBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openPanel(t, 50, 90, 20)
		time.Sleep(150 * time.Millisecond)
		if r := f.do(t, "do_heater", 30, "h1"); !refusedBy(r, "vent_open") {
			t.Fatalf("heater 30 with the vent at 90: %+v", r)
		}
		if r := f.do(t, "do_heater", 20, "h2"); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 20 with the vent at 90: %+v", r)
		}
		thePanel.set("vent", 40)
		time.Sleep(100 * time.Millisecond)
		if r := f.do(t, "do_heater", 60, "h3"); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60 with the vent at 40: %+v", r)
		}
		thePanel.set("vent", 95) // a fault opens the vent
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if v := thePanel.get("heater"); v != 0 {
			t.Fatalf("the vent opened with the heater at 60: heater %v; want 0", v)
		}
	})
}

// TestTrip: while the temperature is above 35 the heater is held safe;
// no do_ moves it, and a rise trips it.
func TestTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openPanel(t, 50, 0, 40)
		time.Sleep(150 * time.Millisecond)
		if r := f.do(t, "do_heater", 10, "t1"); !refusedBy(r, "overtemp") {
			t.Fatalf("heater 10 at 40 °C: %+v", r)
		}
		thePanel.set("temp", 20)
		time.Sleep(100 * time.Millisecond)
		if r := f.do(t, "do_heater", 15, "t2"); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 15 at 20 °C: %+v", r)
		}
		thePanel.set("temp", 36)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if v := thePanel.get("heater"); v != 0 {
			t.Fatalf("heater %v after the trip; want 0", v)
		}
		recs := 0
		_ = f.al.ScanSince(time.Time{}, func(r audit.Record) bool {
			// The one that took the heater from 15 (an earlier one drove
			// it at start, when its value was unknown and the trip held).
			if r.Event == "safe_state" && strings.Contains(r.Reason, "interlock_trip: trip overtemp") && r.Previous == 15.0 {
				recs++
			}
			return true
		})
		if recs != 1 {
			t.Errorf("%d safe_state audit lines for the trip from 15; want 1", recs)
		}
	})
}

// TestInterlockUnsafeSide: a reading that fails (stale, then error) counts
// as the unsafe side: the permissive stops holding and the valve goes safe;
// a do_ is refused naming the reading's quality.
func TestInterlockUnsafeSide(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openPanel(t, 50, 0, 20)
		time.Sleep(150 * time.Millisecond)
		if r := f.do(t, "do_valve", 40, "u1"); r.Status != promcp.StatusSuccess {
			t.Fatalf("valve 40: %+v", r)
		}
		thePanel.failing("tank", true)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		if v := thePanel.get("valve"); v != 0 {
			t.Fatalf("the tank reading failed and the valve is %v; want 0", v)
		}
		r := f.do(t, "do_valve", 40, "u2")
		if !refusedBy(r, "tank_low") || !strings.Contains(r.Details, "quality=stale") {
			t.Fatalf("valve with a failing tank reading: %+v", r)
		}
	})
}

// TestInterlockCanDoAgrees: for random plant states and requested values,
// can_do says allowed exactly when the do_ then succeeds.
func TestInterlockCanDoAgrees(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openPanel(t, 50, 0, 20)
		time.Sleep(150 * time.Millisecond)
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range 200 {
			thePanel.set("tank", float64(rng.IntN(30)))
			thePanel.set("vent", float64(rng.IntN(100)))
			thePanel.set("temp", float64(20+rng.IntN(30)))
			time.Sleep(100 * time.Millisecond) // a poll of each
			synctest.Wait()
			tool, tag := "do_valve", "irrigation"
			if i%2 == 1 {
				tool, tag = "do_heater", "heating"
			}
			v := float64(rng.IntN(5) * 10)
			says := f.canDo(t, tag, v)
			r := f.do(t, tool, v, fmt.Sprint("k", i))
			allowed := r.Status == promcp.StatusSuccess
			if (says == string(promcp.PermAllowed)) != allowed {
				t.Fatalf("round %d: %s %v with tank %v vent %v temp %v: can_do %s, do_ %s %s (%s)", i, tool, v,
					thePanel.get("tank"), thePanel.get("vent"), thePanel.get("temp"), says, r.Status, r.Code, r.Reason)
			}
		}
	})
}

// meshReader is a Remote whose readings the test sets (or makes fail).
type meshReader struct {
	mu   sync.Mutex
	v    float64
	down bool
	n    int
}

func (m *meshReader) CanDo(context.Context, promcp.CanDoRequest, node.Caller) node.RemoteReport {
	return node.RemoteReport{}
}

func (m *meshReader) ReadRemote(_ context.Context, owner, tool string, _ time.Duration) (promcp.Observation, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.n++
	if m.down || owner != "gw_c" || tool != "read_vent_c" {
		return promcp.Observation{}, fmt.Errorf("%s: no answer", owner)
	}
	return promcp.Observation{Value: m.v, Quality: promcp.QualityGood, Timestamp: time.Now()}, nil
}

func (m *meshReader) set(v float64, down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.v, m.down = v, down
}

// TestInterlockOnAnotherGateway: a trip on another gateway's reading is
// judged on the mesh's answers; an owner that stops answering counts as
// the unsafe side and trips the output.
func TestInterlockOnAnotherGateway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		man := strings.Replace(panelManifest, "network: {protocols: [{type: ip}], mesh: {enabled: false}}",
			"network: {protocols: [{type: ip}], mesh: {enabled: true, bind: 127.0.0.1, port: 7946, expected_size: 2}}", 1)
		mr := &meshReader{v: 20}
		f := openPanelWith(t, man, `physmcp_policy_version: "0.1"
interlocks:
  - {name: vent_c_open, kind: trip, while: {read: read_vent_c, source: gw_c, above: 80}, safe: [do_heater], max_age_ms: 3000}
`, mr, map[string]float64{})
		time.Sleep(time.Second)
		if r := f.do(t, "do_heater", 40, "h1"); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater with gw_c's vent at 20: %+v", r)
		}
		mr.set(90, false)
		time.Sleep(1100 * time.Millisecond) // a poll (every max_age/3)
		synctest.Wait()
		if v := thePanel.get("heater"); v != 0 {
			t.Fatalf("gw_c's vent at 90: heater %v; want 0", v)
		}
		mr.set(20, false)
		time.Sleep(1100 * time.Millisecond)
		if r := f.do(t, "do_heater", 40, "h2"); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater after gw_c's vent closed: %+v", r)
		}
		mr.set(20, true) // gw_c stops answering
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if v := thePanel.get("heater"); v != 0 {
			t.Fatalf("gw_c unreachable: heater %v; want 0 (the unsafe side)", v)
		}
		r := f.do(t, "do_heater", 40, "h3")
		if !refusedBy(r, "vent_c_open") || !strings.Contains(r.Reason, "gw_c did not answer") {
			t.Fatalf("heater with gw_c unreachable: %+v", r)
		}
	})
}

// TestInterlockBypass: a bypass needs two people with the rule's role; in
// force, the rule lets values through and does not trip; when it ends the
// rule is judged on the plant at once.
func TestInterlockBypass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pol := strings.Replace(panelPolicy, "    max: 20\n", "    max: 20\n    bypass: {role: supervisor, max_minutes: 30}\n", 1)
		f := openPanelWith(t, panelManifest, pol, nil, map[string]float64{"tank": 50, "vent": 90, "temp": 20})
		n, al := f.n, f.al
		time.Sleep(150 * time.Millisecond)
		alice := node.Caller{ID: "alice", Role: "supervisor", Credentials: []string{"token:alice"}}
		alice2 := node.Caller{ID: "alice-2", Role: "admin", Credentials: []string{"token:alice"}}
		bob := node.Caller{ID: "bob", Role: "supervisor", Credentials: []string{"token:bob"}}
		op := node.Caller{ID: "op", Role: "operator", Credentials: []string{"token:op"}}
		if _, err := n.RequestBypass("vent_open", 10*time.Minute, "vent sensor under repair", op); !errors.Is(err, node.ErrBypass) {
			t.Fatalf("an operator asked: %v", err)
		}
		if _, err := n.RequestBypass("vent_open", time.Hour, "too long", alice); !errors.Is(err, node.ErrBypass) {
			t.Fatalf("beyond max_minutes: %v", err)
		}
		if _, err := n.RequestBypass("overtemp", time.Minute, "a trip", alice); !errors.Is(err, node.ErrBypass) {
			t.Fatalf("a trip: %v", err)
		}
		if _, err := n.RequestBypass("vent_open", 10*time.Minute, "vent sensor under repair", alice); err != nil {
			t.Fatal(err)
		}
		if r := f.do(t, "do_heater", 60, "b0"); !refusedBy(r, "vent_open") {
			t.Fatalf("a pending bypass let a value through: %+v", r)
		}
		if _, err := n.ApproveBypass("vent_open", alice2); !errors.Is(err, node.ErrBypass) {
			t.Fatalf("the same person (another token of alice's) approved: %v", err)
		}
		b, err := n.ApproveBypass("vent_open", bob)
		if err != nil || b.State != node.BypassActive {
			t.Fatalf("bob's approval: %v %+v", err, b)
		}
		if got := f.canDo(t, "heating", 60); got != string(promcp.PermAllowed) {
			t.Fatalf("can_do under the bypass: %s", got)
		}
		if r := f.do(t, "do_heater", 60, "b1"); r.Status != promcp.StatusSuccess {
			t.Fatalf("do_ under the bypass: %+v", r)
		}
		time.Sleep(5 * time.Minute)
		synctest.Wait()
		if v := thePanel.get("heater"); v != 60 {
			t.Fatalf("the bypassed rule tripped the heater: %v", v)
		}
		time.Sleep(5*time.Minute + time.Millisecond) // the bypass ends
		synctest.Wait()
		if v := thePanel.get("heater"); v != 0 {
			t.Fatalf("after the bypass the vent is still open and the heater is %v; want 0", v)
		}
		events := map[string]int{}
		_ = al.ScanSince(time.Time{}, func(r audit.Record) bool {
			if strings.HasPrefix(r.Event, "interlock_bypass") {
				events[r.Event]++
			}
			return true
		})
		if events["interlock_bypass_requested"] != 1 || events["interlock_bypass_refused"] != 1 || events["interlock_bypass_approved"] != 1 || events["interlock_bypass_ended"] != 1 {
			t.Errorf("bypass audit: %v", events)
		}
	})
}
