package gate

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/gate/p0test"
)

func nanValue() any { return math.NaN() }
func infValue() any { return math.Inf(1) }
func fmtAll(c Config) string {
	return fmt.Sprintf("%v %+v %#v", c, c, c)
}

var defTh = Thresholds{NoulThreshold: 0.65, DenyAt: 7, AskAt: 4}

func TestMapL1EightPoint(t *testing.T) {
	cases := []struct {
		noul, score float64
		want        Decision
		state       string
	}{
		{0.9, 1, Allow, "true"}, {0.5, 5, Ask, "wavering"}, {0.1, 8, Deny, "false"}, {0.9, 8, Deny, "true"},
		{0.1, 2, Deny, "false"}, {0.5, 2, Ask, "wavering"}, {0.65, 3.9, Allow, "true"}, {0.65, 4.0, Ask, "true"},
		// boundaries
		{0.65, 2, Allow, "true"}, {0.6499, 2, Ask, "wavering"}, {0.35, 2, Deny, "false"}, {0.3501, 2, Ask, "wavering"},
		{1, 6.99, Ask, "true"}, {1, 7.0, Deny, "true"}, {1, 3.99, Allow, "true"},
		// bool equivalents (true → 1.0, false → 0.0)
		{1, 1, Allow, "true"}, {1, 5, Ask, "true"}, {0, 8, Deny, "false"}, {1, 8, Deny, "true"},
		{0, 2, Deny, "false"}, {1, 3.9, Allow, "true"}, {1, 4, Ask, "true"},
		{math.NaN(), 2, Deny, ""},
	}
	for _, c := range cases {
		got, st := MapL1(c.noul, c.score, defTh)
		if got != c.want || (c.state != "" && st != c.state) {
			t.Errorf("MapL1(%v,%v) = %s,%s want %s,%s", c.noul, c.score, got, st, c.want, c.state)
		}
	}
}

// l1Gate is a gate with L1 on against srv.
func l1Gate(t *testing.T, srv *p0test.Server, mod func(*Config)) *Gate {
	t.Helper()
	cfg := Config{L1: L1Config{Enabled: true, Server: srv.URL}}
	if mod != nil {
		mod(&cfg)
	}
	return mustGate(t, cfg)
}

// TestL1EightPointFloat runs the 8-point mapping end to end with float noul
// answers (the scores must be integers on the wire, so 3.9 → 3).
func TestL1EightPointFloat(t *testing.T) {
	points := []struct {
		p     float64
		score int
		want  Decision
	}{
		{0.9, 2, Allow}, {0.5, 5, Ask}, {0.1, 8, Deny}, {0.9, 8, Deny},
		{0.1, 2, Deny}, {0.5, 2, Ask}, {0.65, 3, Allow}, {0.65, 4, Ask},
		{0.35, 3, Deny}, {0.36, 3, Ask}, {1, 7, Deny}, {1, 6, Ask},
	}
	var rules []p0test.Rule
	for i, pt := range points {
		rules = append(rules, p0test.Rule{Pattern: fmt.Sprintf(`^do_p%d `, i), NoulP: p0test.P(pt.p), Score: p0test.N(pt.score)})
	}
	srv := p0test.New(t, p0test.Options{NoulFloat: true, Rules: rules})
	g := l1Gate(t, srv, nil)
	for i, pt := range points {
		res := decide(g, fmt.Sprintf("do_p%d", i), map[string]any{"value": 1})
		if res.Decision != pt.want || res.Layer != LayerL1 {
			t.Errorf("(%v,%d): %s/%s %s", pt.p, pt.score, res.Decision, res.Layer, res.Reason)
		}
		if res.Noul == nil || *res.Noul != pt.p || res.Score == nil || *res.Score != float64(pt.score) {
			t.Errorf("(%v,%d): noul/score %v %v", pt.p, pt.score, res.Noul, res.Score)
		}
		if res.Confidence["gate_noul"] == 0 || res.Confidence["gate_score"] == 0 {
			t.Errorf("confidence %v", res.Confidence)
		}
	}
}

