package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Attacks on the fleet from the outside: sites that lie, answer late,
// twice or in pieces, forged requests and go-aheads, and views at the
// fleet endpoint, each against physd fleet with its hub embedded.

// fakeSite is a site's gateway played by the test over NATS with the
// site's own credentials: a valid catalog and heartbeats (so the fleet
// endpoint lists it as up), and whatever answers the test gives its
// requests. It can do nothing the hub does not let the site do.
type fakeSite struct {
	nc       *nats.Conn
	site     string
	device   string
	base     string
	cat      fleet.Catalog
	mu       sync.Mutex
	handlers map[string]func(*nats.Msg)
	asked    atomic.Int64 // requests other than for its catalog
}

func startFakeSite(t *testing.T, hubAddr, site string) *fakeSite {
	t.Helper()
	m, err := manifest.Load(repoPath("examples/fleet/" + site + ".manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	pw, err := os.ReadFile(repoPath("examples/fleet/secrets/" + site + ".pw"))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect("nats://"+hubAddr, nats.UserInfo(site, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(hub.SiteInbox(site)))
	if err != nil {
		t.Fatal(err)
	}
	const every = 200 * time.Millisecond
	f := &fakeSite{nc: nc, site: site, device: m.Device.ID, base: fleet.Base("physd", site, m.Device.ID), handlers: map[string]func(*nats.Msg){},
		cat: fleet.CatalogOf(m, site, []string{manifest.FleetServeRead, manifest.FleetServeCanDo, manifest.FleetServeDo}, "fake-"+site, fleet.StateServing, every)}
	if _, err := nc.Subscribe(f.base+".req.*", func(msg *nats.Msg) {
		kind := msg.Subject[strings.LastIndexByte(msg.Subject, '.')+1:]
		if kind == fleet.KindCatalog {
			b, _ := json.Marshal(f.cat)
			f.reply(msg, fleet.ReplyAnswer, b, "")
			return
		}
		f.asked.Add(1)
		f.mu.Lock()
		h := f.handlers[kind]
		f.mu.Unlock()
		if h != nil {
			go h(msg)
		}
	}); err != nil {
		t.Fatal(err)
	}
	cat, _ := json.Marshal(f.cat)
	hb, _ := json.Marshal(fleet.Heartbeat{Instance: f.cat.Instance, IntervalMS: every.Milliseconds(), Catalog: f.cat.Hash, State: fleet.StateServing})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			_ = nc.Publish(f.base+".catalog", cat)
			_ = nc.Publish(f.base+".hb", hb)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done; nc.Close() })
	return f
}

// on answers the requests of kind with h (nil: no answer at all).
func (f *fakeSite) on(kind string, h func(*nats.Msg)) {
	f.mu.Lock()
	f.handlers[kind] = h
	f.mu.Unlock()
}

func (f *fakeSite) reply(m *nats.Msg, kind string, body []byte, instance string) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(fleet.HeaderReply, kind)
	if instance != "" {
		r.Header.Set(fleet.HeaderInstance, instance)
	}
	r.Data = body
	_ = f.nc.PublishMsg(r)
}

// ackThen acknowledges every do_ request and answers its go-ahead with
// then (nil: never).
func (f *fakeSite) ackThen(then func(*nats.Msg)) {
	f.on(fleet.KindDo, func(m *nats.Msg) { f.reply(m, fleet.ReplyAck, nil, f.cat.Instance) })
	f.on(fleet.KindGo, then)
}

// obs publishes an observation on the site's own subject.
func (f *fakeSite) obs(t *testing.T, o promcp.Observation) {
	t.Helper()
	b, _ := json.Marshal(o)
	if err := f.nc.Publish(f.base+".obs."+o.Capability, b); err != nil {
		t.Fatal(err)
	}
	_ = f.nc.Flush()
}

// callWithin is call bounded by d: a fleet that never answers fails the
// test instead of hanging it.
func callWithin(t *testing.T, cs *mcp.ClientSession, d time.Duration, name string, args any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s(%v): %v", name, args, err)
	}
	return res
}

// heatIntent is can_do's question for zone_c's heater at every site.
var heatIntent = map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_c", "value": 30}}

// canDoEntries are a can_do answer's candidates and blocked entries.
func canDoEntries(rep map[string]any) []map[string]any {
	var out []map[string]any
	for _, k := range []string{"candidates", "blocked"} {
		list, _ := rep[k].([]any)
		for _, e := range list {
			m := e.(map[string]any)
			m["list"] = k
			out = append(out, m)
		}
	}
	return out
}

