package lint

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// RuntimeRules are the checks on real answers (runtime.go). They complement
// the static table: promcp-lint itself does not check feasible derivation,
// valid_until values or the compensable → compensation_hint coupling.
var RuntimeRules = []Rule{
	{"RT001", SevError, "can_do failed (protocol error or isError) on a well-formed intent"},
	{"RT002", SevError, "can_do answer lacks query_id, feasible, candidates or blocked, or has the wrong types"},
	{"RT003", SevError, "feasible is not derived: it must be true iff a candidate has permission allowed"},
	{"RT004", SevError, "a candidate lacks capability, source, confidence, permission or valid_until"},
	{"RT005", SevError, "a candidate's valid_until does not parse or is not in the future"},
	{"RT006", SevWarning, "a candidate's valid_until is more than 300 s ahead (beyond every §11.3 band)"},
	{"RT007", SevError, "a permission value outside the 9-value enum"},
	{"RT008", SevWarning, "a candidate with a blocked-only permission (only allowed and requires_human_approval belong in candidates[])"},
	{"RT009", SevError, "a blocked entry lacks capability, source, permission or a non-empty reason, or says allowed"},
	{"RT010", SevError, "unroutable[] is non-empty while feasible is true"},
	{"RT011", SevError, "an unroutable entry lacks outcome, reason or detail, or its reason is outside the enum"},
	{"RT012", SevError, "feasible is false but neither blocked[] nor unroutable[] explains why"},
	{"RT013", SevError, "a confidence is not a number in [0, 1]"},
	{"RT014", SevWarning, "candidates are not ordered by confidence, descending"},
	{"RT015", SevWarning, "a nonsense intent was answered with candidates or as feasible"},
	{"RT016", SevWarning, "a name in the answer (candidate, related_reads) is not a listed tool"},
	{"RT017", SevWarning, "query_id repeats across can_do calls"},
	{"RT020", SevError, "read_ failed (protocol error or isError) with no arguments"},
	{"RT021", SevError, "the answer carries no JSON object (structuredContent or JSON text)"},
	{"RT022", SevError, "read_ answer lacks value, timestamp or quality (value may be null only with quality error)"},
	{"RT023", SevError, "quality outside good|stale|degraded|error"},
	{"RT024", SevError, "a timestamp does not parse as ISO 8601 (RFC 3339)"},
	{"RT025", SevWarning, "an observation timestamp is more than 5 s in the future"},
	{"RT026", SevWarning, "read_ answer has no unit (PhysMCP §14.2 requires it for physical quantities)"},
	{"RT027", SevError, "structuredContent does not validate against the tool's outputSchema"},
	{"RT028", SevInfo, "read_ quality is not good (what an orchestrator would do with it)"},
	{"RT029", SevInfo, "a tool was not called (needs arguments, or a do_ without --allow-do or without an obvious current value)"},
	{"RT030", SevError, "do_ failed (protocol error or isError) on input that matches its schema"},
	{"RT031", SevError, "do_ answer lacks status, idempotency_key, compensable or timestamp"},
	{"RT032", SevError, "status outside success|partial|failed"},
	{"RT033", SevError, "idempotency_key is not the key that was sent"},
	{"RT034", SevError, "compensable is true but compensation_hint is missing or empty"},
	{"RT035", SevWarning, "side_effects is missing or not a string array (§4.2 says MUST list)"},
	{"RT036", SevWarning, "applied_value or previous_value is absent (PhysMCP §14.2 requires both on do_)"},
	{"RT037", SevWarning, "status failed without permission or reason (the caller cannot tell why)"},
}

const (
	maxValidity     = 300 * time.Second
	futureSkew      = 5 * time.Second
	permAllowed     = "allowed"
	permHumanApprov = "requires_human_approval"
)

// parseTime parses an ISO 8601 timestamp as RFC 3339 (with or without
// fractional seconds).
func parseTime(v any) (time.Time, bool) {
	s, ok := v.(string)
	if !ok || s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t, err == nil
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	}
	return 0, false
}

func isStringArray(v any) bool {
	a, ok := v.([]any)
	if !ok {
		return false
	}
	for _, e := range a {
		if _, ok := e.(string); !ok {
			return false
		}
	}
	return true
}

// CanDoCheck is what CheckCanDo needs to know about one can_do call.
type CanDoCheck struct {
	Report   map[string]any // the structured answer
	SentAt   time.Time      // when the request left
	Nonsense bool           // the intent names nothing any server could produce
	Tools    map[string]bool
}

