// Package p0test is a deterministic in-test mock of the Phocinae P0
// POST /v1/systemone service (phocinae notes B8, kept outside the repository), for gate tests.
//
// It validates requests like phocinae-server (422 for a wrong model, bad
// questions or thresholds; 413 over the body limit; 401 without the
// configured bearer token), answers from an ordered rule list (first RE2
// match on state.command wins), emits the flat, nested or no-extensions
// answer shape, injects faults, records request bodies, listens on loopback
// port 0 only, uses no randomness, and can also run without any listener
// (Options.InMemory + Transport) for testing/synctest bubbles.
package p0test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// DefaultModel is the model name the mock accepts unless Options.Model is set.
const DefaultModel = "Phocinae-Largha-150M-v1"

// DefaultMaxBody is phocinae-server's body limit (2 MiB).
const DefaultMaxBody = 2 << 20

// Shape of the answers.
type Shape string

// Shapes.
const (
	Flat         Shape = "flat"          // phocinae-server: bool noul, int score, with extensions
	Nested       Shape = "nested"        // upstream guard mock: {"type":"noul","noul":0.9}
	NoExtensions Shape = "no_extensions" // PHOC_EXTENSIONS=0: only model, answers, usage
)

// Options configure the mock.
type Options struct {
	Token     string // when set, POSTs need "Authorization: Bearer <Token>" (else 401)
	Model     string // accepted model name; default DefaultModel
	Shape     Shape  // default Flat
	NoulFloat bool   // answer noul with the float p instead of the bool p >= threshold
	Rules     []Rule // ordered; first match on state.command wins
	MaxBody   int64  // default 2 MiB (413 above)
	InMemory  bool   // no listener: URL is a dead loopback address, use Transport()
}

// Rule picks the answers for requests whose state.command matches Pattern.
type Rule struct {
	Pattern    string             // RE2 on state.command; "" matches everything
	NoulP      *float64           // P(true); default 0.9
	Score      *int               // 2..10; default 2
	Choice     *int               // choice index; default 0
	Confidence map[string]float64 // answer_confidence overrides by question id
	Fault      *Fault             // fault for matching requests (a global fault wins)
}

// Fault injection. The zero Fault injects nothing.
type Fault struct {
	Status         int           // answer this HTTP status (e.g. 500, 503) with a JSON error body
	Delay          time.Duration // wait before answering (honours client cancellation)
	NonJSON        bool          // 200 with an HTML body
	TopLevelArray  bool          // 200 with the response wrapped in a JSON array
	AnswersArray   bool          // "answers" is an array instead of an object
	AnswersMissing bool          // no "answers" field
	DropID         string        // leave this question id out of "answers"
	NoulYes        bool          // every noul answer is the string "yes"
	ScoreRaw       string        // raw JSON for every score answer, e.g. "11" or "1.5"
	CloseMidBody   bool          // 200, Content-Length of the full body, connection closed halfway
	Body           string        // raw 200 body override
}

func (f Fault) zero() bool {
	return f.Status == 0 && f.Delay == 0 && !f.NonJSON && !f.TopLevelArray && !f.AnswersArray &&
		!f.AnswersMissing && f.DropID == "" && !f.NoulYes && f.ScoreRaw == "" && !f.CloseMidBody && f.Body == ""
}

// P returns a pointer to f (for Rule.NoulP).
func P(f float64) *float64 { return &f }

// N returns a pointer to n (for Rule.Score and Rule.Choice).
func N(n int) *int { return &n }

// Recorded is one received request.
type Recorded struct {
	Method string
	Path   string
	Header http.Header
	Body   []byte
}

// Request is a decoded /v1/systemone request body.
type Request struct {
	Model     string     `json:"model"`
	State     string     `json:"state"`
	Questions []Question `json:"questions"`
}

// Question is one decoded question; Extra holds any field the real server
// would ignore (instructions, criteria, ...).
type Question struct {
	ID        string
	Type      string
	Options   []string
	Threshold *float64
	Extra     map[string]json.RawMessage
}

// Decode parses the recorded body.
func (r Recorded) Decode() (Request, map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(r.Body, &raw); err != nil {
		return Request{}, nil, err
	}
	var q Request
	_ = json.Unmarshal(raw["model"], &q.Model)
	_ = json.Unmarshal(raw["state"], &q.State)
	var qs []map[string]json.RawMessage
	_ = json.Unmarshal(raw["questions"], &qs)
	for _, m := range qs {
		var qq Question
		_ = json.Unmarshal(m["id"], &qq.ID)
		_ = json.Unmarshal(m["type"], &qq.Type)
		_ = json.Unmarshal(m["options"], &qq.Options)
		if t, ok := m["threshold"]; ok {
			var f float64
			if json.Unmarshal(t, &f) == nil {
				qq.Threshold = &f
			}
		}
		for k, v := range m {
			switch k {
			case "id", "type", "options", "threshold":
			default:
				if qq.Extra == nil {
					qq.Extra = map[string]json.RawMessage{}
				}
				qq.Extra[k] = v
			}
		}
		q.Questions = append(q.Questions, qq)
	}
	return q, raw, nil
}

