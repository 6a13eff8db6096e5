package e2e

import (
	"context"
	"encoding/json"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const observedManifest = `physmcp_version: "0.1"
device: {id: obs_gw, type: greenhouse_controller, location: {zone: zone_a}}
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
    poll_ms: 200
    deadband: 5
    alarms: {high: 50, hysteresis: 5, for_ms: 500}
`

// waitFor polls cond until it holds or 15 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 15 s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestObservationsAlarmsHistory runs the binary: a 2025-11-25 client over
// stdio subscribed to an observation resource is told of a do_'s change;
// the alarm it raises shows in physmcp://alarms, /metrics and the audit
// trail; after a restart on the same state directory, the history resource
// still holds the minute's bucket with the value.
func TestObservationsAlarmsHistory(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(observedManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	cmd := exec.Command(physdBin, "run", "--manifest", man, "--state", state, "--stdio", "--http", "127.0.0.1:0")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	updates := make(chan string, 64)
	c := mcp.NewClient(&mcp.Implementation{Name: "obs-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) { updates <- r.Params.URI }})
	ctx := context.Background()
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		t.Fatalf("connect: %v\n%s", err, stderr.String())
	}
	d := &daemon{cmd: cmd, addr: stderr.logValue(t, "listening", "addr"), stderr: stderr}
	for _, uri := range []string{"physmcp://obs/heater_power_zone_a", "physmcp://alarms"} {
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
			t.Fatalf("subscribe %s: %v", uri, err)
		}
	}
	drain := func() {
		for {
			select {
			case <-updates:
			case <-time.After(700 * time.Millisecond):
				return
			}
		}
	}
	drain() // the first poll counts as a change
	if res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "e2e-hot"}); res.IsError {
		t.Fatalf("do: %s", text(res))
	}
	got := map[string]bool{}
	waitFor(t, "updates of the observation and the alarms", func() bool {
		select {
		case u := <-updates:
			got[u] = true
		default:
		}
		return got["physmcp://obs/heater_power_zone_a"] && got["physmcp://alarms"]
	})
	rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "physmcp://alarms"})
	if err != nil || !strings.Contains(rr.Contents[0].Text, `"capability":"read_heater_power_zone_a","kind":"high"`) {
		t.Fatalf("alarms resource: %v %+v", err, rr)
	}
	_, metrics := d.request(t, "GET", "/metrics", "")
	for _, want := range []string{`physd_alarm_active{capability="read_heater_power_zone_a",kind="high"} 1`,
		`physd_alarm_events_total{capability="read_heater_power_zone_a",kind="high",state="raised"} 1`, "physd_history_bytes", "physd_observations_dropped 0"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	cs.Close() // stdin closes: physd exits, flushing the history
	auditLog, err := os.ReadFile(filepath.Join(state, "audit", "audit.jsonl"))
	if err != nil || !strings.Contains(string(auditLog), `"event":"alarm_raised","tool":"read_heater_power_zone_a"`) {
		t.Fatalf("audit: %v\n%s", err, auditLog)
	}

	h := startHTTP(t, daemonOpts{manifest: man, state: state})
	hs := connectHTTP(t, h, "2026-07-28")
	rr, err = hs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "physmcp://history/heater_power_zone_a?since=10m&step=1m"})
	if err != nil {
		t.Fatal(err)
	}
	var series struct {
		Buckets []struct {
			Max   *float64
			Count int
		}
	}
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &series); err != nil {
		t.Fatal(err)
	}
	seen := false
	for _, b := range series.Buckets {
		seen = seen || b.Max != nil && *b.Max == 70 && b.Count > 0
	}
	if !seen {
		t.Fatalf("history after restart has no bucket with 70: %s", rr.Contents[0].Text)
	}
}

// TestStatusPageChartInChromium renders / of a node whose polled heater
// power is held at a known value in headless Chromium: the active alarm
// heads the page, and the screenshot shows the chart's mean line at the
// height of that value (70 % of a 0–100 range: 30 % from the top of the
// 80 px plot). The window is tall enough for the trend cards, which
// follow the values table.
func TestStatusPageChartInChromium(t *testing.T) {
	bin := chromium(t)
	dir := t.TempDir()
	man := filepath.Join(dir, "physmcp.manifest.yml")
	if err := os.WriteFile(man, []byte(observedManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startHTTP(t, daemonOpts{manifest: man})
	cs := connectHTTP(t, d, "2026-07-28")
	if res := call(t, cs, "do_heater_zone_a", map[string]any{"value": 70, "idempotency_key": "chart-1"}); res.IsError {
		t.Fatalf("do: %s", text(res))
	}
	waitFor(t, "the high alarm", func() bool {
		_, body := d.request(t, "GET", "/status", "")
		return strings.Contains(string(body), `"kind":"high"`)
	})
	shot := filepath.Join(dir, "status.png")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
		"--force-device-scale-factor=1", "--user-data-dir=" + t.TempDir(), "--virtual-time-budget=2000"}
	dom, err := exec.CommandContext(ctx, bin, append(args, "--dump-dom", d.url("/"))...).Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	page := string(dom)
	if a, c := strings.Index(page, `id="alarms"`), strings.Index(page, "Checks"); a < 0 || a > c {
		t.Errorf("the active alarm does not head the page:\n%s", page)
	}
	if strings.Count(page, `<svg class="chart"`) != 2 {
		t.Errorf("want a chart for each of the 2 capabilities:\n%s", page)
	}
	if out, err := exec.CommandContext(ctx, bin, append(args, "--window-size=1200,2000", "--screenshot="+shot, d.url("/"))...).CombinedOutput(); err != nil {
		t.Fatalf("chromium screenshot: %v\n%s", err, out)
	}
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	// The mean line's colour (#1f5fa8) and the band's (#cfe3f7): rows
	// where each appears.
	lineRows, bandRows := map[int]bool{}, map[int]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			switch {
			case near(r, 0x1f) && near(g, 0x5f) && near(bl, 0xa8):
				lineRows[y] = true
			case near(r, 0xcf) && near(g, 0xe3) && near(bl, 0xf7):
				bandRows[y] = true
			}
		}
	}
	if len(lineRows) == 0 || len(bandRows) == 0 {
		t.Fatalf("screenshot shows no chart (line rows %d, band rows %d)", len(lineRows), len(bandRows))
	}
	// The read capability's chart: the band (min = max = 70 after the
	// first poll, drawn at least 1 px) and the line share rows; the line is
	// about 0.3 × 80 = 24 px below the top of its plot. The do_ capability's
	// chart shows 0 → 70 and so spans more rows; both charts' line rows must
	// include one that is within 2 px of a band row.
	shared := 0
	for y := range lineRows {
		for d := -2; d <= 2; d++ {
			if bandRows[y+d] {
				shared++
				break
			}
		}
	}
	if shared == 0 {
		t.Errorf("the mean line never meets the min–max band: line rows %v, band rows %v", keys(lineRows), keys(bandRows))
	}
}

func near(c uint32, want uint32) bool {
	v := int(c >> 8)
	return v >= int(want)-6 && v <= int(want)+6
}

func keys(m map[int]bool) []int {
	var out []int
	for k := range m {
		out = append(out, k)
	}
	return out
}
