package lint

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/physd/physd/promcp"
)

// A compliant server: every rule is quiet on it (except the server-level
// density rules, which it stays under).
const compliantJSON = `[
 {"name": "read_temperature",
  "description": "Air temperature in the room, measured at desk height.",
  "inputSchema": {"type": "object", "properties": {"max_age_ms": {"type": "integer"}}},
  "outputSchema": {"type": "object", "properties": {
     "value": {"type": ["number", "null"]}, "unit": {"type": "string"},
     "timestamp": {"type": "string", "format": "date-time"},
     "quality": {"type": "string", "enum": ["good", "stale", "degraded", "error"]}}}},
 {"name": "do_fan_speed",
  "description": "Fan speed in percent; call can_do first and pass a fresh idempotency_key.",
  "inputSchema": {"type": "object", "properties": {"value": {"type": "integer"}, "idempotency_key": {"type": "string"}}},
  "outputSchema": {"type": "object", "properties": {
     "status": {"type": "string", "enum": ["success", "partial", "failed"]},
     "idempotency_key": {"type": "string"}, "compensable": {"type": "boolean"},
     "compensation_hint": {"type": ["string", "null"]},
     "timestamp": {"type": "string"}, "side_effects": {"type": "array", "items": {"type": "string"}},
     "applied_value": {}, "previous_value": {}}}},
 {"name": "can_do",
  "description": "Check whether an intent is feasible before acting, without side effects.",
  "inputSchema": {"type": "object", "properties": {"intent": {"type": "object", "properties": {"semantic_tags": {"type": "array"}}}}},
  "outputSchema": {"type": "object", "properties": {
     "query_id": {"type": "string"}, "feasible": {"type": "boolean"},
     "candidates": {"type": "array", "items": {"type": "object", "properties": {
        "capability": {}, "source": {}, "confidence": {}, "valid_until": {},
        "permission": {"type": "string", "enum": ["allowed", "requires_human_approval", "policy_denied", "rate_limited",
          "cooldown_active", "out_of_range", "permission_insufficient", "source_unreachable", "partition_no_quorum"]}}}},
     "blocked": {"type": "array", "items": {"type": "object", "properties": {"capability": {}, "source": {}, "permission": {}, "reason": {}}}},
     "unroutable": {"type": "array", "items": {"type": "object", "properties": {
        "outcome": {}, "detail": {}, "reason": {"type": "string", "enum": ["no_producer", "requirements_unmet", "malformed_request"]}}}}}}}
]`

func compliant(t *testing.T) []map[string]any {
	t.Helper()
	var tools []map[string]any
	if err := json.Unmarshal([]byte(compliantJSON), &tools); err != nil {
		t.Fatal(err)
	}
	return tools
}

// byName returns the tool with name from tools.
func byName(tools []map[string]any, name string) map[string]any {
	for _, tl := range tools {
		if tl["name"] == name {
			return tl
		}
	}
	panic("no tool " + name)
}

// path walks nested objects: path(m, "outputSchema", "properties").
func path(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		m = m[k].(map[string]any)
	}
	return m
}

func outProps(tl map[string]any) map[string]any { return path(tl, "outputSchema", "properties") }

// codes lints a server and returns every finding code with its count.
func codes(tools []map[string]any) map[string]int {
	res, server := LintServer(tools)
	got := map[string]int{}
	for _, fd := range server {
		got[fd.Code]++
	}
	for _, r := range res {
		for _, fd := range r.Findings {
			got[fd.Code]++
		}
	}
	return got
}

