package fleetd

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/history"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// alarmGreenhouse is the greenhouse with a high alarm on zone A's
// temperature.
func alarmGreenhouse(t *testing.T) *manifest.Manifest {
	t.Helper()
	text := testrig.ReadFile(t, testrig.Greenhouse("physmcp.manifest.yml"))
	const at = "  - name: temperature_zone_a\n    kind: read\n"
	alarmed := strings.Replace(text, at, at+"    alarms: {high: 30, hysteresis: 1}\n", 1)
	if alarmed == text {
		t.Fatal("the greenhouse's temperature_zone_a moved")
	}
	m, err := manifest.Parse("physmcp.manifest.yml", []byte(alarmed))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// recordingGateway is a greenhouse gateway of a site whose uplink copies
// its history (one-second buckets) and its alarm engine's state to the
// hub, and that serves the fleet its catalog.
type recordingGateway struct {
	hist *history.History
	eng  *alarms.Engine
	temp *manifest.Capability
	t0   time.Time // its first bucket
}

func startRecordingGateway(t *testing.T, h *natstest.Hub, site string) *recordingGateway {
	t.Helper()
	m := alarmGreenhouse(t)
	r := testrig.OpenManifest(t, m, "", nil)
	hist, err := history.Open(filepath.Join(t.TempDir(), history.FileName), m, history.Config{Resolution: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hist.Close() })
	eng := alarms.New(m)
	t.Cleanup(eng.Close)
	u, err := fleet.New(fleet.Config{URLs: []string{h.URL()}, Site: site, DeviceID: r.Node.DeviceID(), Stream: testStreams.Audit, Prefix: "physd",
		History: true, Alarms: true, Refresh: 100 * time.Millisecond,
		Options: []nats.Option{nats.UserInfo(site, site+"-pw")}, ConnectTimeout: time.Second, PublishTimeout: time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := fleet.NewServer(fleet.ServeConfig{Prefix: "physd", Site: site, Serve: []string{manifest.FleetServeRead},
		Owner: meshnode.Owner{Node: r.Node}, Heartbeat: 100 * time.Millisecond})
	srv.Start(u)
	u.Start(r.Audit)
	u.FollowHistory(hist)
	u.FollowAlarms(eng)
	t.Cleanup(func() { srv.Close(); u.Close() })
	return &recordingGateway{hist: hist, eng: eng, temp: m.Capability("temperature_zone_a"), t0: time.Now().Truncate(time.Second).Add(time.Second)}
}

// record puts a minute of zone A's temperature in the history (stamped
// ahead of now: a bucket is sealed once a later one starts) and flushes
// it: 59 sealed buckets go to the hub.
func (g *recordingGateway) record(base float64) {
	for s := range 60 {
		for k := range 3 {
			at := g.t0.Add(time.Duration(s)*time.Second + time.Duration(k)*300*time.Millisecond)
			g.hist.Record(node.Observed{Cap: g.temp, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: base + float64(s%7+k)}})
		}
	}
	g.hist.Flush()
}

// heat raises (35 °C) or clears (20 °C) zone A's high alarm.
func (g *recordingGateway) heat(v float64) {
	g.eng.Observe(node.Observed{Cap: g.temp, At: time.Now(), Obs: promcp.Observation{Quality: promcp.QualityGood, Value: v}})
}

// twoRecordingSites is an endpoint with views and the recording gateways
// of sites north and south, up, each with a minute of history recorded.
func twoRecordingSites(t *testing.T, views ...*manifest.View) (e *Endpoint, north, south *recordingGateway) {
	t.Helper()
	h := hubFor(t, "north", "south")
	e = endpoint(t, h, views...)
	north, south = startRecordingGateway(t, h, "north"), startRecordingGateway(t, h, "south")
	waitFor(t, "two gateways up", func() bool {
		return link(e, "north/gw_greenhouse_001") == LinkUp && link(e, "south/gw_greenhouse_001") == LinkUp
	})
	north.record(20)
	south.record(10)
	return e, north, south
}

// watcher is an in-memory MCP client of the endpoint through a view (the
// stdio caller's) that records the resource updates it is told.
type watcher struct {
	cs  *mcp.ClientSession
	mu  sync.Mutex
	got []string
}

func watch(t *testing.T, e *Endpoint, view string) *watcher {
	t.Helper()
	w := &watcher{}
	w.cs = mcpClient(t, e, view, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			w.mu.Lock()
			w.got = append(w.got, req.Params.URI)
			w.mu.Unlock()
		}})
	return w
}

func (w *watcher) updates() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

// settled is the count of updates once none came for 300 ms (within 5
// s): the client runs its notification handlers on a goroutine of its
// own, so an update the server sent may be counted after the reply of a
// later request; what the server would send has been sent by then.
func (w *watcher) settled() int {
	n, since := w.updates(), time.Now()
	for end := time.Now().Add(5 * time.Second); time.Since(since) < 300*time.Millisecond && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if m := w.updates(); m != n {
			n, since = m, time.Now()
		}
	}
	return n
}