// Server is the mock.
type Server struct {
	URL string

	opts Options
	hs   *httptest.Server

	mu     sync.Mutex
	rules  []compiledRule
	fault  Fault
	reqs   []Recorded
	closed bool
}

type compiledRule struct {
	Rule
	re *regexp.Regexp
}

// New starts the mock (or prepares it, with InMemory) and registers Close
// with t.Cleanup.
func New(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Model == "" {
		o.Model = DefaultModel
	}
	if o.Shape == "" {
		o.Shape = Flat
	}
	if o.MaxBody == 0 {
		o.MaxBody = DefaultMaxBody
	}
	s := &Server{opts: o}
	if err := s.SetRules(o.Rules); err != nil {
		t.Fatalf("p0test: %v", err)
	}
	if o.InMemory {
		s.URL = "http://127.0.0.1:1" // nothing listens there: a leak to the network fails
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("p0test: listen on loopback: %v", err)
		}
		s.hs = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(s.serveHTTP)}}
		s.hs.Start()
		s.URL = s.hs.URL
	}
	t.Cleanup(s.Close)
	return s
}

// Close stops the listener.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	if s.hs != nil {
		s.hs.CloseClientConnections()
		s.hs.Close()
	}
}

// SetRules replaces the rule list.
func (s *Server) SetRules(rules []Rule) error {
	cr := make([]compiledRule, 0, len(rules))
	for i, r := range rules {
		re, err := regexp.Compile(r.Pattern)
		if err != nil {
			return fmt.Errorf("rule %d: %w", i, err)
		}
		cr = append(cr, compiledRule{Rule: r, re: re})
	}
	s.mu.Lock()
	s.rules = cr
	s.mu.Unlock()
	return nil
}

// SetFault sets the global fault (it wins over rule faults).
func (s *Server) SetFault(f Fault) { s.mu.Lock(); s.fault = f; s.mu.Unlock() }

// ClearFault removes the global fault.
func (s *Server) ClearFault() { s.SetFault(Fault{}) }

// Requests returns copies of the /v1/systemone requests received so far.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, len(s.reqs))
	for i, r := range s.reqs {
		out[i] = Recorded{Method: r.Method, Path: r.Path, Header: r.Header.Clone(), Body: bytes.Clone(r.Body)}
	}
	return out
}

// Reset forgets the recorded requests.
func (s *Server) Reset() { s.mu.Lock(); s.reqs = nil; s.mu.Unlock() }

// Transport serves requests in-process, without a network: for
// gate.L1Config.Transport, and inside testing/synctest bubbles (delays then
// run on the bubble's fake clock).
func (s *Server) Transport() http.RoundTripper { return roundTripper{s} }

// reply is a computed answer.
type reply struct {
	status  int
	ctype   string
	body    []byte
	cut     int   // >0: send only body[:cut], then drop the connection
	aborted error // the client went away during a delay
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	rep := s.respond(r)
	if rep.aborted != nil {
		return
	}
	if rep.cut > 0 {
		hj, ok := w.(http.Hijacker)
		if !ok {
			panic("p0test: hijack unsupported")
		}
		conn, buf, err := hj.Hijack()
		if err != nil {
			return
		}
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
			rep.status, http.StatusText(rep.status), rep.ctype, len(rep.body))
		buf.Write(rep.body[:rep.cut])
		buf.Flush()
		conn.Close()
		return
	}
	w.Header().Set("Content-Type", rep.ctype)
	w.Header().Set("Content-Length", strconv.Itoa(len(rep.body)))
	w.WriteHeader(rep.status)
	w.Write(rep.body)
}

type roundTripper struct{ s *Server }

