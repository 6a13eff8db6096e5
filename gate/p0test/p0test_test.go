package p0test_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/gate/p0test"
)

const body = `{"model":"Phocinae-Largha-150M-v1","state":"{\"command\":\"do_vent {\\\"value\\\":40}\"}","questions":[{"id":"ok","type":"noul","threshold":0.65},{"id":"act","type":"choice","options":["allow","ask","deny"]},{"id":"risk","type":"score"}]}`

func post(t *testing.T, c *http.Client, url, b string, hdr ...string) (int, map[string]any, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/v1/systemone", strings.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	json.Unmarshal(raw, &m)
	return resp.StatusCode, m, string(raw)
}

func TestShapes(t *testing.T) {
	rules := []p0test.Rule{
		{Pattern: `^do_heater`, NoulP: p0test.P(0.1), Score: p0test.N(9)},
		{Pattern: `^do_vent`, NoulP: p0test.P(0.7), Score: p0test.N(5), Choice: p0test.N(1), Confidence: map[string]float64{"risk": 0.33}},
	}
	flat := p0test.New(t, p0test.Options{Rules: rules})
	code, m, raw := post(t, http.DefaultClient, flat.URL, body)
	if code != 200 {
		t.Fatalf("%d %s", code, raw)
	}
	a := m["answers"].(map[string]any)
	if a["ok"] != true || a["act"] != 1.0 || a["risk"] != 5.0 {
		t.Fatalf("flat answers %v", a)
	}
	if c := m["answer_confidence"].(map[string]any); c["risk"] != 0.33 || c["ok"] != 0.7 {
		t.Fatalf("confidence %v", c)
	}
	if os := m["option_scores"].(map[string]any)["ok"].([]any); os[0] != 0.3 || os[1] != 0.7 {
		t.Fatalf("option_scores %v", os)
	}
	for _, k := range []string{"model", "usage", "action", "routing"} {
		if _, ok := m[k]; !ok {
			t.Errorf("flat lacks %s", k)
		}
	}

	nested := p0test.New(t, p0test.Options{Shape: p0test.Nested, Rules: rules})
	_, m, _ = post(t, http.DefaultClient, nested.URL, body)
	if ok := m["answers"].(map[string]any)["ok"].(map[string]any); ok["type"] != "noul" || ok["noul"] != 0.7 {
		t.Fatalf("nested %v", ok)
	}

	bare := p0test.New(t, p0test.Options{Shape: p0test.NoExtensions, NoulFloat: true, Rules: rules})
	_, m, _ = post(t, http.DefaultClient, bare.URL, body)
	if len(m) != 3 || m["answers"].(map[string]any)["ok"] != 0.7 {
		t.Fatalf("no_extensions %v", m)
	}
	// default rule: noul 0.9, score 2; first match wins; plain-text state
	_, m, _ = post(t, http.DefaultClient, flat.URL, strings.Replace(body, `{\"command\":\"do_vent {\\\"value\\\":40}\"}`, `note\ncommand: do_heater 3`, 1))
	if a := m["answers"].(map[string]any); a["ok"] != false || a["risk"] != 9.0 {
		t.Fatalf("text state %v", a)
	}
	_, m, _ = post(t, http.DefaultClient, flat.URL, strings.Replace(body, `do_vent`, `do_other`, 1))
	if a := m["answers"].(map[string]any); a["ok"] != true || a["risk"] != 2.0 || a["act"] != 0.0 {
		t.Fatalf("defaults %v", a)
	}
	if n := len(flat.Requests()); n != 3 {
		t.Fatalf("recorded %d", n)
	}
	flat.Reset()
	if n := len(flat.Requests()); n != 0 {
		t.Fatal("reset")
	}
}