func clone(t *testing.T, tools []map[string]any, extra ...map[string]any) []map[string]any {
	b, _ := json.Marshal(append(tools, extra...))
	var out []map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func manyTools(n int, prefix string) []map[string]any {
	var out []map[string]any
	for i := range n {
		out = append(out, map[string]any{"name": fmt.Sprintf("%s%c", prefix, 'a'+i)})
	}
	return out
}

// ruleCases breaks each rule on purpose: mutate turns the compliant server
// into one that must trigger code (and a rule that stays quiet fails).
var ruleCases = []struct {
	code   string
	why    string
	mutate func(tools []map[string]any) []map[string]any
}{
	{"N001", "tool without a name", func(ts []map[string]any) []map[string]any {
		delete(byName(ts, "read_temperature"), "name")
		return ts
	}},
	{"N001", "empty name", func(ts []map[string]any) []map[string]any { byName(ts, "read_temperature")["name"] = ""; return ts }},
	{"N002", "upper case", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["name"] = "read_Temperature"
		return ts
	}},
	{"N003", "wrong prefix", func(ts []map[string]any) []map[string]any {
		byName(ts, "do_fan_speed")["name"] = "set_fan_speed"
		return ts
	}},
	{"N003", "suffix style", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["name"] = "temperature_read"
		return ts
	}},
	{"N004", "bare read_", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["name"] = "read_"
		return ts
	}},
	{"N005", "bare do_", func(ts []map[string]any) []map[string]any { byName(ts, "do_fan_speed")["name"] = "do_"; return ts }},
	{"N006", "65 characters", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["name"] = "read_" + strings.Repeat("t", 60)
		return ts
	}},
	{"N007", "generic read_data", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["name"] = "read_data"
		return ts
	}},
	{"N007", "generic do_run", func(ts []map[string]any) []map[string]any { byName(ts, "do_fan_speed")["name"] = "do_run"; return ts }},
	{"D001", "no description", func(ts []map[string]any) []map[string]any { delete(byName(ts, "can_do"), "description"); return ts }},
	{"D002", "19 characters", func(ts []map[string]any) []map[string]any {
		byName(ts, "do_fan_speed")["description"] = strings.Repeat("x", 19)
		return ts
	}},
	{"D003", "substring set in setpoint", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["description"] = "Temperature setpoint of the room controller, in celsius."
		return ts
	}},
	{"D003", "keyword in capitals", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["description"] = "WRITE the temperature to the log and return it."
		return ts
	}},
	{"I001", "can_do without intent", func(ts []map[string]any) []map[string]any {
		path(byName(ts, "can_do"), "inputSchema")["properties"] = map[string]any{"query": map[string]any{}}
		return ts
	}},
	{"I002", "intent with properties but no semantic_tags", func(ts []map[string]any) []map[string]any {
		path(byName(ts, "can_do"), "inputSchema", "properties", "intent")["properties"] = map[string]any{"action": map[string]any{}}
		return ts
	}},
	{"I002", "bare {} intent", func(ts []map[string]any) []map[string]any {
		path(byName(ts, "can_do"), "inputSchema", "properties")["intent"] = map[string]any{}
		return ts
	}},
	{"I003", "do_ without idempotency_key", func(ts []map[string]any) []map[string]any {
		delete(path(byName(ts, "do_fan_speed"), "inputSchema", "properties"), "idempotency_key")
		return ts
	}},
	{"R000", "no outputSchema", func(ts []map[string]any) []map[string]any {
		delete(byName(ts, "read_temperature"), "outputSchema")
		return ts
	}},
	{"R000", "empty outputSchema", func(ts []map[string]any) []map[string]any {
		byName(ts, "read_temperature")["outputSchema"] = map[string]any{}
		return ts
	}},
	{"R001", "read_ without quality", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "read_temperature")), "quality")
		return ts
	}},
	{"R001", "read_ without timestamp", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "read_temperature")), "timestamp")
		return ts
	}},
	{"R002", "invalid quality value", func(ts []map[string]any) []map[string]any {
		outProps(byName(ts, "read_temperature"))["quality"] = map[string]any{"enum": []any{"good", "stale", "degraded", "error", "unknown"}}
		return ts
	}},
	{"R003", "quality without error", func(ts []map[string]any) []map[string]any {
		outProps(byName(ts, "read_temperature"))["quality"] = map[string]any{"enum": []any{"good", "stale", "degraded"}}
		return ts
	}},
	{"R003", "quality with no enum", func(ts []map[string]any) []map[string]any {
		outProps(byName(ts, "read_temperature"))["quality"] = map[string]any{"type": "string"}
		return ts
	}},
	{"R004", "do_ without timestamp", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "do_fan_speed")), "timestamp")
		return ts
	}},
	{"R005", "invalid status", func(ts []map[string]any) []map[string]any {
		outProps(byName(ts, "do_fan_speed"))["status"] = map[string]any{"enum": []any{"success", "done"}}
		return ts
	}},
	{"R006", "do_ without compensable", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "do_fan_speed")), "compensable")
		return ts
	}},
	{"R007", "do_ response without idempotency_key", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "do_fan_speed")), "idempotency_key")
		return ts
	}},
	{"R008", "do_ without side_effects", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "do_fan_speed")), "side_effects")
		return ts
	}},
	{"R009", "can_do without query_id", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "can_do")), "query_id")
		return ts
	}},
	{"R010", "candidate without valid_until", func(ts []map[string]any) []map[string]any {
		delete(path(outProps(byName(ts, "can_do")), "candidates", "items", "properties"), "valid_until")
		return ts
	}},
	{"R012", "unknown permission", func(ts []map[string]any) []map[string]any {
		path(outProps(byName(ts, "can_do")), "candidates", "items", "properties")["permission"] = map[string]any{"enum": []any{"allowed", "maybe"}}
		return ts
	}},
	{"R013", "blocked without reason", func(ts []map[string]any) []map[string]any {
		delete(path(outProps(byName(ts, "can_do")), "blocked", "items", "properties"), "reason")
		return ts
	}},
	{"R014", "unroutable without detail", func(ts []map[string]any) []map[string]any {
		delete(path(outProps(byName(ts, "can_do")), "unroutable", "items", "properties"), "detail")
		return ts
	}},
	{"R014", "unroutable with an unknown reason", func(ts []map[string]any) []map[string]any {
		path(outProps(byName(ts, "can_do")), "unroutable", "items", "properties")["reason"] = map[string]any{"enum": []any{"no_producer", "busy"}}
		return ts
	}},
	{"R015", "can_do without unroutable", func(ts []map[string]any) []map[string]any {
		delete(outProps(byName(ts, "can_do")), "unroutable")
		return ts
	}},
	{"SE001", "read_ declaring side_effects", func(ts []map[string]any) []map[string]any {
		outProps(byName(ts, "read_temperature"))["side_effects"] = map[string]any{"type": "array"}
		return ts
	}},
	{"S001", "no can_do", func(ts []map[string]any) []map[string]any {
		return []map[string]any{byName(ts, "read_temperature"), byName(ts, "do_fan_speed")}
	}},
	{"S002", "two can_do", func(ts []map[string]any) []map[string]any { return append(ts, map[string]any{"name": "can_do"}) }},
	{"S003", "duplicate name", func(ts []map[string]any) []map[string]any {
		return append(ts, map[string]any{"name": "read_temperature"})
	}},
	{"S004", "9 tools", func(ts []map[string]any) []map[string]any { return append(ts, manyTools(6, "read_x")...) }},
	{"S005", "6 do_ tools", func(ts []map[string]any) []map[string]any { return append(ts, manyTools(5, "do_x")...) }},
}

