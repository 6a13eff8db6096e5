package mcpserver_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/history"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// hiddenPoints: zone_b's heater and temperature are observed but not
// exposed (expose: false); zone_a's and zone_c's are tools. The heaters of
// a and c form the family heater; zone_b's is in no family (it is no tool).
const hiddenPoints = `physmcp_version: "0.1"
device: {id: hidden_points, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
      zone_b: {ambient_c: 12, initial_c: 18, tau_s: 60}
      zone_c: {ambient_c: 12, initial_c: 18}
capabilities:
  - {name: heater_zone_a, kind: do, description: Heater A., zone: zone_a, family: heater, binding: {type: sim, bus: plant, point: zone_a.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heater, heating]}
  - {name: heater_zone_b, kind: do, description: Heater B., zone: zone_b, expose: false, binding: {type: sim, bus: plant, point: zone_b.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heater, heating]}
  - {name: heater_zone_c, kind: do, description: Heater C., zone: zone_c, family: heater, binding: {type: sim, bus: plant, point: zone_c.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heater, heating]}
  - {name: temp_zone_a, kind: read, description: Air A., zone: zone_a, binding: {type: sim, bus: plant, point: zone_a.temperature}, data_type: float, unit: celsius, range: {min: -10, max: 50}, semantic_tags: [temperature, heating], poll_ms: 500}
  - {name: temp_zone_b, kind: read, description: Air B., zone: zone_b, expose: false, binding: {type: sim, bus: plant, point: zone_b.temperature}, data_type: float, unit: celsius, range: {min: -10, max: 50}, semantic_tags: [temperature, heating], poll_ms: 500, deadband: 0.05, alarms: {low: 17}}
views:
  a: {zones: [zone_a]}
  b: {zones: [zone_b]}
`

// hiddenRig serves hiddenPoints in memory (stdio, role admin) with history
// and alarms.
type hiddenRig struct {
	n     *node.Node
	plant *sim.Plant
	cs    *mcp.ClientSession
	mu    sync.Mutex
	got   []string
}

func (r *hiddenRig) updates() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

func openHiddenRig(t *testing.T, era string, opts mcpserver.Options) *hiddenRig {
	t.Helper()
	m, err := manifest.Parse("hidden.yml", []byte(hiddenPoints))
	if err != nil {
		t.Fatal(err)
	}
	tr := testrig.OpenManifest(t, m, "", nil)
	h, err := history.Open(filepath.Join(t.TempDir(), history.FileName), m, history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h.Follow(tr.Node)
	e := alarms.New(m)
	e.Follow(tr.Node)
	opts.History, opts.Alarms, opts.StdioRole = h, e, "admin"
	r := &hiddenRig{n: tr.Node, plant: tr.Plant}
	srv := mcpserver.New(tr.Node, opts)
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "hidden-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			r.mu.Lock()
			r.got = append(r.got, req.Params.URI)
			r.mu.Unlock()
		},
	})
	if r.cs, err = c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: era}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.cs.Close()
		ss.Wait()
		e.Close()
		h.Close()
	})
	return r
}