// CheckCanDo checks one CapabilityReport against proMCP §6.3/§7.4/§12 and
// the v0.4 checklist.
func CheckCanDo(c CanDoCheck) []Finding {
	r := c.Report
	var out []Finding
	for _, k := range requiredCanDo {
		if _, ok := r[k]; !ok {
			out = append(out, f(SevError, "RT002", "answer lacks '%s'", k))
		}
	}
	feasible, okF := r["feasible"].(bool)
	if _, present := r["feasible"]; present && !okF {
		out = append(out, f(SevError, "RT002", "feasible is %T, not a boolean", r["feasible"]))
	}
	cands, okC := r["candidates"].([]any)
	if _, present := r["candidates"]; present && !okC {
		out = append(out, f(SevError, "RT002", "candidates is not an array"))
	}
	blocked, okB := r["blocked"].([]any)
	if _, present := r["blocked"]; present && !okB {
		out = append(out, f(SevError, "RT002", "blocked is not an array"))
	}
	unroutable, _ := r["unroutable"].([]any)

	allowed := 0
	prevConf := 2.0
	for i, raw := range cands {
		cand := asMap(raw)
		label := fmt.Sprintf("candidates[%d]", i)
		if name, ok := cand["capability"].(string); ok && name != "" {
			label += " (" + name + ")"
			if c.Tools != nil && !c.Tools[name] {
				out = append(out, f(SevWarning, "RT016", "%s names a tool that tools/list does not list (a route through another node?)", label))
			}
		}
		for _, k := range requiredCandidate {
			if _, ok := cand[k]; !ok {
				out = append(out, f(SevError, "RT004", "%s lacks '%s'", label, k))
			}
		}
		if s, _ := cand["source"].(string); cand["source"] != nil && s == "" {
			out = append(out, f(SevError, "RT004", "%s has an empty source", label))
		}
		if vu, present := cand["valid_until"]; present {
			t, ok := parseTime(vu)
			switch {
			case !ok:
				out = append(out, f(SevError, "RT005", "%s valid_until %v does not parse as ISO 8601", label, vu))
			case !t.After(c.SentAt):
				out = append(out, f(SevError, "RT005", "%s valid_until %s is not in the future (request sent %s)", label, t.Format(time.RFC3339Nano), c.SentAt.UTC().Format(time.RFC3339Nano)))
			case t.Sub(c.SentAt) > maxValidity:
				out = append(out, f(SevWarning, "RT006", "%s valid_until is %s ahead; §11.3 bands end at 300 s", label, t.Sub(c.SentAt).Round(time.Second)))
			}
		}
		perm, _ := cand["permission"].(string)
		if _, present := cand["permission"]; present {
			if !contains(PermissionValues, perm) {
				out = append(out, f(SevError, "RT007", "%s permission %q is outside the proMCP enum", label, perm))
			} else if perm != permAllowed && perm != permHumanApprov {
				out = append(out, f(SevWarning, "RT008", "%s has permission %s, which belongs in blocked[]", label, perm))
			}
		}
		if perm == permAllowed {
			allowed++
		}
		if cv, present := cand["confidence"]; present {
			n, ok := number(cv)
			if !ok || n < 0 || n > 1 {
				out = append(out, f(SevError, "RT013", "%s confidence %v is not a number in [0, 1]", label, cv))
			} else {
				if n > prevConf {
					out = append(out, f(SevWarning, "RT014", "%s confidence %v is higher than the one before it", label, n))
				}
				prevConf = n
			}
		}
	}
	for i, raw := range blocked {
		b := asMap(raw)
		label := fmt.Sprintf("blocked[%d]", i)
		if name, ok := b["capability"].(string); ok && name != "" {
			label += " (" + name + ")"
		}
		for _, k := range requiredBlocked {
			if _, ok := b[k]; !ok {
				out = append(out, f(SevError, "RT009", "%s lacks '%s'", label, k))
			}
		}
		if reason, ok := b["reason"].(string); b["reason"] != nil && (!ok || strings.TrimSpace(reason) == "") {
			out = append(out, f(SevError, "RT009", "%s has an empty reason", label))
		}
		if perm, ok := b["permission"].(string); ok {
			switch {
			case perm == permAllowed:
				out = append(out, f(SevError, "RT009", "%s has permission allowed: an allowed route is a candidate", label))
			case !contains(PermissionValues, perm):
				out = append(out, f(SevError, "RT007", "%s permission %q is outside the proMCP enum", label, perm))
			}
		}
	}
	for i, raw := range unroutable {
		u := asMap(raw)
		for _, k := range requiredUnroutable {
			if s, ok := u[k].(string); !ok || s == "" {
				out = append(out, f(SevError, "RT011", "unroutable[%d] lacks '%s'", i, k))
			}
		}
		if reason, ok := u["reason"].(string); ok && reason != "" && !contains(UnroutableReasons, reason) {
			out = append(out, f(SevError, "RT011", "unroutable[%d] reason %q is outside %v", i, reason, UnroutableReasons))
		}
	}
	if okF && okC {
		if feasible != (allowed > 0) {
			out = append(out, f(SevError, "RT003", "feasible is %v but %d candidate(s) have permission allowed (AP-10: derive it)", feasible, allowed))
		}
		if feasible && len(unroutable) > 0 {
			out = append(out, f(SevError, "RT010", "unroutable[] has %d entr(ies) although feasible is true", len(unroutable)))
		}
		if !feasible && len(blocked) == 0 && len(unroutable) == 0 {
			out = append(out, f(SevError, "RT012", "feasible is false and neither blocked[] nor unroutable[] says why"))
		}
		if c.Nonsense && (feasible || len(cands) > 0) {
			out = append(out, f(SevWarning, "RT015", "a nonsense intent got %d candidate(s), feasible %v", len(cands), feasible))
		}
	}
	if ctx := asMap(r["context"]); ctx != nil && c.Tools != nil {
		if rr, ok := ctx["related_reads"].([]any); ok {
			for _, v := range rr {
				if s, _ := v.(string); s != "" && !c.Tools[s] {
					out = append(out, f(SevWarning, "RT016", "context.related_reads names %q, which tools/list does not list", s))
				}
			}
		}
	}
	return out
}

