package lint

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

var sent = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func obj(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%v: %s", err, s)
	}
	return m
}

func codeSet(fs []Finding) map[string]bool {
	out := map[string]bool{}
	for _, f := range fs {
		out[f.Code] = true
	}
	return out
}

const goodReport = `{"query_id": "q1", "feasible": true,
 "candidates": [
   {"capability": "do_heater_zone_a", "source": "gw", "confidence": 1, "permission": "allowed", "valid_until": "2026-11-29T12:00:10Z",
    "current_state": {"value": 40, "unit": "percent", "timestamp": "2026-11-29T11:59:59Z", "quality": "good"}},
   {"capability": "do_heater_zone_c", "source": "gw", "confidence": 0.5, "permission": "requires_human_approval", "valid_until": "2026-11-29T12:00:05.5Z"}],
 "blocked": [{"capability": "do_vent_zone_c", "source": "gw", "permission": "out_of_range", "reason": "value above max", "details": null}],
 "unroutable": [],
 "context": {"related_reads": ["read_temperature_zone_a"]}}`

const infeasibleReport = `{"query_id": "q2", "feasible": false, "candidates": [], "blocked": [],
 "unroutable": [{"outcome": "set zzx", "reason": "no_producer", "detail": "no capability has tag zzx"}]}`

var knownTools = map[string]bool{"do_heater_zone_a": true, "do_heater_zone_c": true, "do_vent_zone_c": true, "read_temperature_zone_a": true, "can_do": true}

// TestCheckCanDo breaks one property of a good CapabilityReport per case.
func TestCheckCanDo(t *testing.T) {
	cases := []struct {
		code     string
		report   string
		edit     func(m map[string]any)
		nonsense bool
	}{
		{"", goodReport, nil, false},
		{"", infeasibleReport, nil, true},
		{"RT002", goodReport, func(m map[string]any) { delete(m, "query_id") }, false},
		{"RT002", goodReport, func(m map[string]any) { m["feasible"] = "yes" }, false},
		{"RT003", goodReport, func(m map[string]any) { m["feasible"] = false }, false},
		{"RT003", infeasibleReport, func(m map[string]any) {
			m["feasible"] = true
			m["unroutable"] = []any{}
		}, false},
		{"RT004", goodReport, func(m map[string]any) { delete(cand(m, 0), "source") }, false},
		{"RT005", goodReport, func(m map[string]any) { cand(m, 0)["valid_until"] = "soon" }, false},
		{"RT005", goodReport, func(m map[string]any) { cand(m, 0)["valid_until"] = "2026-11-29T11:59:59Z" }, false},
		{"RT005", goodReport, func(m map[string]any) { cand(m, 0)["valid_until"] = "2026-11-29T12:00:00Z" }, false},
		{"RT006", goodReport, func(m map[string]any) { cand(m, 0)["valid_until"] = "2026-11-29T13:00:00Z" }, false},
		{"RT007", goodReport, func(m map[string]any) { cand(m, 1)["permission"] = "maybe" }, false},
		{"RT007", goodReport, func(m map[string]any) { blk(m, 0)["permission"] = "closed" }, false},
		{"RT008", goodReport, func(m map[string]any) { cand(m, 1)["permission"] = "rate_limited" }, false},
		{"RT009", goodReport, func(m map[string]any) { blk(m, 0)["reason"] = " " }, false},
		{"RT009", goodReport, func(m map[string]any) { delete(blk(m, 0), "source") }, false},
		{"RT009", goodReport, func(m map[string]any) { blk(m, 0)["permission"] = "allowed" }, false},
		{"RT010", goodReport, func(m map[string]any) {
			m["unroutable"] = []any{map[string]any{"outcome": "x", "reason": "no_producer", "detail": "d"}}
		}, false},
		{"RT011", infeasibleReport, func(m map[string]any) { delete(m["unroutable"].([]any)[0].(map[string]any), "detail") }, true},
		{"RT011", infeasibleReport, func(m map[string]any) { m["unroutable"].([]any)[0].(map[string]any)["reason"] = "busy" }, true},
		{"RT012", infeasibleReport, func(m map[string]any) { m["unroutable"] = []any{} }, true},
		{"RT013", goodReport, func(m map[string]any) { cand(m, 1)["confidence"] = 1.5 }, false},
		{"RT013", goodReport, func(m map[string]any) { cand(m, 1)["confidence"] = "high" }, false},
		{"RT014", goodReport, func(m map[string]any) { cand(m, 0)["confidence"] = 0.2 }, false},
		{"RT015", goodReport, nil, true},
		{"RT016", goodReport, func(m map[string]any) {
			m["context"].(map[string]any)["related_reads"] = []any{"read_nothing"}
		}, false},
		{"RT016", goodReport, func(m map[string]any) { cand(m, 0)["capability"] = "do_elsewhere" }, false},
	}
	for _, c := range cases {
		name := c.code
		if name == "" {
			name = "clean"
		}
		t.Run(name, func(t *testing.T) {
			m := obj(t, c.report)
			if c.edit != nil {
				c.edit(m)
			}
			got := codeSet(CheckCanDo(CanDoCheck{Report: m, SentAt: sent, Nonsense: c.nonsense, Tools: knownTools}))
			if c.code == "" {
				if len(got) != 0 {
					t.Fatalf("clean report has findings %v", CheckCanDo(CanDoCheck{Report: m, SentAt: sent, Nonsense: c.nonsense, Tools: knownTools}))
				}
				return
			}
			if !got[c.code] {
				t.Fatalf("%s did not fire: %v", c.code, got)
			}
		})
	}
}

