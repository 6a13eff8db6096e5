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
	"github.com/physd/physd/internal/natstest"
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

// connectRogue is a connection with a site's credentials (and its
// inbox) that watches for the hub's refusals.
func connectRogue(t *testing.T, hubAddr, site string) *natstest.Watched {
	t.Helper()
	pw, err := os.ReadFile(repoPath("examples/fleet/secrets/" + site + ".pw"))
	if err != nil {
		t.Fatal(err)
	}
	return natstest.Watch(t, "nats://"+hubAddr, nats.UserInfo(site, strings.TrimSpace(string(pw))), nats.CustomInboxPrefix(hub.SiteInbox(site)))
}

// doRequest is a do_ request as the fleet endpoint sends it to a gateway.
func doRequest(subject, reply, from, id, key string, value any, credential string) *nats.Msg {
	v, _ := json.Marshal(value)
	b, _ := json.Marshal(map[string]any{"tool": "do_heater_zone_c", "value": json.RawMessage(v), "idempotency_key": key,
		"caller": map[string]any{"id": "token:operator_console", "role": "admin"}, "credential": credential})
	m := nats.NewMsg(subject)
	m.Reply, m.Data = reply, b
	m.Header.Set(fleet.HeaderFrom, from)
	m.Header.Set(fleet.HeaderCallID, id)
	m.Header.Set(fleet.HeaderBudget, "3000")
	return m
}