func TestCompliantServerIsClean(t *testing.T) {
	if got := codes(compliant(t)); len(got) != 0 {
		t.Fatalf("compliant server has findings: %v", got)
	}
}

// TestRules breaks each rule on purpose and checks that exactly that rule
// speaks up (a broken rule fails its own subtest).
func TestRules(t *testing.T) {
	for _, c := range ruleCases {
		t.Run(c.code+"/"+c.why, func(t *testing.T) {
			got := codes(c.mutate(clone(t, compliant(t))))
			if got[c.code] == 0 {
				t.Fatalf("%s did not fire; findings: %v", c.code, got)
			}
			for code := range got {
				if !related(c.code, code) {
					t.Errorf("unexpected %s (with %s); findings: %v", code, c.code, got)
				}
			}
		})
	}
}

// related lists the rules that legitimately fire together (promcp-lint's
// own overlaps: R004 duplicates R006/R007; a renamed tool also loses its
// category checks; bare extra tools have no description or schemas).
func related(want, got string) bool {
	if want == got {
		return true
	}
	overlaps := map[string][]string{
		"R006": {"R004"}, "R007": {"R004"},
		"N002": {"N003"}, "N001": {}, "N003": {"I003", "R004", "R006", "R007", "R008", "R001", "R003"},
		"N004": {"D003"}, "N005": {"I003"},
		"S002": {"D001", "I001", "R000", "S003"}, "S003": {"D001", "R000"},
		"S004": {"D001", "R000"}, "S005": {"D001", "R000", "I003", "S004"},
	}
	for _, o := range overlaps[want] {
		if o == got {
			return true
		}
	}
	return false
}

// TestEveryRuleHasACase keeps the table complete.
func TestEveryRuleHasACase(t *testing.T) {
	have := map[string]bool{}
	for _, c := range ruleCases {
		have[c.code] = true
	}
	for _, r := range Rules {
		if !have[r.Code] {
			t.Errorf("rule %s has no breaking case", r.Code)
		}
	}
	if len(Rules) != 34 {
		t.Errorf("promcp-lint has 34 rules (R011 does not exist), table has %d", len(Rules))
	}
}

func TestSeverities(t *testing.T) {
	sev := map[string]Severity{}
	for _, r := range Rules {
		sev[r.Code] = r.Severity
	}
	for _, c := range ruleCases {
		res, server := LintServer(c.mutate(clone(t, compliant(t))))
		all := server
		for _, r := range res {
			all = append(all, r.Findings...)
		}
		for _, fd := range all {
			if fd.Severity != sev[fd.Code] {
				t.Errorf("%s reported as %s, table says %s", fd.Code, fd.Severity, sev[fd.Code])
			}
		}
	}
}

