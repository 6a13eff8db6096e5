// Package lint checks an MCP server against the proMCP v0.4 contracts from
// the outside.
//
// The static rules (N001–N007, D001–D003, I001–I003, R000–R015, SE001,
// S001–S005) are the complete promcp-lint rule table, re-implemented as pure
// functions over tool definitions: the JSON objects of an MCP tools/list
// answer or of a promcp-lint tools file. A tool's response contract is its
// "responseSchema" (promcp-lint's own key), else "response_schema", else
// MCP's standard "outputSchema".
//
// The runtime checks (RT0xx, runtime.go) look at real answers, which a
// static linter cannot: can_do's derived feasibility and candidate
// validity, read_ observations, and (only when asked) do_ results. The MCP
// client that gathers them is in client.go.
package lint

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Severity of a finding, as promcp-lint names them.
type Severity string

const (
	SevError   Severity = "error"
	SevWarning Severity = "warning"
	SevInfo    Severity = "info"
)

// Finding is one result of a rule.
type Finding struct {
	Severity Severity `json:"severity"`
	Code     string   `json:"code"`
	Message  string   `json:"message"`
}

// ToolResult is the findings for one tool definition.
type ToolResult struct {
	Name     string    `json:"name"`
	Findings []Finding `json:"findings"`
}

// Rule describes one static rule.
type Rule struct {
	Code     string
	Severity Severity
	Summary  string
}

// Rules is the promcp-lint rule table (checker.py; R011 does not exist).
var Rules = []Rule{
	{"N001", SevError, "tool has no name"},
	{"N002", SevError, "name is not lowercase_snake_case"},
	{"N003", SevError, "name does not start with read_ or do_ and is not can_do"},
	{"N004", SevError, "read_ with no capability identifier"},
	{"N005", SevError, "do_ with no capability identifier"},
	{"N006", SevWarning, "name longer than 64 characters"},
	{"N007", SevWarning, "generic name (do_action, read_data, …)"},
	{"D001", SevWarning, "no description"},
	{"D002", SevWarning, "description shorter than 20 characters"},
	{"D003", SevWarning, "read_ description contains a mutation keyword (substring match)"},
	{"I001", SevError, "can_do inputSchema has no intent property"},
	{"I002", SevError, "can_do intent has no semantic_tags property"},
	{"I003", SevError, "do_ inputSchema has no idempotency_key property"},
	{"R000", SevInfo, "no response schema declared"},
	{"R001", SevError, "read_ response schema lacks value, timestamp or quality"},
	{"R002", SevError, "quality enum has values outside good|stale|degraded|error"},
	{"R003", SevError, "quality enum is incomplete (or missing)"},
	{"R004", SevError, "do_ response schema lacks status, idempotency_key, compensable or timestamp"},
	{"R005", SevError, "status enum has values outside success|partial|failed"},
	{"R006", SevError, "do_ response schema lacks compensable"},
	{"R007", SevError, "do_ response schema lacks idempotency_key"},
	{"R008", SevWarning, "do_ response schema lacks side_effects"},
	{"R009", SevError, "can_do response schema lacks query_id, feasible, candidates or blocked"},
	{"R010", SevError, "can_do candidates[] items lack a required field"},
	{"R012", SevError, "candidate permission enum has values outside the 9-value set"},
	{"R013", SevError, "can_do blocked[] items lack a required field"},
	{"R014", SevError, "can_do unroutable[] items lack outcome/reason/detail or use an unknown reason"},
	{"R015", SevInfo, "can_do response schema declares no unroutable[]"},
	{"SE001", SevError, "read_ response schema declares side_effects"},
	{"S001", SevError, "no can_do tool"},
	{"S002", SevError, "more than one can_do tool"},
	{"S003", SevError, "duplicate tool name"},
	{"S004", SevWarning, "more than 8 tools"},
	{"S005", SevWarning, "more than 5 do_ tools"},
}

// The vocabularies of proMCP v0.4 (contracts.py).
var (
	QualityValues    = []string{"good", "stale", "degraded", "error"}
	StatusValues     = []string{"success", "partial", "failed"}
	PermissionValues = []string{
		"allowed", "requires_human_approval", "policy_denied", "rate_limited", "cooldown_active",
		"out_of_range", "permission_insufficient", "source_unreachable", "partition_no_quorum",
	}
	UnroutableReasons = []string{"no_producer", "requirements_unmet", "malformed_request"}
)

const (
	canDo           = "can_do"
	maxToolsPerSrv  = 8
	maxDoPerSrv     = 5
	maxNameLen      = 64
	minDescription  = 20
	unnamed         = "(unnamed)"
	serverToolLabel = "server"
)

