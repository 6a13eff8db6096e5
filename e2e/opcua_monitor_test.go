package e2e

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/drivers/opcua/opcuatest"
)

// Monitored items through the built binary against node-opcua: read_process
// has poll_ms and a deadband, so physd monitors ns=1;s=Process (EURange
// 0..200) instead of polling it; do_process_set writes the same node.
const opcuaMonitorManifest = `physmcp_version: "0.1"
device:
  id: gw_opcua_mon
  type: plc
  location: {zone: plant}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  plc: {type: opcua, endpoint: "ENDPOINT", timeout_ms: 2000, connect_timeout_ms: 5000, reconnect_backoff_ms: 200, keepalive_ms: 1000}
capabilities:
  - name: process
    kind: read
    description: process value the server pushes
    data_type: float
    unit: percent
    range: {min: 0, max: 200}
    semantic_tags: [plant]
    poll_ms: 200
    deadband: 2
    binding: {type: opcua, bus: plc, node: "ns=1;s=Process"}
  - name: process_set
    kind: do
    description: the process node, written
    data_type: float
    unit: percent
    range: {min: 0, max: 200}
    semantic_tags: [plant]
    binding: {type: opcua, bus: plc, node: "ns=1;s=Process"}
`

func startOPCUAMonitored(t *testing.T, endpoint string) (*daemon, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "physmcp.manifest.yml")
	if err := os.WriteFile(p, []byte(strings.ReplaceAll(opcuaMonitorManifest, "ENDPOINT", endpoint)), 0o600); err != nil {
		t.Fatal(err)
	}
	return startHTTP(t, daemonOpts{manifest: p}), p
}

// uriUpdates records the resources/updated notifications by URI.
type uriUpdates struct {
	mu  sync.Mutex
	got map[string][]time.Time
}

func (u *uriUpdates) add(_ context.Context, r *mcp.ResourceUpdatedNotificationRequest) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.got[r.Params.URI] = append(u.got[r.Params.URI], time.Now())
}

func (u *uriUpdates) count(uri string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.got[uri])
}

