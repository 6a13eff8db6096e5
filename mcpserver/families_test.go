package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/lint"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
)

// familyTools is the greenhouse listed by family: 3 temperatures, 3
// humidities and 2 heaters become 3 tools.
var familyTools = []string{"can_do", "do_fan_zone_b", "do_heater", "do_irrigation_valve", "do_vent_zone_c",
	"read_humidity", "read_irrigation_valve_position", "read_rain_tank_level", "read_temperature"}

// TestFamiliesList: with families on, the list has one tool per family
// (typed, with a zone enum and each member's range in the schema) and
// passes proMCP's lint; with families off, the instances as before.
func TestFamiliesList(t *testing.T) {
	r := newRigWith(t, mcpserver.Options{StdioRole: "operator", Families: true})
	res, err := r.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	var asMaps []map[string]any
	var heater *mcp.Tool
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
		if tl.Name == "do_heater" {
			heater = tl
		}
		b, _ := json.Marshal(tl)
		var m map[string]any
		json.Unmarshal(b, &m)
		asMaps = append(asMaps, m)
	}
	slices.Sort(names)
	if !slices.Equal(names, familyTools) {
		t.Fatalf("families on: tools\n got %v\nwant %v", names, familyTools)
	}
	schema, _ := json.Marshal(heater.InputSchema)
	for _, want := range []string{`"zone":{"description"`, `"enum":["zone_a","zone_c"]`, `"allOf"`, `"const":"zone_c"`, `"maximum":100`} {
		if !strings.Contains(string(schema), want) {
			t.Errorf("do_heater input schema lacks %s: %s", want, schema)
		}
	}
	if rep := lint.LintTools(asMaps); rep.Summary.Errors != 0 {
		b, _ := json.MarshalIndent(rep, "", " ")
		t.Errorf("the family list fails proMCP lint: %s", b)
	}

	off := newRigWith(t, mcpserver.Options{StdioRole: "operator"})
	if got := toolNames(t, off.cs); slices.Contains(got, "do_heater") || !slices.Contains(got, "do_heater_zone_a") {
		t.Errorf("families off: %v", got)
	}
	// A role that may run no heater is not listed the family.
	none := newRigWith(t, mcpserver.Options{StdioRole: "none", Families: true})
	if got := toolNames(t, none.cs); slices.Contains(got, "do_heater") {
		t.Errorf("role none is listed do_heater: %v", got)
	}
}

// TestFamilyCallRunsAsItsMember: a family call moves exactly the zone it
// names, answers as the member's own tool would (the same key replays
// through either tool), and refuses a zone it does not have without
// touching the plant.
func TestFamilyCallRunsAsItsMember(t *testing.T) {
	r := newRigWith(t, mcpserver.Options{StdioRole: "operator", Families: true})
	call := func(tool string, args map[string]any) *mcp.CallToolResult {
		t.Helper()
		res, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
		if err != nil {
			t.Fatalf("%s: %v", tool, err)
		}
		return res
	}
	o := out(t, call("do_heater", map[string]any{"zone": "zone_c", "value": 20, "idempotency_key": "fam-1"}))
	if o["status"] != "success" || o["applied_value"] != float64(20) {
		t.Fatalf("do_heater zone_c: %v", o)
	}
	pts := r.plant.Stats().Points
	if pts["zone_c.heater"].Writes != 1 || pts["zone_a.heater"].Writes != 0 {
		t.Errorf("writes: zone_c %d, zone_a %d; want 1 and 0", pts["zone_c.heater"].Writes, pts["zone_a.heater"].Writes)
	}
	// The same operation through the member's own tool replays.
	again := out(t, call("do_heater_zone_c", map[string]any{"value": 20, "idempotency_key": "fam-1"}))
	if again["audit"] == nil || !jsonEqual(again, o) {
		t.Errorf("replay through the instance differs:\n%v\n%v", again, o)
	}
	if w := r.plant.Stats().Points["zone_c.heater"].Writes; w != 1 {
		t.Errorf("the replay wrote again: %d writes", w)
	}
	before := r.plant.Stats().Writes
	for _, bad := range []map[string]any{
		{"zone": "zone_b", "value": 20, "idempotency_key": "fam-2"}, // no heater in zone_b
		{"value": 20, "idempotency_key": "fam-3"},                   // no zone
		{"zone": 7, "value": 20, "idempotency_key": "fam-4"},        // not a string
		{"zone": "zone_a", "value": 150, "idempotency_key": "fam-5"},
		{"zone": "zone_a", "source": "gw_other", "value": 20, "idempotency_key": "fam-6"},
	} {
		res := call("do_heater", bad)
		if !res.IsError {
			if o := out(t, res); o["status"] != "failed" {
				t.Errorf("do_heater %v: %v", bad, o)
			}
		}
	}
	if w := r.plant.Stats().Writes - before; w != 0 {
		t.Errorf("refused family calls wrote %d times", w)
	}
	rd := out(t, call("read_temperature", map[string]any{"zone": "zone_b"}))
	if rd["capability"] != "read_temperature_zone_b" || rd["quality"] != "good" {
		t.Errorf("read_temperature zone_b: %v", rd)
	}
}

