package mcpserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// twoZones: a heater and its power reading (polled, with a high alarm) in
// each of zone_a and zone_b, and a view "a" of zone_a.
const twoZones = `physmcp_version: "0.1"
device: {id: two_zones, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
      zone_b: {ambient_c: 12, initial_c: 18}
capabilities:
  - {name: heater_zone_a, kind: do, description: Heater A., zone: zone_a, binding: {type: sim, bus: plant, point: zone_a.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heater]}
  - {name: heater_zone_b, kind: do, description: Heater B., zone: zone_b, binding: {type: sim, bus: plant, point: zone_b.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heater]}
  - {name: power_zone_a, kind: read, description: Heater power A., zone: zone_a, binding: {type: sim, bus: plant, point: zone_a.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [power], poll_ms: 500, deadband: "5%", alarms: {high: 50}}
  - {name: power_zone_b, kind: read, description: Heater power B., zone: zone_b, binding: {type: sim, bus: plant, point: zone_b.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [power], poll_ms: 500, deadband: "5%", alarms: {high: 50}}
views:
  a:
    zones: [zone_a]
`

// zonesRig serves twoZones in memory to one go-sdk client, as stdio with
// --view a serves it.
type zonesRig struct {
	n   *node.Node
	srv *mcpserver.Server
	cs  *mcp.ClientSession
	mu  sync.Mutex
	got []string
}

func (r *zonesRig) updates() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func openZonesRig(t *testing.T, era string, withAlarms bool) *zonesRig {
	t.Helper()
	m, err := manifest.Parse("zones.yml", []byte(twoZones))
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
	opts := mcpserver.Options{View: "a"}
	if withAlarms {
		e := alarms.New(m)
		e.Follow(n)
		t.Cleanup(e.Close)
		opts.Alarms = e
	}
	r := &zonesRig{n: n, srv: mcpserver.New(n, opts)}
	ct, srvT := mcp.NewInMemoryTransports()
	ss, err := r.srv.MCP().Connect(context.Background(), srvT, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "zones-test", Version: "1"}, &mcp.ClientOptions{
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
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	return r
}

func (r *zonesRig) set(t *testing.T, tool string, v float64, key string) {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := r.n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	var res promcp.DoResult
	if err := json.Unmarshal(body, &res); err != nil || res.Status != promcp.StatusSuccess {
		t.Fatalf("%s(%v): %s", tool, v, body)
	}
}

// TestViewSubscriptionLeftByReload: a subscription made inside the view
// of its endpoint is told nothing once a manifest reload moved its
// capability out of that view, in both eras (the sender checks each
// update against the view in force, not only the subscribe request); one
// the reload moved in is told.
func TestViewSubscriptionLeftByReload(t *testing.T) {
	uriA, uriB := mcpserver.ObsURIPrefix+"power_zone_a", mcpserver.ObsURIPrefix+"power_zone_b"
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := openZonesRig(t, era, false)
				ctx := context.Background()
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uriA}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(600 * time.Millisecond) // the first poll counts as a change
				r.set(t, "do_heater_zone_a", 30, "a1")
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				if got := r.updates(); len(got) == 0 || got[len(got)-1] != uriA {
					t.Fatalf("inside the view: updates %v, want %s", got, uriA)
				}

				m, err := manifest.Parse("zones.yml", []byte(strings.Replace(twoZones, "zones: [zone_a]\n", "zones: [zone_b]\n", 1)))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := r.n.Reload(ctx, m); err != nil {
					t.Fatal(err)
				}
				r.srv.ManifestReloaded()
				synctest.Wait()
				before := len(r.updates())
				r.set(t, "do_heater_zone_a", 60, "a2")
				time.Sleep(1500 * time.Millisecond)
				r.set(t, "do_heater_zone_a", 10, "a3")
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				if got := r.updates()[before:]; len(got) != 0 {
					t.Errorf("after the reload moved power_zone_a out of the view: told %v", got)
				}

				// Now zone_b is the view: its subscription is told.
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uriB}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(600 * time.Millisecond)
				r.set(t, "do_heater_zone_b", 40, "b1")
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				got := r.updates()[before:]
				if len(got) == 0 {
					t.Fatalf("power_zone_b, in the view after the reload: no update")
				}
				for _, u := range got {
					if u != uriB {
						t.Errorf("told %s", u)
					}
				}
			})
		})
	}
}

