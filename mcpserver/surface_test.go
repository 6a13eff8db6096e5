package mcpserver_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
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

// surface is physd's HTTP surface (package web) in front of the MCP server
// on a loopback test server: the MCP endpoints with the boundary's callers
// (bearer tokens, views). The boundary's own tests are web's.
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
func newSurface(t *testing.T, policyText string, opts mcpserver.Options, tlsConfig *tls.Config) *surface {
	t.Helper()
	return newSurfaceAt(t, example("physmcp.manifest.yml"), policyText, opts, tlsConfig)
}

// newSurfaceAt is newSurface for the manifest at manifestPath (one with
// the greenhouse's plant bus).
func newSurfaceAt(t *testing.T, manifestPath, policyText string, opts mcpserver.Options, tlsConfig *tls.Config) *surface {
	t.Helper()
	tr := testrig.Open(t, manifestPath, policyText, nil)
	n, al, plant := tr.Node, tr.Audit, tr.Plant
	opts.Guard = tr.Guard
	opts.Audit, opts.Metrics = al, metrics.New()
	ms := mcpserver.New(n, opts)
	hs := httptest.NewUnstartedServer(web.New(ms, web.Options{Guard: opts.Guard, Audit: al, Metrics: opts.Metrics, Mesh: opts.Mesh, History: opts.History, Alarms: opts.Alarms,
		SimControls: map[string]http.Handler{"plant": plant.ControlHandler()}}).Handler())
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

func heaterC(t *testing.T, cs *mcp.ClientSession, key string) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_zone_c", Arguments: map[string]any{"value": 20, "idempotency_key": key}})
	if err != nil {
		t.Fatal(err)
	}
	return out(t, res)
}

// discover is a 2026-07-28 server/discover request.
const discover = `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`