func readText(t *testing.T, cs *mcp.ClientSession, uri string) (string, error) {
	t.Helper()
	res, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		return "", err
	}
	return res.Contents[0].Text, nil
}

func followed(e *Endpoint, site string, active int) bool {
	for _, st := range e.records.AlarmsFollowed() {
		if st.Site == site && len(st.Active) == active {
			return true
		}
	}
	return false
}

// TestSiteHistoryAndAlarms: two sites copy their history and alarm states
// to the hub; the endpoint answers physmcp://history/{site}/{device}/
// {capability} from the hub's copy (the same buckets as the gateway's
// own history), lists the series in physmcp://history, and serves the
// active alarms of every site in physmcp://alarms, each naming its site
// and device, with each gateway's link and the age of its state; a
// subscriber is told when an alarm is raised or cleared.
func TestSiteHistoryAndAlarms(t *testing.T) {
	e, north, _ := twoRecordingSites(t)
	w := watch(t, e, "")
	cs := w.cs
	if err := cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: mcpserver.AlarmsURI}); err != nil {
		t.Fatal(err)
	}

	// The history index, once the hub holds both series.
	var index struct {
		Series []struct{ Site, Device, Capability, Tool, URI string }
	}
	waitFor(t, "both series at the hub", func() bool {
		text, err := readText(t, cs, mcpserver.SiteHistoryIndexURI)
		return err == nil && json.Unmarshal([]byte(text), &index) == nil && len(index.Series) == 2
	})
	if s := index.Series[0]; s.Site != "north" || s.Device != "gw_greenhouse_001" || s.Capability != "temperature_zone_a" || s.Tool != "read_temperature_zone_a" ||
		s.URI != "physmcp://history/north/gw_greenhouse_001/temperature_zone_a" || index.Series[1].Site != "south" {
		t.Errorf("physmcp://history: %+v", index.Series)
	}

	// A window of north's series: the hub's copy answers what north's
	// own history answers.
	since, until := north.t0.Add(10*time.Second), north.t0.Add(50*time.Second)
	uri := "physmcp://history/north/gw_greenhouse_001/temperature_zone_a?since=" + url.QueryEscape(since.Format(time.RFC3339)) + "&until=" + url.QueryEscape(until.Format(time.RFC3339)) + "&step=10s"
	want, err := north.hist.Query("temperature_zone_a", since, until, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Site, Device string
		history.Series
	}
	var last string
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		text, err := readText(t, cs, uri)
		if err == nil && json.Unmarshal([]byte(text), &got) == nil && reflect.DeepEqual(got.Buckets, want.Buckets) {
			break
		}
		last = fmt.Sprint(text, err)
		if time.Now().After(end) {
			t.Fatalf("north's window at the hub:\n %s\nnorth's own:\n %+v", last, want.Buckets)
		}
	}
	if got.Site != "north" || got.Device != "gw_greenhouse_001" || got.Capability != "temperature_zone_a" || got.StepS != 10 || got.Unit != "celsius" || len(got.Buckets) < 4 {
		t.Errorf("north's window: %+v", got)
	}
	for _, bad := range []struct{ uri, want string }{
		{"physmcp://history/north/gw_greenhouse_001/temperature_zone_a?step=1500ms", "not a multiple"},
		{"physmcp://history/north/gw_greenhouse_001/humidity_zone_c?since=1h", "no history of read_humidity_zone_c at north/gw_greenhouse_001"},
		{"physmcp://history/south/gw_9/temperature_zone_a?since=1h", "no history of temperature_zone_a at south/gw_9 is known to the fleet"},
		// Not the template's shape (a wildcard, two segments): the SDK
		// finds no such resource; nothing reaches the hub.
		{"physmcp://history/*/gw_greenhouse_001/temperature_zone_a", "Resource not found"},
		{"physmcp://history/north/temperature_zone_a", "Resource not found"},
	} {
		if _, err := readText(t, cs, bad.uri); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: %v, want %q", bad.uri, err, bad.want)
		}
	}

	// Alarms: none, then north's raised (a subscriber told), then
	// cleared.
	var doc struct {
		Active []struct {
			Site, Device, Capability, Kind string
			Value                          float64
		}
		Gateways []struct {
			Site, Device, Link string
			Stored             time.Time
			AgeMS              int64 `json:"age_ms"`
			Active             int
		}
	}
	readAlarms := func(cs *mcp.ClientSession) {
		t.Helper()
		text, err := readText(t, cs, mcpserver.AlarmsURI)
		if err != nil {
			t.Fatal(err)
		}
		doc.Active, doc.Gateways = nil, nil
		if err := json.Unmarshal([]byte(text), &doc); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "both gateways' states at the hub", func() bool { readAlarms(cs); return len(doc.Gateways) == 2 })
	if len(doc.Active) != 0 || doc.Gateways[0].Site != "north" || doc.Gateways[0].Link != LinkUp || doc.Gateways[0].Stored.IsZero() {
		t.Errorf("no alarm: %+v", doc)
	}
	waitFor(t, "the endpoint following both states", func() bool { return followed(e, "north", 0) && followed(e, "south", 0) })
	before := w.updates()
	north.heat(35)
	waitFor(t, "a subscriber told of north's alarm", func() bool { return w.updates() > before })
	readAlarms(cs)
	if len(doc.Active) != 1 || doc.Active[0].Site != "north" || doc.Active[0].Device != "gw_greenhouse_001" || doc.Active[0].Capability != "read_temperature_zone_a" ||
		doc.Active[0].Kind != alarms.KindHigh || doc.Active[0].Value != 35 || doc.Gateways[0].Active != 1 {
		t.Errorf("north's alarm (read after the update): %+v", doc)
	}
	before = w.updates()
	north.heat(20)
	waitFor(t, "a subscriber told of the clear", func() bool { return w.updates() > before })
	if readAlarms(cs); len(doc.Active) != 0 {
		t.Errorf("cleared: %+v", doc.Active)
	}
}

