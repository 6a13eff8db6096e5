package gate

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"path"
	"sort"
	"strconv"
	"unicode/utf8"
)

// Canonical returns the canonical command string "<tool> <canonical JSON>"
// (sorted keys, no insignificant whitespace, no HTML escaping, numbers as
// received) and its fingerprint "sha256:<hex of tool \x00 canonical-args>".
// This is what L1 sees as state.command and what an approval is bound to.
func Canonical(tool string, args map[string]any) (command, fingerprint string) {
	ca := canonicalArgs(args)
	h := sha256.New()
	h.Write([]byte(tool))
	h.Write([]byte{0})
	h.Write([]byte(ca))
	return tool + " " + ca, "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func canonicalArgs(args map[string]any) string {
	if len(args) == 0 {
		return "{}"
	}
	var b bytes.Buffer
	if err := writeCanonical(&b, args); err != nil {
		// Not JSON-encodable (NaN, Inf, a channel...). Such calls are denied
		// at L0 anyway; keep the command and fingerprint deterministic.
		b.Reset()
		writeString(&b, "$unencodable")
		s, _ := json.Marshal(fmt.Sprint(args))
		return `{` + b.String() + `:` + string(s) + `}`
	}
	return b.String()
}

func writeCanonical(b *bytes.Buffer, v any) error {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			writeString(b, k)
			b.WriteByte(':')
			if err := writeCanonical(b, x[k]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
		return nil
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeCanonical(b, e); err != nil {
				return err
			}
		}
		b.WriteByte(']')
		return nil
	case string:
		writeString(b, x)
		return nil
	default:
		out, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Write(out)
		return nil
	}
}

func writeString(b *bytes.Buffer, s string) {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		c := s[i]
		plain = c >= 0x20 && c < 0x7f && c != '"' && c != '\\'
	}
	if plain {
		b.WriteByte('"')
		b.WriteString(s)
		b.WriteByte('"')
		return
	}
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	b.Truncate(b.Len() - 1) // Encode appends '\n'
}

// isScalar reports whether v is a JSON scalar: null, bool, string or a
// finite number.
func isScalar(v any) bool {
	switch v.(type) {
	case nil, bool, string:
		return true
	}
	_, ok := toNumber(v)
	return ok
}

// toNumber converts a finite JSON number (float, int, json.Number) to float64.
func toNumber(v any) (float64, bool) {
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case float32:
		f = float64(x)
	case int:
		f = float64(x)
	case int8:
		f = float64(x)
	case int16:
		f = float64(x)
	case int32:
		f = float64(x)
	case int64:
		f = float64(x)
	case uint:
		f = float64(x)
	case uint8:
		f = float64(x)
	case uint16:
		f = float64(x)
	case uint32:
		f = float64(x)
	case uint64:
		f = float64(x)
	case json.Number:
		p, err := strconv.ParseFloat(string(x), 64)
		if err != nil || !json.Valid([]byte(x)) {
			return 0, false
		}
		f = p
	default:
		return 0, false
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// scalarEqual compares two scalars; numbers compare numerically.
func scalarEqual(a, b any) bool {
	if fa, ok := toNumber(a); ok {
		fb, ok := toNumber(b)
		return ok && fa == fb
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case bool:
		y, ok := b.(bool)
		return ok && x == y
	case string:
		y, ok := b.(string)
		return ok && x == y
	}
	return false
}

// validTool reports whether the tool name uses only MCP tool-name characters.
func validTool(t string) bool {
	if len(t) == 0 || len(t) > 128 {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '/') {
			return false
		}
	}
	return true
}

// matches reports whether the table rule applies to the call.
func (r *Rule) matches(tool string, args map[string]any) bool {
	if r.Tool != tool {
		ok, err := path.Match(r.Tool, tool)
		if err != nil || !ok {
			return false
		}
	}
	for k, want := range r.Args {
		got, ok := args[k]
		if !ok || !scalarEqual(got, want) {
			return false
		}
	}
	if rg := r.Range; rg != nil {
		f, ok := toNumber(args[rg.Arg])
		inside := ok && (rg.Min == nil || f >= *rg.Min) && (rg.Max == nil || f <= *rg.Max)
		if rg.Outside {
			return !inside // missing or non-numeric counts as outside
		}
		return inside
	}
	return true
}

// l0 is the outcome of the deterministic layer.
type l0 struct {
	decision Decision // "" = grey
	rule     string
	reason   string
	// operators: some string in the call contains shell operators, so no
	// allow may come from L0 and an L1 allow is capped at ask.
	operators bool
	// allowRule is the allow rule that was refused because of operators.
	allowRule string
}

