package alarms_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
)

const plant = `physmcp_version: "0.1"
device: {id: alarm_node, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
capabilities:
  - name: heater_zone_a
    kind: do
    description: Heater power in zone A.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater]
  - name: heater_power_zone_a
    kind: read
    description: Heater power in zone A as the controller reports it.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater, power]
    poll_ms: 1000
    alarms: {high: 50, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}
`

type rig struct {
	n     *node.Node
	plant *sim.Plant
	e     *alarms.Engine
	mu    sync.Mutex
	evs   []alarms.Event
	k     int
}

func (r *rig) events() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.evs {
		out = append(out, e.Kind+" "+e.State)
	}
	return out
}

func (r *rig) set(t *testing.T, v float64) {
	t.Helper()
	r.k++
	raw, _ := json.Marshal(v)
	if _, err := r.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_zone_a", Value: raw, IdempotencyKey: "k" + string(rune('a'+r.k)), Caller: node.Caller{ID: "t"}}); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) fault(t *testing.T, body string) {
	t.Helper()
	path := "/fault"
	if body == "" {
		path, body = "/clear", "{}"
	}
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	r.plant.ControlHandler().ServeHTTP(w, req)
	if w.Code != 200 {
		t.Fatalf("sim %s: %d %s", path, w.Code, w.Body)
	}
}

func open(t *testing.T) *rig {
	m, err := manifest.Parse("a.yml", []byte(plant))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{n: n, plant: n.Buses()["plant"].(*sim.Plant), e: alarms.New(m)}
	r.e.OnEvent(func(ev alarms.Event) {
		r.mu.Lock()
		r.evs = append(r.evs, ev)
		r.mu.Unlock()
	})
	r.e.Follow(n)
	t.Cleanup(func() {
		r.e.Close()
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	return r
}

func step(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// TestAlarmLifecycle: a high value raises only after for_ms, a spike
// shorter than that raises nothing, noise around the limit does not flap,
// the alarm clears only past the hysteresis; a device gone offline raises
// the quality alarm and then the stale one, and both clear when it reads
// again.
func TestAlarmLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := open(t)
		want := func(when string, evs ...string) {
			t.Helper()
			if got := strings.Join(r.events(), ", "); got != strings.Join(evs, ", ") {
				t.Fatalf("%s: events [%s], want [%s]", when, got, strings.Join(evs, ", "))
			}
		}
		step(1500 * time.Millisecond)
		r.set(t, 60) // a 2 s spike
		step(2 * time.Second)
		r.set(t, 10)
		step(5 * time.Second)
		want("spike shorter than for_ms")

		for i := range 6 { // noise across the limit, never 3 s above it
			r.set(t, []float64{51, 49}[i%2])
			step(time.Second)
		}
		want("noise across the limit")

		r.set(t, 60)
		step(2 * time.Second)
		want("2 s above the limit")
		step(2 * time.Second)
		want("4 s above the limit", "high raised")
		if a := r.e.Active(); len(a) != 1 || a[0].Capability != "read_heater_power_zone_a" || a[0].Value != 60.0 {
			t.Fatalf("active = %+v", a)
		}

		for i := range 6 { // noise inside the hysteresis band: stays raised
			r.set(t, []float64{48, 52}[i%2])
			step(time.Second)
		}
		want("noise inside the hysteresis", "high raised")
		r.set(t, 44)
		step(time.Second)
		want("below the hysteresis", "high raised", "high cleared")

		r.fault(t, `{"point":"zone_a.heater","mode":"offline"}`)
		step(2 * time.Second)
		want("offline 2 s", "high raised", "high cleared")
		step(2 * time.Second)
		want("offline 4 s", "high raised", "high cleared", "quality raised")
		step(3 * time.Second)
		want("offline 7 s", "high raised", "high cleared", "quality raised", "stale raised")
		r.fault(t, "")
		step(1500 * time.Millisecond)
		want("reading again", "high raised", "high cleared", "quality raised", "stale raised", "stale cleared", "quality cleared")
		if a := r.e.Active(); len(a) != 0 {
			t.Fatalf("active after recovery = %+v", a)
		}
	})
}