// TestAttackFleetLyingSites: sites that answer can_do after the deadline,
// twice, in another site's or gateway's name, or with something that is
// not a report; a read whose age is negative or absurd, or stamped in
// the future; a do_ whose go-ahead is answered with nothing, with a
// malformed reply, with a body that is not a do_ result or is another
// capability's. The fleet reports every matching gateway (blocked when it
// did not answer usably), takes nothing a site says about another, never
// serves a negative age or a stale value as fresh, and answers a do_ it
// cannot be sure of as partial / outcome_unknown.
func TestAttackFleetLyingSites(t *testing.T) {
	t.Parallel() // its own hub on a free port, its own processes
	hubAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f := startFleet(t, hubAddr)
	north, south, east := startFakeSite(t, hubAddr, "north"), startFakeSite(t, hubAddr, "south"), startFakeSite(t, hubAddr, "east")
	waitFleetMembers(t, f, map[string]string{"north/gw_greenhouse_001": "up", "south/gw_greenhouse_001": "up", "east/gw_greenhouse_001": "up"})
	cs := connectAsPath(t, f, "/mcp", operatorToken)

	report := func(cands ...promcp.Candidate) []byte {
		b, _ := json.Marshal(promcp.CapabilityReport{Feasible: true, Candidates: cands, Blocked: []promcp.Blocked{}})
		return b
	}
	heater := func(site, device string, perm promcp.Permission) promcp.Candidate {
		return promcp.Candidate{Capability: "do_heater_zone_c", Source: device, DeviceID: device, Site: site, Permission: perm, Kind: manifest.KindDo, Zone: "zone_c"}
	}
	// North answers after the deadline (call_timeout_ms 1000).
	north.on(fleet.KindCanDo, func(m *nats.Msg) {
		time.Sleep(1500 * time.Millisecond)
		north.reply(m, fleet.ReplyAnswer, report(heater("north", north.device, promcp.PermAllowed)), "")
	})
	// South answers twice, and its answer speaks for north and for a
	// gateway and a capability it does not have.
	south.on(fleet.KindCanDo, func(m *nats.Msg) {
		south.reply(m, fleet.ReplyAnswer, report(heater("south", south.device, promcp.PermAllowed), heater("north", "gw_rogue", promcp.PermAllowed),
			heater("north", north.device, promcp.PermAllowed), promcp.Candidate{Capability: "do_rogue_valve", Source: south.device, DeviceID: south.device, Permission: promcp.PermAllowed, Kind: manifest.KindDo}), "")
		south.reply(m, fleet.ReplyAnswer, report(heater("south", south.device, promcp.PermPolicyDenied)), "")
	})
	// East answers with something that is not a report.
	east.on(fleet.KindCanDo, func(m *nats.Msg) { east.reply(m, fleet.ReplyAnswer, []byte(`{"candidates": 7`), "") })

	start := time.Now()
	rep := structured(t, call(t, cs, "can_do", heatIntent))
	t.Logf("can_do with a late, a double-speaking and a garbled site: %v in %v", rep["metadata"], time.Since(start))
	bySite := map[string]map[string]bool{}
	candidates := map[string]bool{}
	for _, e := range canDoEntries(rep) {
		site, src, capability := fmt.Sprint(e["site"]), fmt.Sprint(e["source"]), fmt.Sprint(e["capability"])
		if src != "gw_greenhouse_001" || capability != "do_heater" && !strings.HasPrefix(capability, "do_heater") {
			t.Errorf("can_do lists what no site has: %v", e)
			continue
		}
		if e["list"] == "candidates" {
			k := fmt.Sprint(site, src, capability, e["zone"])
			if candidates[k] {
				t.Errorf("can_do lists a candidate twice: %v", e)
			}
			candidates[k] = true
		}
		if bySite[site] == nil {
			bySite[site] = map[string]bool{}
		}
		bySite[site][fmt.Sprintf("%s:%v:%v", e["list"], e["permission"], e["code"])] = true
		if site == "east" && strings.Contains(fmt.Sprint(e["reason"]), "did not answer in time") {
			t.Errorf("east answered in time, with something that is not a report: %v", e["reason"])
		}
	}
	want := map[string]string{"north": "blocked:source_unreachable:site_unreachable", "south": "candidates:allowed:<nil>", "east": "blocked:source_unreachable:site_unreachable"}
	for s, w := range want {
		if len(bySite[s]) != 1 || !bySite[s][w] {
			t.Errorf("can_do, site %s: %v, want only %q (all: %v)", s, bySite[s], w, bySite)
		}
	}
	md := rep["metadata"].(map[string]any)
	if md["peers_matched"] != float64(3) || md["responses_received"] != float64(1) || md["responses_dropped_late"] != float64(1) {
		t.Errorf("can_do metadata: %v", md)
	}

	// Reads: a value stamped an hour ahead with a negative age, and one
	// whose age overflows a duration; neither is younger than its arrival,
	// and the absurdly old one is stale.
	future := time.Now().Add(time.Hour).UTC()
	north.obs(t, promcp.Observation{Value: 21.5, Unit: "celsius", Timestamp: future, Quality: promcp.QualityGood, Capability: "read_temperature_zone_a",
		Source: north.device, AgeMS: -3_600_000})
	south.obs(t, promcp.Observation{Value: 19.0, Unit: "celsius", Timestamp: time.Unix(0, 0).UTC(), Quality: promcp.QualityGood, Capability: "read_temperature_zone_a",
		Source: south.device, AgeMS: 1 << 62})
	time.Sleep(200 * time.Millisecond) // the observations reach the fleet endpoint
	for _, site := range []string{"north", "south"} {
		args := map[string]any{"site": site, "zone": "zone_a"} // any age: the fleet's copy
		if site == "north" {
			args["max_age_ms"] = 60_000 // a copy at most a minute old; north's claims to be younger than new
		}
		r := structured(t, call(t, cs, "read_temperature", args))
		t.Logf("read_temperature at %s: %v", site, r)
		if age, _ := r["age_ms"].(float64); age < 0 {
			t.Errorf("%s: a negative age: %v", site, r)
		}
		if site == "south" && r["quality"] == "good" {
			t.Errorf("south's value, observed in 1970, is served as fresh: %v", r)
		}
	}
	// A read through the gateway that answers a negative age.
	east.on(fleet.KindRead, func(m *nats.Msg) {
		b, _ := json.Marshal(promcp.Observation{Value: 17.0, Unit: "celsius", Timestamp: future, Quality: promcp.QualityGood, Capability: "read_temperature_zone_a",
			Source: east.device, AgeMS: -5000})
		east.reply(m, fleet.ReplyAnswer, b, "")
	})
	for range 2 { // through east, then from the fleet's copy
		r := structured(t, call(t, cs, "read_temperature", map[string]any{"site": "east", "zone": "zone_a", "max_age_ms": 0}))
		if age, _ := r["age_ms"].(float64); age < 0 {
			t.Errorf("east: a negative age: %v", r)
		}
	}

	// do_: the go-ahead answered with no reply kind, with an unknown one,
	// with a body that is not a do_ result, with another capability's
	// result, and not at all (the WAN cut after the go-ahead left). None
	// is a failure or an error that says nothing was done.
	heat := func(key string) map[string]any {
		t.Helper()
		res := callWithin(t, cs, 20*time.Second, "do_heater", map[string]any{"site": "north", "zone": "zone_c", "value": 30, "idempotency_key": key})
		if res.IsError {
			t.Errorf("%s: a tool error: %s", key, text(res))
			return nil
		}
		return structured(t, res)
	}
	other, _ := json.Marshal(promcp.DoResult{Status: promcp.StatusSuccess, Capability: "do_vent_zone_c", Source: north.device, Verified: true})
	for key, then := range map[string]func(*nats.Msg){
		"no-kind":     func(m *nats.Msg) { north.reply(m, "", []byte(`{"status":"failed"}`), "") },
		"bogus-kind":  func(m *nats.Msg) { north.reply(m, "bogus", nil, "") },
		"not-json":    func(m *nats.Msg) { north.reply(m, fleet.ReplyAnswer, []byte(`garbage`), "") },
		"other-cap":   func(m *nats.Msg) { north.reply(m, fleet.ReplyAnswer, other, "") },
		"no-status":   func(m *nats.Msg) { north.reply(m, fleet.ReplyAnswer, []byte(`{"capability":"do_heater_zone_c"}`), "") },
		"wan-cut-mid": nil,
	} {
		north.ackThen(then)
		if r := heat(key); r != nil && (r["status"] != "partial" || r["code"] != "outcome_unknown" || r["verified"] != false) {
			t.Errorf("%s: %v, want partial / outcome_unknown", key, r)
		}
	}
}
