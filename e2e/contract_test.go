package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var eras = []string{"2026-07-28", "2025-11-25"}

// session is one way to reach a daemon: an era over a transport.
type session struct {
	name string
	cs   *mcp.ClientSession
	d    *daemon
	role string // the caller's role: none over HTTP without a policy, operator over stdio
}

// sessions starts one daemon per transport and era, without a policy file:
// the manifest's own limits hold (do_heater_zone_a requires the operator
// role, which only the stdio caller has here).
func sessions(t *testing.T) []session {
	var out []session
	for _, era := range eras {
		d := startHTTP(t, daemonOpts{})
		out = append(out, session{"http/" + era, connectHTTP(t, d, era), d, "none"})
		cs, sd := startStdio(t, era, daemonOpts{extra: []string{"--stdio-role", "operator"}})
		out = append(out, session{"stdio/" + era, cs, sd, "operator"})
	}
	return out
}

func TestContractsAcrossTransportsAndEras(t *testing.T) {
	t.Parallel()
	for _, s := range sessions(t) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			tools := listTools(t, s.cs)
			checkToolDefinitions(t, tools, s.role)
			checkRead(t, s.cs, tools["read_temperature_zone_a"])
			checkDoAndReplay(t, s, tools["do_fan_zone_b"])
			checkCanDo(t, s.cs, tools["can_do"], s.role)
			checkOffline(t, s)
		})
	}
}

func listTools(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		out[tl.Name] = tl
	}
	return out
}

func checkToolDefinitions(t *testing.T, tools map[string]*mcp.Tool, role string) {
	t.Helper()
	want := []string{
		"can_do",
		"do_fan_zone_b", "do_heater_zone_c", "do_irrigation_valve", "do_vent_zone_c",
		"read_humidity_zone_a", "read_humidity_zone_b", "read_humidity_zone_c", "read_irrigation_valve_position",
		"read_rain_tank_level", "read_temperature_zone_a", "read_temperature_zone_b", "read_temperature_zone_c",
	}
	if role != "none" { // the manifest: do_heater_zone_a requires_permission operator
		want = append(want, "do_heater_zone_a")
	}
	if len(tools) != len(want) {
		t.Errorf("got %d tools, want %d", len(tools), len(want))
	}
	for _, name := range want {
		tl := tools[name]
		if tl == nil {
			t.Errorf("missing tool %s", name)
			continue
		}
		a := tl.Annotations
		if a == nil || a.DestructiveHint == nil || a.OpenWorldHint == nil {
			t.Errorf("%s: all four annotations must be explicit, got %+v", name, a)
			continue
		}
		if *a.OpenWorldHint {
			t.Errorf("%s: openWorldHint must be false", name)
		}
		isDo := strings.HasPrefix(name, "do_")
		if a.ReadOnlyHint == isDo || *a.DestructiveHint != isDo || !a.IdempotentHint {
			t.Errorf("%s: annotations %+v (readOnly=%v destructive=%v idempotent=%v)", name, a, a.ReadOnlyHint, *a.DestructiveHint, a.IdempotentHint)
		}
		if tl.OutputSchema == nil {
			t.Errorf("%s: no outputSchema", name)
		}
		if isDo {
			in := schemaMap(t, tl.InputSchema)
			req := fmt.Sprint(in["required"])
			if !strings.Contains(req, "idempotency_key") || !strings.Contains(req, "value") {
				t.Errorf("%s: inputSchema.required = %v, want value and idempotency_key", name, req)
			}
		}
	}
}

func schemaMap(t *testing.T, s any) map[string]any {
	t.Helper()
	b, _ := json.Marshal(s)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// conforms validates structured content against the tool's outputSchema.
func conforms(t *testing.T, tool *mcp.Tool, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	out := structured(t, res)
	b, _ := json.Marshal(tool.OutputSchema)
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: outputSchema: %v", tool.Name, err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("%s: resolve outputSchema: %v", tool.Name, err)
	}
	if err := rs.Validate(out); err != nil {
		t.Errorf("%s: structuredContent does not match outputSchema: %v\n%v", tool.Name, err, out)
	}
	// The text block carries the same JSON (MCP backward compatibility).
	var fromText map[string]any
	if err := json.Unmarshal([]byte(text(res)), &fromText); err != nil {
		t.Errorf("%s: text block is not the JSON result: %v", tool.Name, err)
	}
	return out
}

