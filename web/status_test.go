package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
	"github.com/physd/physd/web"
)

// observedPlant: heater_power_zone_a reads the heater power do_heater_zone_a
// sets, polled every second with a 5 % deadband.
const observedPlant = `physmcp_version: "0.1"
device: {id: obs_node, type: greenhouse_controller, location: {zone: zone_a}}
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
    deadband: "5%"
    alarms: {high: 50, for_ms: 2000}
`

// statusRig is observedPlant with its history and alarms, and the HTTP
// surface over them as a handler (no listener, so that it runs in a
// synctest bubble).
type statusRig struct {
	n   *node.Node
	web *web.Server
}

func openStatusRig(t *testing.T) *statusRig {
	t.Helper()
	m, err := manifest.Parse("obs.yml", []byte(observedPlant))
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
	h, err := history.Open(filepath.Join(dir, history.FileName), m, history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h.Follow(n)
	e := alarms.New(m)
	e.Follow(n)
	t.Cleanup(func() {
		n.Close(context.Background())
		al.Close()
		st.Close()
		e.Close()
		h.Close()
	})
	srv := mcpserver.New(n, mcpserver.Options{History: h, Alarms: e})
	return &statusRig{n: n, web: web.New(srv, web.Options{History: h, Alarms: e})}
}

func (r *statusRig) setHeater(t *testing.T, v float64, key string) {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := r.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_zone_a", Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	var res promcp.DoResult
	if err := json.Unmarshal(body, &res); err != nil || res.Status != promcp.StatusSuccess {
		t.Fatalf("do_heater_zone_a(%v): %s", v, body)
	}
}

// TestStatusPageAlarmsAndCharts: the status page shows the active alarms
// at the top and each polled capability's last hour as an inline SVG whose
// line sits at the known signal's per-minute means.
func TestStatusPageAlarmsAndCharts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := openStatusRig(t)
		r.setHeater(t, 30, "p1")
		time.Sleep(120500 * time.Millisecond)
		r.setHeater(t, 70, "p2")
		time.Sleep(60 * time.Second)
		synctest.Wait()
		req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
		w := httptest.NewRecorder()
		r.web.Handler().ServeHTTP(w, req)
		page := w.Body.String()
		if w.Code != 200 {
			t.Fatalf("GET /: %d %s", w.Code, page)
		}
		alarmsAt, checksAt := strings.Index(page, `<table id="alarms">`), strings.Index(page, `<h2 id="h-checks">Checks</h2>`)
		if alarmsAt < 0 || alarmsAt > checksAt || !strings.Contains(page, `<th scope="row"><code>read_heater_power_zone_a</code></th><td data-label="alarm" class="error">high</td>`) {
			t.Fatalf("no active alarm above the checks:\n%s", page)
		}
		// Range 0..100 over the 80 px plot from y 10: a mean of 30 is at
		// y 66.0; minute 2 holds one poll of 30 and 59 of 70, mean 69.33,
		// y 34.5; minute 3 (under way, at the right edge, x 312) 70, y 34.0.
		fig := strings.Index(page, `<figcaption><code>read_heater_power_zone_a</code>`)
		i := strings.Index(page[max(fig, 0):], `<polyline`) + max(fig, 0)
		if fig < 0 || i < fig {
			t.Fatalf("no chart:\n%s", page)
		}
		line := page[i : i+strings.Index(page[i:], "/>")]
		if strings.Count(line, ",66.0") != 4 || strings.Count(line, ",34.5 ") != 2 || !strings.HasSuffix(line, ` 311.0,34.0 312.0,34.0"`) || strings.Count(page, `<svg class="chart"`) != 2 {
			t.Fatalf("chart line %s (charts: %d)", line, strings.Count(page, `<svg class="chart"`))
		}
		// The axes: the range's ends and middle with the unit, the hour's
		// start, middle and end in UTC, and the hour's min and max.
		chart := page[fig : fig+strings.Index(page[fig:], "</figure>")]
		for _, want := range []string{`text-anchor="end">100</text>`, `text-anchor="end">50</text>`, `text-anchor="end">0</text>`, `>%</text>`,
			`text-anchor="start">23:03</text>`, `text-anchor="end">00:03</text>`, `<p class="stats">min 30 · max 70 percent</p>`, `aria-label="read_heater_power_zone_a, last hour: min 30 · max 70 percent"`} {
			if !strings.Contains(chart, want) {
				t.Errorf("chart lacks %s:\n%s", want, chart)
			}
		}
	})
}