func (g *Gate) evalL0(tool string, args map[string]any, key string) l0 {
	if tool == "" {
		return l0{decision: Deny, rule: "empty_command", reason: "L0 deny empty_command: empty tool name"}
	}
	if !utf8.ValidString(tool) {
		return l0{decision: Deny, rule: "invalid_argument", reason: "L0 deny invalid_argument: tool name is not valid UTF-8"}
	}
	if len(tool) > 256 {
		return l0{decision: Deny, rule: "invalid_argument", reason: "L0 deny invalid_argument: tool name longer than 256 bytes"}
	}
	if len(args) > MaxArgs {
		return l0{decision: Deny, rule: "invalid_argument", reason: fmt.Sprintf("L0 deny invalid_argument: %d arguments (max %d)", len(args), MaxArgs)}
	}
	total := len(tool)
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := args[k]
		if !isScalar(v) {
			return l0{decision: Deny, rule: "non_scalar_argument",
				reason: fmt.Sprintf("L0 deny non_scalar_argument: argument %q is %s, not a JSON scalar (string, finite number, bool, null)", k, kindOf(v))}
		}
		if s, ok := v.(string); ok && (len(s) > MaxArgBytes || !utf8.ValidString(s)) {
			return l0{decision: Deny, rule: "invalid_argument",
				reason: fmt.Sprintf("L0 deny invalid_argument: argument %q is longer than %d bytes or not valid UTF-8", k, MaxArgBytes)}
		}
		if len(k) > MaxArgBytes || !utf8.ValidString(k) {
			return l0{decision: Deny, rule: "invalid_argument", reason: "L0 deny invalid_argument: an argument name is too long or not valid UTF-8"}
		}
		total += len(k)
		if s, ok := v.(string); ok {
			total += len(s)
		}
	}
	if total > MaxTotalArgBytes {
		return l0{decision: Deny, rule: "invalid_argument", reason: fmt.Sprintf("L0 deny invalid_argument: arguments total %d bytes (max %d)", total, MaxTotalArgBytes)}
	}

	// 1. table deny rules, first match wins.
	for i := range g.cfg.L0.Deny {
		r := &g.cfg.L0.Deny[i]
		if r.matches(tool, args) {
			return l0{decision: Deny, rule: r.Name, reason: "L0 deny " + r.Name + ": " + noteOr(r.Note, "denied by the actuator table")}
		}
	}
	// 2. shell blacklist on the tool name, the idempotency key, argument
	// names and string values. Operators in the key alone do not make the
	// call grey: the key is never part of the command.
	ops := hasShellOperator(tool)
	if sr, ok := MatchShell(tool); ok {
		return shellDeny(sr, "the tool name")
	}
	if sr, ok := MatchShell(key); ok && key != "" {
		return shellDeny(sr, "the idempotency_key")
	}
	for _, k := range keys {
		if sr, ok := MatchShell(k); ok {
			return shellDeny(sr, fmt.Sprintf("argument name %q", k))
		}
		ops = ops || hasShellOperator(k)
		if s, ok := args[k].(string); ok {
			if sr, ok := MatchShell(s); ok {
				return shellDeny(sr, fmt.Sprintf("argument %q", k))
			}
			ops = ops || hasShellOperator(s)
		}
	}
	// 3. table allow rules.
	if !validTool(tool) {
		return l0{operators: true, reason: fmt.Sprintf("L0 grey: tool name %q has characters outside [A-Za-z0-9_./-]; no allow rule applies", tool)}
	}
	for i := range g.cfg.L0.Allow {
		r := &g.cfg.L0.Allow[i]
		if r.matches(tool, args) {
			if ops {
				return l0{operators: true, allowRule: r.Name,
					reason: "L0 grey: allow rule " + r.Name + " not applied: an argument contains shell operators (; & | ` $( > < newline)"}
			}
			return l0{decision: Allow, rule: r.Name, reason: "L0 allow " + r.Name + ": " + noteOr(r.Note, "allowed by the actuator table")}
		}
	}
	if ops {
		return l0{operators: true, reason: "L0 grey: no rule for " + tool + "; an argument contains shell operators"}
	}
	return l0{reason: "L0 grey: no actuator table rule matches " + tool}
}

func shellDeny(sr ShellRule, where string) l0 {
	return l0{decision: Deny, rule: sr.Name, reason: "L0 deny " + sr.Name + ": shell blacklist (" + sr.Note + ") in " + where}
}

func noteOr(note, def string) string {
	if note != "" {
		return note
	}
	return def
}

func kindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case float64, float32, json.Number:
		return "not a finite number"
	}
	return fmt.Sprintf("a %T", v)
}
