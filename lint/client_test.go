package lint

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeServer is a small MCP server whose answers break the proMCP
// contracts in known ways, to prove the runtime checks see them through a
// real client.
type fakeServer struct {
	doCalls atomic.Int32
	lastDo  atomic.Value // map[string]any
}

func jsonResult(v any) *mcp.CallToolResult {
	b, _ := json.Marshal(v)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}, StructuredContent: json.RawMessage(b)}
}

func (fs *fakeServer) handler(t *testing.T, broken bool, versions ...string) http.Handler {
	s := mcp.NewServer(&mcp.Implementation{Name: "fake", Version: "1"}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}, SupportedProtocolVersions: versions})
	var tools []map[string]any
	if err := json.Unmarshal([]byte(compliantJSON), &tools); err != nil {
		t.Fatal(err)
	}
	def := func(name string) *mcp.Tool {
		tl := byName(tools, name)
		b, _ := json.Marshal(tl)
		var out mcp.Tool
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	s.AddTool(def("can_do"), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		until := time.Now().Add(5 * time.Second).UTC().Format(time.RFC3339Nano)
		rep := map[string]any{"query_id": "same-id", "feasible": false, "blocked": []any{}, "unroutable": []any{},
			"candidates": []any{map[string]any{"capability": "do_fan_speed", "source": "fake", "confidence": 0.9, "permission": "allowed",
				"valid_until": until, "current_state": map[string]any{"value": 30, "quality": "good"}}}}
		if !broken {
			rep["feasible"] = true
			rep["query_id"] = newKey()
		}
		if strings.Contains(string(req.Params.Arguments), NonsenseTag) {
			rep = map[string]any{"query_id": newKey(), "feasible": false, "candidates": []any{}, "blocked": []any{},
				"unroutable": []any{map[string]any{"outcome": "x", "reason": "no_producer", "detail": "nothing has that tag"}}}
		}
		return jsonResult(rep), nil
	})
	s.AddTool(def("read_temperature"), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		q := "good"
		if broken {
			q = "fine"
		}
		return jsonResult(map[string]any{"value": 21.5, "unit": "celsius", "timestamp": time.Now().UTC().Format(time.RFC3339Nano), "quality": q}), nil
	})
	s.AddTool(def("do_fan_speed"), func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		fs.doCalls.Add(1)
		var in map[string]any
		_ = json.Unmarshal(req.Params.Arguments, &in)
		fs.lastDo.Store(in)
		key := in["idempotency_key"]
		if broken {
			key = "something-else"
		}
		return jsonResult(map[string]any{"status": "success", "idempotency_key": key, "compensable": true, "compensation_hint": "do_fan_speed value=30",
			"timestamp": time.Now().UTC().Format(time.RFC3339), "applied_value": in["value"], "previous_value": 30, "side_effects": []any{"airflow"}}), nil
	})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
}

func runtimeCodes(rep *Report) map[string]bool {
	out := map[string]bool{}
	for _, r := range rep.Runtime {
		for _, f := range r.Findings {
			out[f.Code] = true
		}
	}
	return out
}

func TestRunAgainstCompliantFake(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs.handler(t, false))
	defer srv.Close()
	rep, err := Run(context.Background(), Target{URL: srv.URL}, Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ProtocolVersion != "2026-07-28" || rep.Summary.Errors != 0 {
		var sb strings.Builder
		rep.WriteText(&sb)
		t.Fatalf("version %s, report:\n%s", rep.ProtocolVersion, sb.String())
	}
	if n := fs.doCalls.Load(); n != 0 {
		t.Fatalf("do_ was called %d times without --allow-do", n)
	}
	if !runtimeCodes(rep)["RT029"] {
		t.Error("the skipped do_ tools are not reported")
	}

	rep, err = Run(context.Background(), Target{URL: srv.URL}, Options{Timeout: 20 * time.Second, AllowDo: true})
	if err != nil {
		t.Fatal(err)
	}
	if n := fs.doCalls.Load(); n != 1 {
		t.Fatalf("--allow-do called do_ %d times, want once", n)
	}
	in := fs.lastDo.Load().(map[string]any)
	if in["value"] != 30.0 || !strings.HasPrefix(in["idempotency_key"].(string), "physd-lint-") {
		t.Errorf("do_ arguments %v: want the current value 30 and a fresh key", in)
	}
	if rep.Summary.Errors != 0 {
		t.Errorf("allow-do run: %+v %+v", rep.Summary, rep.Runtime)
	}
}

func TestRunFindsBrokenAnswers(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs.handler(t, true))
	defer srv.Close()
	rep, err := Run(context.Background(), Target{URL: srv.URL, Header: http.Header{"Authorization": {"Bearer x"}}}, Options{Timeout: 20 * time.Second, AllowDo: true})
	if err != nil {
		t.Fatal(err)
	}
	got := runtimeCodes(rep)
	// feasible asserted false with an allowed candidate; a quality outside
	// the enum (also against the outputSchema); the do_ answer carries
	// another key; the query_id repeats.
	for _, want := range []string{"RT003", "RT023", "RT027", "RT033", "RT017"} {
		if !got[want] {
			t.Errorf("%s not reported; runtime codes %v", want, got)
		}
	}
	if rep.ExitCode() != 1 {
		t.Errorf("exit %d with errors", rep.ExitCode())
	}
}

func TestRunCannotConnect(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := Run(context.Background(), Target{URL: url + "/mcp"}, Options{Timeout: 5 * time.Second})
	var ce *ConnectError
	if err == nil || !asConnectError(err, &ce) {
		t.Fatalf("want a ConnectError, got %v", err)
	}
	_, err = Run(context.Background(), Target{Command: []string{"false"}}, Options{Timeout: 5 * time.Second})
	if err == nil || !asConnectError(err, &ce) {
		t.Fatalf("stdio: want a ConnectError, got %v", err)
	}
}

func asConnectError(err error, target **ConnectError) bool {
	ce, ok := err.(*ConnectError)
	if ok {
		*target = ce
	}
	return ok
}

// TestRunFallsBackToLegacy: a server without 2026-07-28 is linted over
// 2025-11-25.
func TestRunFallsBackToLegacy(t *testing.T) {
	fs := &fakeServer{}
	srv := httptest.NewServer(fs.handler(t, false, "2025-11-25"))
	defer srv.Close()
	rep, err := Run(context.Background(), Target{URL: srv.URL}, Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.ProtocolVersion != "2025-11-25" || rep.Summary.Errors != 0 {
		t.Fatalf("version %q, summary %+v", rep.ProtocolVersion, rep.Summary)
	}
}
