package fleetd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

const operatorToken = "greenhouse-operator-demo-token"

// fleetUser is the endpoint's user on the test hubs: the permissions a
// hub gives the fleet endpoint (hub.FleetPermissions), so that every test
// here also checks they are enough.
const fleetUser = "fleet"

// hubFor runs a real nats-server with per-site users for sites and the
// fleet endpoint's user.
func hubFor(t *testing.T, sites ...string) *natstest.Hub {
	t.Helper()
	users := []*server.User{natstest.FleetUser(fleetUser, fleetUser+"-pw", "physd", testStreams)}
	for _, s := range sites {
		users = append(users, natstest.SiteUser(s, s+"-pw", "physd", s, testStreams.Audit, testStreams.History, testStreams.Alarms))
	}
	return natstest.Start(t, t.TempDir(), users...)
}

var testStreams = hub.FleetStreams{Audit: "PHYSD_AUDIT", Catalog: fleet.DefaultCatalogStream, History: "PHYSD_HISTORY", Alarms: "PHYSD_ALARMS"}

// endpoint starts a fleet endpoint on the hub as the fleet's user, with
// views.
func endpoint(t *testing.T, h *natstest.Hub, views ...*manifest.View) *Endpoint {
	t.Helper()
	pw := filepath.Join(t.TempDir(), "fleet.pw")
	if err := os.WriteFile(pw, []byte(fleetUser+"-pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &Config{ID: "fleet_test", Prefix: "physd", AuditStream: "PHYSD_AUDIT", CatalogStream: fleet.DefaultCatalogStream, Replicas: 1,
		CallTimeout: 500 * time.Millisecond, ReadTimeout: 2 * time.Second, DoTimeout: 5 * time.Second, ConnectTimeout: time.Second,
		NATS: &NATS{URLs: []string{h.URL()}, Fleet: manifest.Fleet{URLs: []string{h.URL()}, User: fleetUser, PasswordFile: pw}}, Views: views}
	e := New(cfg, nil)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	waitFor(t, "the endpoint's streams", func() bool { return e.Ready() == nil && streamsExist(h) })
	select {
	case <-e.loaded: // its user could make sure of every stream and read the catalogs
	case <-time.After(10 * time.Second):
		e.mu.Lock()
		defer e.mu.Unlock()
		t.Fatalf("the endpoint did not read the catalogs: %s", e.streamErr)
	}
	return e
}

func streamsExist(h *natstest.Hub) bool {
	nc, err := nats.Connect(h.URL(), nats.UserInfo(natstest.Admin, natstest.Admin))
	if err != nil {
		return false
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, st := range []string{testStreams.Catalog, testStreams.Audit, testStreams.History, testStreams.Alarms} {
		if _, err = js.Stream(ctx, st); err != nil {
			return false
		}
	}
	return true
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// testGateway is an in-process greenhouse gateway of site serving the fleet.
type testGateway struct {
	rig *testrig.Rig
	up  *fleet.Uplink
	srv *fleet.Server
}

func startGateway(t *testing.T, h *natstest.Hub, site string, serve []string) *testGateway {
	t.Helper()
	r := testrig.Open(t, testrig.Greenhouse("physmcp.manifest.yml"), testrig.ReadFile(t, testrig.Greenhouse("physmcp.policy.yml")), nil)
	id := r.Guard.Policy().Identity
	authn := func(cred string) (node.Caller, error) {
		p, err := id.AuthenticateFleet(context.Background(), cred)
		return node.Caller{ID: p.ID, Role: p.Role, Credentials: p.Credentials}, err
	}
	u, err := fleet.New(fleet.Config{URLs: []string{h.URL()}, Site: site, DeviceID: r.Node.DeviceID(), Stream: "PHYSD_AUDIT", Prefix: "physd",
		Options: []nats.Option{nats.UserInfo(site, site+"-pw")}, ConnectTimeout: time.Second, PublishTimeout: time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{rig: r, up: u, srv: fleet.NewServer(fleet.ServeConfig{Prefix: "physd", Site: site, Serve: serve,
		Owner: meshnode.Owner{Node: r.Node, Authn: authn}, Heartbeat: 100 * time.Millisecond})}
	g.srv.Start(u)
	u.Start(r.Audit)
	t.Cleanup(func() { g.srv.Close(); u.Close() })
	return g
}

func link(e *Endpoint, key string) string {
	g, ok := e.dir.gateway(key)
	if !ok {
		return "(unknown)"
	}
	return g.link
}

// mcpOn serves the endpoint's MCP (its own node, no capability) in
// memory, as the stdio caller of view.
func mcpOn(t *testing.T, e *Endpoint, view string) *mcp.ClientSession {
	t.Helper()
	return mcpClient(t, e, view, nil)
}

// mcpClient is mcpOn with the client's options.
func mcpClient(t *testing.T, e *Endpoint, view string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	r := testrig.OpenManifest(t, e.Manifest(), "", func(c *node.Config) { c.Remote = e })
	srv := mcpserver.New(r.Node, mcpserver.Options{StdioRole: "operator", Families: true, Router: e, Fleet: true, View: view, Mesh: e.Status, Sites: e.Sites()})
	ct, st := mcp.NewInMemoryTransports()
	if _, err := srv.MCP().Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, opts).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func toolsOf(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		out[tl.Name] = tl
	}
	return out
}

func enum(t *testing.T, tl *mcp.Tool, prop string) []string {
	t.Helper()
	b, _ := json.Marshal(tl.InputSchema)
	var s struct {
		Properties map[string]struct{ Enum []string } `json:"properties"`
	}
	_ = json.Unmarshal(b, &s)
	return s.Properties[prop].Enum
}

// TestHundredSites: the greenhouse at 100 sites (one gateway each, every
// one named gw_greenhouse_001, known from the catalog stream) is listed
// in 9 tools by family, each with the 100 sites as its site enum; a view
// of one site lists that site only, in tools and in physmcp://mesh.
func TestHundredSites(t *testing.T) {
	h := hubFor(t)
	e := endpoint(t, h, &manifest.View{Name: "s042", Sites: []string{"s042"}})
	m, err := manifest.Load(testrig.Greenhouse("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	nc, js := adminJS(t, h)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var sites []string
	for i := range 100 {
		site := fmt.Sprintf("s%03d", i)
		sites = append(sites, site)
		cat := fleet.CatalogOf(m, site, manifest.FleetServes, "i", fleet.StateServing, time.Second)
		b, _ := json.Marshal(cat)
		if _, err := js.Publish(ctx, "physd."+site+".gw_greenhouse_001.catalog", b); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "100 gateways", func() bool { return len(e.dir.gateways()) == 100 })
	tools := toolsOf(t, mcpOn(t, e, ""))
	var names []string
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("100 sites: %d tools: %v", len(names), names)
	if len(names) > 40 || tools["do_heater"] == nil {
		t.Fatalf("100 sites: %d tools: %v", len(names), names)
	}
	if got := enum(t, tools["do_heater"], "site"); !slices.Equal(got, sites) {
		t.Errorf("do_heater's site enum: %d sites", len(got))
	}
	view := mcpOn(t, e, "s042")
	vt := toolsOf(t, view)
	if got := enum(t, vt["read_temperature"], "site"); !slices.Equal(got, []string{"s042"}) {
		t.Errorf("through the view s042: read_temperature's sites %v", got)
	}
	res, err := view.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: mcpserver.MeshURI})
	if err != nil {
		t.Fatal(err)
	}
	if doc := res.Contents[0].Text; strings.Contains(doc, "s041") || !strings.Contains(doc, `"s042"`) {
		t.Errorf("physmcp://mesh through the view s042 names other sites: %.300s", doc)
	}
	// A call through the view to another site is refused before anything.
	r, err := view.CallTool(context.Background(), &mcp.CallToolParams{Name: "read_temperature_zone_a", Arguments: map[string]any{"site": "s041"}})
	if err != nil || !r.IsError {
		t.Errorf("read of s041 through the view s042: %v %v", err, r)
	}
}

func adminJS(t *testing.T, h *natstest.Hub) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(h.URL(), nats.UserInfo(natstest.Admin, natstest.Admin))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	return nc, js
}

// TestGatewaysAcrossRestarts: a gateway that stopped gracefully is known
// to an endpoint started after it, from the catalog stream, as stopped;
// a gateway whose link dies is down after three missed heartbeats, and
// can_do reports it blocked at once, naming its site.
func TestGatewaysAcrossRestarts(t *testing.T) {
	h := hubFor(t, "north", "south")
	e := endpoint(t, h)
	north := startGateway(t, h, "north", manifest.FleetServes)
	south := startGateway(t, h, "south", manifest.FleetServes)
	waitFor(t, "two gateways up", func() bool {
		return link(e, "north/gw_greenhouse_001") == LinkUp && link(e, "south/gw_greenhouse_001") == LinkUp
	})
	north.srv.Close()
	north.up.Close()
	waitFor(t, "north stopped", func() bool { return link(e, "north/gw_greenhouse_001") == LinkStopped })
	south.up.Close() // a cut: no goodbye
	waitFor(t, "south down", func() bool { return link(e, "south/gw_greenhouse_001") == LinkDown })

	e2 := endpoint(t, h)
	if l := link(e2, "north/gw_greenhouse_001"); l != LinkStopped {
		t.Errorf("north after the endpoint restarted: %s, want stopped (from the stream)", l)
	}
	if n := len(e2.RemoteTools()); n != 26 {
		t.Errorf("tools known after the restart: %d, want 26", n)
	}
	rep := e2.CanDo(context.Background(), promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"heating"}}}, node.Caller{})
	if rep.PeersMatched != 2 || rep.PeersConsulted != 1 || len(rep.Reports) != 0 {
		t.Errorf("can_do: matched %d consulted %d answered %d", rep.PeersMatched, rep.PeersConsulted, len(rep.Reports))
	}
	for _, b := range rep.Unreachable {
		if b.Site == "north" && !strings.Contains(b.Reason, "gateway gw_greenhouse_001 of site north stopped") {
			t.Errorf("north: %+v", b)
		}
		if b.Site == "south" && !strings.Contains(b.Reason, "site south") {
			t.Errorf("south: %+v", b)
		}
	}
	if _, err := e2.Do(context.Background(), "north/gw_greenhouse_001", mcpserver.RoutedDo{Tool: "do_vent_zone_c", Value: json.RawMessage("20"), IdempotencyKey: "k"}); err == nil ||
		!strings.Contains(err.Error(), "nothing was done") || !strings.Contains(err.Error(), "stopped") {
		t.Errorf("do_ on the stopped gateway: %v", err)
	}
}