// CheckRead checks one read_ answer against proMCP §6.1 (and PhysMCP's
// unit requirement). now is when the answer arrived.
func CheckRead(obs map[string]any, now time.Time) []Finding {
	var out []Finding
	q, hasQ := obs["quality"]
	quality, _ := q.(string)
	if !hasQ {
		out = append(out, f(SevError, "RT022", "answer lacks 'quality'"))
	} else if !contains(QualityValues, quality) {
		out = append(out, f(SevError, "RT023", "quality %v is outside %v", q, QualityValues))
	}
	if ts, ok := obs["timestamp"]; !ok {
		out = append(out, f(SevError, "RT022", "answer lacks 'timestamp'"))
	} else if t, ok := parseTime(ts); !ok {
		out = append(out, f(SevError, "RT024", "timestamp %v does not parse as ISO 8601", ts))
	} else if t.Sub(now) > futureSkew {
		out = append(out, f(SevWarning, "RT025", "timestamp %s is %s in the future", ts, t.Sub(now).Round(time.Millisecond)))
	}
	if v, ok := obs["value"]; (!ok || v == nil) && hasQ && quality != "error" {
		out = append(out, f(SevError, "RT022", "value is missing or null with quality %q (only quality error may lack a value)", quality))
	}
	if u, ok := obs["unit"]; !ok || u == nil {
		out = append(out, f(SevWarning, "RT026", "answer has no unit"))
	}
	if hasQ && contains(QualityValues, quality) && quality != "good" {
		why := ""
		if s, _ := obs["reason"].(string); s != "" {
			why = ": " + s
		}
		out = append(out, f(SevInfo, "RT028", "quality %s%s", quality, why))
	}
	return out
}