func TestAuthAndLimits(t *testing.T) {
	s := p0test.New(t, p0test.Options{Token: "t0k", MaxBody: 1024})
	if code, m, _ := post(t, http.DefaultClient, s.URL, body); code != 401 || m["detail"] != "missing or invalid bearer token" {
		t.Fatalf("no token: %d", code)
	}
	if code, _, _ := post(t, http.DefaultClient, s.URL, body, "Authorization", "Bearer nope"); code != 401 {
		t.Fatalf("wrong token: %d", code)
	}
	if code, _, raw := post(t, http.DefaultClient, s.URL, body, "Authorization", "Bearer t0k"); code != 200 {
		t.Fatalf("token: %d %s", code, raw)
	}
	big := strings.Replace(body, "do_vent", strings.Repeat("x", 2000), 1)
	if code, m, _ := post(t, http.DefaultClient, s.URL, big, "Authorization", "Bearer t0k"); code != 413 || m["error"] == nil {
		t.Fatalf("413: %d %v", code, m)
	}
	resp, _ := http.Get(s.URL + "/nope")
	if resp.StatusCode != 404 {
		t.Fatal(resp.StatusCode)
	}
	resp.Body.Close()
	resp, _ = http.Get(s.URL + "/v1/systemone")
	if resp.StatusCode != 405 {
		t.Fatal(resp.StatusCode)
	}
	resp.Body.Close()
}

func TestFaults(t *testing.T) {
	s := p0test.New(t, p0test.Options{Rules: []p0test.Rule{{Pattern: "do_vent", Fault: &p0test.Fault{Status: 503}}}})
	if code, _, _ := post(t, http.DefaultClient, s.URL, body); code != 503 {
		t.Fatalf("rule fault: %d", code)
	}
	for _, c := range []struct {
		f     p0test.Fault
		check func(raw string) bool
	}{
		{p0test.Fault{NonJSON: true}, func(r string) bool { return strings.HasPrefix(r, "<html>") }},
		{p0test.Fault{TopLevelArray: true}, func(r string) bool { return strings.HasPrefix(r, "[{") }},
		{p0test.Fault{AnswersArray: true}, func(r string) bool { return strings.Contains(r, `"answers":[`) }},
		{p0test.Fault{AnswersMissing: true}, func(r string) bool { return !strings.Contains(r, `"answers"`) }},
		{p0test.Fault{DropID: "risk"}, func(r string) bool { return !strings.Contains(r, `"risk":2`) }},
		{p0test.Fault{NoulYes: true}, func(r string) bool { return strings.Contains(r, `"ok":"yes"`) }},
		{p0test.Fault{ScoreRaw: "1.5"}, func(r string) bool { return strings.Contains(r, `"risk":1.5`) }},
		{p0test.Fault{Body: `{"x":1}`}, func(r string) bool { return r == `{"x":1}` }},
	} {
		s.SetFault(c.f) // the global fault wins over the rule's 503
		code, _, raw := post(t, http.DefaultClient, s.URL, body)
		if code != 200 || !c.check(raw) {
			t.Errorf("%+v: %d %s", c.f, code, raw)
		}
	}
	s.SetFault(p0test.Fault{CloseMidBody: true})
	resp, err := http.Post(s.URL+"/v1/systemone", "application/json", strings.NewReader(body))
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if err == nil {
		t.Fatal("mid-body close not seen by the client")
	}
}

func TestInMemoryDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := p0test.New(t, p0test.Options{InMemory: true})
		s.SetFault(p0test.Fault{Delay: time.Minute})
		c := &http.Client{Transport: s.Transport()}
		start := time.Now()
		code, _, _ := post(t, c, s.URL, body)
		if code != 200 || time.Since(start) != time.Minute {
			t.Fatalf("%d after %v", code, time.Since(start))
		}
		c.Timeout = time.Second
		req, _ := http.NewRequest("POST", s.URL+"/v1/systemone", strings.NewReader(body))
		if _, err := c.Do(req); err == nil {
			t.Fatal("timeout not reported")
		}
		if n := len(s.Requests()); n != 2 {
			t.Fatalf("recorded %d", n)
		}
	})
}