// TestL1BoolNoul: the real server's shape, noul a bool (p >= threshold on
// the server), so the wavering band never occurs.
func TestL1BoolNoul(t *testing.T) {
	points := []struct {
		p     float64
		score int
		want  Decision
		noul  float64
	}{
		{0.9, 2, Allow, 1}, {0.5, 5, Deny, 0}, {0.1, 8, Deny, 0}, {0.9, 8, Deny, 1},
		{0.65, 3, Allow, 1}, {0.65, 4, Ask, 1}, {0.6499, 2, Deny, 0}, {0.9, 10, Deny, 1}, {0.9, 6, Ask, 1},
	}
	var rules []p0test.Rule
	for i, pt := range points {
		rules = append(rules, p0test.Rule{Pattern: fmt.Sprintf(`^do_b%d `, i), NoulP: p0test.P(pt.p), Score: p0test.N(pt.score)})
	}
	for _, shape := range []p0test.Shape{p0test.Flat, p0test.NoExtensions} {
		srv := p0test.New(t, p0test.Options{Shape: shape, Rules: rules})
		g := l1Gate(t, srv, nil)
		for i, pt := range points {
			res := decide(g, fmt.Sprintf("do_b%d", i), map[string]any{"value": 1})
			if res.Decision != pt.want || res.Layer != LayerL1 || *res.Noul != pt.noul {
				t.Errorf("%s (%v,%d): %s/%s %s", shape, pt.p, pt.score, res.Decision, res.Layer, res.Reason)
			}
		}
	}
}

func TestL1ReasonText(t *testing.T) {
	srv := p0test.New(t, p0test.Options{Rules: []p0test.Rule{{NoulP: p0test.P(0.9), Score: p0test.N(5)}}})
	res := decide(l1Gate(t, srv, nil), "do_x", nil)
	if want := "L1 noul=1.0000(true, threshold=0.65) score=5(deny>=7, ask>=4) → ask"; res.Reason != want {
		t.Fatalf("reason %q, want %q", res.Reason, want)
	}
	if res.NoulState != "true" || res.Error != "" {
		t.Fatalf("%+v", res)
	}
}

func TestL1NestedShape(t *testing.T) {
	srv := p0test.New(t, p0test.Options{Shape: p0test.Nested, Rules: []p0test.Rule{{NoulP: p0test.P(0.9), Score: p0test.N(2)}}})
	if res := decide(l1Gate(t, srv, nil), "do_x", nil); res.Decision != Deny || res.Layer != LayerFailClosed {
		t.Fatalf("nested without accept_nested must deny: %+v", res)
	}
	res := decide(l1Gate(t, srv, func(c *Config) { c.L1.AcceptNested = true }), "do_x", nil)
	if res.Decision != Allow || res.Layer != LayerL1 || *res.Noul != 0.9 {
		t.Fatalf("nested accepted: %+v", res)
	}
}

// deadURL returns a loopback URL where nothing listens.
func deadURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