func cand(m map[string]any, i int) map[string]any { return m["candidates"].([]any)[i].(map[string]any) }
func blk(m map[string]any, i int) map[string]any  { return m["blocked"].([]any)[i].(map[string]any) }

func TestCheckRead(t *testing.T) {
	now := sent
	cases := []struct {
		code string
		obs  string
	}{
		{"", `{"value": 17.5, "unit": "celsius", "timestamp": "2026-11-29T11:59:59.5Z", "quality": "good"}`},
		{"", `{"value": null, "unit": "celsius", "timestamp": "2026-11-29T11:59:59Z", "quality": "error", "reason": "offline"}`},
		{"", `{"unit": "celsius", "timestamp": "2026-11-29T11:59:59Z", "quality": "error"}`},
		{"RT022", `{"value": 1, "unit": "c", "timestamp": "2026-11-29T11:59:59Z"}`},
		{"RT022", `{"value": 1, "unit": "c", "quality": "good"}`},
		{"RT022", `{"value": null, "unit": "c", "timestamp": "2026-11-29T11:59:59Z", "quality": "good"}`},
		{"RT023", `{"value": 1, "unit": "c", "timestamp": "2026-11-29T11:59:59Z", "quality": "fine"}`},
		{"RT024", `{"value": 1, "unit": "c", "timestamp": "yesterday", "quality": "good"}`},
		{"RT024", `{"value": 1, "unit": "c", "timestamp": 1732881600, "quality": "good"}`},
		{"RT025", `{"value": 1, "unit": "c", "timestamp": "2026-11-29T12:01:00Z", "quality": "good"}`},
		{"RT026", `{"value": 1, "timestamp": "2026-11-29T11:59:59Z", "quality": "good"}`},
		{"RT028", `{"value": 1, "unit": "c", "timestamp": "2026-11-29T11:59:59Z", "quality": "stale", "reason": "bus timeout"}`},
	}
	for _, c := range cases {
		got := CheckRead(obj(t, c.obs), now)
		set := codeSet(got)
		if c.code == "" {
			for _, f := range got {
				if f.Severity != SevInfo {
					t.Errorf("clean %s: %v", c.obs, got)
				}
			}
			continue
		}
		if !set[c.code] {
			t.Errorf("%s did not fire on %s: %v", c.code, c.obs, got)
		}
	}
}

