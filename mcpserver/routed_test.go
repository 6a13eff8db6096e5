package mcpserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
)

// siteRouter is a site of one other gateway, gw_09, whose answers the
// test sets: what the mesh layer (meshnode.Router) returns.
type siteRouter struct {
	doErr, readErr error
}

func (r *siteRouter) RemoteTools() []mcpserver.RemoteTool {
	lo, hi := 0.0, 100.0
	return []mcpserver.RemoteTool{
		{Owner: "gw_09", Tool: "do_fan_zone_09", Kind: "do", DataType: "int", Unit: "percent", Zone: "zone_09", Description: "Fan.", Min: &lo, Max: &hi},
		{Owner: "gw_09", Tool: "read_temperature_zone_09", Kind: "read", DataType: "float", Unit: "celsius", Zone: "zone_09", Description: "Temperature."},
	}
}
func (r *siteRouter) Read(context.Context, string, string, int64) ([]byte, error) {
	return nil, r.readErr
}
func (r *siteRouter) Do(context.Context, string, mcpserver.RoutedDo) ([]byte, error) {
	return nil, r.doErr
}
func (r *siteRouter) OnChange(func()) {}

func routedSession(t *testing.T, r mcpserver.Router) *mcp.ClientSession {
	t.Helper()
	m, err := manifest.Load(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpserver.New(n, mcpserver.Options{StdioRole: "operator", Audit: al, Router: r})
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "agent", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait(); n.Close(context.Background()); al.Close(); st.Close() })
	return cs
}

// A routed do_ whose go-ahead reached the owner but whose answer did not
// come back is a do_ result (partial, outcome_unknown), never a failure
// nor a tool error; a dead owner's tool is still listed and a call names
// the owner and its state (never JSON-RPC "unknown tool").
func TestRoutedOutcomeUnknownAndDeadOwner(t *testing.T) {
	r := &siteRouter{doErr: fmt.Errorf("%w: gw_09 acknowledged do and was told to go ahead, but did not answer within the deadline", mcpserver.ErrOutcomeUnknown)}
	cs := routedSession(t, r)
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "do_fan_zone_09", Arguments: map[string]any{"source": "gw_09", "value": 40, "idempotency_key": "k-1"}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &got)
	if res.IsError || got["status"] != "partial" || got["code"] != "outcome_unknown" || got["verified"] != false ||
		got["idempotency_key"] != "k-1" || got["source"] != "gw_09" ||
		// gw_09 serves no read_fan_zone_09: the way to look is can_do on gw_09.
		!strings.Contains(fmt.Sprint(got["reason"]), `call can_do with {"intent":{"semantic_tags":[]},"scope":["gw_09"]}; its candidate do_fan_zone_09 on gw_09`) ||
		strings.Contains(fmt.Sprint(got["reason"]), "read_fan_zone_09") {
		t.Errorf("outcome unknown: isError %v, %v", res.IsError, got)
	}

	r.readErr = errors.New("owner gw_09 is dead (down since 2026-12-01T21:00:00Z; its tools stay listed for 10m0s after that): mesh: node not alive: gw_09 is dead")
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_temperature_zone_09", Arguments: map[string]any{"source": "gw_09"}})
	if err != nil {
		t.Fatalf("a dead owner's tool: JSON-RPC error %v (want a tool error)", err)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	if !res.IsError || !strings.Contains(text, "gw_09 is dead") || !strings.Contains(text, "read_temperature_zone_09 on gw_09") {
		t.Errorf("dead owner: isError %v, %q", res.IsError, text)
	}
}

// A routed tool called without source names the owners to pick from.
func TestRoutedCallWithoutSource(t *testing.T) {
	cs := routedSession(t, &siteRouter{})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_temperature_zone_09", Arguments: map[string]any{}})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Content[0].(*mcp.TextContent).Text; !res.IsError || !strings.Contains(text, "name its owner, one of gw_09") {
		t.Errorf("no source: isError %v, %q", res.IsError, text)
	}
}
