package mcpserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/mcpserver"
)

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

func toolNames(t *testing.T, cs *mcp.ClientSession) []string {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

var (
	greenhouseReads = []string{"read_humidity_zone_a", "read_humidity_zone_b", "read_humidity_zone_c", "read_irrigation_valve_position",
		"read_rain_tank_level", "read_temperature_zone_a", "read_temperature_zone_b", "read_temperature_zone_c"}
	// do_ tools the greenhouse policy lets role none run (no permission rule).
	greenhouseOpenDos = []string{"do_fan_zone_b", "do_irrigation_valve", "do_vent_zone_c"}
	greenhouseHeaters = []string{"do_heater_zone_a", "do_heater_zone_c"}
)

func sorted(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		out = append(out, l...)
	}
	slices.Sort(out)
	return out
}

// TestToolListFollowsRole: each caller is listed the do_ tools its role may
// run under the policy, in both protocol eras; reads and can_do for all.
// Calling a tool that was not listed is still judged by the policy.
func TestToolListFollowsRole(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{}, nil)
	for _, era := range eras {
		for _, tc := range []struct {
			who, token string
			want       []string
		}{
			{"viewer", viewerToken, sorted(greenhouseReads, greenhouseOpenDos, []string{"can_do"})},
			{"operator", operatorToken, sorted(greenhouseReads, greenhouseOpenDos, greenhouseHeaters, []string{"can_do"})},
			{"admin", adminToken, sorted(greenhouseReads, greenhouseOpenDos, greenhouseHeaters, []string{"can_do"})},
		} {
			got := toolNames(t, connectPath(t, s, "/mcp", era, tc.token))
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s, %s: tools\n got %v\nwant %v", era, tc.who, got, tc.want)
			}
		}
	}
	// Over stdio, the --stdio-role decides.
	if got, want := toolNames(t, newRigWith(t, mcpserver.Options{StdioRole: "none"}).cs), sorted(greenhouseReads, greenhouseOpenDos, []string{"can_do"}); !slices.Equal(got, want) {
		t.Errorf("stdio, role none: tools\n got %v\nwant %v", got, want)
	}
	if got, want := toolNames(t, newRigWith(t, mcpserver.Options{StdioRole: "supervisor"}).cs), sorted(greenhouseReads, greenhouseOpenDos, greenhouseHeaters, []string{"can_do"}); !slices.Equal(got, want) {
		t.Errorf("stdio, role supervisor: tools\n got %v\nwant %v", got, want)
	}
	// The unlisted heater, called anyway by a viewer: refused by the policy.
	o := heaterC(t, connectPath(t, s, "/mcp", "2026-07-28", viewerToken), "unlisted-1")
	if o["status"] != "failed" || o["permission"] != "permission_insufficient" {
		t.Errorf("a viewer calling an unlisted heater: %v", o)
	}
	if w := s.plant.Stats().Points["zone_c.heater"].Writes; w != 0 {
		t.Errorf("the heater was written %d times", w)
	}
}

// TestToolListWithoutPolicyListsAll: without a policy nothing is filtered
// by role (the node enforces only the manifest, and says so).
func TestToolListWithoutPolicyListsAll(t *testing.T) {
	s := newSurface(t, "", mcpserver.Options{}, nil)
	got := toolNames(t, connectPath(t, s, "/mcp", "2026-07-28", ""))
	if want := sorted(greenhouseReads, greenhouseOpenDos, greenhouseHeaters, []string{"can_do"}); !slices.Equal(got, want) {
		t.Errorf("tools\n got %v\nwant %v", got, want)
	}
}

