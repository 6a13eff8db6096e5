package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
)

// fleetOnlyToken is an operator of examples/fleet/fleet.policy.yml that no
// site's policy knows.
const fleetOnlyToken = "fleet-only-demo-token"

// freePort is a loopback port nobody listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startFleet runs physd fleet with the example's sites and policy, its
// NATS hub embedded on hubAddr.
func startFleet(t *testing.T, hubAddr string) *daemon {
	t.Helper()
	return startFleetViews(t, hubAddr, "  north: {sites: [north]}\n")
}

// startFleetViews is startFleet with the configuration's views (indented
// entries under views:).
func startFleetViews(t *testing.T, hubAddr, views string) *daemon {
	t.Helper()
	dir := t.TempDir()
	ex := repoPath("examples/fleet")
	cfg := fmt.Sprintf(`id: fleet_hq
call_timeout_ms: 1000
do_timeout_ms: 3000
embed:
  sites:
    north: {password_file: %[1]s/secrets/north.pw}
    south: {password_file: %[1]s/secrets/south.pw}
    east: {password_file: %[1]s/secrets/east.pw}
views:
%[2]s`, ex, views)
	path := filepath.Join(dir, "fleet.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	d := &daemon{cmd: exec.Command(physdBin, "fleet", "--config", path, "--policy", filepath.Join(ex, "fleet.policy.yml"), "--http", "127.0.0.1:0",
		"--state", state, "--embed", hubAddr), state: state, stderr: &syncBuffer{}, done: make(chan error, 1), token: operatorToken}
	return d.serve(t)
}

