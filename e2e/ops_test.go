package e2e

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric returns the value of one series (exact label set) or -1.
func metric(body, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

func TestMetricsMoveUnderLoad(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", greenhousePolicy}})
	cs := connectAs(t, d, "2026-07-28", operatorToken, nil)
	for range 5 {
		call(t, cs, "read_temperature_zone_a", nil)
	}
	call(t, cs, "do_fan_zone_b", map[string]any{"value": 40, "idempotency_key": "m1"})
	call(t, cs, "do_heater_zone_c", map[string]any{"value": 85, "idempotency_key": "m2"}) // range_guard deny
	call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}}})
	d.fault(t, "zone_b.humidity", "offline")
	call(t, cs, "read_humidity_zone_b", map[string]any{"max_age_ms": 0})
	_, raw := d.request(t, "GET", "/metrics", "")
	body := string(raw)
	for series, min := range map[string]float64{
		`physd_tool_calls_total{outcome="good",permission="",tool="read_temperature_zone_a"}`:        5,
		`physd_read_cache_total{result="hit"}`:                                                       4,
		`physd_tool_calls_total{outcome="success",permission="allowed",tool="do_fan_zone_b"}`:        1,
		`physd_tool_calls_total{outcome="failed",permission="out_of_range",tool="do_heater_zone_c"}`: 1,
		`physd_do_refusals_total{permission="out_of_range"}`:                                         1,
		`physd_gate_decisions_total{decision="allow",layer="L0"}`:                                    1,
		`physd_tool_calls_total{outcome="feasible",permission="",tool="can_do"}`:                     1,
		`physd_driver_errors_total{bus="plant"}`:                                                     1,
		`physd_bus_up{bus="plant"}`:                                                                  1,
		`physd_tool_call_duration_seconds_count{kind="read"}`:                                        5,
		`process_resident_memory_bytes`:                                                              1,
	} {
		if v := metric(body, series); v < min {
			t.Errorf("%s = %v, want ≥ %v", series, v, min)
		}
	}
}

func TestStatusAndReadiness(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	call(t, cs, "read_temperature_zone_a", nil)
	call(t, cs, "do_fan_zone_b", map[string]any{"value": 25, "idempotency_key": "s1"})
	code, body := get(t, d.url("/status"))
	for _, want := range []string{`"device_id":"gw_greenhouse_001"`, `"tool":"read_temperature_zone_a"`, `"quality":"good"`, `"idempotency_key":"s1"`, `"ready":true`} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("/status lacks %s (%d):\n%s", want, code, body)
		}
	}
	code, page := get(t, d.url("/"))
	if code != 200 || !strings.Contains(page, "read_temperature_zone_a") || !strings.Contains(page, "<html") {
		t.Errorf("status page: %d", code)
	}
	// Readiness flips when the plant goes away and recovers when it returns.
	d.fault(t, "*", "offline")
	if code, body := get(t, d.url("/readyz")); code != 503 || !strings.Contains(body, "bus:plant") {
		t.Errorf("readyz with the plant down: %d %s", code, body)
	}
	d.fault(t, "*", "none")
	if code, _ := get(t, d.url("/readyz")); code != 200 {
		t.Errorf("readyz after recovery: %d", code)
	}
}

func TestSIGHUPReloadsPolicy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yml")
	orig, err := os.ReadFile(greenhousePolicy)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(pol, orig, 0o644)
	d := startHTTP(t, daemonOpts{extra: []string{"--policy", pol}})
	cs := connectAs(t, d, "2026-07-28", operatorToken, nil)
	r := structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 30, "idempotency_key": "h1"}))
	if r["status"] != "success" {
		t.Fatalf("before reload: %v", r)
	}
	// A bad policy is rejected; the running one stays.
	os.WriteFile(pol, []byte("physmcp_policy_version: \"0.1\"\ncapabilities: {do_nothing: {rules: []}}\n"), 0o644)
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.logValue(t, "reload rejected; the running manifest and policy stay in force", "err")
	r = structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 35, "idempotency_key": "h2"}))
	if r["status"] != "success" {
		t.Errorf("after a rejected reload: %v", r)
	}
	// A good policy that now denies the vent above 20 takes effect.
	os.WriteFile(pol, []byte(strings.Replace(string(orig),
		"{type: range_guard, min: 10, max: 90, on_violation: warn}", "{type: range_guard, min: 0, max: 20, on_violation: deny}", 1)), 0o644)
	d.cmd.Process.Signal(syscall.SIGHUP)
	d.stderr.logValue(t, "policy reloaded", "policy")
	deadline := time.Now().Add(5 * time.Second)
	for {
		r = structured(t, call(t, cs, "do_vent_zone_c", map[string]any{"value": 40, "idempotency_key": "h3-" + strconv.FormatInt(time.Now().UnixNano(), 10)}))
		if r["permission"] == "out_of_range" || time.Now().After(deadline) {
			break
		}
	}
	if r["status"] != "failed" || r["permission"] != "out_of_range" {
		t.Errorf("after a good reload: %v", r)
	}
}