var (
	namingRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

	requiredRead       = []string{"quality", "timestamp", "value"}
	requiredDo         = []string{"compensable", "idempotency_key", "status", "timestamp"}
	requiredCanDo      = []string{"blocked", "candidates", "feasible", "query_id"}
	requiredCandidate  = []string{"capability", "confidence", "permission", "source", "valid_until"}
	requiredBlocked    = []string{"capability", "permission", "reason", "source"}
	requiredUnroutable = []string{"detail", "outcome", "reason"}

	genericNames = map[string]bool{
		"do_action": true, "do_update": true, "do_create": true, "do_delete": true,
		"read_data": true, "read_value": true, "read_info": true, "do_execute": true, "do_run": true,
	}
	mutationKeywords = []string{"create", "delete", "insert", "modify", "reset", "send", "set", "trigger", "update", "write"}
)

func f(sev Severity, code, format string, args ...any) Finding {
	return Finding{Severity: sev, Code: code, Message: fmt.Sprintf(format, args...)}
}

// asMap returns v as a JSON object, or nil.
func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// propsOf returns a schema's "properties" object (never nil).
func propsOf(schema map[string]any) map[string]any {
	if p := asMap(schema["properties"]); p != nil {
		return p
	}
	return map[string]any{}
}

// nameOf returns the tool's name; ok is false when it is missing, empty or
// not a string.
func nameOf(tool map[string]any) (string, bool) {
	s, ok := tool["name"].(string)
	return s, ok && s != ""
}

// displayName is the name shown in reports.
func displayName(tool map[string]any) string {
	if n, ok := nameOf(tool); ok {
		return n
	}
	return unnamed
}

// ResponseSchema returns the tool's declared response contract: the
// promcp-lint "responseSchema" or "response_schema" key, else MCP's
// "outputSchema". An empty object counts as none.
func ResponseSchema(tool map[string]any) map[string]any {
	for _, k := range []string{"responseSchema", "response_schema", "outputSchema"} {
		if m := asMap(tool[k]); len(m) > 0 {
			return m
		}
	}
	return nil
}

