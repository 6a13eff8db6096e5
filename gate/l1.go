package gate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// L1Question is the question text carried inside state (the server ignores
// instructions/criteria fields, phocinae notes A2/A8-1).
const L1Question = "How harmful is this actuator command if it runs on real equipment?"

// Question ids (the upstream http engine's ids).
const (
	IDNoul  = "gate_noul"
	IDScore = "gate_score"
)

// maxL1Body bounds the P0 response read (B5).
const maxL1Body = 1 << 20

type p0Question struct {
	ID        string   `json:"id"`
	Type      string   `json:"type"`
	Threshold *float64 `json:"threshold,omitempty"`
}

type p0Request struct {
	Model     string       `json:"model"`
	State     string       `json:"state"`
	Questions []p0Question `json:"questions"`
}

type p0State struct {
	Command  string `json:"command"`
	Cwd      string `json:"cwd"`
	Tool     string `json:"tool"`
	Question string `json:"question"`
}

func marshalNoEscape(v any) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'})
}

// buildState returns the state JSON string, clamped to MaxStateChars
// characters by shortening the command (the string stays valid JSON), and
// whether the command had to be shortened.
func buildState(command, cwd, tool string) (string, bool) {
	st := p0State{Command: command, Cwd: cwd, Tool: tool, Question: L1Question}
	s := string(marshalNoEscape(st))
	if utf8.RuneCountInString(s) <= MaxStateChars {
		return s, false
	}
	runes := []rune(command)
	lo, hi := 0, len(runes) // largest prefix that fits
	for lo < hi {
		mid := (lo + hi + 1) / 2
		st.Command = string(runes[:mid]) + "…"
		if utf8.RuneCountInString(string(marshalNoEscape(st))) <= MaxStateChars {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	st.Command = string(runes[:lo]) + "…"
	st.Cwd = clampRunes(st.Cwd, 256)
	return string(marshalNoEscape(st)), true
}

func clampRunes(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// RequestBody returns the exact P0 request body the gate sends for r.
func (g *Gate) RequestBody(r Request) []byte {
	cmd, _ := Canonical(r.Tool, r.Args)
	b, _ := g.requestBody(cmd, "device:"+r.DeviceID)
	return b
}

func (g *Gate) requestBody(command, cwd string) ([]byte, bool) {
	state, truncated := buildState(command, cwd, g.toolID)
	th := g.cfg.L1.NoulThreshold
	req := p0Request{
		Model: g.cfg.L1.Model,
		State: state,
		Questions: []p0Question{
			{ID: IDNoul, Type: "noul", Threshold: &th},
			{ID: IDScore, Type: "score"},
		},
	}
	return marshalNoEscape(req), truncated
}

// failure classes (B5).
type l1Failure struct {
	unavailable bool // dial / timeout / non-2xx: the configured fail_closed
	cause       string
}

func (f *l1Failure) Error() string { return f.cause }

func unavailable(format string, a ...any) *l1Failure {
	return &l1Failure{unavailable: true, cause: fmt.Sprintf(format, a...)}
}
func malformed(format string, a ...any) *l1Failure {
	return &l1Failure{cause: fmt.Sprintf(format, a...)}
}

// l1Answer is a parsed, range-checked P0 answer.
type l1Answer struct {
	noul       float64
	score      float64
	confidence map[string]float64
}

// applyL1 asks P0 and writes the verdict (or the fail-closed one) into res.
func (g *Gate) applyL1(ctx context.Context, res *Result, o l0) {
	body, truncated := g.requestBody(res.Command, res.Cwd)
	ans, f := g.askP0(ctx, body)
	g.health.note(f == nil || !f.unavailable, causeOf(f))
	if f != nil {
		d := Deny
		if f.unavailable {
			d = g.cfg.FailClosed
		}
		res.Decision, res.Layer, res.Error = d, LayerFailClosed, f.cause
		res.Reason = fmt.Sprintf("fail-closed (%s): L1 %s", d, f.cause)
		return
	}
	noul, score := ans.noul, ans.score
	res.Noul, res.Score, res.Confidence = &noul, &score, ans.confidence
	d, state := MapL1(noul, score, g.thresholds)
	res.NoulState = state
	res.Layer = LayerL1
	res.Reason = fmt.Sprintf("L1 noul=%.4f(%s, threshold=%s) score=%s(deny>=%s, ask>=%s) → %s",
		noul, state, fmtNum(g.thresholds.NoulThreshold), fmtNum(score),
		fmtNum(g.thresholds.DenyAt), fmtNum(g.thresholds.AskAt), d)
	if d == Allow && (o.operators || truncated) {
		d = Ask
		why := "an argument contains shell operators"
		if truncated {
			why = fmt.Sprintf("the command was clamped to %d characters for L1", MaxStateChars)
		}
		res.Reason += "; capped at ask: " + why
	}
	res.Decision = d
}

func causeOf(f *l1Failure) string {
	if f == nil {
		return ""
	}
	return f.cause
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// MapL1 is the upstream map_l1 (phocinae notes A4): noul p ≥ threshold → "true"
// (allow channel), p ≤ 1−threshold → "false" (deny channel), otherwise
// "wavering" (ask); score ≥ deny_at → deny, ≥ ask_at → ask, else allow; the
// strictest channel wins (deny > ask > allow).
func MapL1(noul, score float64, th Thresholds) (Decision, string) {
	var state string
	var byNoul Decision
	switch {
	case noul >= th.NoulThreshold:
		state, byNoul = "true", Allow
	case noul <= 1-th.NoulThreshold:
		state, byNoul = "false", Deny
	default:
		state, byNoul = "wavering", Ask
	}
	byScore := Allow
	switch {
	case score >= th.DenyAt:
		byScore = Deny
	case score >= th.AskAt:
		byScore = Ask
	}
	if math.IsNaN(noul) || math.IsNaN(score) {
		return Deny, state
	}
	return strictest(byNoul, byScore), state
}

func strictest(a, b Decision) Decision {
	rank := map[Decision]int{Allow: 0, Ask: 1, Deny: 2}
	ra, oka := rank[a]
	rb, okb := rank[b]
	if !oka || !okb {
		return Deny
	}
	if ra >= rb {
		return a
	}
	return b
}

// askP0 performs the one HTTP attempt and parses the answer.
func (g *Gate) askP0(ctx context.Context, body []byte) (*l1Answer, *l1Failure) {
	timeout := time.Duration(g.cfg.L1.TimeoutMS) * time.Millisecond
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, malformed("request could not be built: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", g.toolID)
	if tok := g.cfg.L1.token.value(); tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, classifyTransport(ctx, err, timeout, false)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, unavailable("P0 service answered HTTP %d %s", resp.StatusCode, http.StatusText(resp.StatusCode))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, malformed("P0 service answered HTTP %d instead of 200", resp.StatusCode)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxL1Body+1))
	if err != nil {
		return nil, classifyTransport(ctx, err, timeout, true)
	}
	if len(raw) > maxL1Body {
		return nil, malformed("answer body exceeds %d bytes", maxL1Body)
	}
	return parseAnswer(raw, g.cfg.L1.AcceptNested)
}

// classifyTransport: dial errors, timeouts and errors before the response
// headers are "unavailable" (configured fail_closed); a body cut short after
// a 200 is a malformed answer (deny), unless the deadline caused it.
func classifyTransport(ctx context.Context, err error, timeout time.Duration, inBody bool) *l1Failure {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) {
		return unavailable("P0 service timed out after %v", timeout)
	}
	if errors.Is(err, context.Canceled) {
		return malformed("request cancelled by the caller")
	}
	if inBody {
		return malformed("answer body cut short: %v", err)
	}
	return unavailable("P0 service unreachable: %v", err)
}

// parseAnswer validates the P0 response (B2/B5). Every deviation is a
// malformed answer, which is deny.
func parseAnswer(raw []byte, nested bool) (*l1Answer, *l1Failure) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var top any
	if err := dec.Decode(&top); err != nil {
		return nil, malformed("answer is not JSON: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, malformed("answer has trailing data after the JSON value")
	}
	obj, ok := top.(map[string]any)
	if !ok {
		return nil, malformed("answer top level is %s, not an object", jsonKind(top))
	}
	av, ok := obj["answers"]
	if !ok {
		return nil, malformed("answer has no \"answers\" field")
	}
	answers, ok := av.(map[string]any)
	if !ok {
		return nil, malformed("\"answers\" is %s, not an object keyed by question id", jsonKind(av))
	}
	nv, ok := answers[IDNoul]
	if !ok {
		return nil, malformed("answer %s is missing", IDNoul)
	}
	sv, ok := answers[IDScore]
	if !ok {
		return nil, malformed("answer %s is missing", IDScore)
	}
	if nested {
		nv = unwrapNested(nv, "noul")
		sv = unwrapNested(sv, "score")
	}
	var noul float64
	switch x := nv.(type) {
	case bool:
		if x {
			noul = 1
		}
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsNaN(f) || f < 0 || f > 1 {
			return nil, malformed("answer %s=%s is not a bool or a number in [0,1]", IDNoul, x)
		}
		noul = f
	default:
		return nil, malformed("answer %s is %s, not a bool or a number in [0,1]", IDNoul, jsonKind(nv))
	}
	var score float64
	switch x := sv.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil || math.IsNaN(f) || f != math.Trunc(f) || f < 2 || f > 10 {
			return nil, malformed("answer %s=%s is not an integer in 2..10", IDScore, x)
		}
		score = f
	default:
		return nil, malformed("answer %s is %s, not an integer in 2..10", IDScore, jsonKind(sv))
	}
	out := &l1Answer{noul: noul, score: score}
	if c, ok := obj["answer_confidence"].(map[string]any); ok {
		for k, v := range c {
			if n, ok := v.(json.Number); ok {
				if f, err := strconv.ParseFloat(string(n), 64); err == nil && finite(f) {
					if out.confidence == nil {
						out.confidence = map[string]float64{}
					}
					out.confidence[k] = f
				}
			}
		}
	}
	return out, nil
}

// unwrapNested reads the legacy {type, noul|score, answer|value} object, up
// to 4 levels deep (phocinae notes A3).
func unwrapNested(v any, key string) any {
	for range 4 {
		m, ok := v.(map[string]any)
		if !ok {
			return v
		}
		switch {
		case m[key] != nil:
			v = m[key]
		case m["answer"] != nil:
			v = m["answer"]
		case m["value"] != nil:
			v = m["value"]
		default:
			return v
		}
	}
	return v
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a bool"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
