package mcpserver_test

import (
	"context"
	"encoding/json"
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
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// observedPlant: heater_power_zone_a reads the heater power do_heater_zone_a
// sets, polled every second with a 5 % deadband.
const observedPlant = `physmcp_version: "0.1"
device: {id: obs_node, type: greenhouse_controller, location: {zone: zone_a}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
      zone_a: {ambient_c: 12, initial_c: 18}
capabilities:
  - name: heater_zone_a
    kind: do
    description: Heater power in zone A.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater]
  - name: heater_power_zone_a
    kind: read
    description: Heater power in zone A as the controller reports it.
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heater, power]
    poll_ms: 1000
    deadband: "5%"
    alarms: {high: 50, for_ms: 2000}
`

const heaterURI = mcpserver.ObsURIPrefix + "heater_power_zone_a"

type obsRig struct {
	srv     *mcpserver.Server
	n       *node.Node
	cs      *mcp.ClientSession
	mu      sync.Mutex
	updates []string
}

func (r *obsRig) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.updates)
}

// openObsRig serves observedPlant in memory to a go-sdk client of era.
func openObsRig(t *testing.T, era string, opts mcpserver.Options) *obsRig {
	t.Helper()
	m, err := manifest.Parse("obs.yml", []byte(observedPlant))
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
	r := &obsRig{n: n}
	if opts.History != nil {
		h, err := history.Open(filepath.Join(dir, history.FileName), m, history.Config{})
		if err != nil {
			t.Fatal(err)
		}
		h.Follow(n)
		t.Cleanup(func() { h.Close() })
		opts.History = h
	}
	if opts.Alarms != nil {
		e := alarms.New(m)
		e.Follow(n)
		t.Cleanup(e.Close)
		opts.Alarms = e
	}
	srv := mcpserver.New(n, opts)
	r.srv = srv
	ct, srvT := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), srvT, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "obs-test", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			r.mu.Lock()
			r.updates = append(r.updates, req.Params.URI)
			r.mu.Unlock()
		},
	})
	r.cs, err = c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: era})
	if err != nil {
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

func (r *obsRig) setHeater(t *testing.T, v float64, key string) {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := r.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_zone_a", Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "test"}})
	if err != nil {
		t.Fatal(err)
	}
	var res promcp.DoResult
	if err := json.Unmarshal(body, &res); err != nil || res.Status != promcp.StatusSuccess {
		t.Fatalf("do_heater_zone_a(%v): %s", v, body)
	}
}

// TestObservationResourceSubscription: in both protocol eras a subscribed
// go-sdk client is told within one poll interval of a change beyond the
// deadband, and not of changes inside it; reading the resource gives the
// observation; updates are rate-limited with the last change delivered.
func TestObservationResourceSubscription(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := openObsRig(t, era, mcpserver.Options{ObsMinInterval: 3 * time.Second})
				ctx := context.Background()
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: heaterURI}); err != nil {
					t.Fatal(err)
				}
				time.Sleep(1001 * time.Millisecond) // first poll: the first observation counts
				synctest.Wait()
				if r.count() != 1 {
					t.Fatalf("after the first poll: %d updates, want 1", r.count())
				}
				time.Sleep(3 * time.Second) // out of the rate limit; no change meanwhile
				synctest.Wait()
				if r.count() != 1 {
					t.Fatalf("unchanged value: %d updates, want 1", r.count())
				}

				r.setHeater(t, 4, "inside") // 4 % < 5 % of 0..100
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if r.count() != 1 {
					t.Fatalf("change inside the deadband: %d updates, want 1", r.count())
				}

				r.setHeater(t, 40, "beyond")
				time.Sleep(time.Second) // one poll interval
				synctest.Wait()
				if r.count() != 2 || r.updates[1] != heaterURI {
					t.Fatalf("change beyond the deadband: updates %v, want a second one for %s", r.updates, heaterURI)
				}
				res, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: heaterURI})
				if err != nil {
					t.Fatal(err)
				}
				var o promcp.Observation
				if err := json.Unmarshal([]byte(res.Contents[0].Text), &o); err != nil || o.Value != 40.0 || o.Quality != promcp.QualityGood {
					t.Fatalf("resource = %s (%v)", res.Contents[0].Text, err)
				}

				// Rate limit: two more changes inside 3 s give one trailing update.
				r.setHeater(t, 60, "r1")
				time.Sleep(time.Second)
				r.setHeater(t, 80, "r2")
				time.Sleep(time.Second)
				synctest.Wait()
				if r.count() != 2 {
					t.Fatalf("inside the rate limit: %d updates, want 2", r.count())
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if r.count() != 3 {
					t.Fatalf("after the rate limit: %d updates, want 3 (the trailing one)", r.count())
				}
				time.Sleep(5 * time.Second)
				synctest.Wait()
				if r.count() != 3 {
					t.Fatalf("no change since: %d updates, want 3", r.count())
				}

				if err := r.cs.Unsubscribe(ctx, &mcp.UnsubscribeParams{URI: heaterURI}); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				r.setHeater(t, 10, "after")
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if r.count() != 3 {
					t.Fatalf("after unsubscribe: %d updates, want 3", r.count())
				}
			})
		})
	}
}