// reload puts the plant manifest with alarms line alarmsLine (or none,
// when "") in force on the node and the engine.
func (r *rig) reload(t *testing.T, alarmsLine string) {
	t.Helper()
	text := strings.Replace(plant, "    alarms: {high: 50, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}\n", alarmsLine, 1)
	m, err := manifest.Parse("a.yml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.n.Reload(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	r.e.Reload(m)
	synctest.Wait()
}

// TestReloadKeepsChangesAndRemovesAlarms: a raised alarm whose definition
// a reload keeps stays raised (same since, no new event); one whose
// definition changed is cleared, saying so, and raised again by the new
// definition when it holds; one the reload removes is cleared, saying so,
// and nothing is raised for it after.
func TestReloadKeepsChangesAndRemovesAlarms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := open(t)
		step(1500 * time.Millisecond)
		r.set(t, 60)
		step(4 * time.Second)
		if got := strings.Join(r.events(), ", "); got != "high raised" {
			t.Fatalf("events [%s], want [high raised]", got)
		}
		since := r.e.Active()[0].Since

		// The same alarms (the manifest parsed again: new objects).
		r.reload(t, "    alarms: {high: 50, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}\n")
		step(5 * time.Second)
		if got := strings.Join(r.events(), ", "); got != "high raised" {
			t.Fatalf("after a reload keeping the alarm: events [%s], want [high raised] only", got)
		}
		if a := r.e.Active(); len(a) != 1 || a[0].Kind != alarms.KindHigh || !a[0].Since.Equal(since) {
			t.Fatalf("after a reload keeping the alarm: active %+v, want high since %v", a, since)
		}

		// The high limit changed: cleared now, raised again after for_ms
		// by the new limit (60 > 55); the stale and quality alarms are
		// unchanged and not touched.
		r.reload(t, "    alarms: {high: 55, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}\n")
		r.mu.Lock()
		last := r.evs[len(r.evs)-1]
		r.mu.Unlock()
		if last.State != "cleared" || last.Kind != alarms.KindHigh || !strings.Contains(last.Message, "the manifest reload changed this alarm") {
			t.Fatalf("after a reload changing the limit: last event %+v, want high cleared by the reload", last)
		}
		if len(r.e.Active()) != 0 {
			t.Fatalf("active right after the change: %+v", r.e.Active())
		}
		step(4 * time.Second)
		if got := strings.Join(r.events(), ", "); got != "high raised, high cleared, high raised" {
			t.Fatalf("after the new limit held: events [%s]", got)
		}
		if a := r.e.Active(); len(a) != 1 || !strings.Contains(a[0].Message, "above the high limit 55") {
			t.Fatalf("active %+v, want high by the new limit 55", a)
		}

		// The alarms removed: cleared, saying so; nothing raised after.
		r.reload(t, "")
		r.mu.Lock()
		last = r.evs[len(r.evs)-1]
		r.mu.Unlock()
		if last.State != "cleared" || !strings.Contains(last.Message, "the manifest reload removed this alarm") {
			t.Fatalf("after a reload removing the alarms: last event %+v", last)
		}
		r.fault(t, `{"point":"zone_a.heater","mode":"offline"}`)
		step(10 * time.Second)
		if got := strings.Join(r.events(), ", "); got != "high raised, high cleared, high raised, high cleared" {
			t.Fatalf("after the removal: events [%s], want nothing new", got)
		}
		if len(r.e.Active()) != 0 || len(r.e.Declared()) != 0 {
			t.Fatalf("after the removal: active %+v declared %v", r.e.Active(), r.e.Declared())
		}

		// Declared again by a later reload: evaluated from then on.
		r.reload(t, "    alarms: {quality: [error], stale_s: 5}\n")
		step(6 * time.Second)
		if a := r.e.Active(); len(a) != 2 {
			t.Fatalf("after the alarms came back with the device offline: active %+v, want quality and stale", a)
		}
	})
}

// TestReloadAddsAlarmsToANodeStartedWithout: the engine exists for a
// manifest that declares no alarm, and a reload that declares one starts
// evaluating it.
func TestReloadAddsAlarmsToANodeStartedWithout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := open(t)
		r.reload(t, "")
		none, err := manifest.Parse("a.yml", []byte(strings.Replace(plant, "    alarms: {high: 50, hysteresis: 5, for_ms: 3000, quality: [stale, error], stale_s: 5}\n", "", 1)))
		if err != nil {
			t.Fatal(err)
		}
		e := alarms.New(none)
		if e == nil {
			t.Fatal("no engine for a manifest without alarms: a reload could not add any")
		}
		var got []string
		e.OnEvent(func(ev alarms.Event) { got = append(got, ev.Kind+" "+ev.State) })
		e.Follow(r.n)
		defer e.Close()
		r.set(t, 60)
		step(5 * time.Second)
		r.reload(t, "    alarms: {high: 50, for_ms: 1000}\n")
		e.Reload(r.n.Manifest())
		step(3 * time.Second)
		if strings.Join(got, ", ") != "high raised" || !e.IsActive("read_heater_power_zone_a", alarms.KindHigh) {
			t.Fatalf("events %v, active %+v: want the alarm the reload declared raised", got, e.Active())
		}
	})
}
