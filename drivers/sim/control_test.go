package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
)

// do sends a request to h and decodes the JSON answer.
func do(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	if method == http.MethodPost {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: body %q is not JSON: %v", method, path, rec.Body.String(), err)
	}
	return rec.Code, out
}

func TestControlHandlerFaultThenReadsFail(t *testing.T) {
	p := newPlantT(t, oneZone)
	temp := open(t, p, "read", "float", "zone_a.temperature")
	readF(t, temp)
	// Mounted the way the daemon will: under /sim/<bus>/.
	mux := http.NewServeMux()
	mux.Handle("/sim/plant/", http.StripPrefix("/sim/plant", p.ControlHandler()))

	code, st := do(t, mux, "POST", "/sim/plant/fault", `{"point":"zone_a.temperature","mode":"offline"}`)
	if code != http.StatusOK {
		t.Fatalf("POST /fault = %d %v", code, st)
	}
	if _, err := temp.Read(t.Context()); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read after POST /fault offline: %v", err)
	}

	code, st = do(t, mux, "GET", "/sim/plant/", "")
	if code != http.StatusOK {
		t.Fatalf("GET / = %d", code)
	}
	faults := st["faults"].(map[string]any)
	if f, ok := faults["zone_a.temperature"].(map[string]any); !ok || f["mode"] != "offline" {
		t.Fatalf("GET / faults = %v", faults)
	}
	if sig := st["signals"].(map[string]any); sig["zone_a.temperature"] != 12.0 || len(sig) != 5 {
		t.Fatalf("GET / signals = %v", sig)
	}
	stats := st["stats"].(map[string]any)
	pts := stats["points"].(map[string]any)
	if ts := pts["zone_a.temperature"].(map[string]any); ts["reads"] != 2.0 || ts["writes"] != 0.0 || stats["reads"] != 2.0 {
		t.Fatalf("GET / stats = %v", stats)
	}

	code, st = do(t, mux, "POST", "/sim/plant/fault", `{"point":"*","mode":"slow","delay_ms":250}`)
	if code != http.StatusOK {
		t.Fatalf("POST slow = %d %v", code, st)
	}
	if f := p.Faults()["*"]; f.Mode != FaultSlow || f.Delay.Milliseconds() != 250 {
		t.Fatalf("slow fault = %+v", f)
	}

	code, st = do(t, mux, "POST", "/sim/plant/clear", "")
	if code != http.StatusOK || len(st["faults"].(map[string]any)) != 0 {
		t.Fatalf("POST /clear = %d %v", code, st)
	}
	readF(t, temp)
}

func TestControlHandlerNoisyAndNone(t *testing.T) {
	p := newPlantT(t, oneZone)
	h := p.ControlHandler()
	// Stripping the trailing slash too leaves "fault" without a leading one.
	mux := http.NewServeMux()
	mux.Handle("/sim/plant/", http.StripPrefix("/sim/plant/", h))
	if code, st := do(t, h, "POST", "/fault", `{"point":"zone_a.fan","mode":"noisy","noise":1.5}`); code != 200 {
		t.Fatalf("noisy = %d %v", code, st)
	}
	if f := p.Faults()["zone_a.fan"]; f.Mode != FaultNoisy || f.Noise != 1.5 {
		t.Fatalf("fault = %+v", f)
	}
	if code, st := do(t, mux, "POST", "/sim/plant/fault", `{"point":"zone_a.fan","mode":"none"}`); code != 200 {
		t.Fatalf("none = %d %v", code, st)
	}
	if len(p.Faults()) != 0 {
		t.Fatalf("mode none left %v", p.Faults())
	}
}

func TestControlHandlerRejectsBadInput(t *testing.T) {
	p := newPlantT(t, oneZone)
	h := p.ControlHandler()
	for _, tc := range []struct {
		method, path, body string
		code               int
		want               string
	}{
		{"POST", "/fault", `{"point":`, 400, "bad JSON"},
		{"POST", "/fault", `not json`, 400, "bad JSON"},
		{"POST", "/fault", ``, 400, "empty body"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"offline"} {}`, 400, "trailing data"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"offline","extra":1}`, 400, "unknown field"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"melted"}`, 400, "unknown fault mode \"melted\""},
		{"POST", "/fault", `{"mode":"offline"}`, 400, "\"point\" is required"},
		{"POST", "/fault", `{"point":"zone_z.fan","mode":"offline"}`, 400, "unknown point \"zone_z.fan\""},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"slow"}`, 400, "delay > 0"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"slow","delay_ms":-5}`, 400, "delay_ms"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"noisy","noise":-1}`, 400, "noise > 0"},
		{"POST", "/fault", `{"point":"zone_a.fan","mode":"offline","noise":"x"}`, 400, "bad JSON"},
		{"POST", "/fault", `{"point":"` + strings.Repeat("x", 70<<10) + `"}`, 413, "exceeds"},
		{"GET", "/fault", ``, 405, "use POST"},
		{"POST", "/", ``, 405, "use GET"},
		{"GET", "/nope", ``, 404, "no such control"},
	} {
		code, out := do(t, h, tc.method, tc.path, tc.body)
		msg, _ := out["error"].(string)
		if code != tc.code || !strings.Contains(msg, tc.want) {
			t.Errorf("%s %s %.40q = %d %q; want %d mentioning %q", tc.method, tc.path, tc.body, code, msg, tc.code, tc.want)
		}
	}
	// A form post or a no-cors fetch (a browser's only cross-site POSTs
	// without a preflight) cannot inject a fault.
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"} {
		for _, path := range []string{"/fault", "/clear"} {
			req := httptest.NewRequest("POST", path, strings.NewReader(`{"point":"*","mode":"offline"}`))
			if ct != "" {
				req.Header.Set("Content-Type", ct)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusUnsupportedMediaType {
				t.Errorf("POST %s as %q = %d, want 415", path, ct, rec.Code)
			}
		}
	}
	if len(p.Faults()) != 0 {
		t.Fatalf("bad requests installed faults: %v", p.Faults())
	}
}