func TestL1FailClosed(t *testing.T) {
	type fc struct {
		name        string
		opts        p0test.Options
		fault       p0test.Fault
		mod         func(*Config)
		unavailable bool // configured fail_closed applies; else always deny
		reason      string
	}
	dead := deadURL(t)
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("wrong\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []fc{
		{name: "down", mod: func(c *Config) { c.L1.Server = dead }, unavailable: true, reason: "unreachable"},
		{name: "slow", fault: p0test.Fault{Delay: 5 * time.Second}, mod: func(c *Config) { c.L1.TimeoutMS = 100 }, unavailable: true, reason: "timed out"},
		{name: "500", fault: p0test.Fault{Status: 500}, unavailable: true, reason: "HTTP 500"},
		{name: "503", fault: p0test.Fault{Status: 503}, unavailable: true, reason: "HTTP 503"},
		{name: "401", opts: p0test.Options{Token: "right"}, unavailable: true, reason: "HTTP 401"},
		{name: "401 wrong token", opts: p0test.Options{Token: "right"}, mod: func(c *Config) { c.L1.TokenFile = tokFile }, unavailable: true, reason: "HTTP 401"},
		{name: "413", opts: p0test.Options{MaxBody: 64}, unavailable: true, reason: "HTTP 413"},
		{name: "422 model", mod: func(c *Config) { c.L1.Model = "phocinae-largha-150m-v1" }, unavailable: true, reason: "HTTP 422"},
		{name: "non-JSON", fault: p0test.Fault{NonJSON: true}, reason: "not JSON"},
		{name: "empty body", fault: p0test.Fault{Body: " "}, reason: "not JSON"},
		{name: "trailing", fault: p0test.Fault{Body: `{"answers":{"gate_noul":true,"gate_score":2}} {}`}, reason: "trailing"},
		{name: "top-level array", fault: p0test.Fault{TopLevelArray: true}, reason: "not an object"},
		{name: "answers missing", fault: p0test.Fault{AnswersMissing: true}, reason: `no "answers"`},
		{name: "answers array", fault: p0test.Fault{AnswersArray: true}, reason: "an array"},
		{name: "answers null", fault: p0test.Fault{Body: `{"answers":null}`}, reason: "null"},
		{name: "missing gate_noul", fault: p0test.Fault{DropID: "gate_noul"}, reason: "gate_noul is missing"},
		{name: "missing gate_score", fault: p0test.Fault{DropID: "gate_score"}, reason: "gate_score is missing"},
		{name: "noul yes", fault: p0test.Fault{NoulYes: true}, reason: "gate_noul is a string"},
		{name: "noul 1.5", fault: p0test.Fault{Body: `{"answers":{"gate_noul":1.5,"gate_score":2}}`}, reason: "[0,1]"},
		{name: "noul -0.1", fault: p0test.Fault{Body: `{"answers":{"gate_noul":-0.1,"gate_score":2}}`}, reason: "[0,1]"},
		{name: "score 11", fault: p0test.Fault{ScoreRaw: "11"}, reason: "2..10"},
		{name: "score 1", fault: p0test.Fault{ScoreRaw: "1"}, reason: "2..10"},
		{name: "score 1.5", fault: p0test.Fault{ScoreRaw: "1.5"}, reason: "2..10"},
		{name: "score 5.5", fault: p0test.Fault{ScoreRaw: "5.5"}, reason: "2..10"},
		{name: "score string", fault: p0test.Fault{ScoreRaw: `"5"`}, reason: "a string"},
		{name: "score null", fault: p0test.Fault{ScoreRaw: `null`}, reason: "null"},
		{name: "closed mid-body", fault: p0test.Fault{CloseMidBody: true}, reason: "cut short"},
	}
	for _, c := range cases {
		for _, conf := range []Decision{Deny, Ask} {
			t.Run(fmt.Sprintf("%s/%s", c.name, conf), func(t *testing.T) {
				t.Parallel()
				opts := c.opts
				opts.Rules = []p0test.Rule{{NoulP: p0test.P(1), Score: p0test.N(2)}} // would be allow
				srv := p0test.New(t, opts)
				srv.SetFault(c.fault)
				g := l1Gate(t, srv, func(cfg *Config) {
					cfg.FailClosed = conf
					if c.mod != nil {
						c.mod(cfg)
					}
				})
				start := time.Now()
				res := decide(g, "do_set_vent", map[string]any{"value": 40})
				want := Deny
				if c.unavailable {
					want = conf
				}
				if res.Decision != want || res.Layer != LayerFailClosed {
					t.Fatalf("got %s/%s (%s), want %s/fail_closed", res.Decision, res.Layer, res.Reason, want)
				}
				if !strings.Contains(res.Reason, "fail-closed") || !strings.Contains(res.Reason, c.reason) || res.Error == "" {
					t.Fatalf("reason %q should name %q (error %q)", res.Reason, c.reason, res.Error)
				}
				if res.Noul != nil || res.Score != nil {
					t.Fatalf("noul/score set on failure: %+v", res)
				}
				if d := time.Since(start); d > 3*time.Second {
					t.Fatalf("took %v", d)
				}
			})
		}
	}
}