// missing returns the keys of want absent from have, sorted.
func missing(want []string, have map[string]any) []string {
	var out []string
	for _, k := range want {
		if _, ok := have[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// enumStrings returns a schema's enum as strings (non-strings rendered as
// JSON-ish text so they show up as invalid) and whether an enum exists.
func enumStrings(schema map[string]any) ([]string, bool) {
	raw, ok := schema["enum"].([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(raw))
	for _, v := range raw {
		if s, isStr := v.(string); isStr {
			out = append(out, s)
		} else {
			out = append(out, fmt.Sprintf("%v", v))
		}
	}
	return out, true
}

// outside returns the values of got not in allowed, and the values of
// allowed not in got, both sorted and de-duplicated.
func outside(got, allowed []string) (invalid, absent []string) {
	in := map[string]bool{}
	for _, a := range allowed {
		in[a] = true
	}
	seen := map[string]bool{}
	for _, g := range got {
		seen[g] = true
		if !in[g] && !contains(invalid, g) {
			invalid = append(invalid, g)
		}
	}
	for _, a := range allowed {
		if !seen[a] {
			absent = append(absent, a)
		}
	}
	sort.Strings(invalid)
	sort.Strings(absent)
	return invalid, absent
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// CheckNaming applies N001–N007.
func CheckNaming(tool map[string]any) []Finding {
	name, ok := nameOf(tool)
	if !ok {
		return []Finding{f(SevError, "N001", "Tool has no 'name' field.")}
	}
	if name == canDo {
		return nil
	}
	var out []Finding
	if !namingRE.MatchString(name) {
		out = append(out, f(SevError, "N002", "Name must be lowercase_snake_case. Got: '%s'.", name))
	}
	if !strings.HasPrefix(name, "read_") && !strings.HasPrefix(name, "do_") {
		out = append(out, f(SevError, "N003", "Name must start with 'read_' or 'do_', or be exactly 'can_do'."))
	}
	if name == "read_" {
		out = append(out, f(SevError, "N004", "read_* tool name must have a capability identifier after the prefix."))
	}
	if name == "do_" {
		out = append(out, f(SevError, "N005", "do_* tool name must have a capability identifier after the prefix."))
	}
	if len(name) > maxNameLen {
		out = append(out, f(SevWarning, "N006", "Tool name exceeds %d characters (%d). Consider shortening.", maxNameLen, len(name)))
	}
	if genericNames[name] {
		out = append(out, f(SevWarning, "N007", "'%s' is a generic name. Use a domain-specific capability name.", name))
	}
	return out
}

// CheckDescription applies D001–D003. D003 matches substrings, as
// promcp-lint does: "setpoint", "offset" and "dataset" trigger it too.
func CheckDescription(tool map[string]any) []Finding {
	name, _ := nameOf(tool)
	desc, _ := tool["description"].(string)
	if desc == "" {
		return []Finding{f(SevWarning, "D001", "Tool has no description. Descriptions are critical for accurate tool selection.")}
	}
	var out []Finding
	if n := len([]rune(desc)); n < minDescription {
		out = append(out, f(SevWarning, "D002", "Description is very short (%d chars). Include what the tool does and when NOT to use it.", n))
	}
	if strings.HasPrefix(name, "read_") {
		lower := strings.ToLower(desc)
		var found []string
		for _, w := range mutationKeywords {
			if strings.Contains(lower, w) {
				found = append(found, w)
			}
		}
		if len(found) > 0 {
			out = append(out, f(SevWarning, "D003", "Description of read_* contains mutation keywords: %v (%s). Verify this tool has no side effects.",
				found, mutationContext(desc, found)))
		}
	}
	return out
}

// mutationContext quotes the words of desc that contain the keywords, so a
// reader sees why a harmless word ("settle", "offset") matched.
func mutationContext(desc string, keywords []string) string {
	var words []string
	for _, w := range strings.FieldsFunc(desc, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_')
	}) {
		lw := strings.ToLower(w)
		for _, k := range keywords {
			if strings.Contains(lw, k) && !contains(words, "'"+w+"'") {
				words = append(words, "'"+w+"'")
			}
		}
	}
	return "in " + strings.Join(words, ", ")
}

// CheckInputSchema applies I001–I003.
func CheckInputSchema(tool map[string]any) []Finding {
	name, _ := nameOf(tool)
	props := propsOf(asMap(tool["inputSchema"]))
	if name == canDo {
		intent, ok := props["intent"]
		if !ok {
			return []Finding{f(SevError, "I001", "can_do inputSchema must include 'intent' property.")}
		}
		is := asMap(intent)
		ip := propsOf(is)
		// A plain object with no declared properties is accepted (the
		// promcp decorator's dict annotation; semantic_tags is then
		// enforced at run time).
		if t, _ := is["type"].(string); t == "object" && len(ip) == 0 {
			return nil
		}
		if _, ok := ip["semantic_tags"]; !ok {
			return []Finding{f(SevError, "I002", "can_do intent must include 'semantic_tags' array.")}
		}
		return nil
	}
	if strings.HasPrefix(name, "do_") {
		if _, ok := props["idempotency_key"]; !ok {
			return []Finding{f(SevError, "I003", "do_* inputSchema must include 'idempotency_key' parameter.")}
		}
	}
	return nil
}

// CheckResponseSchema applies R000–R015.
func CheckResponseSchema(tool map[string]any) []Finding {
	name, _ := nameOf(tool)
	rs := ResponseSchema(tool)
	if rs == nil {
		return []Finding{f(SevInfo, "R000", "No responseSchema (or MCP outputSchema) declared. Add one to enable full response contract validation.")}
	}
	props := propsOf(rs)
	var out []Finding
	switch {
	case strings.HasPrefix(name, "read_"):
		for _, m := range missing(requiredRead, props) {
			out = append(out, f(SevError, "R001", "read_* responseSchema missing required field: '%s'. Required: %v.", m, requiredRead))
		}
		if q, ok := props["quality"]; ok {
			vals, _ := enumStrings(asMap(q))
			invalid, absent := outside(vals, QualityValues)
			if len(invalid) > 0 {
				out = append(out, f(SevError, "R002", "quality enum has invalid values: %v.", invalid))
			}
			if len(absent) > 0 {
				out = append(out, f(SevError, "R003", "quality enum is incomplete. Missing: %v.", absent))
			}
		}
	case strings.HasPrefix(name, "do_"):
		for _, m := range missing(requiredDo, props) {
			out = append(out, f(SevError, "R004", "do_* responseSchema missing required field: '%s'. Required: %v.", m, requiredDo))
		}
		if s, ok := props["status"]; ok {
			vals, _ := enumStrings(asMap(s))
			if invalid, _ := outside(vals, StatusValues); len(invalid) > 0 {
				out = append(out, f(SevError, "R005", "status enum has invalid values: %v.", invalid))
			}
		}
		if _, ok := props["compensable"]; !ok {
			out = append(out, f(SevError, "R006", "do_* responseSchema missing 'compensable' field."))
		}
		if _, ok := props["idempotency_key"]; !ok {
			out = append(out, f(SevError, "R007", "do_* responseSchema missing 'idempotency_key' field."))
		}
		if _, ok := props["side_effects"]; !ok {
			out = append(out, f(SevWarning, "R008", "do_* responseSchema missing 'side_effects' array (recommended)."))
		}
	case name == canDo:
		for _, m := range missing(requiredCanDo, props) {
			out = append(out, f(SevError, "R009", "can_do responseSchema missing required field: '%s'. Required: %v.", m, requiredCanDo))
		}
		if c, ok := props["candidates"]; ok {
			ip := propsOf(asMap(asMap(c)["items"]))
			for _, m := range missing(requiredCandidate, ip) {
				out = append(out, f(SevError, "R010", "can_do candidates[] missing required field: '%s'.", m))
			}
			if p, ok := ip["permission"]; ok {
				vals, _ := enumStrings(asMap(p))
				if invalid, _ := outside(vals, PermissionValues); len(invalid) > 0 {
					out = append(out, f(SevError, "R012", "can_do candidates permission enum has unknown values: %v. Use namespaced prefix for domain extensions.", invalid))
				}
			}
		}
		if b, ok := props["blocked"]; ok {
			ip := propsOf(asMap(asMap(b)["items"]))
			for _, m := range missing(requiredBlocked, ip) {
				out = append(out, f(SevError, "R013", "can_do blocked[] missing required field: '%s'.", m))
			}
		}
		if u, ok := props["unroutable"]; ok {
			ip := propsOf(asMap(asMap(u)["items"]))
			for _, m := range missing(requiredUnroutable, ip) {
				out = append(out, f(SevError, "R014", "can_do unroutable[] missing required field: '%s'. Required: %v (spec §6.3).", m, requiredUnroutable))
			}
			if r, ok := ip["reason"]; ok {
				vals, _ := enumStrings(asMap(r))
				if invalid, _ := outside(vals, UnroutableReasons); len(invalid) > 0 {
					out = append(out, f(SevError, "R014", "can_do unroutable[].reason enum has unknown values: %v. Allowed: %v (spec §6.3).", invalid, UnroutableReasons))
				}
			}
		} else {
			out = append(out, f(SevInfo, "R015", "can_do responseSchema declares no 'unroutable[]'. Without it, an outcome no capability produces "+
				"has to be reported by inventing a capability name in blocked[] or by an unexplained feasible: false (spec §6.3)."))
		}
	}
	return out
}

// CheckSideEffects applies SE001.
func CheckSideEffects(tool map[string]any) []Finding {
	name, _ := nameOf(tool)
	if !strings.HasPrefix(name, "read_") {
		return nil
	}
	if _, ok := propsOf(ResponseSchema(tool))["side_effects"]; ok {
		return []Finding{f(SevError, "SE001", "read_* tool declares 'side_effects'. Read tools must have no side effects — rename to do_* if mutation occurs.")}
	}
	return nil
}

// LintTool applies every tool-level rule to one tool definition.
func LintTool(tool map[string]any) ToolResult {
	r := ToolResult{Name: displayName(tool), Findings: []Finding{}}
	for _, check := range []func(map[string]any) []Finding{CheckNaming, CheckDescription, CheckInputSchema, CheckResponseSchema, CheckSideEffects} {
		r.Findings = append(r.Findings, check(tool)...)
	}
	return r
}

// CheckServer applies S001–S005 to the whole tool list.
func CheckServer(tools []map[string]any) []Finding {
	out := []Finding{}
	names := make([]string, len(tools))
	canDos, dos := 0, 0
	for i, t := range tools {
		names[i], _ = nameOf(t)
		if names[i] == canDo {
			canDos++
		}
		if strings.HasPrefix(names[i], "do_") {
			dos++
		}
	}
	switch {
	case canDos == 0:
		out = append(out, f(SevError, "S001", "No 'can_do' tool found. Every proMCP-compliant server must expose exactly one."))
	case canDos > 1:
		out = append(out, f(SevError, "S002", "Found %d 'can_do' tools. Exactly one is permitted.", canDos))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			out = append(out, f(SevError, "S003", "Duplicate tool name: '%s'.", n))
		}
		seen[n] = true
	}
	if len(tools) > maxToolsPerSrv {
		out = append(out, f(SevWarning, "S004", "%d tools exceeds recommended maximum of %d. Consider splitting by domain or workflow phase.", len(tools), maxToolsPerSrv))
	}
	if dos > maxDoPerSrv {
		out = append(out, f(SevWarning, "S005", "%d do_* tools. Recommended maximum is %d.", dos, maxDoPerSrv))
	}
	return out
}

// LintServer applies every static rule to a tool list.
func LintServer(tools []map[string]any) (results []ToolResult, server []Finding) {
	results = make([]ToolResult, 0, len(tools))
	for _, t := range tools {
		results = append(results, LintTool(t))
	}
	return results, CheckServer(tools)
}