func checkRead(t *testing.T, cs *mcp.ClientSession, tool *mcp.Tool) {
	t.Helper()
	o := conforms(t, tool, call(t, cs, "read_temperature_zone_a", map[string]any{}))
	if o["quality"] != "good" || o["unit"] != "celsius" || o["source"] != "gw_greenhouse_001" {
		t.Errorf("read: %v", o)
	}
	if v, ok := o["value"].(float64); !ok || v < -10 || v > 50 {
		t.Errorf("read value %v", o["value"])
	}
	// A second read inside cache_ttl_ms is served from the cache.
	o2 := structured(t, call(t, cs, "read_temperature_zone_a", nil))
	if o2["cached"] != true || o2["timestamp"] != o["timestamp"] {
		t.Errorf("second read not cached: %v", o2)
	}
	// max_age_ms 0 forces the device.
	o3 := structured(t, call(t, cs, "read_temperature_zone_a", map[string]any{"max_age_ms": 0}))
	if o3["cached"] != false {
		t.Errorf("max_age_ms=0 served the cache: %v", o3)
	}
}

func checkDoAndReplay(t *testing.T, s session, tool *mcp.Tool) {
	t.Helper()
	before := s.d.sim(t).writes("zone_b.fan")
	key := "e2e-" + s.name + "-fan-1"
	args := map[string]any{"value": 60, "idempotency_key": key}
	first := call(t, s.cs, "do_fan_zone_b", args)
	r := conforms(t, tool, first)
	if r["status"] != "success" || r["verified"] != true || r["applied_value"] != 60.0 || r["previous_value"] != 0.0 {
		t.Errorf("do: %v", r)
	}
	if r["compensable"] != true || r["compensation_hint"] != "do_fan_zone_b value=0" {
		t.Errorf("compensation: %v %v", r["compensable"], r["compensation_hint"])
	}
	pol, _ := r["policy"].(map[string]any)
	if pol["configured"] != false || !strings.Contains(fmt.Sprint(pol["note"]), "no physmcp.policy.yml") {
		t.Errorf("policy note must say honestly that no policy is configured: %v", pol)
	}
	// Replay: identical response, no second write.
	second := call(t, s.cs, "do_fan_zone_b", args)
	if text(second) != text(first) {
		t.Errorf("replay differs:\n%s\n%s", text(first), text(second))
	}
	if got := s.d.sim(t).writes("zone_b.fan") - before; got != 1 {
		t.Errorf("simulator saw %d writes for one key, want 1", got)
	}
	// Same key, other arguments: a clear error, nothing written.
	bad := call(t, s.cs, "do_fan_zone_b", map[string]any{"value": 80, "idempotency_key": key})
	if !bad.IsError || !strings.Contains(text(bad), "idempotency_key") || !strings.Contains(text(bad), "different arguments") {
		t.Errorf("reused key with other value: isError=%v %s", bad.IsError, text(bad))
	}
	if got := s.d.sim(t).writes("zone_b.fan") - before; got != 1 {
		t.Errorf("after a rejected key reuse the simulator saw %d writes, want 1", got)
	}
	// The effect is visible on the actuator's own reading.
	if v := s.d.sim(t).Signals["zone_b.fan"]; v != 60 {
		t.Errorf("plant fan = %v, want 60", v)
	}
}