// TestFamilyInView: in a view, a family with two or more members in the
// view is its family tool (observe: read_temperature for three zones); one
// with a single member in the view is that member's own tool (zone_a:
// do_heater_zone_a), and the family tool still refuses the zones outside
// the view; can_do names the tool the view lists.
func TestFamilyInView(t *testing.T) {
	obs := newRigWith(t, mcpserver.Options{StdioRole: "operator", Families: true, View: "observe"})
	if got, want := toolNames(t, obs.cs), []string{"can_do", "read_humidity", "read_irrigation_valve_position", "read_rain_tank_level", "read_temperature"}; !slices.Equal(got, want) {
		t.Errorf("view observe by family:\n got %v\nwant %v", got, want)
	}
	r := newRigWith(t, mcpserver.Options{StdioRole: "operator", Families: true, View: "zone_a"})
	if got, want := toolNames(t, r.cs), []string{"can_do", "do_heater_zone_a", "do_irrigation_valve", "read_humidity_zone_a", "read_irrigation_valve_position", "read_temperature_zone_a"}; !slices.Equal(got, want) {
		t.Errorf("view zone_a by family:\n got %v\nwant %v", got, want)
	}
	before := r.plant.Stats().Writes
	cres, err := r.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater", Arguments: map[string]any{"zone": "zone_c", "value": 20, "idempotency_key": "fv-1"}})
	if err != nil || !cres.IsError {
		t.Errorf("do_heater zone_c through view zone_a: %v %v", err, cres)
	}
	if w := r.plant.Stats().Writes - before; w != 0 {
		t.Errorf("wrote %d times outside the view", w)
	}
	full := newRigWith(t, mcpserver.Options{StdioRole: "operator", Families: true})
	for _, tc := range []struct {
		rig  *rig
		want string
	}{{r, "do_heater_zone_a"}, {full, "do_heater"}} {
		cres, err = tc.rig.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "can_do", Arguments: map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_a"}}})
		if err != nil || cres.IsError {
			t.Fatalf("can_do: %v %v", err, cres)
		}
		b, _ := json.Marshal(cres.StructuredContent)
		var rep report
		json.Unmarshal(b, &rep)
		if len(rep.Candidates) == 0 || rep.Candidates[0].Capability != tc.want || rep.Candidates[0].Zone != "zone_a" {
			t.Errorf("can_do candidates: %+v, want %s first", rep.Candidates, tc.want)
		}
	}
}