func TestCheckDo(t *testing.T) {
	const key = "k-1"
	good := `{"status": "success", "idempotency_key": "k-1", "compensable": true, "compensation_hint": "do_fan value=0",
	          "timestamp": "2026-11-29T12:00:00Z", "applied_value": 40, "previous_value": 0, "side_effects": ["noise"]}`
	cases := []struct {
		code string
		edit func(m map[string]any)
	}{
		{"", nil},
		{"", func(m map[string]any) { m["compensable"] = false; m["compensation_hint"] = nil }},
		{"", func(m map[string]any) { m["status"] = "failed"; m["permission"] = "rate_limited" }},
		{"RT031", func(m map[string]any) { delete(m, "timestamp") }},
		{"RT031", func(m map[string]any) { m["compensable"] = "yes" }},
		{"RT032", func(m map[string]any) { m["status"] = "ok" }},
		{"RT033", func(m map[string]any) { m["idempotency_key"] = "other" }},
		{"RT034", func(m map[string]any) { m["compensation_hint"] = nil }},
		{"RT034", func(m map[string]any) { m["compensation_hint"] = "" }},
		{"RT024", func(m map[string]any) { m["timestamp"] = "now" }},
		{"RT035", func(m map[string]any) { delete(m, "side_effects") }},
		{"RT035", func(m map[string]any) { m["side_effects"] = "noise" }},
		{"RT036", func(m map[string]any) { delete(m, "previous_value") }},
		{"RT037", func(m map[string]any) { m["status"] = "failed" }},
	}
	for _, c := range cases {
		m := obj(t, good)
		if c.edit != nil {
			c.edit(m)
		}
		got := CheckDo(m, key)
		if c.code == "" {
			if len(got) != 0 {
				t.Errorf("clean do answer %v: %v", m, got)
			}
			continue
		}
		if !codeSet(got)[c.code] {
			t.Errorf("%s did not fire on %v: %v", c.code, m, got)
		}
	}
}

// TestEveryRuntimeRuleIsChecked keeps the runtime table and the tests in
// step: each code appears in a test case or is produced by the client.
func TestEveryRuntimeRuleIsChecked(t *testing.T) {
	clientOnly := map[string]bool{"RT001": true, "RT017": true, "RT020": true, "RT021": true, "RT027": true, "RT029": true, "RT030": true}
	src := strings.Join([]string{"RT002 RT003 RT004 RT005 RT006 RT007 RT008 RT009 RT010 RT011 RT012 RT013 RT014 RT015 RT016",
		"RT022 RT023 RT024 RT025 RT026 RT028", "RT031 RT032 RT033 RT034 RT035 RT036 RT037"}, " ")
	for _, r := range RuntimeRules {
		if !clientOnly[r.Code] && !strings.Contains(src, r.Code) {
			t.Errorf("runtime rule %s has no unit test", r.Code)
		}
	}
}

func TestProbes(t *testing.T) {
	tools := []string{"read_temperature_zone_a", "do_heater_zone_a", "can_do", "do_fan_zone_b", "read_humidity_zone_a"}
	ps := Probes(tools, 1)
	if len(ps) != 3 {
		t.Fatalf("probes: %+v", ps)
	}
	do := ps[0].Args["intent"].(map[string]any)
	if ps[0].For != "do_fan_zone_b" || do["semantic_tags"].([]any)[0] != "fan" || do["target"] != "fan_zone_b" || do["action"] != "set" {
		t.Errorf("do probe: %+v", ps[0])
	}
	rd := ps[1].Args["intent"].(map[string]any)
	if ps[1].For != "read_humidity_zone_a" || rd["action"] != "read" {
		t.Errorf("read probe: %+v", ps[1])
	}
	if !ps[2].Nonsense || ps[2].Args["intent"].(map[string]any)["semantic_tags"].([]any)[0] != NonsenseTag {
		t.Errorf("nonsense probe: %+v", ps[2])
	}
}

func TestCurrentValue(t *testing.T) {
	r := obj(t, goodReport)
	if v, ok := CurrentValue([]map[string]any{r}, "do_heater_zone_a"); !ok || v != 40.0 {
		t.Errorf("current value: %v %v", v, ok)
	}
	if _, ok := CurrentValue([]map[string]any{r}, "do_heater_zone_c"); ok {
		t.Error("no current_state must give no value")
	}
	cand(r, 0)["current_state"].(map[string]any)["quality"] = "stale"
	if _, ok := CurrentValue([]map[string]any{r}, "do_heater_zone_a"); ok {
		t.Error("a stale current_state must not be used")
	}
}