// TestL1TimeoutSynctest pins the 2 s default timeout on the fake clock.
func TestL1TimeoutSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := p0test.New(t, p0test.Options{InMemory: true})
		cfg := Config{FailClosed: Ask, L1: L1Config{Enabled: true, Server: srv.URL, Transport: srv.Transport()}}
		g := mustGate(t, cfg)

		srv.SetFault(p0test.Fault{Delay: 1999 * time.Millisecond})
		start := time.Now()
		res := decide(g, "do_x", nil)
		if res.Decision != Allow || res.Layer != LayerL1 || time.Since(start) != 1999*time.Millisecond {
			t.Fatalf("1.999 s answer: %+v after %v", res, time.Since(start))
		}

		srv.SetFault(p0test.Fault{Delay: time.Hour})
		start = time.Now()
		res = decide(g, "do_x", nil)
		if res.Decision != Ask || res.Layer != LayerFailClosed || !strings.Contains(res.Reason, "timed out after 2s") {
			t.Fatalf("timeout: %+v", res)
		}
		if d := time.Since(start); d != 2*time.Second {
			t.Fatalf("gave up after %v, want 2s", d)
		}
		// the caller's own deadline is a timeout too
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		res = g.Decide(ctx, Request{Tool: "do_x"})
		if res.Decision != Ask || res.Layer != LayerFailClosed {
			t.Fatalf("caller deadline: %+v", res)
		}
		// a cancelled caller is deny, not the configured ask
		ctx, cancel2 := context.WithCancel(context.Background())
		cancel2()
		if res = g.Decide(ctx, Request{Tool: "do_x"}); res.Decision != Deny {
			t.Fatalf("cancelled: %+v", res)
		}
		// in-memory mid-body close is deny
		srv.SetFault(p0test.Fault{CloseMidBody: true})
		if res = decide(g, "do_x", nil); res.Decision != Deny || !strings.Contains(res.Reason, "cut short") {
			t.Fatalf("mid-body: %+v", res)
		}
	})
}

func TestL1RequestGolden(t *testing.T) {
	srv := p0test.New(t, p0test.Options{Token: "tok-123"})
	cfg := Config{L1: L1Config{Enabled: true, Server: srv.URL + "/"}}
	g := mustGate(t, cfg)
	g.cfg.L1.token = &secret{"tok-123"} // as if read from token_env
	res := decide(g, "do_set_valve", map[string]any{"open": true, "id": "v3"})
	if res.Decision != Allow || res.Layer != LayerL1 {
		t.Fatalf("%+v", res)
	}
	reqs := srv.Requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	r := reqs[0]
	if r.Path != "/v1/systemone" || r.Header.Get("Authorization") != "Bearer tok-123" ||
		r.Header.Get("Content-Type") != "application/json" || r.Header.Get("User-Agent") != "physd/1.2.3" {
		t.Fatalf("path %s headers %v", r.Path, r.Header)
	}
	want := `{"model":"Phocinae-Largha-150M-v1","state":"{\"command\":\"do_set_valve {\\\"id\\\":\\\"v3\\\",\\\"open\\\":true}\",\"cwd\":\"device:edge-01\",\"tool\":\"physd/1.2.3\",\"question\":\"How harmful is this actuator command if it runs on real equipment?\"}","questions":[{"id":"gate_noul","type":"noul","threshold":0.65},{"id":"gate_score","type":"score"}]}`
	if string(r.Body) != want {
		t.Fatalf("body\n got %s\nwant %s", r.Body, want)
	}
	q, raw, err := r.Decode()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := raw["instructions"]; ok || len(raw) != 3 {
		t.Fatalf("top-level fields %v", raw)
	}
	if q.Model != "Phocinae-Largha-150M-v1" || len(q.Questions) != 2 || q.Questions[0].ID != "gate_noul" ||
		q.Questions[1].ID != "gate_score" || *q.Questions[0].Threshold != 0.65 || q.Questions[1].Threshold != nil {
		t.Fatalf("%+v", q)
	}
	for _, qq := range q.Questions {
		if qq.Extra != nil {
			t.Fatalf("question carries ignored fields %v", qq.Extra)
		}
	}
	var st map[string]string
	if err := json.Unmarshal([]byte(q.State), &st); err != nil {
		t.Fatalf("state is not a JSON string: %v", err)
	}
	if st["command"] != res.Command || st["cwd"] != "device:edge-01" || st["question"] != L1Question || st["tool"] != "physd/1.2.3" {
		t.Fatalf("state %v", st)
	}
	if got := g.RequestBody(Request{Tool: "do_set_valve", Args: map[string]any{"id": "v3", "open": true}, DeviceID: "edge-01"}); string(got) != want {
		t.Fatalf("RequestBody differs: %s", got)
	}
	// without a token no Authorization header
	srv2 := p0test.New(t, p0test.Options{})
	decide(l1Gate(t, srv2, nil), "do_x", nil)
	if h := srv2.Requests()[0].Header.Get("Authorization"); h != "" {
		t.Fatalf("unexpected Authorization %q", h)
	}
}

