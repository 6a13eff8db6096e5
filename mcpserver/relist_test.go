package mcpserver_test

import (
	"context"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
)

// TestManifestReloadRelists: after a manifest reload the surface lists the
// new capabilities (tools and obs resources) and views, to sessions that
// were open before and to new ones, and refuses what the reload removed.
func TestManifestReloadRelists(t *testing.T) {
	s := newSurface(t, "", mcpserver.Options{}, nil)
	open := connectPath(t, s, "/mcp", "2025-11-25", "")
	if got := toolNames(t, open); !slices.Contains(got, "do_fan_zone_b") {
		t.Fatalf("before: %v", got)
	}
	src, err := os.ReadFile(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	fan := text[strings.Index(text, "  - name: fan_zone_b\n"):strings.Index(text, "  - name: vent_zone_c\n")]
	text = strings.Replace(text, fan, `  - name: fan_speed_zone_b
    kind: read
    description: Circulation fan speed in zone B as the fan reports it.
    zone: zone_b
    binding: {type: sim, bus: plant, point: zone_b.fan}
    data_type: int
    unit: percent
    semantic_tags: [fan, zone_b]
`, 1)
	water := text[strings.Index(text, "  water:\n"):]
	text = strings.Replace(text, water, "  zone_b:\n    description: Zone B.\n    zones: [zone_b]\n", 1)
	m, err := manifest.Parse(example("physmcp.manifest.yml"), []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.node.Reload(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	s.mcp.ManifestReloaded()

	for _, cs := range []*mcp.ClientSession{open, connectPath(t, s, "/mcp", "2026-07-28", "")} {
		got := toolNames(t, cs)
		if slices.Contains(got, "do_fan_zone_b") || !slices.Contains(got, "read_fan_speed_zone_b") {
			t.Errorf("tools after the reload: %v", got)
		}
		res, err := cs.ListResources(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var uris []string
		for _, r := range res.Resources {
			uris = append(uris, r.URI)
		}
		if slices.Contains(uris, "physmcp://obs/fan_zone_b") || !slices.Contains(uris, "physmcp://obs/fan_speed_zone_b") {
			t.Errorf("resources after the reload: %v", uris)
		}
	}
	res, err := open.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_fan_speed_zone_b", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Errorf("the added tool: %v %+v", err, res)
	}
	if got := toolNames(t, connectPath(t, s, "/mcp/zone_b", "2026-07-28", "")); !slices.Equal(got, []string{"can_do", "read_fan_speed_zone_b", "read_humidity_zone_b", "read_temperature_zone_b"}) {
		t.Errorf("the added view lists %v", got)
	}
	resp, err := http.Post(s.srv.URL+"/mcp/water", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("the removed view answers %d", resp.StatusCode)
	}
}