func (rt roundTripper) RoundTrip(r *http.Request) (*http.Response, error) {
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	rep := rt.s.respond(r)
	if r.Body != nil {
		r.Body.Close()
	}
	if rep.aborted != nil {
		return nil, rep.aborted
	}
	var body io.ReadCloser = io.NopCloser(bytes.NewReader(rep.body))
	if rep.cut > 0 {
		body = io.NopCloser(io.MultiReader(bytes.NewReader(rep.body[:rep.cut]), errReader{io.ErrUnexpectedEOF}))
	}
	h := http.Header{}
	h.Set("Content-Type", rep.ctype)
	return &http.Response{
		Status: fmt.Sprintf("%d %s", rep.status, http.StatusText(rep.status)), StatusCode: rep.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: body, ContentLength: int64(len(rep.body)), Request: r,
	}, nil
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func jsonReply(status int, v any) reply {
	b, _ := json.Marshal(v)
	return reply{status: status, ctype: "application/json", body: b}
}

func detail(status int, msg string) reply { return jsonReply(status, map[string]any{"detail": msg}) }

func unprocessable(loc, msg string) reply {
	return jsonReply(422, map[string]any{"detail": []map[string]any{{"type": "value_error", "loc": []string{"body", loc}, "msg": msg}}})
}

// respond computes the answer for one request, exactly like the real
// service would, plus the configured faults.
func (s *Server) respond(r *http.Request) reply {
	p := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case p == "/health" && r.Method == http.MethodGet:
		return jsonReply(200, map[string]any{"status": "ok", "model": s.opts.Model, "model_loaded": true, "device": "cpu", "uptime_s": 0})
	case p == "" && r.Method == http.MethodGet:
		return jsonReply(200, map[string]any{"service": "p0test", "model": s.opts.Model, "docs": "/docs", "health": "/health"})
	case p != "/v1/systemone":
		return detail(404, "Not Found")
	case r.Method != http.MethodPost:
		return detail(405, "Method Not Allowed")
	}

	var body []byte
	var tooBig bool
	if r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, s.opts.MaxBody+1))
		if err != nil {
			return reply{aborted: err}
		}
		body, tooBig = b, int64(len(b)) > s.opts.MaxBody
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, Recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body})
	global := s.fault
	rules := s.rules
	s.mu.Unlock()

	if tooBig {
		return jsonReply(413, map[string]any{"error": map[string]any{"code": 413, "message": fmt.Sprintf("request body exceeds %d bytes", s.opts.MaxBody)}})
	}
	if s.opts.Token != "" && r.Header.Get("Authorization") != "Bearer "+s.opts.Token {
		return detail(401, "missing or invalid bearer token")
	}
	req, rep, ok := s.validate(body)
	if !ok {
		return rep
	}

	command := commandOf(req.State)
	rule := compiledRule{}
	for _, cr := range rules {
		if cr.re.MatchString(command) {
			rule = cr
			break
		}
	}
	f := global
	if f.zero() && rule.Fault != nil {
		f = *rule.Fault
	}
	if f.Delay > 0 {
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return reply{aborted: r.Context().Err()}
		}
	}
	if f.Status != 0 {
		return jsonReply(f.Status, map[string]any{"detail": http.StatusText(f.Status)})
	}
	if f.Body != "" {
		return reply{status: 200, ctype: "application/json", body: []byte(f.Body)}
	}
	if f.NonJSON {
		return reply{status: 200, ctype: "text/html", body: []byte("<html><body>upstream error</body></html>")}
	}
	resp := s.answer(req, rule, f)
	var out []byte
	if f.TopLevelArray {
		out, _ = json.Marshal([]any{resp})
	} else {
		out, _ = json.Marshal(resp)
	}
	rep = reply{status: 200, ctype: "application/json", body: out}
	if f.CloseMidBody {
		rep.cut = len(out) / 2
	}
	return rep
}

// validate mirrors phocinae-server's request model (422 on violations).
func (s *Server) validate(body []byte) (Request, reply, bool) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return Request{}, unprocessable("", "JSON decode error: "+err.Error()), false
	}
	var req Request
	if err := json.Unmarshal(raw["model"], &req.Model); err != nil || raw["model"] == nil {
		return req, unprocessable("model", "field required (string)"), false
	}
	if req.Model != s.opts.Model {
		return req, unprocessable("model", fmt.Sprintf("unknown model %q; this server serves %q", req.Model, s.opts.Model)), false
	}
	if err := json.Unmarshal(raw["state"], &req.State); err != nil || raw["state"] == nil {
		return req, unprocessable("state", "field required (string)"), false
	}
	var qs []map[string]json.RawMessage
	if err := json.Unmarshal(raw["questions"], &qs); err != nil || raw["questions"] == nil {
		return req, unprocessable("questions", "field required (list of questions)"), false
	}
	if len(qs) < 1 || len(qs) > 64 {
		return req, unprocessable("questions", "questions must have 1 to 64 entries"), false
	}
	seen := map[string]bool{}
	for i, m := range qs {
		loc := fmt.Sprintf("questions.%d", i)
		var q Question
		if json.Unmarshal(m["id"], &q.ID) != nil || q.ID == "" {
			return req, unprocessable(loc+".id", "id must be a non-empty string"), false
		}
		if seen[q.ID] {
			return req, unprocessable(loc+".id", "duplicate question id "+q.ID), false
		}
		seen[q.ID] = true
		if json.Unmarshal(m["type"], &q.Type) != nil {
			return req, unprocessable(loc+".type", "type must be a string"), false
		}
		if o, ok := m["options"]; ok && string(o) != "null" {
			if json.Unmarshal(o, &q.Options) != nil {
				return req, unprocessable(loc+".options", "options must be a list of strings"), false
			}
		}
		switch q.Type {
		case "choice":
			if len(q.Options) == 0 || len(q.Options) > 255 {
				return req, unprocessable(loc+".options", "choice needs 1 to 255 options"), false
			}
		case "score":
			if len(q.Options) > 0 {
				return req, unprocessable(loc+".options", "score must not carry options"), false
			}
		case "noul":
		default:
			return req, unprocessable(loc+".type", "type must be noul, choice or score"), false
		}
		if t, ok := m["threshold"]; ok && string(t) != "null" {
			var f float64
			if json.Unmarshal(t, &f) != nil || math.IsNaN(f) || f < 0 || f > 1 {
				return req, unprocessable(loc+".threshold", "threshold must lie in [0,1]"), false
			}
			q.Threshold = &f
		}
		req.Questions = append(req.Questions, q)
	}
	return req, reply{}, true
}