// TestObservationSubscribeUnknown: subscribing to something that is not an
// observation resource is refused with the fix.
func TestObservationSubscribeUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := openObsRig(t, "2025-11-25", mcpserver.Options{})
		err := r.cs.Subscribe(context.Background(), &mcp.SubscribeParams{URI: "physmcp://obs/nope"})
		if err == nil || !strings.Contains(err.Error(), "fix: subscribe to physmcp://obs/<capability>") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestObservationOverHTTP: on physd's stateless HTTP endpoint a 2026-07-28
// client subscribes with subscriptions/listen and is told of a do_'s
// change; a 2025-11-25 resources/subscribe, which has no stream there, is
// refused with the fix.
func TestObservationOverHTTP(t *testing.T) {
	s := newSurface(t, "", mcpserver.Options{}, nil)
	got := make(chan string, 16)
	c := mcp.NewClient(&mcp.Implementation{Name: "obs-http", Version: "1"}, &mcp.ClientOptions{
		Capabilities: &mcp.ClientCapabilities{},
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			got <- req.Params.URI
		},
	})
	ctx := context.Background()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.srv.URL + "/mcp", HTTPClient: s.srv.Client()}, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	uri := mcpserver.ObsURIPrefix + "fan_zone_b"
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: uri}); err != nil {
		t.Fatal(err)
	}
	// The listen stream is opened in the background: call until the update
	// comes (each do_ reads the fan before and after its write).
	deadline := time.After(10 * time.Second)
	for i := 0; ; i++ {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "do_fan_zone_b", Arguments: map[string]any{"value": 20 + 30*(i%2), "idempotency_key": "http-" + string(rune('a'+i))}})
		if err != nil || res.IsError {
			t.Fatalf("do_fan_zone_b: %v %+v", err, res)
		}
		select {
		case u := <-got:
			if u != uri {
				t.Fatalf("update for %s, want %s", u, uri)
			}
			legacy := connectPath(t, s, "/mcp", "2025-11-25", "")
			err := legacy.Subscribe(ctx, &mcp.SubscribeParams{URI: uri})
			if err == nil || !strings.Contains(err.Error(), "use protocol 2026-07-28 (subscriptions/listen") {
				t.Fatalf("legacy subscribe over stateless HTTP: %v", err)
			}
			return
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("no resource update within 10 s of do_ calls")
		}
	}
}

// TestHistoryResourceTemplate: the history template is listed, answers the
// last minutes of a polled capability in buckets, and a bad query names the
// parameter and the fix.
func TestHistoryResourceTemplate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := openObsRig(t, "2026-07-28", mcpserver.Options{History: &history.History{}})
		ctx := context.Background()
		tl, err := r.cs.ListResourceTemplates(ctx, nil)
		if err != nil || len(tl.ResourceTemplates) != 1 || tl.ResourceTemplates[0].URITemplate != mcpserver.HistoryURITemplate {
			t.Fatalf("templates: %+v %v", tl, err)
		}
		r.setHeater(t, 30, "h1")
		time.Sleep(2*time.Minute + 500*time.Millisecond)
		synctest.Wait()
		res, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "physmcp://history/heater_power_zone_a?since=5m&step=1m"})
		if err != nil {
			t.Fatal(err)
		}
		var s history.Series
		if err := json.Unmarshal([]byte(res.Contents[0].Text), &s); err != nil {
			t.Fatal(err)
		}
		if s.Capability != "read_heater_power_zone_a" || s.StepS != 60 || len(s.Buckets) != 3 || s.Buckets[0].Count != 59 || s.Buckets[1].Count != 60 ||
			*s.Buckets[1].Min != 30 || *s.Buckets[1].Max != 30 || *s.Buckets[1].Mean != 30 || s.Buckets[1].GoodShare != 1 {
			t.Fatalf("history = %s", res.Contents[0].Text)
		}
		for uri, want := range map[string]string{
			"physmcp://history/heater_power_zone_a?step=90s":    "step: 1m30s is not a multiple of the history's resolution 1m0s; fix: use step=1m0s",
			"physmcp://history/heater_power_zone_a?since=later": `since: "later" is neither an RFC 3339 time nor a duration; fix:`,
			"physmcp://history/nope":                            `no history of "nope"`,
		} {
			_, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: err = %v, want %q", uri, err, want)
			}
		}
	})
}