// TestViewEndpoints: /mcp/<view> lists only the view's capabilities (and
// can_do), refuses calls outside it without touching the plant, and its
// can_do names only tools of the view, saying how many it left out.
func TestViewEndpoints(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{}, nil)
	for _, era := range eras {
		for _, tc := range []struct {
			view, token string
			want        []string
		}{
			// observe sets families: true (its endpoint lists family tools).
			{"observe", adminToken, []string{"can_do", "read_humidity", "read_irrigation_valve_position", "read_rain_tank_level", "read_temperature"}},
			{"zone_a", operatorToken, []string{"can_do", "do_heater_zone_a", "do_irrigation_valve", "read_humidity_zone_a", "read_irrigation_valve_position", "read_temperature_zone_a"}},
			// The role filter applies inside a view too.
			{"zone_a", viewerToken, []string{"can_do", "do_irrigation_valve", "read_humidity_zone_a", "read_irrigation_valve_position", "read_temperature_zone_a"}},
			{"water", operatorToken, []string{"can_do", "do_irrigation_valve", "read_irrigation_valve_position", "read_rain_tank_level"}},
		} {
			got := toolNames(t, connectPath(t, s, "/mcp/"+tc.view, era, tc.token))
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s, view %s: tools\n got %v\nwant %v", era, tc.view, got, tc.want)
			}
		}
	}

	cs := connectPath(t, s, "/mcp/observe", "2026-07-28", adminToken)
	before := s.plant.Stats().Writes
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 40, "idempotency_key": "view-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(text(res), `not in the view "observe"`) {
		t.Errorf("do_fan_zone_b through the observe view: isError=%v %s", res.IsError, text(res))
	}
	if w := s.plant.Stats().Writes - before; w != 0 {
		t.Errorf("a call outside the view wrote %d times", w)
	}

	ventilate := map[string]any{"intent": map[string]any{"semantic_tags": []string{"ventilation"}, "action": "set", "target": "airflow"}}
	full := canDo(t, connectPath(t, s, "/mcp", "2026-07-28", operatorToken), ventilate)
	zoneA := canDo(t, connectPath(t, s, "/mcp/zone_a", "2026-07-28", operatorToken), ventilate)
	if len(full.Candidates) == 0 {
		t.Fatalf("the full endpoint found no ventilation candidate: %+v", full)
	}
	for _, c := range zoneA.Candidates {
		if c.Zone != "zone_a" {
			t.Errorf("view zone_a offers %s in %s", c.Capability, c.Zone)
		}
	}
	for _, b := range zoneA.Blocked {
		t.Errorf("view zone_a reports %s as blocked: the view must not leak it", b.Capability)
	}
	if zoneA.Metadata.View != "zone_a" || zoneA.Metadata.FilteredByView != len(full.Candidates)+len(full.Blocked)-len(zoneA.Candidates) {
		t.Errorf("metadata: view %q, filtered %d; full endpoint had %d candidates and %d blocked", zoneA.Metadata.View, zoneA.Metadata.FilteredByView, len(full.Candidates), len(full.Blocked))
	}
	if zoneA.Feasible || len(zoneA.Unroutable) == 0 || !strings.Contains(zoneA.Unroutable[0].Detail, "outside the view") {
		t.Errorf("an infeasible view answer must say the view filtered the match: %+v", zoneA.Unroutable)
	}
	for obs := range zoneA.Context.CurrentObservations {
		if !strings.HasSuffix(obs, "zone_a") && obs != "irrigation_valve_position" {
			t.Errorf("view zone_a leaks the observation %s", obs)
		}
	}
}

type report struct {
	Feasible   bool
	Candidates []struct{ Capability, Source, Zone string }
	Blocked    []struct{ Capability, Source string }
	Unroutable []struct{ Reason, Detail string }
	Context    struct {
		CurrentObservations map[string]any `json:"current_observations"`
	}
	Metadata struct {
		View           string `json:"view"`
		FilteredByView int    `json:"filtered_by_view"`
	}
}

func canDo(t *testing.T, cs *mcp.ClientSession, args map[string]any) report {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: args})
	if err != nil || res.IsError {
		t.Fatalf("can_do: %v %s", err, text(res))
	}
	b, _ := json.Marshal(res.StructuredContent)
	var r report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func text(res *mcp.CallToolResult) string {
	if res == nil || len(res.Content) == 0 {
		return ""
	}
	if tc, ok := res.Content[0].(*mcp.TextContent); ok {
		return tc.Text
	}
	return ""
}

// TestStdioViewAndListChanged: over stdio (--view) the view applies; a
// policy reload tells a connected client its tool list may have changed.
func TestStdioViewAndListChanged(t *testing.T) {
	r := newRigWith(t, mcpserver.Options{StdioRole: "operator", View: "water"})
	got := toolNames(t, r.cs)
	if want := []string{"can_do", "do_irrigation_valve", "read_irrigation_valve_position", "read_rain_tank_level"}; !slices.Equal(got, want) {
		t.Errorf("stdio --view water: tools\n got %v\nwant %v", got, want)
	}
	r.srv.PolicyReloaded()
	select {
	case <-r.listChanged:
	case <-time.After(10 * time.Second):
		t.Fatal("no tools/list_changed after a policy reload")
	}
}