func (r *hiddenRig) call(t *testing.T, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestUnexposedPointIsObservedButNoTool: a capability with expose: false is
// no tool for any MCP method — not listed, a call of its tool (or of a
// family in its zone) is refused saying why and moves nothing, can_do never
// offers it, the node refuses its actuation from any caller (the mesh's
// too) — while it is still polled and observed: its observation resource
// is served through the observation template (not listed one by one), read
// and subscribed to, history and alarms cover it, and the manifest
// document shows it as not exposed. In both protocol eras.
func TestUnexposedPointIsObservedButNoTool(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				r := openHiddenRig(t, era, mcpserver.Options{})
				if got, want := toolNames(t, r.cs), []string{"can_do", "do_heater_zone_a", "do_heater_zone_c", "read_temp_zone_a"}; !slices.Equal(got, want) {
					t.Errorf("tools/list: %v, want %v", got, want)
				}
				for _, tool := range []string{"do_heater_zone_b", "read_temp_zone_b"} {
					res := r.call(t, tool, map[string]any{"value": 40, "idempotency_key": "hidden-1"})
					if tool == "read_temp_zone_b" {
						res = r.call(t, tool, nil)
					}
					if !res.IsError || !strings.Contains(resultText(res), tool+" is not exposed as a tool (expose: false in the manifest)") {
						t.Errorf("%s: %s", tool, resultText(res))
					}
				}
				// The node refuses it whoever calls (a routed call from
				// another gateway reaches node.Do directly).
				_, err := r.n.Do(ctx, node.DoRequest{Tool: "do_heater_zone_b", Value: json.RawMessage("40"), IdempotencyKey: "mesh-1", Caller: node.Caller{ID: "peer", Role: "admin"}})
				if err == nil || !strings.Contains(err.Error(), "not exposed") {
					t.Errorf("node.Do of the unexposed heater: %v", err)
				}
				if w := r.plant.Stats().Points["zone_b.heater"].Writes; w != 0 {
					t.Errorf("the unexposed heater was written %d times", w)
				}

				// can_do offers the exposed heaters only, and names only
				// exposed reads as related.
				cr := r.call(t, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "increase", "target": "heater"}})
				var rep promcp.CapabilityReport
				if err := json.Unmarshal([]byte(resultText(cr)), &rep); err != nil {
					t.Fatal(err)
				}
				var named []string
				for _, c := range rep.Candidates {
					named = append(named, c.Capability)
				}
				for _, b := range rep.Blocked {
					named = append(named, b.Capability)
				}
				named = append(named, rep.Context.RelatedReads...)
				for name := range rep.Context.CurrentObservations {
					named = append(named, name)
				}
				if slices.ContainsFunc(named, func(s string) bool { return strings.HasSuffix(s, "zone_b") }) || len(rep.Candidates) == 0 ||
					rep.Metadata.CapabilitiesScanned != 3 {
					t.Errorf("can_do: named %v, scanned %d", named, rep.Metadata.CapabilitiesScanned)
				}

				// Observed: served through the observation template (not
				// listed one by one, as it is no tool), read, subscribed
				// to, history, alarms.
				lr, err := r.cs.ListResources(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(lr.Resources, func(res *mcp.Resource) bool { return res.URI == mcpserver.ObsURIPrefix+"temp_zone_a" }) ||
					slices.ContainsFunc(lr.Resources, func(res *mcp.Resource) bool { return strings.HasSuffix(res.URI, "zone_b") }) {
					t.Errorf("resources/list: want the exposed points' observations and not the others': %v", lr.Resources)
				}
				tl, err := r.cs.ListResourceTemplates(ctx, nil)
				if err != nil || !slices.ContainsFunc(tl.ResourceTemplates, func(rt *mcp.ResourceTemplate) bool { return rt.URITemplate == mcpserver.ObsURITemplate }) {
					t.Errorf("resources/templates/list: %v %v", tl, err)
				}
				uri := mcpserver.ObsURIPrefix + "temp_zone_b"
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Minute) // zone_b cools (tau 60 s) past its low alarm
				synctest.Wait()
				if !slices.Contains(r.updates(), uri) {
					t.Errorf("no update of %s while it cooled: %v", uri, r.updates())
				}
				rr, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
				if err != nil || !strings.Contains(rr.Contents[0].Text, `"quality":"good"`) {
					t.Fatalf("read %s: %v %v", uri, rr, err)
				}
				hr, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "physmcp://history/temp_zone_b?since=5m"})
				var series history.Series
				if err != nil || json.Unmarshal([]byte(hr.Contents[0].Text), &series) != nil || len(series.Buckets) < 3 || series.Buckets[1].Count < 100 {
					t.Errorf("history of the unexposed point: %v %v", hr, err)
				}
				ar, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.AlarmsURI})
				if err != nil || !strings.Contains(ar.Contents[0].Text, `"capability":"read_temp_zone_b","kind":"low"`) {
					t.Errorf("alarms: %v %v", ar, err)
				}
				mr, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ManifestURI})
				var doc struct {
					Capabilities []struct {
						Name   string `json:"name"`
						Expose *bool  `json:"expose"`
					} `json:"capabilities"`
				}
				if err != nil || json.Unmarshal([]byte(mr.Contents[0].Text), &doc) != nil {
					t.Fatalf("manifest: %v %v", mr, err)
				}
				for _, c := range doc.Capabilities {
					if c.Expose == nil || *c.Expose != !strings.HasSuffix(c.Name, "zone_b") {
						t.Errorf("physmcp://manifest: %s expose %v", c.Name, c.Expose)
					}
				}
			})
		})
	}
}

