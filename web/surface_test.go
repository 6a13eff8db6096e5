package web_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/web"
)

func example(name string) string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(f), "..", "examples", "greenhouse", name)
}

// Demo tokens of the greenhouse policy.
const (
	viewerToken   = "greenhouse-viewer-demo-token"
	operatorToken = "greenhouse-operator-demo-token"
	adminToken    = "greenhouse-admin-demo-token"
)

// greenhousePolicy is the text of the example policy.
func greenhousePolicy(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(example("physmcp.policy.yml"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// writePolicy writes a policy for the greenhouse manifest into a temp dir.
func writePolicy(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "physmcp.policy.yml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// surface is physd's HTTP surface on a loopback test server.
type surface struct {
	srv   *httptest.Server
	plant *sim.Plant
	guard *guard.Guard
	audit string
	node  *node.Node
	mcp   *mcpserver.Server
}

// newSurface serves the greenhouse over HTTP with the simulator controls
// and metrics; policyText "" runs without a policy. tlsConfig, when set,
// makes it an HTTPS server.
func newSurface(t *testing.T, policyText string, opts web.Options, tlsConfig *tls.Config) *surface {
	t.Helper()
	tr := testrig.Open(t, example("physmcp.manifest.yml"), policyText, nil)
	n, al, plant := tr.Node, tr.Audit, tr.Plant
	opts.Guard = tr.Guard
	opts.Audit, opts.Metrics = al, metrics.New()
	opts.SimControls = map[string]http.Handler{"plant": plant.ControlHandler()}
	ms := mcpserver.New(n, mcpserver.Options{Guard: opts.Guard, Audit: al, Metrics: opts.Metrics})
	hs := httptest.NewUnstartedServer(web.New(ms, opts).Handler())
	if tlsConfig != nil {
		hs.TLS = tlsConfig
		hs.StartTLS()
	} else {
		hs.Start()
	}
	t.Cleanup(func() {
		hs.Close()
	})
	return &surface{srv: hs, plant: plant, guard: opts.Guard, audit: tr.AuditFile, node: n, mcp: ms}
}

// bearerRT adds headers to every request of an MCP client.
type bearerRT struct {
	headers map[string]string
	rt      http.RoundTripper
}

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range b.headers {
		r.Header.Set(k, v)
	}
	return b.rt.RoundTrip(r)
}

func connectMCP(t *testing.T, url string, hc *http.Client) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "boundary-test", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func heaterC(t *testing.T, cs *mcp.ClientSession, key string) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: map[string]any{"value": 20, "idempotency_key": key}})
	if err != nil {
		t.Fatal(err)
	}
	return out(t, res)
}

var eras = []string{"2026-07-28", "2025-11-25"}

// connectPath connects to an MCP endpoint path of s in one protocol era,
// with a bearer token ("" for none).
func connectPath(t *testing.T, s *surface, path, era, token string) *mcp.ClientSession {
	t.Helper()
	hc := s.srv.Client()
	if token != "" {
		hc = &http.Client{Transport: bearerRT{map[string]string{"Authorization": "Bearer " + token}, http.DefaultTransport}}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "views-test", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.srv.URL + path, HTTPClient: hc}, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
		t.Fatalf("connect %s (%s): %v", path, era, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func out(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	if res.NeedsInput() || res.IsError {
		t.Fatalf("want a complete result, got needsInput=%v isError=%v %v", res.NeedsInput(), res.IsError, res.Content)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	json.Unmarshal(b, &m)
	return m
}