// TestViewAlarmsUpdatesStayInTheView: physmcp://alarms through a view lists
// the view's alarms only; its subscriber is not told when an alarm outside
// the view is raised (nothing it can read changed), and is told when one
// inside is.
func TestViewAlarmsUpdatesStayInTheView(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := openZonesRig(t, era, true)
				ctx := context.Background()
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.AlarmsURI}); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				r.set(t, "do_heater_zone_b", 80, "hot-b")
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if got := r.updates(); len(got) != 0 {
					t.Errorf("an alarm outside the view was told: %v", got)
				}
				res, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.AlarmsURI})
				if err != nil || strings.Contains(res.Contents[0].Text, "zone_b") {
					t.Errorf("physmcp://alarms through the view: %v %v", res, err)
				}
				r.set(t, "do_heater_zone_a", 80, "hot-a")
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if got := r.updates(); len(got) != 1 || got[0] != mcpserver.AlarmsURI {
					t.Errorf("an alarm inside the view: told %v, want one update of %s", got, mcpserver.AlarmsURI)
				}
				res, err = r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.AlarmsURI})
				if err != nil || !strings.Contains(res.Contents[0].Text, "read_power_zone_a") || strings.Contains(res.Contents[0].Text, "zone_b") {
					t.Errorf("physmcp://alarms through the view: %v %v", res, err)
				}
			})
		})
	}
}

// TestViewStdioSubscribeRefused: with --view, a 2025-11-25
// resources/subscribe outside the view is refused with the error its read
// gets.
func TestViewStdioSubscribeRefused(t *testing.T) {
	r := openZonesRig(t, "2025-11-25", false)
	uri := mcpserver.ObsURIPrefix + "power_zone_b"
	_, rerr := r.cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	serr := r.cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri})
	strip := func(err error) string { _, msg, _ := strings.Cut(err.Error(), `": `); return msg }
	if rerr == nil || serr == nil || strip(serr) != strip(rerr) || !strings.Contains(strip(rerr), `is not in the view "a"`) {
		t.Errorf("read: %v; subscribe: %v", rerr, serr)
	}
}

// rawListen sends a 2026-07-28 subscriptions/listen for uris through path
// and returns the first message of the answer (the acknowledgement, or
// the error).
func rawListen(t *testing.T, s *surface, path, token string, uris ...string) string {
	t.Helper()
	subs, _ := json.Marshal(uris)
	body := `{"jsonrpc":"2.0","id":7,"method":"subscriptions/listen","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{},"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}},"notifications":{"resourceSubscriptions":` + string(subs) + `}}}`
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			return strings.TrimSpace(d)
		}
		if strings.HasPrefix(line, "{") {
			return line
		}
	}
	t.Fatalf("%s: no message (status %d)", path, resp.StatusCode)
	return ""
}

// TestViewListenJudgedByItsEndpoint: a listen is judged by the view of the
// endpoint it came through, not by the stdio --view of the same daemon:
// /mcp (the whole site) subscribes to fan_zone_b while --view zone_a is
// set, /mcp/zone_a does not, and /mcp/water refuses heater_zone_a.
func TestViewListenJudgedByItsEndpoint(t *testing.T) {
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{View: "zone_a"}, nil)
	fan := mcpserver.ObsURIPrefix + "fan_zone_b"
	if got := rawListen(t, s, "/mcp", operatorToken, fan); !strings.Contains(got, "notifications/subscriptions/acknowledged") || !strings.Contains(got, fan) {
		t.Errorf("/mcp listen for %s: %s", fan, got)
	}
	if got := rawListen(t, s, "/mcp/zone_a", operatorToken, fan); !strings.Contains(got, `is not in the view \"zone_a\"`) {
		t.Errorf("/mcp/zone_a listen for %s: %s", fan, got)
	}
	heater := mcpserver.ObsURIPrefix + "heater_zone_a"
	if got := rawListen(t, s, "/mcp/water", operatorToken, heater); !strings.Contains(got, `is not in the view \"water\"`) {
		t.Errorf("/mcp/water listen for %s: %s", heater, got)
	}
}