// CheckDo checks one do_ answer against proMCP §6.2/§9/§10 (and PhysMCP's
// applied/previous value requirement). sentKey is the idempotency_key sent.
func CheckDo(res map[string]any, sentKey string) []Finding {
	var out []Finding
	for _, k := range requiredDo {
		if _, ok := res[k]; !ok {
			out = append(out, f(SevError, "RT031", "answer lacks '%s'", k))
		}
	}
	status, _ := res["status"].(string)
	if _, ok := res["status"]; ok && !contains(StatusValues, status) {
		out = append(out, f(SevError, "RT032", "status %v is outside %v", res["status"], StatusValues))
	}
	if k, ok := res["idempotency_key"]; ok && k != sentKey {
		out = append(out, f(SevError, "RT033", "idempotency_key %v differs from the key sent (%s)", k, sentKey))
	}
	if c, ok := res["compensable"]; ok {
		comp, isBool := c.(bool)
		if !isBool {
			out = append(out, f(SevError, "RT031", "compensable is %T, not a boolean", c))
		} else if comp {
			if h, _ := res["compensation_hint"].(string); strings.TrimSpace(h) == "" {
				out = append(out, f(SevError, "RT034", "compensable is true but compensation_hint is %v", res["compensation_hint"]))
			}
		}
	}
	if ts, ok := res["timestamp"]; ok {
		if _, ok := parseTime(ts); !ok {
			out = append(out, f(SevError, "RT024", "timestamp %v does not parse as ISO 8601", ts))
		}
	}
	if !isStringArray(res["side_effects"]) {
		out = append(out, f(SevWarning, "RT035", "side_effects is %v, not a string array", res["side_effects"]))
	}
	for _, k := range []string{"applied_value", "previous_value"} {
		if _, ok := res[k]; !ok {
			out = append(out, f(SevWarning, "RT036", "answer lacks '%s'", k))
		}
	}
	if status == "failed" {
		p, _ := res["permission"].(string)
		r, _ := res["reason"].(string)
		if p == "" && r == "" {
			out = append(out, f(SevWarning, "RT037", "status failed with neither permission nor reason"))
		}
	}
	return out
}

// Probe is one can_do call the runtime makes.
type Probe struct {
	Label    string         // shown in reports
	Args     map[string]any // the can_do arguments
	Nonsense bool
	For      string // the tool this probe was built for ("" for nonsense)
}

// NonsenseTag is a semantic tag no real capability has.
const NonsenseTag = "zzx_no_such_capability_7f3a"

// capWords splits a tool's capability part into words: do_heater_zone_a →
// [heater zone a].
func capWords(tool string) []string {
	rest := strings.TrimPrefix(strings.TrimPrefix(tool, "read_"), "do_")
	var out []string
	for _, w := range strings.Split(rest, "_") {
		if w != "" {
			out = append(out, w)
		}
	}
	return out
}

// Probes builds the can_do intents for a tool list: one per do_ tool (at
// most maxDo, sorted by name), one for the first read_ tool, and a
// nonsense intent. Each plausible intent uses the first word of the
// capability as its semantic tag and the capability name as the target,
// which is what a client that knows only tools/list would ask.
func Probes(tools []string, maxDo int) []Probe {
	sorted := append([]string(nil), tools...)
	sort.Strings(sorted)
	var out []Probe
	nDo := 0
	firstRead := ""
	for _, t := range sorted {
		words := capWords(t)
		if len(words) == 0 {
			continue
		}
		switch {
		case strings.HasPrefix(t, "do_") && nDo < maxDo:
			nDo++
			intent := map[string]any{"semantic_tags": []any{words[0]}, "action": "set", "target": strings.Join(words, "_")}
			out = append(out, Probe{Label: fmt.Sprintf("intent %s set %s", words[0], strings.Join(words, "_")), For: t,
				Args: map[string]any{"intent": intent}})
		case strings.HasPrefix(t, "read_") && firstRead == "":
			firstRead = t
		}
	}
	if firstRead != "" {
		words := capWords(firstRead)
		out = append(out, Probe{Label: fmt.Sprintf("intent %s read", words[0]), For: firstRead,
			Args: map[string]any{"intent": map[string]any{"semantic_tags": []any{words[0]}, "action": "read", "target": strings.Join(words, "_")}}})
	}
	out = append(out, Probe{Label: "nonsense intent " + NonsenseTag, Nonsense: true,
		Args: map[string]any{"intent": map[string]any{"semantic_tags": []any{NonsenseTag}, "action": "set"}}})
	return out
}

// CurrentValue finds the current value of a do_ tool's capability in can_do
// answers: a candidate for exactly that tool whose current_state has a
// non-null value of quality good (or no quality). ok is false when no
// answer says so.
func CurrentValue(reports []map[string]any, tool string) (any, bool) {
	for _, r := range reports {
		cands, _ := r["candidates"].([]any)
		for _, raw := range cands {
			c := asMap(raw)
			if c["capability"] != tool {
				continue
			}
			st := asMap(c["current_state"])
			if st == nil || st["value"] == nil {
				continue
			}
			if q, has := st["quality"]; has && q != "good" {
				continue
			}
			return st["value"], true
		}
	}
	return nil, false
}
