package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// rpc posts one modern JSON-RPC request with the headers a conforming
// 2026-07-28 client sends, minus any named in omit.
func rpc(t *testing.T, d *daemon, method, name string, params map[string]any, omit ...string) (int, map[string]any) {
	t.Helper()
	if params == nil {
		params = map[string]any{}
	}
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion":    "2026-07-28",
		"io.modelcontextprotocol/clientCapabilities": map[string]any{},
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	return post(t, d, method, name, body, omit...)
}

func post(t *testing.T, d *daemon, method, name string, body []byte, omit ...string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, d.url("/mcp"), bytes.NewReader(body))
	h := map[string]string{
		"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
		"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method, "Mcp-Name": name,
	}
	for _, o := range omit {
		delete(h, o)
	}
	for k, v := range h {
		if v != "" {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m
}

func TestHostileToolArguments(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	cs := connectHTTP(t, d, "2026-07-28")
	huge := strings.Repeat("x", 1_000_000)
	cases := []struct {
		name string
		tool string
		args any
		want string // substring of the error text
	}{
		{"string for a number", "do_heater_zone_a", map[string]any{"value": "50", "idempotency_key": "k1"}, "value: must be a JSON number"},
		{"empty string", "do_heater_zone_a", map[string]any{"value": "", "idempotency_key": "k2"}, "value: must be a JSON number"},
		{"bool for a number", "do_fan_zone_b", map[string]any{"value": true, "idempotency_key": "k3"}, "value: must be a JSON number"},
		{"object for a number", "do_fan_zone_b", map[string]any{"value": map[string]any{"x": 1}, "idempotency_key": "k4"}, "got object"},
		{"fraction for an int", "do_fan_zone_b", map[string]any{"value": 33.3, "idempotency_key": "k5"}, "whole number"},
		{"missing value", "do_fan_zone_b", map[string]any{"idempotency_key": "k6"}, "value: required"},
		{"missing key", "do_fan_zone_b", map[string]any{"value": 10}, "idempotency_key: required"},
		{"key of the wrong type", "do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": 7}, "idempotency_key must be a string"},
		{"1 MB key", "do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": huge}, "idempotency_key: at most 128"},
		{"1 MB value", "do_fan_zone_b", map[string]any{"value": huge, "idempotency_key": "k7"}, "value: must be a JSON number"},
		{"control characters in key", "do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": "a\nb"}, "control characters"},
		{"unknown argument", "do_fan_zone_b", map[string]any{"value": 10, "idempotency_key": "k8", "force": true}, "unknown argument \"force\""},
		{"arguments not an object", "do_fan_zone_b", []any{1, 2}, "arguments"},
		{"huge int", "do_fan_zone_b", map[string]any{"value": 1e300, "idempotency_key": "k9"}, "too large"},
		{"read with a bad max_age", "read_temperature_zone_a", map[string]any{"max_age_ms": "soon"}, "max_age_ms must be an integer"},
		{"read with a negative max_age", "read_temperature_zone_a", map[string]any{"max_age_ms": -5}, "max_age_ms: must be ≥ 0"},
		{"can_do without intent", "can_do", map[string]any{}, "intent: required"},
		{"can_do with empty tags", "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{" "}}}, "semantic_tags"},
		{"can_do with tags as a string", "can_do", map[string]any{"intent": map[string]any{"semantic_tags": "heat"}}, "semantic_tags must be an array"},
		{"can_do with an unknown action", "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"heat"}, "action": "explode"}}, "intent.action"},
		{"can_do with a 1 MB tag", "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{huge}}}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := call(t, cs, c.tool, c.args)
			if c.want == "" {
				return // must not crash; any answer will do
			}
			if !res.IsError || !strings.Contains(text(res), c.want) {
				t.Errorf("isError=%v text=%q, want error containing %q", res.IsError, truncateText(text(res)), c.want)
			}
		})
	}
	// A finite value beyond the physical range is a refusal, not a write.
	r := structured(t, call(t, cs, "do_heater_zone_a", map[string]any{"value": 1e308, "idempotency_key": "k-big"}))
	if r["status"] != "failed" || r["permission"] != "out_of_range" || !strings.Contains(fmt.Sprint(r["reason"]), "outside") {
		t.Errorf("1e308: %v", r)
	}
	// NaN and ±Inf are not JSON: the raw request is rejected before any tool runs.
	for _, v := range []string{"NaN", "Infinity", "-Infinity", "1e400"} {
		body := []byte(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"do_heater_zone_a","arguments":{"value":` + v +
			`,"idempotency_key":"k-` + v + `"},"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
		code, m := post(t, d, "tools/call", "do_heater_zone_a", body)
		res, _ := m["result"].(map[string]any)
		if code == http.StatusOK && (res == nil || res["isError"] != true) {
			t.Errorf("value %s: HTTP %d %v, want an error", v, code, m)
		}
	}
	s := d.sim(t)
	for p := range s.Stats.Points {
		if w := s.writes(p); w != 0 {
			t.Errorf("hostile input actuated %s %d times", p, w)
		}
	}
	if resp, err := http.Get(d.url("/healthz")); err != nil || resp.StatusCode != 200 {
		t.Fatalf("daemon unhealthy after hostile input: %v", err)
	}
}