// TestAttackFleetForgedCalls: a real site (north, physd run, serving do_)
// behind the fleet endpoint, attacked from outside. South's credentials
// cannot send north a do_ or a go-ahead, take north's requests, hear
// north's replies or read north's streams. A do_ request captured at north
// (by a holder of north's own credentials) and replayed later, as is or
// with another value, moves nothing: the site's ledger answers it. A do_
// with no credential the site knows, or with another person's, runs as
// nobody or as that person, never as the key's first caller. Fifty
// concurrent do_ calls with one idempotency key actuate once, and every
// caller gets the same answer. Through a view of north, nothing of south
// is reachable by any MCP method.
func TestAttackFleetForgedCalls(t *testing.T) {
	t.Parallel() // its own hub on a free port, its own processes
	hubAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f := startFleet(t, hubAddr) // the view north: {sites: [north]}
	north := startHTTP(t, daemonOpts{manifest: fleetSiteManifest(t, "north", "nats://"+hubAddr), extra: []string{"--policy", greenhousePolicy}})
	south := startFakeSite(t, hubAddr, "south")
	waitFleetMembers(t, f, map[string]string{"north/gw_greenhouse_001": "up", "south/gw_greenhouse_001": "up"})
	cs := connectAsPath(t, f, "/mcp", operatorToken)
	const base = "physd.north.gw_greenhouse_001"
	writes := func() uint64 { return north.sim(t).writes("zone_c.heater") }
	before := writes()

	// South's credentials against north.
	rogue := connectRogue(t, hubAddr, "south")
	for _, m := range []*nats.Msg{doRequest(base+".req.do", hub.SiteInbox("south")+".r1", "fleet_hq/forged", "1", "forged-1", 30, operatorToken),
		doRequest(base+".req.go", hub.SiteInbox("south")+".r2", "fleet_hq/forged", "1", "forged-1", 30, operatorToken)} {
		m.Header.Set(fleet.HeaderInstance, "any")
		_ = rogue.Conn.PublishMsg(m)
		rogue.Refused(t, "Publish to", m.Subject)
	}
	for _, s := range []string{"physd.north.>", base + ".req.>", hub.SiteInbox("north") + ".>", hub.FleetInboxPrefix + ".>", "_INBOX.>"} {
		_, _ = rogue.Conn.SubscribeSync(s)
		rogue.Refused(t, "Subscription to", s)
	}
	for _, s := range []string{"$JS.API.DIRECT.GET.PHYSD_AUDIT." + base + ".audit", "$JS.API.DIRECT.GET.PHYSD_HISTORY." + base + ".hist.read_temperature_zone_a",
		"$JS.API.DIRECT.GET.PHYSD_ALARMS." + base + ".alarms", "$JS.API.DIRECT.GET.PHYSD_CATALOG." + base + ".catalog", "$JS.API.STREAM.MSG.GET.PHYSD_AUDIT",
		"$JS.API.CONSUMER.CREATE.PHYSD_AUDIT", hub.FleetInboxPrefix + ".north.x.1"} {
		_ = rogue.Conn.PublishRequest(s, hub.SiteInbox("south")+".r3", []byte(`{"last_by_subj":"`+base+`.audit","seq":1}`))
		rogue.Refused(t, "Publish to", s)
	}

	// A do_ through the fleet, its request captured by a holder of
	// north's credentials (they take north's requests), then replayed.
	insider := connectRogue(t, hubAddr, "north")
	captured := make(chan *nats.Msg, 4)
	if _, err := insider.Conn.Subscribe(base+".req.do", func(m *nats.Msg) { captured <- m }); err != nil {
		t.Fatal(err)
	}
	_ = insider.Conn.Flush()
	first := call(t, cs, "do_heater", map[string]any{"site": "north", "zone": "zone_c", "value": 30, "idempotency_key": "attack-replay"})
	if structured(t, first)["status"] != "success" || writes() != before+1 {
		t.Fatalf("the do_ through the fleet: %s; %d writes", text(first), writes()-before)
	}
	var orig *nats.Msg
	select {
	case orig = <-captured:
	case <-time.After(5 * time.Second):
		t.Fatal("north's credentials did not see the fleet's do_ request")
	}
	// The gateway may answer only under its site's subjects: the insider
	// listens for its answers where north's credentials may.
	request := func(m *nats.Msg) *nats.Msg {
		t.Helper()
		m.Reply = "physd.north.insider.req." + m.Header.Get(fleet.HeaderCallID) + "-" + m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		sub, err := insider.Conn.SubscribeSync(m.Reply)
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := insider.Conn.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
		r, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("replayed %s: %v", m.Subject, err)
		}
		return r
	}
	replay := func(id string, data []byte) string {
		t.Helper()
		m := nats.NewMsg(orig.Subject)
		m.Header, m.Data = orig.Header, data
		m.Header.Set(fleet.HeaderCallID, id)
		ack := request(m)
		if ack.Header.Get(fleet.HeaderReply) != fleet.ReplyAck {
			return string(ack.Data)
		}
		g := nats.NewMsg(base + ".req.go")
		g.Header.Set(fleet.HeaderFrom, orig.Header.Get(fleet.HeaderFrom))
		g.Header.Set(fleet.HeaderCallID, id)
		g.Header.Set(fleet.HeaderInstance, ack.Header.Get(fleet.HeaderInstance))
		return string(request(g).Data)
	}
	if got := replay("replay-1", orig.Data); got != text(first) {
		t.Errorf("the replayed request answered\n %s\nthe first call\n %s", got, text(first))
	}
	var call0 map[string]any
	_ = json.Unmarshal(orig.Data, &call0)
	call0["value"] = 75
	altered, _ := json.Marshal(call0)
	if got := replay("replay-2", altered); !strings.Contains(got, "different arguments") {
		t.Errorf("the replayed request with another value answered %s", got)
	}
	if w := writes(); w != before+1 {
		t.Errorf("replays wrote zone_c.heater: %d writes, want 1", w-before)
	}

	// The same key from other callers: a viewer, a token only the fleet
	// knows; neither runs, neither gets the operator's answer.
	for _, c := range []struct{ token, want string }{{viewerToken, "permission_insufficient"}, {fleetOnlyToken, "unauthenticated"}} {
		other := connectAsPath(t, f, "/mcp", c.token)
		r := structured(t, call(t, other, "do_heater", map[string]any{"site": "north", "zone": "zone_c", "value": 30, "idempotency_key": "attack-replay"}))
		if r["status"] != "failed" || r["code"] != c.want && r["permission"] != c.want {
			t.Errorf("the operator's key with %s's token: %v", c.want, r)
		}
	}
	if w := writes(); w != before+1 {
		t.Errorf("other callers' calls wrote zone_c.heater: %d writes, want 1", w-before)
	}

	// Fifty concurrent calls, one key: one actuation, one answer.
	sessions := make([]*mcp.ClientSession, 5)
	for i := range sessions {
		sessions[i] = connectAsPath(t, f, "/mcp", operatorToken)
	}
	answers := make([]string, 50)
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			res := callWithin(t, sessions[i%len(sessions)], 30*time.Second, "do_heater",
				map[string]any{"site": "north", "zone": "zone_c", "value": 42, "idempotency_key": "attack-50"})
			answers[i] = text(res)
			if res.IsError {
				answers[i] = "error: " + answers[i]
			}
		})
	}
	wg.Wait()
	distinct := map[string]int{}
	for _, a := range answers {
		distinct[a]++
	}
	if len(distinct) != 1 || !strings.Contains(answers[0], `"status":"success"`) {
		t.Errorf("50 calls with one key answered %d ways: %v", len(distinct), distinct)
	}
	if w := writes(); w != before+2 {
		t.Errorf("50 calls with one key wrote zone_c.heater %d times, want 1", w-before-1)
	}
	if n := len(auditLines(t, north.state, "do", "attack-50")); n != 1 {
		t.Errorf("north audited the key %d times, want 1", n)
	}

	// The view north, on every method.
	asked := south.asked.Load()
	v := connectAsPath(t, f, "/mcp/north", operatorToken)
	ctx := context.Background()
	leak := func(where string, x any) {
		t.Helper()
		b, _ := json.Marshal(x)
		if i := strings.Index(string(b), "south"); i >= 0 {
			t.Errorf("%s through the view north names south: …%s…", where, b[max(0, i-200):min(len(b), i+100)])
		}
	}
	tools, err := v.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leak("tools/list", tools)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{{"read_temperature", map[string]any{"site": "south", "zone": "zone_a"}}, {"read_temperature_zone_a", map[string]any{"site": "south"}},
		{"do_heater", map[string]any{"site": "south", "zone": "zone_c", "value": 30, "idempotency_key": "view-1"}},
		{"do_heater_zone_c", map[string]any{"site": "south", "value": 30, "idempotency_key": "view-2"}},
		{"do_heater", map[string]any{"source": "gw_greenhouse_001", "zone": "zone_c", "value": 30, "idempotency_key": "view-3"}}} {
		n := south.asked.Load()
		res, err := v.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
		if err == nil && !res.IsError {
			if r := structured(t, res); r["site"] != "north" {
				t.Errorf("%s %v through the view north: %s", c.tool, c.args, text(res))
			}
		}
		if south.asked.Load() != n {
			t.Errorf("%s %v through the view north reached south", c.tool, c.args)
		}
	}
	leak("can_do", call(t, v, "can_do", heatIntent).StructuredContent)
	res, err := v.ListResources(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leak("resources/list", res)
	tmpl, err := v.ListResourceTemplates(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leak("resources/templates/list", tmpl)
	for _, r := range res.Resources {
		if rr, err := v.ReadResource(ctx, &mcp.ReadResourceParams{URI: r.URI}); err == nil {
			leak("resources/read "+r.URI, rr)
		}
	}
	for _, uri := range []string{"physmcp://history/south/gw_greenhouse_001/temperature_zone_a", "physmcp://history/south/gw_greenhouse_001/temperature_zone_a?since=1h"} {
		if rr, err := v.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri}); err == nil {
			t.Errorf("resources/read %s through the view north: %v", uri, rr.Contents)
		}
		if got := rawListenHTTP(t, f, "/mcp/north", operatorToken, uri); strings.Contains(got, "notifications/subscriptions/acknowledged") {
			t.Errorf("subscriptions/listen %s through the view north was taken: %s", uri, got)
		}
	}
	if got := rawListenHTTP(t, f, "/mcp/north", operatorToken, "physmcp://alarms"); !strings.Contains(got, "notifications/subscriptions/acknowledged") {
		t.Errorf("subscriptions/listen physmcp://alarms through the view north (the control): %s", got)
	}
	if p, err := v.ListPrompts(ctx, nil); err == nil {
		leak("prompts/list", p)
	}
	if c, err := v.Complete(ctx, &mcp.CompleteParams{Ref: &mcp.CompleteReference{Type: "ref/resource", URI: "physmcp://history/{site}/{device}/{capability}"},
		Argument: mcp.CompleteParamsArgument{Name: "site", Value: "s"}}); err == nil {
		leak("completion/complete", c)
	}
	if n := south.asked.Load(); n != asked {
		t.Errorf("calls through the view north reached south %d times", n-asked)
	}
}