func checkCanDo(t *testing.T, cs *mcp.ClientSession, tool *mcp.Tool, role string) {
	t.Helper()
	// A natural intent: warm zone A up.
	rep := conforms(t, tool, call(t, cs, "can_do", map[string]any{"intent": map[string]any{
		"semantic_tags": []string{"heating"}, "action": "increase", "target": "temperature", "location": "zone_a", "value": 40,
	}}))
	if role == "none" {
		// Without a policy the manifest's requires_permission still holds:
		// blocked with the reason, never a candidate.
		blocked, _ := rep["blocked"].([]any)
		if rep["feasible"] != false || len(blocked) == 0 || blocked[0].(map[string]any)["permission"] != "permission_insufficient" ||
			!strings.Contains(fmt.Sprint(blocked[0].(map[string]any)["details"]), "required_role=operator") {
			t.Errorf("can_do heating zone_a as role none: %v", rep)
		}
	} else {
		cands, _ := rep["candidates"].([]any)
		if rep["feasible"] != true || len(cands) == 0 {
			t.Fatalf("can_do heating zone_a: %v", rep)
		}
		top := cands[0].(map[string]any)
		if top["capability"] != "do_heater_zone_a" || top["confidence"].(float64) < 0.7 || top["permission"] != "allowed" || top["valid_until"] == "" {
			t.Errorf("top candidate: %v", top)
		}
	}
	ctx, _ := rep["context"].(map[string]any)
	if !strings.Contains(fmt.Sprint(ctx["related_reads"]), "read_temperature_zone_a") {
		t.Errorf("related_reads: %v", ctx["related_reads"])
	}
	// PhysMCP query form with direction is accepted too.
	rep = structured(t, call(t, cs, "can_do", map[string]any{"query": map[string]any{
		"semantic_tags": []string{"ventilation"}, "direction": "increase", "location": "zone_c"}, "ttl": 2}))
	if rep["feasible"] != true || !strings.Contains(fmt.Sprint(rep["candidates"]), "do_vent_zone_c") {
		t.Errorf("PhysMCP query: %v", rep)
	}
	// Nonsense: unroutable and not feasible.
	rep = conforms(t, tool, call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"teleport", "unicorn"}}}))
	un, _ := rep["unroutable"].([]any)
	if rep["feasible"] != false || len(un) != 1 || un[0].(map[string]any)["reason"] != "no_producer" {
		t.Errorf("nonsense intent: %v", rep)
	}
	// A value outside the range is blocked, not a candidate.
	rep = structured(t, call(t, cs, "can_do", map[string]any{"intent": map[string]any{
		"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_a", "value": 150}}))
	blocked, _ := rep["blocked"].([]any)
	if rep["feasible"] != false || len(blocked) == 0 || blocked[0].(map[string]any)["permission"] != "out_of_range" {
		t.Errorf("out-of-range intent: %v", rep)
	}
}

func checkOffline(t *testing.T, s session) {
	t.Helper()
	// Read humidity_zone_b once so a last value exists, then take it
	// offline; the rain tank gauge has never been read.
	o := structured(t, call(t, s.cs, "read_humidity_zone_b", nil))
	if o["quality"] != "good" {
		t.Fatalf("before fault: %v", o)
	}
	s.d.fault(t, "zone_b.humidity", "offline")
	s.d.fault(t, "rain_tank.level", "offline")
	defer s.d.fault(t, "zone_b.humidity", "none")
	defer s.d.fault(t, "rain_tank.level", "none")
	o = structured(t, call(t, s.cs, "read_humidity_zone_b", map[string]any{"max_age_ms": 0}))
	if o["quality"] != "stale" || o["value"] == nil {
		t.Errorf("offline sensor with a last value: want stale, got %v", o)
	}
	o = structured(t, call(t, s.cs, "read_rain_tank_level", nil))
	if o["quality"] != "error" || o["value"] != nil {
		t.Errorf("offline sensor never read: want error and null, got %v", o)
	}
	// An actuator whose device is offline is refused with nothing written.
	s.d.fault(t, "zone_c.vent", "offline")
	defer s.d.fault(t, "zone_c.vent", "none")
	r := structured(t, call(t, s.cs, "do_vent_zone_c", map[string]any{"value": 30, "idempotency_key": "offline-" + s.name}))
	if r["status"] != "failed" || r["permission"] != "source_unreachable" {
		t.Errorf("do on an offline device: %v", r)
	}
	if w := s.d.sim(t).writes("zone_c.vent"); w != 0 {
		t.Errorf("offline vent got %d writes", w)
	}
}

func TestManifestResource(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://manifest"})
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		PromcpBase     string `json:"promcp_base"`
		PhysMCPVersion string `json:"physmcp_version"`
		Device         struct{ ID string }
		Capabilities   []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(res.Contents[0].Text), &m); err != nil {
		t.Fatal(err)
	}
	if m.PromcpBase != "0.4.0" || m.PhysMCPVersion != "0.1" || m.Device.ID != "gw_greenhouse_001" || len(m.Capabilities) != 13 {
		t.Errorf("manifest resource: %+v", m)
	}
}