// commandOf reads the command from state: a JSON object with "command", a
// "command: ..." line, or the whole state.
func commandOf(state string) string {
	var m map[string]any
	if json.Unmarshal([]byte(state), &m) == nil {
		if c, ok := m["command"].(string); ok {
			return c
		}
	}
	sc := bufio.NewScanner(strings.NewReader(state))
	for sc.Scan() {
		if c, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "command:"); ok {
			return strings.TrimSpace(c)
		}
	}
	return state
}

func round4(f float64) float64 { return math.Round(f*1e4) / 1e4 }

func spread(n, at int, conf float64) []float64 {
	out := make([]float64, n)
	rest := 0.0
	if n > 1 {
		rest = round4((1 - conf) / float64(n-1))
	}
	for i := range out {
		out[i] = rest
	}
	if at >= 0 && at < n {
		out[at] = round4(conf)
	}
	return out
}

func (s *Server) answer(req Request, rule compiledRule, f Fault) map[string]any {
	p := 0.9
	if rule.NoulP != nil {
		p = *rule.NoulP
	}
	score := 2
	if rule.Score != nil {
		score = *rule.Score
	}
	choice := 0
	if rule.Choice != nil {
		choice = *rule.Choice
	}
	answers := map[string]any{}
	conf := map[string]any{}
	optScores := map[string]any{}
	action := map[string]any{}
	var order []any
	for _, q := range req.Questions {
		var a any
		var c float64
		switch q.Type {
		case "noul":
			thr := 0.5
			if q.Threshold != nil {
				thr = *q.Threshold
			}
			c = math.Max(p, 1-p)
			optScores[q.ID] = []float64{round4(1 - p), round4(p)}
			switch {
			case s.opts.Shape == Nested:
				a = map[string]any{"type": "noul", "noul": p}
			case s.opts.NoulFloat:
				a = p
			default:
				a = p >= thr
			}
			if f.NoulYes {
				a = "yes"
			}
		case "score":
			c = 0.6
			optScores[q.ID] = spread(9, score-2, c)
			if s.opts.Shape == Nested {
				a = map[string]any{"type": "score", "score": float64(score)}
			} else {
				a = score
			}
			if f.ScoreRaw != "" {
				a = json.RawMessage(f.ScoreRaw)
			}
		case "choice":
			idx := min(max(choice, 0), len(q.Options)-1)
			c = 0.7
			optScores[q.ID] = spread(len(q.Options), idx, c)
			action[q.ID] = map[string]any{q.ID + "_probability": c}
			if s.opts.Shape == Nested {
				a = map[string]any{"type": "choice", "choice": idx}
			} else {
				a = idx
			}
		}
		if v, ok := rule.Confidence[q.ID]; ok {
			c = v
		}
		conf[q.ID] = round4(c)
		if q.ID == f.DropID {
			continue
		}
		answers[q.ID] = a
		order = append(order, a)
	}
	resp := map[string]any{
		"model":   s.opts.Model,
		"answers": answers,
		"usage":   map[string]any{"input_tokens": len(req.State)/4 + 8*len(req.Questions), "output_tokens": 0},
	}
	if f.AnswersArray {
		resp["answers"] = order
	}
	if f.AnswersMissing {
		delete(resp, "answers")
	}
	if s.opts.Shape != NoExtensions {
		resp["answer_confidence"] = conf
		resp["action"] = action
		resp["option_scores"] = optScores
		resp["routing"] = map[string]any{"model": s.opts.Model, "device": "cpu", "perm": "none", "backend": "p0test"}
	}
	return resp
}