// TestViewDocumentsNameOnlyTheView: through a view, the gate's policy, the
// mesh status, the resource templates and the views and manifest
// documents name no capability outside the view, in both eras; the whole
// site's endpoint still names them (so each check can fail).
func TestViewDocumentsNameOnlyTheView(t *testing.T) {
	m, err := manifest.Load(example("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	h, err := history.Open(filepath.Join(t.TempDir(), history.FileName), m, history.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	status := func() any {
		cat := func(dev, area string, entries ...mesh.CatalogEntry) *mesh.Catalog {
			return &mesh.Catalog{DeviceID: dev, Area: area, Capabilities: entries, Hash: "abc"}
		}
		return struct {
			Members []mesh.Member `json:"members"`
		}{[]mesh.Member{
			{Name: "gw_greenhouse_001", State: "alive", Self: true, Catalog: cat("gw_greenhouse_001", "north_block",
				mesh.CatalogEntry{Tool: "read_temperature_zone_a", Kind: "read", Zone: "zone_a"},
				mesh.CatalogEntry{Tool: "do_fan_zone_b", Kind: "do", Zone: "zone_b", Description: "fan"})},
			{Name: "gw_2", State: "alive", Catalog: cat("gw_2", "south_block",
				mesh.CatalogEntry{Tool: "do_pump_zone_c", Kind: "do", Zone: "zone_c"},
				mesh.CatalogEntry{Tool: "read_soil_zone_a", Kind: "read", Zone: "zone_a"})},
		}}
	}
	s := newSurface(t, greenhousePolicy(t), mcpserver.Options{History: h, Mesh: status}, nil)
	ctx := context.Background()
	read := func(cs *mcp.ClientSession, uri string) string {
		t.Helper()
		res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		return res.Contents[0].Text
	}
	templates := func(cs *mcp.ClientSession) string {
		t.Helper()
		res, err := cs.ListResourceTemplates(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(res.ResourceTemplates)
		return string(b)
	}
	check := func(where, text string, absent, present []string) {
		t.Helper()
		for _, a := range absent {
			if strings.Contains(text, a) {
				t.Errorf("%s names %s:\n%s", where, a, text)
			}
		}
		for _, p := range present {
			if !strings.Contains(text, p) {
				t.Errorf("%s does not name %s:\n%s", where, p, text)
			}
		}
	}
	for _, era := range eras {
		site := connectPath(t, s, "/mcp", era, operatorToken)
		zoneA := connectPath(t, s, "/mcp/zone_a", era, operatorToken)
		water := connectPath(t, s, "/mcp/water", era, operatorToken)

		check(era+" /mcp gate", read(site, mcpserver.GateApprovalURI), nil, []string{"do_fan_zone_b", "do_vent_zone_c", "heaters_bounded"})
		check(era+" /mcp/zone_a gate", read(zoneA, mcpserver.GateApprovalURI),
			[]string{"do_fan_zone_b", "do_vent_zone_c", "circulation_fan", "roof_vent"}, []string{"heaters_bounded", "irrigation_flood", `"view": "zone_a"`})

		check(era+" /mcp mesh", read(site, mcpserver.MeshURI), nil, []string{"do_fan_zone_b", "do_pump_zone_c", "read_soil_zone_a"})
		check(era+" /mcp/zone_a mesh", read(zoneA, mcpserver.MeshURI),
			[]string{"fan_zone_b", "pump_zone_c", `"hash"`}, []string{"read_temperature_zone_a", "read_soil_zone_a", "gw_2"})

		check(era+" /mcp templates", templates(site), nil, []string{"temperature_zone_a"})
		check(era+" /mcp/water templates", templates(water), []string{"temperature_zone_a"}, []string{"physmcp://history/{capability}"})

		_, err := water.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: mcpserver.HistoryURITemplate},
			Argument: mcp.CompleteParamsArgument{Name: "capability", Value: "temp"}})
		if err == nil {
			t.Errorf("%s: completion/complete answered through a view", era)
		} else {
			check(era+" /mcp/water completion", err.Error(), []string{"temperature", "heater", "fan"}, nil)
		}
	}
}

// TestViewSelectorsShowOnlyTheView: a view's own capabilities: selector,
// as physmcp://views and physmcp://manifest show it through its endpoint,
// names only capabilities in the view.
func TestViewSelectorsShowOnlyTheView(t *testing.T) {
	s := newReloadSurface(t)
	s.reload(t, func(src string) string {
		return withoutViews(src) + "views:\n  pick:\n    zones: [zone_a]\n    capabilities: [heater_zone_a, fan_zone_b]\n  other:\n    tags: [fan]\n"
	})
	for _, era := range eras {
		cs := connectPath(t, s.surface, "/mcp/pick", era, "")
		if got := toolNames(t, cs); strings.Join(got, ",") != "can_do,do_heater_zone_a" {
			t.Fatalf("/mcp/pick lists %v", got)
		}
		for _, uri := range []string{mcpserver.ViewsURI, mcpserver.ManifestURI} {
			res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
			if err != nil {
				t.Fatal(err)
			}
			text := res.Contents[0].Text
			if strings.Contains(text, "fan_zone_b") || strings.Contains(text, "other") || !strings.Contains(text, "heater_zone_a") {
				t.Errorf("%s %s through /mcp/pick:\n%s", era, uri, text)
			}
		}
	}
}