// TestSiteRecordsStayInTheView: through a view of site north, nothing of
// south's history or alarms is listed, read or told: resources/list and
// templates/list name no south, physmcp://history lists north's series
// only, south's series is not in the view (the error its read gets
// through a view, as on a gateway), physmcp://alarms shows north's
// gateway and alarms only, and a subscriber through the view is not told
// of south's alarm but is of north's.
func TestSiteRecordsStayInTheView(t *testing.T) {
	e, north, south := twoRecordingSites(t, &manifest.View{Name: "north", Sites: []string{"north"}})
	all := mcpOn(t, e, "")
	waitFor(t, "both series at the hub", func() bool {
		text, err := readText(t, all, mcpserver.SiteHistoryIndexURI)
		return err == nil && strings.Contains(text, "/south/") && strings.Contains(text, "/north/")
	})
	w := watch(t, e, "north")
	view := w.cs
	ctx := context.Background()

	list, err := view.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	templates, err := view.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	lb, _ := json.Marshal(list)
	tb, _ := json.Marshal(templates)
	if strings.Contains(string(lb)+string(tb), "south") || !strings.Contains(string(lb), mcpserver.AlarmsURI) || !strings.Contains(string(tb), "physmcp://history/{site}") {
		t.Errorf("through the view north: resources %s, templates %s", lb, tb)
	}
	if text, err := readText(t, view, mcpserver.SiteHistoryIndexURI); err != nil || strings.Contains(text, "south") || !strings.Contains(text, "/north/") {
		t.Errorf("physmcp://history through the view north: %s %v", text, err)
	}
	southURI := "physmcp://history/south/gw_greenhouse_001/temperature_zone_a?since=1h&step=1m"
	if text, err := readText(t, all, southURI); err != nil || !strings.Contains(text, `"site": "south"`) {
		t.Fatalf("south's history through the whole fleet: %s %v", text, err)
	}
	if _, err := readText(t, view, southURI); err == nil || !strings.Contains(err.Error(), `is not in the view "north"`) {
		t.Errorf("south's history through the view north: %v", err)
	}
	if text, err := readText(t, view, "physmcp://history/north/gw_greenhouse_001/temperature_zone_a?since=1h&step=1m"); err != nil || !strings.Contains(text, `"site": "north"`) {
		t.Errorf("north's history through the view north: %s %v", text, err)
	}

	if err := view.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.AlarmsURI}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the endpoint following both states", func() bool { return followed(e, "north", 0) && followed(e, "south", 0) })
	before := w.updates()
	// South's alarm first, then north's: the updates are sent in the
	// order the states arrive, so once north's is told, a south update
	// would have been told before it.
	south.heat(35)
	waitFor(t, "south's alarm followed", func() bool { return followed(e, "south", 1) })
	north.heat(35)
	waitFor(t, "north's alarm told", func() bool { return w.updates() > before && followed(e, "north", 1) })
	if n := w.settled() - before; n != 1 {
		t.Errorf("the view north was told %d updates, want 1 (north's alarm; south's is outside it)", n)
	}
	text, err := readText(t, view, mcpserver.AlarmsURI)
	if err != nil || strings.Contains(text, "south") || !strings.Contains(text, "north") || strings.Count(text, `"capability"`) != 1 {
		t.Errorf("physmcp://alarms through the view north: %s %v", text, err)
	}
	if text, err := readText(t, all, mcpserver.AlarmsURI); err != nil || !strings.Contains(text, `"site": "south"`) || strings.Count(text, `"capability"`) != 2 {
		t.Errorf("physmcp://alarms through the whole fleet: %s %v", text, err)
	}
}