// firstGood reads name until it is good (or within passes) and returns
// that read; before, when set, judges each read before it.
func firstGood(t *testing.T, cs *mcp.ClientSession, name string, within time.Duration, before func(map[string]any)) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		o := readOPCUA(t, cs, name)
		if o["quality"] == "good" {
			return o
		}
		if before != nil {
			before(o)
		}
		if time.Now().After(deadline) {
			t.Fatalf("read_%s not good within %v: %v", name, within, o)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricValue is the value of one series in /metrics ("" when absent).
func metricValue(t *testing.T, d *daemon, series string) string {
	t.Helper()
	_, body := d.request(t, "GET", "/metrics", "")
	for _, l := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// TestOPCUAMonitoredDeadband: an MCP client subscribed to the monitored
// capability's observation resource is told when the value moves beyond
// the deadband and not when it moves inside it; read_ answers from the
// subscription (within the band of the server's value) without a device
// read; /metrics counts the item and its notifications.
func TestOPCUAMonitoredDeadband(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	d, manifestFile := startOPCUAMonitored(t, srv.Endpoint)
	cs := connectHTTP(t, d, "2026-07-28")
	ups := &uriUpdates{got: map[string][]time.Time{}}
	c := mcp.NewClient(&mcp.Implementation{Name: "opcua-monitor-e2e", Version: "1"}, &mcp.ClientOptions{Capabilities: &mcp.ClientCapabilities{}, ResourceUpdatedHandler: ups.add})
	ls, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.url("/mcp")}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close() })
	const uri = "physmcp://obs/process"
	if err := ls.Subscribe(context.Background(), &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	if o := firstGood(t, cs, "process", 20*time.Second, nil); o["value"] != 50.0 {
		t.Fatalf("read_process: %v, the server holds 50", o)
	}
	// The first value counts as a change; updates are at most one a
	// second per resource, so let the first one go by.
	time.Sleep(1500 * time.Millisecond)
	base := ups.count(uri)

	if a := doModbus(t, cs, "do_process_set", 51.5, "inside"); a.Status != "success" {
		t.Fatalf("do_process_set 51.5: %+v", a)
	}
	time.Sleep(2500 * time.Millisecond)
	if n := ups.count(uri); n != base {
		t.Fatalf("%d updates of %s after a move of 1.5 with deadband 2, want none; physd's log:\n%s", n-base, uri, d.stderr.String())
	}
	o := readOPCUA(t, cs, "process")
	if v, _ := o["value"].(float64); o["quality"] != "good" || o["cached"] != true || math.Abs(v-51.5) > 2 {
		t.Fatalf("read_process inside the band: %v, want a good value from the subscription within 2 of 51.5", o)
	}
	// Keep-alives every second (5 publishing intervals of 200 ms) vouch
	// for it, as of one sampling interval before each.
	if age, _ := o["age_ms"].(float64); age > 1500 {
		t.Fatalf("read_process inside the band is %v ms old: the keep-alives vouch for it", age)
	}

	if a := doModbus(t, cs, "do_process_set", 55.0, "beyond"); a.Status != "success" {
		t.Fatalf("do_process_set 55: %+v", a)
	}
	waitFor(t, "an update of "+uri+" after a move of 5", func() bool { return ups.count(uri) > base })
	rr, err := ls.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: uri})
	if err != nil {
		t.Fatal(err)
	}
	var obs map[string]any
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &obs); err != nil || obs["value"] != 55.0 || obs["quality"] != "good" {
		t.Fatalf("%s after the move: %v %s", uri, err, rr.Contents[0].Text)
	}
	if v := metricValue(t, d, `physd_bus_monitored_items{bus="plc"}`); v != "1" {
		t.Fatalf("physd_bus_monitored_items = %q, want 1", v)
	}
	if v := metricValue(t, d, `physd_bus_notifications{bus="plc"}`); v != "2" {
		t.Fatalf("physd_bus_notifications = %q, want 2 (the first value and the move beyond the band)", v)
	}

	// Manifest reloads (SIGHUP): one that keeps read_process keeps its
	// item (no new first value); one that redefines it (another deadband)
	// replaces the item: one item still, and the new item's first value.
	reload := func(from, to string, n int) {
		t.Helper()
		src, err := os.ReadFile(manifestFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(manifestFile, []byte(strings.Replace(string(src), from, to, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := d.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the reload", func() bool { return len(auditEvents(t, d.state, "manifest_reload")) == n })
	}
	reload("the process node, written", "the process node, set by the test", 1)
	time.Sleep(time.Second)
	if items, notes := metricValue(t, d, `physd_bus_monitored_items{bus="plc"}`), metricValue(t, d, `physd_bus_notifications{bus="plc"}`); items != "1" || notes != "2" {
		t.Fatalf("after a reload that keeps read_process: %s items, %s notifications; want its item kept (1, 2)", items, notes)
	}
	reload("deadband: 2", "deadband: 3", 2)
	waitFor(t, "the redefined item's first value", func() bool {
		return metricValue(t, d, `physd_bus_notifications{bus="plc"}`) == "3"
	})
	if items := metricValue(t, d, `physd_bus_monitored_items{bus="plc"}`); items != "1" {
		t.Fatalf("after a reload that redefines read_process: %s items, want 1 (the old one deleted)", items)
	}
}

// TestOPCUAMonitoredServerRestart: the server restarts under the
// subscription and comes back with another value. While it is down
// read_process is never good; physd reconnects within its deadline,
// subscribes again, and the first good value is the server's new one,
// never the one from before.
func TestOPCUAMonitoredServerRestart(t *testing.T) {
	t.Parallel() // its own server on a free port and its own daemon
	srv := opcuatest.Start(t, opcuatest.Options{})
	d, _ := startOPCUAMonitored(t, srv.Endpoint)
	cs := connectHTTP(t, d, "2026-07-28")
	if o := firstGood(t, cs, "process", 20*time.Second, nil); o["value"] != 50.0 {
		t.Fatalf("read_process: %v", o)
	}
	// The first good read may be a device read: the restart is under the
	// subscription only once the server holds the item. (On a loaded
	// machine runs ended with the item back and no loss counted: the
	// server had been stopped before the subscription was live.)
	waitFor(t, "the item on the server", func() bool {
		return metricValue(t, d, `physd_bus_monitored_items{bus="plc"}`) == "1"
	})
	srv.Stop()
	for i := range 5 {
		if o := readOPCUA(t, cs, "process"); o["quality"] == "good" {
			t.Fatalf("read %d with the server down labelled good: %v", i, o)
		}
		time.Sleep(100 * time.Millisecond)
	}
	v := 77.0
	srv.RestartWith(func(o *opcuatest.Options) { o.Process = &v })
	up := time.Now()
	// Until then the value from before is served stale or degraded (the
	// bus is marked down), never good.
	if o := firstGood(t, cs, "process", 10*time.Second, nil); o["value"] != 77.0 {
		t.Fatalf("first good read after the restart: %v, the server holds 77", o)
	}
	t.Logf("first good read %v after the server was ready again", time.Since(up).Round(time.Millisecond))
	// The value comes from the new subscription, not from a device read.
	// At least one loss (a loaded machine may lose the new session once
	// more while it comes up), and one item again.
	var items, losses string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		items, losses = metricValue(t, d, `physd_bus_monitored_items{bus="plc"}`), metricValue(t, d, `physd_bus_subscription_losses{bus="plc"}`)
		if items == "1" && losses != "" && losses != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the subscription not back within 15 s: %q monitored items, %q subscription losses", items, losses)
		}
	}
	t.Logf("after the restart: %s monitored items, %s subscription losses", items, losses)
	if o := readOPCUA(t, cs, "process"); o["cached"] != true || o["value"] != 77.0 {
		t.Fatalf("read_process after the resubscription: %v, want 77 from the subscription", o)
	}
}