func truncateText(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

func TestHTTPGuards(t *testing.T) {
	t.Parallel()
	d := startHTTP(t, daemonOpts{})
	list := func(mut func(*http.Request)) (int, []byte) {
		body := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
		req, _ := http.NewRequest(http.MethodPost, d.url("/mcp"), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/list")
		mut(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, b := list(func(*http.Request) {}); code != 200 {
		t.Fatalf("baseline tools/list: %d %s", code, b)
	}
	if code, _ := list(func(r *http.Request) { r.Header.Set("Origin", "http://evil.example") }); code != http.StatusForbidden {
		t.Errorf("foreign Origin: %d, want 403", code)
	}
	if code, _ := list(func(r *http.Request) { r.Header.Set("Origin", "null") }); code != http.StatusForbidden {
		t.Errorf("null Origin: %d, want 403", code)
	}
	if code, _ := list(func(r *http.Request) { r.Header.Set("Origin", "http://"+d.addr) }); code != 200 {
		t.Errorf("same Origin: %d, want 200", code)
	}
	if code, _ := list(func(r *http.Request) { r.Host = "evil.example:80" }); code != http.StatusForbidden {
		t.Errorf("non-loopback Host: %d, want 403", code)
	}
	for _, h := range []string{"MCP-Protocol-Version", "Mcp-Method"} {
		code, b := list(func(r *http.Request) { r.Header.Del(h) })
		if code != http.StatusBadRequest || !bytes.Contains(b, []byte("-32020")) {
			t.Errorf("missing %s: %d %s, want 400 with -32020", h, code, b)
		}
	}
	resp, err := http.Get(d.url("/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /mcp: %d, want 405", resp.StatusCode)
	}
	// Oversized bodies are refused before they are parsed.
	big := bytes.Repeat([]byte("x"), 2<<20)
	req, _ := http.NewRequest(http.MethodPost, d.url("/mcp"), bytes.NewReader(big))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode < 400 {
		t.Errorf("2 MiB body: %d, want a 4xx", resp.StatusCode)
	}
	// /readyz names its checks.
	resp, err = http.Get(d.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"bus:plant"`)) {
		t.Errorf("readyz: %d %s", resp.StatusCode, b)
	}
	d.fault(t, "*", "offline")
	resp, err = http.Get(d.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("readyz with the plant offline: %d %s, want 503", resp.StatusCode, b)
	}
}

func TestAuthTokenAndRemoteBind(t *testing.T) {
	t.Parallel()
	// A non-loopback bind is refused without --allow-remote and a token.
	out, err := exec.Command(physdBin, "run", "--manifest", greenhouse, "--state", t.TempDir(), "--http", "0.0.0.0:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "not a loopback address") {
		t.Errorf("non-loopback bind: err=%v out=%s", err, out)
	}
	out, err = exec.Command(physdBin, "run", "--manifest", greenhouse, "--state", t.TempDir(), "--http", "0.0.0.0:0", "--allow-remote").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "auth token") {
		t.Errorf("remote bind without a token: err=%v out=%s", err, out)
	}
	// With a token, /mcp requires it.
	tok := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tok, []byte("s3cret-token-of-enough-length\n"), 0o600)
	d := startHTTP(t, daemonOpts{extra: []string{"--auth-token-file", tok}})
	code, _ := rpc(t, d, "tools/list", "", nil)
	if code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
}

var posRE = regexp.MustCompile(`\.yml:\d+:\d+: `)

func TestValidateCLI(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(physdBin, "validate", greenhouse).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok") {
		t.Fatalf("validate example: %v %s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yml")
	os.WriteFile(bad, []byte(`physmcp_version: "0.1"
device:
  id: Bad-ID
  type: x
  location: {zone: z}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
capabilities:
  - name: t
    kind: read
    description: a temperature
    binding: {type: sim, bus: plant, point: z.temperature}
    data_type: float
    range: {min: 10, max: 0}
    semantic_tags: [temperature]
    colour: blue
  - name: t
    kind: sometimes
    description: again
    binding: {type: sim, bus: nowhere, point: z.heater}
    data_type: float
    semantic_tags: [x]
`), 0o644)
	out, err = exec.Command(physdBin, "validate", bad).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("validate bad file: err=%v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"device.id", "min", "colour", "duplicate", "kind", "nowhere"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
	if n := len(posRE.FindAllString(string(out), -1)); n < 6 {
		t.Errorf("want every error with file:line:col, got %d positions:\n%s", n, out)
	}
	// Malformed YAML is one clear error, not a panic.
	os.WriteFile(bad, []byte("device: [unclosed\n  id: x"), 0o644)
	out, err = exec.Command(physdBin, "validate", bad).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || strings.Contains(string(out), "panic") || !posRE.MatchString(string(out)) {
		t.Errorf("malformed YAML: err=%v out=%s", err, out)
	}
	// physd run refuses a bad manifest too.
	out, err = exec.Command(physdBin, "run", "--manifest", bad, "--state", t.TempDir()).CombinedOutput()
	if err == nil || !posRE.MatchString(string(out)) {
		t.Errorf("run with a bad manifest: err=%v out=%s", err, out)
	}
}