// TestUnexposedThroughViewsAndFamilies: a view that selects an unexposed
// point serves its resources but no tool of it (a call is refused as not
// exposed); a view that does not select it refuses it as outside the view;
// a family tool never reaches it (its zone is not one of the family's).
func TestUnexposedThroughViewsAndFamilies(t *testing.T) {
	ctx := context.Background()
	b := openHiddenRig(t, "2026-07-28", mcpserver.Options{View: "b"})
	if got, want := toolNames(t, b.cs), []string{"can_do"}; !slices.Equal(got, want) {
		t.Errorf("view b: tools %v, want %v", got, want)
	}
	if res := b.call(t, "do_heater_zone_b", map[string]any{"value": 40, "idempotency_key": "view-b"}); !res.IsError || !strings.Contains(resultText(res), "not exposed") {
		t.Errorf("view b, the unexposed heater: %s", resultText(res))
	}
	if _, err := b.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + "temp_zone_b"}); err != nil {
		t.Errorf("view b, the unexposed point's observation: %v", err)
	}
	vr, err := b.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ViewsURI})
	if err != nil || !strings.Contains(vr.Contents[0].Text, `"observed_only": [`) || !strings.Contains(vr.Contents[0].Text, `"temp_zone_b"`) {
		t.Errorf("physmcp://views through b: %v %v", vr, err)
	}

	a := openHiddenRig(t, "2026-07-28", mcpserver.Options{View: "a"})
	if res := a.call(t, "do_heater_zone_b", map[string]any{"value": 40, "idempotency_key": "view-a"}); !res.IsError || !strings.Contains(resultText(res), `is not in the view "a"`) {
		t.Errorf("view a, the unexposed heater of zone_b: %s", resultText(res))
	}
	if _, err := a.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + "temp_zone_b"}); err == nil || !strings.Contains(err.Error(), "not in the view") {
		t.Errorf("view a, zone_b's observation: %v", err)
	}

	f := openHiddenRig(t, "2026-07-28", mcpserver.Options{Families: true})
	if got, want := toolNames(t, f.cs), []string{"can_do", "do_heater", "read_temp_zone_a"}; !slices.Equal(got, want) {
		t.Errorf("families: tools %v, want %v", got, want)
	}
	res := f.call(t, "do_heater", map[string]any{"zone": "zone_b", "value": 40, "idempotency_key": "fam-b"})
	if !res.IsError || !strings.Contains(resultText(res), `no heater in zone "zone_b" here; zones: zone_a, zone_c`) {
		t.Errorf("the family in the unexposed heater's zone: %s", resultText(res))
	}
	for _, r := range []*hiddenRig{a, b, f} {
		if w := r.plant.Stats().Points["zone_b.heater"].Writes; w != 0 {
			t.Errorf("the unexposed heater was written %d times", w)
		}
	}
}

// TestUnexposedNotInPolicyDocument: physmcp://policy lists the rules of the
// tools an agent can call: not those of a do_ that is not exposed (the
// greenhouse policy has rules for do_fan_zone_b).
func TestUnexposedNotInPolicyDocument(t *testing.T) {
	src, err := os.ReadFile(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(src), "    family: fan\n", "    expose: false\n", 1)
	path := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := newSurfaceAt(t, path, greenhousePolicy(t), mcpserver.Options{}, nil)
	cs := connectPath(t, s, "/mcp", "2026-07-28", adminToken)
	if slices.Contains(toolNames(t, cs), "do_fan_zone_b") {
		t.Errorf("do_fan_zone_b is listed")
	}
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: mcpserver.PolicyURI})
	if err != nil {
		t.Fatal(err)
	}
	if text := res.Contents[0].Text; strings.Contains(text, "do_fan_zone_b") || !strings.Contains(text, "do_vent_zone_c") {
		t.Errorf("physmcp://policy:\n%s", text)
	}
}