func jsonEqual(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// familySite is a site of other gateways as the mesh would report it:
// each a copy of the greenhouse in its own zones.
type familySite struct{ tools []mcpserver.RemoteTool }

func (s familySite) RemoteTools() []mcpserver.RemoteTool { return s.tools }
func (familySite) Read(context.Context, string, string, int64) ([]byte, error) {
	return nil, context.DeadlineExceeded
}
func (familySite) Do(context.Context, string, mcpserver.RoutedDo) ([]byte, error) {
	return nil, context.DeadlineExceeded
}
func (familySite) OnChange(func()) {}

// TestTenGatewaySiteFitsClients: a site of ten greenhouse gateways (13
// capabilities each, every name and zone its own) lists 130+ tools by
// instance; by family, the default with a mesh, it stays within the
// smallest common client limit (Cursor: 40 tools).
func TestTenGatewaySiteFitsClients(t *testing.T) {
	m, err := manifest.Load(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var site familySite
	for g := 2; g <= 10; g++ {
		gw := fmt.Sprintf("gw_greenhouse_%03d", g)
		for _, c := range m.Capabilities {
			zone := fmt.Sprintf("%s_g%d", c.Zone, g)
			rt := mcpserver.RemoteTool{Owner: gw, Tool: c.Kind + "_" + c.Name + fmt.Sprintf("_g%d", g), Kind: c.Kind, DataType: c.DataType,
				Unit: c.Unit, Zone: zone, Tags: c.SemanticTags, Description: c.Description, EnumValues: c.EnumValues, SideEffects: c.SideEffects, Family: c.Family}
			if c.Range != nil {
				lo, hi := c.Range.Min, c.Range.Max
				rt.Min, rt.Max = &lo, &hi
			}
			site.tools = append(site.tools, rt)
		}
	}
	byInstance := len(toolNames(t, newRigWith(t, mcpserver.Options{StdioRole: "admin", Router: site}).cs))
	byFamily := toolNames(t, newRigWith(t, mcpserver.Options{StdioRole: "admin", Router: site, Families: true}).cs)
	t.Logf("ten gateways: %d tools by instance, %d by family", byInstance, len(byFamily))
	if byInstance < 130 || len(byFamily) > 40 {
		t.Errorf("ten gateways: %d tools by instance (want ≥ 130), %d by family (want ≤ 40): %v", byInstance, len(byFamily), byFamily)
	}
}

// captureRouter records the routed calls it is sent.
type captureRouter struct {
	familySite
	got chan mcpserver.RoutedDo
}

func (c captureRouter) Do(_ context.Context, _ string, d mcpserver.RoutedDo) ([]byte, error) {
	c.got <- d
	return []byte(`{"status":"failed"}`), nil
}

// TestRoutedCallForwardsTheCredential: a routed do_ carries the bearer the
// caller presented, for the owner to authenticate (meshnode), not only the
// role this gateway gave it.
func TestRoutedCallForwardsTheCredential(t *testing.T) {
	lo, hi := 0.0, 100.0
	cr := captureRouter{familySite{[]mcpserver.RemoteTool{{Owner: "gw_other", Tool: "do_pump", Kind: "do", DataType: "int", Min: &lo, Max: &hi}}}, make(chan mcpserver.RoutedDo, 1)}
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{Router: cr}, nil)
	cs := connectPath(t, s, "/mcp", "2026-07-28", operatorToken)
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_pump", Arguments: map[string]any{"source": "gw_other", "value": 5, "idempotency_key": "fwd-1"}}); err != nil {
		t.Fatal(err)
	}
	c := (<-cr.got).Caller
	if c.Credential != operatorToken || c.Role != "operator" {
		t.Errorf("routed caller: id %s role %s credential %q; want the operator token forwarded", c.ID, c.Role, c.Credential)
	}
}

// TestRoutedLeaseTerms: a leased output on another gateway is listed here
// with its hold_s (bounded by the owner's lease.max_s) and the lease in its
// description, a routed do_ sends the hold_s the caller asked for (none:
// 0, the owner's default), and a hold of 0 or less is refused here with
// nothing sent.
func TestRoutedLeaseTerms(t *testing.T) {
	lo, hi := 0.0, 100.0
	cr := captureRouter{familySite{[]mcpserver.RemoteTool{{Owner: "gw_other", Tool: "do_heater_far", Kind: "do", DataType: "int", Min: &lo, Max: &hi,
		Lease: &manifest.Lease{DefaultS: 60, MaxS: 600}, SafeValue: "0"}}}, make(chan mcpserver.RoutedDo, 4)}
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{Router: cr}, nil)
	cs := connectPath(t, s, "/mcp", "2026-07-28", operatorToken)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var def *mcp.Tool
	for _, tl := range tools.Tools {
		if tl.Name == "do_heater_far" {
			def = tl
		}
	}
	if def == nil {
		t.Fatal("the routed leased tool is not listed")
	}
	schema, _ := json.Marshal(def.InputSchema)
	if !strings.Contains(string(schema), `"hold_s":{`) || !strings.Contains(string(schema), `"maximum":600`) || !strings.Contains(def.Description, "Leased: the value holds for hold_s seconds (default 60, at most 600)") {
		t.Errorf("routed leased tool: description %q schema %s", def.Description, schema)
	}
	call := func(args map[string]any) *mcp.CallToolResult {
		t.Helper()
		args["source"], args["value"] = "gw_other", 5
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "do_heater_far", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	call(map[string]any{"idempotency_key": "lease-1", "hold_s": 30})
	if d := <-cr.got; d.HoldS != 30 || d.IdempotencyKey != "lease-1" {
		t.Errorf("routed do_ with hold_s 30 sent %+v", d)
	}
	call(map[string]any{"idempotency_key": "lease-2"})
	if d := <-cr.got; d.HoldS != 0 {
		t.Errorf("routed do_ without hold_s sent hold %d, want 0 (the owner's default)", d.HoldS)
	}
	for _, bad := range []int{0, -5} {
		if res := call(map[string]any{"idempotency_key": "lease-bad", "hold_s": bad}); !res.IsError {
			t.Errorf("hold_s %d was not refused", bad)
		}
	}
	select {
	case d := <-cr.got:
		t.Errorf("a refused hold_s was sent to the owner: %+v", d)
	default:
	}
}