// TestReadAge: the fleet's copy of a value answers with its age (sent age
// plus the time since it arrived, no clocks compared); past the
// capability's freshness it is stale and says how to read it through the
// gateway; max_age_ms below its age reads through the gateway.
func TestReadAge(t *testing.T) {
	h := hubFor(t, "north")
	e := endpoint(t, h)
	g := startGateway(t, h, "north", []string{"read"})
	key := "north/gw_greenhouse_001"
	waitFor(t, "north up", func() bool { return link(e, key) == LinkUp })
	nc, _ := adminJS(t, h)
	defer nc.Close()
	old := promcp.Observation{Value: 3.5, Unit: "celsius", Timestamp: time.Now().Add(-time.Hour), Quality: promcp.QualityGood,
		Capability: "read_temperature_zone_a", Source: "gw_greenhouse_001", AgeMS: 60_000}
	b, _ := json.Marshal(old)
	if err := nc.Publish("physd.north.gw_greenhouse_001.obs.read_temperature_zone_a", b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the observation", func() bool { _, ok := e.dir.observation(key, "read_temperature_zone_a"); return ok })
	var o promcp.Observation
	b, err := e.Read(context.Background(), key, "read_temperature_zone_a", -1)
	if err != nil || json.Unmarshal(b, &o) != nil {
		t.Fatal(err)
	}
	if o.Value != 3.5 || o.Quality != promcp.QualityStale || o.AgeMS < 60_000 || !o.Cached || o.Site != "north" || !strings.Contains(o.Reason, "pass max_age_ms") {
		t.Errorf("the fleet's old copy: %+v", o)
	}
	b, err = e.Read(context.Background(), key, "read_temperature_zone_a", 5000)
	if err != nil || json.Unmarshal(b, &o) != nil {
		t.Fatal(err)
	}
	if o.Value == 3.5 || o.Quality != promcp.QualityGood || o.AgeMS > 5000 || o.Site != "north" {
		t.Errorf("max_age_ms 5000 (read through the gateway): %+v", o)
	}
	// Its link cut, the copy is the answer, saying so.
	g.up.Close()
	waitFor(t, "north down", func() bool { return link(e, key) == LinkDown })
	b, err = e.Read(context.Background(), key, "read_temperature_zone_a", 0)
	if err != nil || json.Unmarshal(b, &o) != nil {
		t.Fatal(err)
	}
	if o.Quality != promcp.QualityStale && o.Quality != promcp.QualityGood || !strings.Contains(o.Reason, "the link to gateway gw_greenhouse_001 of site north is down") {
		t.Errorf("with the link down: %+v", o)
	}
}

// TestForgedCatalog: a catalog whose body names another site or device
// than its subject, or whose hash is not its own, is not taken.
func TestForgedCatalog(t *testing.T) {
	h := hubFor(t)
	e := endpoint(t, h)
	m, _ := manifest.Load(testrig.Greenhouse("physmcp.manifest.yml"))
	nc, _ := adminJS(t, h)
	defer nc.Close()
	other := fleet.CatalogOf(m, "south", manifest.FleetServes, "i", fleet.StateServing, time.Second)
	b, _ := json.Marshal(other)
	_ = nc.Publish("physd.north.gw_greenhouse_001.catalog", b)
	altered := fleet.CatalogOf(m, "north", []string{"read"}, "i", fleet.StateServing, time.Second)
	altered.Serves = manifest.FleetServes // without its hash
	b, _ = json.Marshal(altered)
	_ = nc.Publish("physd.north.gw_greenhouse_001.catalog", b)
	good := fleet.CatalogOf(m, "east", manifest.FleetServes, "i", fleet.StateServing, time.Second)
	b, _ = json.Marshal(good)
	_ = nc.Publish("physd.east.gw_greenhouse_001.catalog", b)
	waitFor(t, "the good catalog", func() bool { return len(e.dir.gateways()) == 1 })
	if gws := e.dir.gateways(); gws[0].site != "east" || e.dir.rejected != 2 {
		t.Errorf("gateways %+v, rejected %d", gws, e.dir.rejected)
	}
}

// TestDoThroughEndpoint: a do_ the endpoint forwards runs on the owning
// gateway as the caller its credential authenticates there.
func TestDoThroughEndpoint(t *testing.T) {
	h := hubFor(t, "north")
	e := endpoint(t, h)
	g := startGateway(t, h, "north", manifest.FleetServes)
	waitFor(t, "north up", func() bool { return link(e, "north/gw_greenhouse_001") == LinkUp })
	b, err := e.Do(context.Background(), "north/gw_greenhouse_001", mcpserver.RoutedDo{Tool: "do_vent_zone_c", Value: json.RawMessage("20"), IdempotencyKey: "k1",
		Caller: node.Caller{ID: "x", Role: "admin", Credential: operatorToken}})
	var r promcp.DoResult
	if err != nil || json.Unmarshal(b, &r) != nil || r.Status != promcp.StatusSuccess {
		t.Fatalf("do_: %v %s", err, b)
	}
	if w := g.rig.Plant.Stats().Points["zone_c.vent"].Writes; w != 1 {
		t.Errorf("writes %d", w)
	}
	_, err = e.Do(context.Background(), "north/gw_nobody", mcpserver.RoutedDo{Tool: "do_vent_zone_c"})
	if err == nil || errors.Is(err, mcpserver.ErrOutcomeUnknown) {
		t.Errorf("an unknown gateway: %v", err)
	}
}

// TestNamesWithoutCatalogAreNotKept: a site's credentials may publish
// heartbeats and observations under any device and tool name of their
// site; the endpoint keeps observations only of a known gateway's tools
// and a bounded number of gateways it heard of without a catalog, so a
// flood of names cannot grow it without end.
func TestNamesWithoutCatalogAreNotKept(t *testing.T) {
	h := hubFor(t, "north")
	e := endpoint(t, h)
	g := startGateway(t, h, "north", []string{manifest.FleetServeRead, manifest.FleetServeCanDo})
	key := mcpserver.OwnerKey("north", g.rig.Node.DeviceID())
	waitFor(t, "north's gateway", func() bool { return link(e, key) == LinkUp })
	nc, err := nats.Connect(h.URL(), nats.UserInfo("north", "north-pw"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hb, _ := json.Marshal(fleet.Heartbeat{Instance: "x", IntervalMS: 5000, Catalog: "none", State: fleet.StateServing})
	for i := range 3 * maxUnknown {
		dev := fmt.Sprintf("gw_flood_%d", i)
		o, _ := json.Marshal(promcp.Observation{Value: 1.0, Quality: promcp.QualityGood, Capability: "read_x", Source: dev})
		_ = nc.Publish("physd.north."+dev+".hb", hb)
		_ = nc.Publish("physd.north."+dev+".obs.read_x", o)
		own, _ := json.Marshal(promcp.Observation{Value: 1.0, Quality: promcp.QualityGood, Capability: fmt.Sprintf("read_flood_%d", i), Source: g.rig.Node.DeviceID()})
		_ = nc.Publish(fleet.Base("physd", "north", g.rig.Node.DeviceID())+fmt.Sprintf(".obs.read_flood_%d", i), own)
	}
	_ = nc.Flush()
	time.Sleep(300 * time.Millisecond) // the flood has reached the endpoint
	e.dir.mu.Lock()
	defer e.dir.mu.Unlock()
	obs := 0
	for _, gw := range e.dir.gws {
		for tool := range gw.obs {
			if tool == "read_x" || strings.HasPrefix(tool, "read_flood_") {
				obs++
			}
		}
	}
	if n := len(e.dir.gws); n > maxUnknown+1 || obs > 0 {
		t.Errorf("after a flood of %d names the endpoint keeps %d gateways and %d observations", 3*maxUnknown, n, obs)
	}
}