// TestAlarmsResource: a raised alarm updates physmcp://alarms for its
// subscriber, the resource lists it, and can_do's context names it for the
// matched capabilities.
func TestAlarmsResource(t *testing.T) {
	for _, era := range eras {
		t.Run(era, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := openObsRig(t, era, mcpserver.Options{Alarms: &alarms.Engine{}})
				ctx := context.Background()
				if err := r.cs.Subscribe(ctx, &mcp.SubscribeParams{URI: mcpserver.AlarmsURI}); err != nil {
					t.Fatal(err)
				}
				r.setHeater(t, 70, "hot")
				time.Sleep(1500 * time.Millisecond)
				synctest.Wait()
				if r.count() != 0 {
					t.Fatalf("before for_ms: %v", r.updates)
				}
				time.Sleep(2 * time.Second)
				synctest.Wait()
				if r.count() != 1 || r.updates[0] != mcpserver.AlarmsURI {
					t.Fatalf("after for_ms: updates %v", r.updates)
				}
				res, err := r.cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.AlarmsURI})
				if err != nil {
					t.Fatal(err)
				}
				var doc struct{ Active []alarms.Active }
				if err := json.Unmarshal([]byte(res.Contents[0].Text), &doc); err != nil || len(doc.Active) != 1 ||
					doc.Active[0].Capability != "read_heater_power_zone_a" || doc.Active[0].Kind != "high" {
					t.Fatalf("alarms = %s", res.Contents[0].Text)
				}
				cr, err := r.cs.CallTool(ctx, &mcp.CallToolParams{Name: "can_do", Arguments: map[string]any{
					"intent": map[string]any{"semantic_tags": []string{"heater"}, "action": "decrease", "target": "heater"}}})
				if err != nil || cr.IsError {
					t.Fatalf("can_do: %v %+v", err, cr)
				}
				var rep promcp.CapabilityReport
				raw, _ := json.Marshal(cr.StructuredContent)
				if err := json.Unmarshal(raw, &rep); err != nil {
					t.Fatal(err)
				}
				if len(rep.Context.ActiveAlarms) != 1 || rep.Context.ActiveAlarms[0].Capability != "read_heater_power_zone_a" ||
					!strings.Contains(rep.Context.ActiveAlarms[0].Message, "70 percent, above the high limit 50") {
					t.Fatalf("can_do context = %s", raw)
				}
			})
		})
	}
}

// TestObservationResourcesFollowViews: an endpoint's view bounds the
// observation and history resources as it bounds its tools.
func TestObservationResourcesFollowViews(t *testing.T) {
	s := newSurface(t, "", mcpserver.Options{}, nil)
	ctx := context.Background()
	for _, era := range eras {
		cs := connectPath(t, s, "/mcp/zone_a", era, "")
		if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + "temperature_zone_a"}); err != nil {
			t.Errorf("%s: in the view: %v", era, err)
		}
		_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + "temperature_zone_b"})
		if err == nil || !strings.Contains(err.Error(), `is not in the view "zone_a" of this endpoint`) {
			t.Errorf("%s: outside the view: %v", era, err)
		}
		if _, err := connectPath(t, s, "/mcp", era, "").ReadResource(ctx, &mcp.ReadResourceParams{URI: mcpserver.ObsURIPrefix + "temperature_zone_b"}); err != nil {
			t.Errorf("%s: the default endpoint: %v", era, err)
		}
	}
}