// fleetSiteManifest is examples/fleet/<site>.manifest.yml with the hub at url.
func fleetSiteManifest(t *testing.T, site, url string) string {
	t.Helper()
	ex := repoPath("examples/fleet")
	b, err := os.ReadFile(filepath.Join(ex, site+".manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.NewReplacer(`urls: ["nats://127.0.0.1:4222"]`, fmt.Sprintf("urls: [%q]", url),
		"password_file: secrets/", "password_file: "+ex+"/secrets/",
		"$schema=../../schemas/", "$schema="+repoPath("schemas")+"/").Replace(string(b))
	if !strings.Contains(s, url) {
		t.Fatalf("%s.manifest.yml: its urls line moved", site)
	}
	path := filepath.Join(t.TempDir(), site+".manifest.yml")
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// fleetMembers is /status's fleet members: site/device -> state.
func fleetMembers(t *testing.T, d *daemon) map[string]string {
	t.Helper()
	code, b := d.request(t, http.MethodGet, "/status", "")
	if code != 200 {
		t.Fatalf("/status: %d %s", code, b)
	}
	var st struct {
		Fleet struct {
			Members []struct{ Site, Name, State string }
		}
	}
	_ = json.Unmarshal(b, &st)
	out := map[string]string{}
	for _, m := range st.Fleet.Members {
		out[m.Site+"/"+m.Name] = m.State
	}
	return out
}

func waitFleetMembers(t *testing.T, d *daemon, want map[string]string) {
	t.Helper()
	end := time.Now().Add(30 * time.Second)
	for {
		got := fleetMembers(t, d)
		ok := true
		for k, v := range want {
			ok = ok && got[k] == v
		}
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("fleet members %v, want %v\n%s", got, want, d.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// auditLines are the state's audit records of event with key.
func auditLines(t *testing.T, state, event, key string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range localAudit(t, state) {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil && r["event"] == event && r["idempotency_key"] == key {
			out = append(out, r)
		}
	}
	return out
}

func toolByName(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
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

func enumOf(t *testing.T, tl *mcp.Tool, prop string) []string {
	t.Helper()
	b, _ := json.Marshal(tl.InputSchema)
	var s struct {
		Properties map[string]struct {
			Enum []string `json:"enum"`
		} `json:"properties"`
	}
	_ = json.Unmarshal(b, &s)
	return s.Properties[prop].Enum
}

// TestFleetEndpoint runs physd fleet with its NATS hub embedded and three
// greenhouse sites of real physd run processes (north and south serve
// do_, east reads and can_do only; all three gateways are named
// gw_greenhouse_001), and drives the fleet's MCP endpoint: the tools by
// family with a site argument, a value with its age, can_do across the
// sites with one site silent, do_ forwarded to a site and judged there
// (a token only the fleet knows, the site's policy), the same key again,
// an answer lost after the go-ahead, and the hub's per-site permissions.
func TestFleetEndpoint(t *testing.T) {
	t.Parallel() // its own hub on a free port, its own processes
	hubAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	f := startFleet(t, hubAddr)
	proxy := startSlowProxy(t, hubAddr)
	sites := map[string]*daemon{}
	for _, site := range []string{"north", "south", "east"} {
		url := "nats://" + hubAddr
		if site == "north" {
			url = proxy.url()
		}
		sites[site] = startHTTP(t, daemonOpts{manifest: fleetSiteManifest(t, site, url), extra: []string{"--policy", greenhousePolicy}})
	}
	all := map[string]string{"north/gw_greenhouse_001": "up", "south/gw_greenhouse_001": "up", "east/gw_greenhouse_001": "up"}
	waitFleetMembers(t, f, all)
	if _, m := f.request(t, http.MethodGet, "/metrics", ""); !strings.Contains(string(m), `physd_fleet_gateway_up{device="gw_greenhouse_001",site="east",state="up"} 1`) ||
		!strings.Contains(string(m), "physd_fleet_endpoint_connected 1") {
		t.Errorf("the fleet's /metrics lack the gateways' states:\n%s", m)
	}
	cs := connectAsPath(t, f, "/mcp", operatorToken)

	// The tools: one per family, with site (and zone) arguments; do_ only
	// of the sites that serve it.
	tools := toolByName(t, cs)
	var names []string
	for n := range tools {
		names = append(names, n)
	}
	slices.Sort(names)
	t.Logf("fleet tools: %v", names)
	if len(tools) > 40 || tools["do_heater"] == nil || tools["read_temperature"] == nil || tools["can_do"] == nil {
		t.Fatalf("fleet tools: %v", names)
	}
	if got := enumOf(t, tools["do_heater"], "site"); !slices.Equal(got, []string{"north", "south"}) {
		t.Errorf("do_heater site enum %v, want [north south] (east serves no do_)", got)
	}
	if got := enumOf(t, tools["read_temperature"], "site"); !slices.Equal(got, []string{"east", "north", "south"}) {
		t.Errorf("read_temperature site enum %v", got)
	}

	// A value with its age: read through the site once (nothing cached
	// yet: the greenhouse polls nothing), then from the latest observation.
	first := structured(t, call(t, cs, "read_temperature", map[string]any{"site": "south", "zone": "zone_a"}))
	second := structured(t, call(t, cs, "read_temperature", map[string]any{"site": "south", "zone": "zone_a"}))
	t.Logf("read through south: %v; then from the fleet's copy: %v", first, second)
	if first["site"] != "south" || first["source"] != "gw_greenhouse_001" || first["quality"] != "good" || first["capability"] != "read_temperature_zone_a" {
		t.Errorf("read_temperature: %v", first)
	}
	if second["cached"] != true || second["age_ms"] == nil || second["value"] != first["value"] || second["site"] != "south" {
		t.Errorf("the second read is not the fleet's copy with its age: %v", second)
	}
	if live := structured(t, call(t, cs, "read_temperature", map[string]any{"site": "south", "zone": "zone_a", "max_age_ms": 0})); live["age_ms"].(float64) > second["age_ms"].(float64)+1000 {
		t.Errorf("max_age_ms 0 read an older value: %v", live)
	}

	// do_ forwarded to north: its gateway authenticates the operator's
	// token itself, runs it, and audits it via the fleet.
	heat := func(token string, value any, key string) *mcp.CallToolResult {
		t.Helper()
		c := connectAsPath(t, f, "/mcp", token)
		return call(t, c, "do_heater", map[string]any{"site": "north", "zone": "zone_c", "value": value, "idempotency_key": key})
	}
	north := sites["north"]
	ok := heat(operatorToken, 30, "fleet-e2e-1")
	r := structured(t, ok)
	if r["status"] != "success" || r["source"] != "gw_greenhouse_001" {
		t.Fatalf("do_heater through the fleet: %v", r)
	}
	recs := auditLines(t, north.state, "do", "fleet-e2e-1")
	if len(recs) != 1 || recs[0]["caller"] != "token:operator_console" || !strings.HasPrefix(fmt.Sprint(recs[0]["data"]), "map[transport:fleet via:fleet_hq/") {
		t.Errorf("north's audit: %v", recs)
	}
	if again := heat(operatorToken, 30, "fleet-e2e-1"); text(again) != text(ok) {
		t.Errorf("the same key again answered\n %s\nfirst\n %s", text(again), text(ok))
	}
	writes := north.sim(t).writes("zone_c.heater")
	// A token the fleet knows and north does not: refused at north.
	r = structured(t, heat(fleetOnlyToken, 35, "fleet-e2e-2"))
	if r["status"] != "failed" || r["code"] != "unauthenticated" {
		t.Errorf("a fleet-only token: %v", r)
	}
	if got := auditLines(t, north.state, "do_refused", "fleet-e2e-2"); len(got) != 1 {
		t.Errorf("north audited the refusal %d times", len(got))
	}
	// North's policy: zone_c's heater is denied above 80 %; a viewer may
	// not heat.
	if r = structured(t, heat(operatorToken, 85, "fleet-e2e-3")); r["status"] != "failed" || r["permission"] != "out_of_range" || !strings.Contains(fmt.Sprint(r["policy"]), "range_guard") {
		t.Errorf("85 %% on zone_c: %v", r)
	}
	if r = structured(t, heat(viewerToken, 35, "fleet-e2e-4")); r["status"] != "failed" || r["permission"] != "permission_insufficient" {
		t.Errorf("a viewer: %v", r)
	}
	if w := north.sim(t).writes("zone_c.heater"); w != writes {
		t.Errorf("refused calls wrote zone_c.heater: %d writes, %d before", w, writes)
	}

	// can_do with south silent (SIGSTOP: connected, answering nothing):
	// its heater is blocked naming it, within the deadline; east's is
	// blocked as not served; north's is a candidate.
	if err := sites["south"].cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep := structured(t, call(t, cs, "can_do", map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_c", "value": 30}}))
	took := time.Since(start)
	_ = sites["south"].cmd.Process.Signal(syscall.SIGCONT)
	t.Logf("can_do with south stopped: %v in %v", rep["metadata"], took)
	bySite := map[string]string{}
	for _, c := range rep["candidates"].([]any) {
		c := c.(map[string]any)
		bySite[fmt.Sprint(c["site"])] = "candidate:" + fmt.Sprint(c["permission"])
	}
	for _, b := range rep["blocked"].([]any) {
		b := b.(map[string]any)
		if b["capability"] == "do_heater" {
			bySite[fmt.Sprint(b["site"])] = "blocked:" + fmt.Sprint(b["code"])
			if b["site"] == "south" && !strings.Contains(fmt.Sprint(b["reason"]), "site south did not answer in time") {
				t.Errorf("south's entry: %v", b)
			}
		}
	}
	want := map[string]string{"north": "candidate:allowed", "south": "blocked:site_unreachable", "east": "blocked:not_served"}
	for s, w := range want {
		if bySite[s] != w {
			t.Errorf("can_do, site %s: %q, want %q (all: %v)", s, bySite[s], w, bySite)
		}
	}
	md := rep["metadata"].(map[string]any)
	if md["peers_consulted"] != float64(3) || md["responses_received"] != float64(2) {
		t.Errorf("can_do metadata: %v", md)
	}

	// The answer lost after the go-ahead: partial / outcome_unknown, never
	// failed; the site ran it once, and the same key returns its answer.
	proxy.armed.Store(true)
	r = structured(t, heat(operatorToken, 40, "fleet-e2e-5"))
	select {
	case <-proxy.seen:
	default:
		t.Fatal("the go-ahead never passed the proxy")
	}
	if r["status"] != "partial" || r["code"] != "outcome_unknown" || r["verified"] != false {
		t.Errorf("the lost answer: %v", r)
	}
	proxy.heal()
	var done []map[string]any
	for end := time.Now().Add(20 * time.Second); len(done) == 0; done = auditLines(t, north.state, "do", "fleet-e2e-5") {
		if time.Now().After(end) {
			t.Fatal("north never recorded the do_ whose answer was lost")
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFleetMembers(t, f, map[string]string{"north/gw_greenhouse_001": "up"})
	var retry *mcp.CallToolResult
	for end := time.Now().Add(20 * time.Second); ; {
		retry = heat(operatorToken, 40, "fleet-e2e-5")
		if !retry.IsError || time.Now().After(end) {
			break
		}
		time.Sleep(100 * time.Millisecond) // north's connection is back, its subscriptions not yet
	}
	answer, _ := json.Marshal(done[0]["answer"])
	var got, rec any
	_ = json.Unmarshal([]byte(text(retry)), &got)
	_ = json.Unmarshal(answer, &rec)
	if gb, _ := json.Marshal(got); string(gb) != string(answer) || structured(t, retry)["status"] != "success" {
		t.Errorf("the retry answered\n %s\nnorth recorded\n %s", text(retry), answer)
	}
	if w := north.sim(t).writes("zone_c.heater"); w != writes+1 {
		t.Errorf("zone_c.heater written %d times since, want 1", w-writes)
	}
	if _, m := north.request(t, http.MethodGet, "/metrics", ""); !strings.Contains(string(m), "physd_fleet_refused_unauthenticated 1") {
		t.Errorf("north's /metrics do not count the refused fleet-only token")
	}

	// The hub's per-site permissions: north's credentials can neither take
	// south's requests, nor answer the fleet's inbox, nor publish as
	// south; a catalog north publishes for south under its own subjects is
	// not taken.
	errs := make(chan error, 8)
	pw, _ := os.ReadFile(repoPath("examples/fleet/secrets/north.pw"))
	rogue, err := nats.Connect("nats://"+hubAddr, nats.UserInfo("north", strings.TrimSpace(string(pw))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	_, _ = rogue.SubscribeSync("physd.south.gw_greenhouse_001.req.>")
	_ = rogue.Publish("physd.south.gw_greenhouse_001.hb", []byte(`{"instance":"forged","interval_ms":5000}`))
	_ = rogue.Publish("_PHYSD_FLEET.forged.1", []byte(`forged`))
	forged, _ := json.Marshal(map[string]any{"site": "south", "device_id": "gw_rogue", "serves": []string{"do"}, "state": "serving", "hash": "x",
		"capabilities": []any{map[string]any{"tool": "do_rogue", "kind": "do"}}})
	_ = rogue.Publish("physd.north.gw_rogue.catalog", forged)
	_ = rogue.Flush()
	var violations []string
	for range 3 {
		select {
		case e := <-errs:
			violations = append(violations, e.Error())
		case <-time.After(5 * time.Second):
		}
	}
	for _, w := range []string{`Subscription to "physd.south.gw_greenhouse_001.req.>"`, `Publish to "physd.south.gw_greenhouse_001.hb"`, `Publish to "_PHYSD_FLEET.forged.1"`} {
		if !strings.Contains(strings.Join(violations, "\n"), "Permissions Violation for "+w) {
			t.Errorf("no permissions violation for %s: %v", w, violations)
		}
	}
	time.Sleep(200 * time.Millisecond) // the forged catalog has reached the fleet endpoint
	if _, ok := toolByName(t, cs)["do_rogue"]; ok {
		t.Error("the fleet lists a tool of a forged catalog")
	}
	if m := fleetMembers(t, f); len(m) != 3 {
		t.Errorf("fleet members after the forgeries: %v", m)
	}

	// SIGHUP re-reads the fleet's policy (its manifest is built, not read).
	if err := f.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if p := f.stderr.logValue(t, "policy reloaded", "policy"); !strings.HasSuffix(p, "fleet.policy.yml") {
		t.Errorf("policy reloaded: %s", p)
	}
}