func TestL1TokenFromEnv(t *testing.T) {
	t.Setenv("PHYSD_TEST_P0_TOKEN", "envtok")
	srv := p0test.New(t, p0test.Options{Token: "envtok"})
	g := l1Gate(t, srv, func(c *Config) { c.L1.TokenEnv = "PHYSD_TEST_P0_TOKEN" })
	if res := decide(g, "do_x", nil); res.Decision != Allow {
		t.Fatalf("%+v", res)
	}
}

func TestStateClamp(t *testing.T) {
	srv := p0test.New(t, p0test.Options{})
	g := l1Gate(t, srv, nil)
	long := strings.Repeat("é\"", 5000)
	res := decide(g, "do_display", map[string]any{"text": long})
	q, _, err := srv.Requests()[0].Decode()
	if err != nil {
		t.Fatal(err)
	}
	if n := len([]rune(q.State)); n > MaxStateChars {
		t.Fatalf("state has %d chars", n)
	}
	var st map[string]string
	if err := json.Unmarshal([]byte(q.State), &st); err != nil || !strings.HasSuffix(st["command"], "…") || st["question"] != L1Question {
		t.Fatalf("clamped state invalid: %v %q", err, q.State[:80])
	}
	if res.Decision != Ask || !strings.Contains(res.Reason, "clamped") {
		t.Fatalf("a clamped allow must be capped at ask: %+v", res)
	}
}

func TestP0ServerValidation(t *testing.T) {
	srv := p0test.New(t, p0test.Options{})
	g := l1Gate(t, srv, nil)
	good := string(g.RequestBody(Request{Tool: "do_x"}))
	post := func(body string) int {
		t.Helper()
		resp, err := g.client.Post(srv.URL+"/v1/systemone", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for body, want := range map[string]int{
		good: 200,
		`{`:  422,
		`{"model":"x","state":"s","questions":[{"id":"a","type":"noul"}]}`:                                                 422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[]}`:                                                   422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"","type":"noul"}]}`:                            422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"noul"},{"id":"a","type":"score"}]}`: 422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"guess"}]}`:                          422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"choice"}]}`:                         422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"score","options":["x"]}]}`:          422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"noul","threshold":1.2}]}`:           422,
		`{"model":"Phocinae-Largha-150M-v1","state":"s","questions":[{"id":"a","type":"choice","options":["x","y"]}]}`:     200,
	} {
		if got := post(body); got != want {
			t.Errorf("%s: %d want %d", body, got, want)
		}
	}
	resp, err := g.client.Get(srv.URL + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v", err)
	}
	resp.Body.Close()
}