func TestResponseSchemaKeys(t *testing.T) {
	read := byName(compliant(t), "read_temperature")
	out := read["outputSchema"]
	delete(read, "outputSchema")
	for _, key := range []string{"responseSchema", "response_schema", "outputSchema"} {
		tl := map[string]any{"name": "read_temperature", key: out}
		if ResponseSchema(tl) == nil {
			t.Errorf("%s not read", key)
		}
	}
	// promcp-lint's own key wins over MCP's outputSchema.
	tl := map[string]any{"name": "read_x", "responseSchema": map[string]any{"properties": map[string]any{}}, "outputSchema": out}
	if got := CheckResponseSchema(tl); len(got) != 3 {
		t.Errorf("responseSchema should win: %v", got)
	}
}

// TestPhysdSchemasAreClean: the contracts physd publishes as outputSchema
// pass every response rule.
func TestPhysdSchemasAreClean(t *testing.T) {
	toMap := func(s promcp.Schema) map[string]any {
		b, _ := json.Marshal(s)
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		return m
	}
	tools := []map[string]any{
		{"name": "read_temperature_zone_a", "description": "Air temperature in zone A.", "inputSchema": map[string]any{"type": "object"},
			"outputSchema": toMap(promcp.ReadOutputSchema("float", nil))},
		{"name": "read_mode", "description": "Operating mode of the unit.", "inputSchema": map[string]any{"type": "object"},
			"outputSchema": toMap(promcp.ReadOutputSchema("enum", []string{"auto", "off"}))},
		{"name": "do_heater_zone_a", "description": "Heating power in zone A, percent.", "inputSchema": map[string]any{"type": "object",
			"properties": map[string]any{"value": map[string]any{}, "idempotency_key": map[string]any{}}},
			"outputSchema": toMap(promcp.DoOutputSchema("float", nil))},
		{"name": "can_do", "description": "Check whether an intent is feasible.", "inputSchema": toMap(promcp.CanDoInputSchema()),
			"outputSchema": toMap(promcp.CanDoOutputSchema())},
	}
	if got := codes(tools); len(got) != 0 {
		t.Fatalf("physd's contracts have findings: %v", got)
	}
}

func TestLoadTools(t *testing.T) {
	for _, in := range []string{compliantJSON, `{"tools": ` + compliantJSON + `}`} {
		tools, err := LoadTools(strings.NewReader(in))
		if err != nil || len(tools) != 3 {
			t.Errorf("LoadTools: %d tools, %v", len(tools), err)
		}
	}
	for _, bad := range []string{`{"x": 1}`, `[]`, `[1]`, `not json`, `"s"`} {
		if _, err := LoadTools(strings.NewReader(bad)); err == nil {
			t.Errorf("LoadTools(%s) accepted", bad)
		}
	}
}

func TestReportExitCodes(t *testing.T) {
	clean := LintTools(compliant(t))
	if clean.ExitCode() != 0 || !clean.Summary.Pass {
		t.Errorf("clean: %+v", clean.Summary)
	}
	warn := LintTools(clean2(t))
	if warn.ExitCode() != 0 || warn.Summary.Warnings == 0 {
		t.Errorf("warnings only: %+v", warn.Summary)
	}
	warn.Strict(true)
	if warn.ExitCode() != 1 {
		t.Errorf("--strict with warnings: exit %d", warn.ExitCode())
	}
	broken := compliant(t)
	byName(broken, "do_fan_speed")["name"] = "setFan"
	if r := LintTools(broken); r.ExitCode() != 1 || r.Summary.Errors == 0 {
		t.Errorf("errors: %+v", r.Summary)
	}
	var sb strings.Builder
	clean.WriteText(&sb)
	if !strings.Contains(sb.String(), "✓ read_temperature") || !strings.Contains(sb.String(), "0 error(s)") {
		t.Errorf("text report:\n%s", sb.String())
	}
	sb.Reset()
	if err := clean.WriteJSON(&sb); err != nil || !strings.Contains(sb.String(), `"promcp_version": "0.4.0"`) {
		t.Errorf("json report: %v\n%s", err, sb.String())
	}
}

// clean2 is the compliant server with one warning (D002).
func clean2(t *testing.T) []map[string]any {
	ts := compliant(t)
	byName(ts, "can_do")["description"] = "Short."
	return ts
}
