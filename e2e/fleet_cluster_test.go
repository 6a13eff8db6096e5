package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natscluster"
)

// The fleet's topology with real processes: a hub of three nats-server
// processes (JetStream domain "hub", streams with three replicas), a
// leaf node per site that runs JetStream in its own domain (so the
// gateways must name the hub's), each leaf linked to the hub through a
// TCP proxy per hub server (the site's WAN, which the tests cut and
// slow), and real physd processes (the greenhouse) at each leaf.

const hubDomain = "hub"

// fleetSite is one site: its leaf, its gateway and where it keeps state.
type fleetSite struct {
	name    string
	leaf    *natscluster.Leaf
	d       *daemon
	cs      *mcp.ClientSession
	state   string
	args    daemonOpts
	subject string
	keys    []string
}

// startFleetHub runs the hub and creates the streams with three replicas
// (the operator's job: the sites' users may not), the audit's and the
// history's taking atomic batches.
func startFleetHub(t *testing.T, servers int, sites ...string) (*natscluster.Hub, jetstream.JetStream) {
	t.Helper()
	users := []natscluster.User{natscluster.FleetUser(fleetUser, fleetUser+"-pw", "physd", hubDomain,
		hub.FleetStreams{Audit: fleetStream, Catalog: fleet.DefaultCatalogStream, History: "PHYSD_HISTORY", Alarms: "PHYSD_ALARMS"})}
	for _, s := range sites {
		users = append(users, natscluster.SiteUser(s, s+"-pw", "physd", s, hubDomain, fleetStream, "PHYSD_HISTORY", "PHYSD_ALARMS"))
	}
	h := natscluster.StartHub(t, natscluster.HubOptions{Servers: servers, Domain: hubDomain, Users: users})
	_, js := h.Admin(t)
	for _, cfg := range []jetstream.StreamConfig{
		{Name: fleetStream, Subjects: fleet.StreamSubjects("physd"), Duplicates: 10 * time.Minute, AllowAtomicPublish: true},
		{Name: "PHYSD_HISTORY", Subjects: fleet.HistorySubjects("physd"), Duplicates: 10 * time.Minute, AllowAtomicPublish: true},
		{Name: "PHYSD_ALARMS", Subjects: fleet.AlarmSubjects("physd"), MaxMsgsPerSubject: 1},
	} {
		cfg.Replicas, cfg.Storage, cfg.AllowDirect = servers, jetstream.FileStorage, true
		natscluster.CreateStream(t, js, cfg)
	}
	return h, js
}

// fleetUser is the fleet endpoint's user on the hub (hub.FleetPermissions).
const fleetUser = "fleet"

// startFleetSite runs a site's leaf (its user on the hub is the site's) and
// its gateway, connected to the leaf as the leaf's local user gw. With
// o.viaFlags the manifest has no network.fleet and the uplink comes from
// physd run's --fleet-* flags; with o.serveDo the gateway serves the fleet
// endpoint read, can_do and do (network.fleet.serve, or --fleet-serve)
// under the greenhouse's policy (whose tokens it authenticates).
func startFleetSite(t *testing.T, hub *natscluster.Hub, name string, o siteOpts) *fleetSite {
	t.Helper()
	leaf := hub.StartLeaf(t, natscluster.LeafOptions{Site: name, User: name, Password: name + "-pw",
		Local: []natscluster.User{{Name: "gw", Password: "gw-pw"}}, JetStreamDomain: name})
	leaf.WaitLinked(20 * time.Second)
	s := &fleetSite{name: name, leaf: leaf, state: t.TempDir(), subject: "physd." + name + ".gw_greenhouse_001.audit"}
	var extra []string
	if o.serveDo {
		extra = []string{"--policy", greenhousePolicy}
	}
	if o.viaFlags {
		pw := filepath.Join(t.TempDir(), "gw.pw")
		if err := os.WriteFile(pw, []byte("gw-pw\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, "--fleet-url", leaf.URL(), "--fleet-site", name,
			"--fleet-user", "gw", "--fleet-password-file", pw, "--fleet-domain", hubDomain)
		if o.serveDo {
			extra = append(extra, "--fleet-serve", "read,can_do,do")
		}
		s.args = daemonOpts{manifest: greenhouse, state: s.state, extra: extra}
	} else {
		block := "    domain: " + hubDomain + "\n"
		if o.serveDo {
			block += "    serve: [read, can_do, do]\n"
		}
		s.args = daemonOpts{manifest: fleetManifestWith(t, leaf.URL(), name, "gw", "gw-pw", block), state: s.state, extra: extra}
	}
	s.start(t)
	return s
}

// siteOpts shape a site of startFleetSite.
type siteOpts struct{ viaFlags, serveDo bool }

func (s *fleetSite) start(t *testing.T) {
	t.Helper()
	s.d = startHTTP(t, s.args)
	if s.d.token != "" { // a policy's identity: its admin token
		s.cs = connectAsPath(t, s.d, "/mcp", s.d.token)
		return
	}
	s.cs = connectHTTP(t, s.d, "2026-07-28")
}

func (s *fleetSite) do(t *testing.T, prefix string, n int) {
	t.Helper()
	s.keys = append(s.keys, doCalls(t, s.cs, s.name+"-"+prefix, n)...)
}

// subjectCount is how many messages the stream holds on subject (0 when
// the hub does not answer).
func subjectCount(js jetstream.JetStream, subject string) uint64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := streamInfoFor(ctx, js, subject)
	if err != nil {
		return 0
	}
	return info.State.Subjects[subject]
}

// exactCount is how many messages the stream holds on subject, asked
// until the hub answers (a loaded machine may take a while).
func exactCount(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	end := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := streamInfoFor(ctx, js, subject)
		cancel()
		if err == nil {
			return info.State.Subjects[subject]
		}
		if time.Now().After(end) {
			t.Fatalf("the stream's count of %s: %v", subject, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func streamInfoFor(ctx context.Context, js jetstream.JetStream, subject string) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, fleetStream)
	if err != nil {
		return nil, err
	}
	return st.Info(ctx, jetstream.WithSubjectFilter(subject))
}

// waitCopied waits until the stream holds as many records of the site's
// subject as its local audit has.
func (s *fleetSite) waitCopied(t *testing.T, js jetstream.JetStream, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		n := uint64(len(localAudit(t, s.state)))
		c := subjectCount(js, s.subject)
		if c >= n && n > 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the stream holds %d records, the local audit %d, after %s; /status fleet: %v", s.name, c, n, d, fleetStatus(t, s.d))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exactlyOnce fails unless the hub's stream holds the site's local audit
// exactly once, byte for byte, every do_ result included once.
func (s *fleetSite) exactlyOnce(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	t.Logf("site %s:", s.name)
	doResultsOnce(t, sameTrail(t, js, s.subject, s.state), s.keys)
}

// allExactlyOnce waits until the hub holds every site's local audit, then
// checks each is there exactly once.
func allExactlyOnce(t *testing.T, js jetstream.JetStream, sites []*fleetSite, d time.Duration) {
	t.Helper()
	for _, s := range sites {
		s.waitCopied(t, js, d)
	}
	for _, s := range sites {
		s.exactlyOnce(t, js)
	}
}

func readyz(t *testing.T, d *daemon) int {
	t.Helper()
	resp, err := http.Get(d.url("/readyz"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestFleetClusterWANCutAndHubKill: three sites, each a leaf and a
// gateway (two configured by network.fleet, one by --fleet-* flags), all
// serving the fleet read, can_do and do under the greenhouse's policy,
// publish to the three-server hub, and physd fleet connects to the hub's
// servers (not embedded: its own user, hub.FleetPermissions in the hub's
// domain; it creates the catalog stream with three replicas). Through the
// fleet: can_do across the sites; a do_ routed to south through its leaf,
// judged there (its operator's token runs it; its policy refuses 85 %; a
// token only the fleet knows is refused); the sites' alarm states. North's
// WAN link stalls, then is cut: while it stalls, the fleet reports north
// unreachable within its can_do deadline (blocked, naming the site) and a
// do_ at north fails with nothing done (never acknowledged, so no
// go-ahead); cut, north keeps serving (/readyz 200) while its records
// wait, south's keep arriving, and the fleet answers a read of north from
// its copy with its age, stale when a fresh value is asked for. The stall
// and the cut last 10 s, at least twice every timeout and keep-alive involved
// (publish 2 s, connect 1 s, the leaf link's pings 2 x 500 ms and redial
// 250 ms, the uplink's retry 1 s, the history and alarm copies' refresh 5
// s), so every one of them has fired by the heal. After the heal every
// audit record and do_ result of every site, the fleet's included, is in
// the hub's stream exactly once, compared with the sites' local audit
// files, and the do_ sent during the cut is in none. Then the hub server
// leading the audit stream is killed: the R3 stream keeps what it had,
// elects another leader, the sites' records keep arriving exactly once,
// and the fleet keeps answering (can_do from every site, a do_ at south).
func TestFleetClusterWANCutAndHubKill(t *testing.T) {
	t.Parallel() // its own servers on free ports, its own daemons
	hub, js := startFleetHub(t, 3, "north", "south", "east")
	sites := []*fleetSite{startFleetSite(t, hub, "north", siteOpts{serveDo: true}), startFleetSite(t, hub, "south", siteOpts{serveDo: true}),
		startFleetSite(t, hub, "east", siteOpts{viaFlags: true, serveDo: true})}
	north, south := sites[0], sites[1]
	f := startClusterFleet(t, hub)
	waitFleetMembers(t, f, map[string]string{"north/gw_greenhouse_001": "up", "south/gw_greenhouse_001": "up", "east/gw_greenhouse_001": "up"})
	fc := connectAsPath(t, f, "/mcp", operatorToken)
	for _, s := range sites {
		s.do(t, "a", 5)
	}

	// can_do across the sites: every site's heater is a candidate.
	heating := map[string]any{"intent": map[string]any{"semantic_tags": []string{"heating"}, "action": "set", "location": "zone_c", "value": 30}}
	rep, took := fleetCanDo(t, fc, heating)
	if got := heaterBySite(rep); got["north"] != "candidate:allowed" || got["south"] != "candidate:allowed" || got["east"] != "candidate:allowed" {
		t.Errorf("can_do across the sites: %v (in %v)", got, took)
	}
	// A do_ routed to south through its leaf, judged by south.
	heat := func(token, site string, value any, key string) *mcp.CallToolResult {
		t.Helper()
		return call(t, connectAsPath(t, f, "/mcp", token), "do_heater", map[string]any{"site": site, "zone": "zone_c", "value": value, "idempotency_key": key})
	}
	if r := structured(t, heat(operatorToken, "south", 30, "fleet-south-1")); r["status"] != "success" || r["site"] != nil && r["site"] != "south" {
		t.Errorf("do_heater at south through the fleet: %v", r)
	}
	south.keys = append(south.keys, "fleet-south-1")
	if recs := auditLines(t, south.state, "do", "fleet-south-1"); len(recs) != 1 || recs[0]["caller"] != "token:operator_console" ||
		!strings.HasPrefix(fmt.Sprint(recs[0]["data"]), "map[transport:fleet via:fleet_hq/") {
		t.Errorf("south's audit of the fleet's do_: %v", recs)
	}
	if r := structured(t, heat(operatorToken, "south", 85, "fleet-south-2")); r["status"] != "failed" || r["permission"] != "out_of_range" {
		t.Errorf("85 %% at south (its policy denies above 80): %v", r)
	}
	if r := structured(t, heat(fleetOnlyToken, "south", 35, "fleet-south-3")); r["status"] != "failed" || r["code"] != "unauthenticated" {
		t.Errorf("a token only the fleet knows, at south: %v", r)
	}
	// North's temperature through the fleet (read through the site: the
	// fleet keeps the copy).
	if r := structured(t, call(t, fc, "read_temperature", map[string]any{"site": "north", "zone": "zone_a", "max_age_ms": 0})); r["site"] != "north" || r["quality"] != "good" {
		t.Errorf("north's temperature through the fleet: %v", r)
	}
	readAt := time.Now()
	// The sites' alarm states, read through the fleet from the hub.
	waitUntil(t, "every site's alarm state at the fleet", 20*time.Second, func() bool {
		res, err := fc.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "physmcp://alarms"})
		return err == nil && strings.Count(res.Contents[0].Text, `"link": "up"`) == 3
	})
	allExactlyOnce(t, js, sites, 30*time.Second)

	// North's WAN stalls (its packets go nowhere; the leaf's pings notice
	// within a second or two), then is cut; north's gateway stays
	// connected to its leaf. While it stalls, the fleet's requests to
	// north wait in the link: can_do reports north blocked within its
	// deadline (call_timeout_ms 1000), and a do_ at north, never
	// acknowledged, fails with nothing done (no go-ahead is sent; the
	// request that sits in the link is dropped with it).
	writes := north.d.sim(t).writes("zone_c.heater")
	north.leaf.Link.Stall()
	cutAt := time.Now()
	rep, took = fleetCanDo(t, fc, heating)
	got := heaterBySite(rep)
	t.Logf("can_do with north's link stalled: %v in %v", got, took)
	if got["north"] != "blocked:site_unreachable" || got["south"] != "candidate:allowed" || got["east"] != "candidate:allowed" || took > 1500*time.Millisecond {
		t.Errorf("can_do with north's link stalled: %v in %v (want north blocked, naming it, within the 1 s deadline)", got, took)
	}
	for _, b := range rep["blocked"].([]any) {
		if b := b.(map[string]any); b["site"] == "north" && !strings.Contains(fmt.Sprint(b["reason"]), "site north") {
			t.Errorf("north's blocked entry does not name it: %v", b)
		}
	}
	start := time.Now()
	res := heat(operatorToken, "north", 40, "fleet-north-stall")
	t.Logf("do_heater at north, its link stalled: %s in %v", text(res), time.Since(start))
	if !res.IsError || !strings.Contains(text(res), "nothing was done") || time.Since(start) > 2*time.Second {
		t.Errorf("do_heater at north, its link stalled: %s in %v (want failed, nothing done, within the 1 s acknowledgement deadline)", text(res), time.Since(start))
	}
	north.leaf.Link.Cut()
	end := time.Now().Add(10 * time.Second)
	for north.leaf.Linked() {
		if time.Now().After(end) {
			t.Fatal("north's leaf still linked after the cut")
		}
		time.Sleep(20 * time.Millisecond)
	}
	north.do(t, "cut", 20)
	south.do(t, "during", 5)
	if code := readyz(t, north.d); code != 200 {
		t.Errorf("north /readyz during the WAN cut: %d, want 200 (a site keeps working)", code)
	}
	// Cut: north is blocked at once (the hub knows no one answers it).
	rep, took = fleetCanDo(t, fc, heating)
	if got := heaterBySite(rep); got["north"] != "blocked:site_unreachable" || got["south"] != "candidate:allowed" || took > 1500*time.Millisecond {
		t.Errorf("can_do during north's cut: %v in %v", got, took)
	}
	// A read of north: the fleet's copy with its age; asked for a fresh
	// one, the copy, stale, saying why.
	r := structured(t, call(t, fc, "read_temperature", map[string]any{"site": "north", "zone": "zone_a"}))
	if r["cached"] != true || r["age_ms"].(float64) < float64(time.Since(readAt).Milliseconds()-100) {
		t.Errorf("north's temperature during the cut: %v", r)
	}
	r = structured(t, call(t, fc, "read_temperature", map[string]any{"site": "north", "zone": "zone_a", "max_age_ms": 0}))
	t.Logf("a fresh read of north during the cut: %v", r)
	if r["quality"] != "stale" || r["cached"] != true || !strings.Contains(fmt.Sprint(r["reason"]), "north") {
		t.Errorf("a fresh read of north during the cut: %v (want the copy, stale, saying why)", r)
	}
	res = heat(operatorToken, "north", 41, "fleet-north-cut")
	if !res.IsError || !strings.Contains(text(res), "nothing was done") {
		t.Errorf("do_heater at north during the cut: %s (want failed, nothing done)", text(res))
	}
	south.waitCopied(t, js, 30*time.Second) // the other sites are not held up
	time.Sleep(10*time.Second - time.Since(cutAt))
	st := fleetStatus(t, north.d)
	if st["connected"] != true || st["synced"] != false || st["pending"].(float64) < 20 || st["audit_error"] == nil {
		t.Errorf("north /status fleet at the end of the cut: %v (want connected to its leaf, not synced, 20 pending at least, an audit error)", st)
	}
	if n := exactCount(t, js, north.subject); n != 5 {
		t.Errorf("the hub holds %d of north's records during the cut, want the 5 from before", n)
	}
	north.leaf.Link.Heal()
	allExactlyOnce(t, js, sites, 30*time.Second)
	for _, key := range []string{"fleet-north-stall", "fleet-north-cut"} {
		if recs := auditLines(t, north.state, "do", key); len(recs) != 0 {
			t.Errorf("the do_ %s sent while north's link was down ran at north: %v", key, recs)
		}
	}
	if w := north.d.sim(t).writes("zone_c.heater"); w != writes {
		t.Errorf("north's heater was written %d times while its link was down", w-writes)
	}

	// The server leading the audit stream dies.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	info, err := streamInfo(ctx, js)
	cancel()
	if err != nil || info.Cluster == nil {
		t.Fatalf("stream info: %v %+v", err, info)
	}
	var leader *natscluster.Server
	for _, s := range hub.Servers {
		if s.Name == info.Cluster.Leader {
			leader = s
		}
	}
	if leader == nil {
		t.Fatalf("no hub server named %q", info.Cluster.Leader)
	}
	t.Logf("killing %s, the audit stream's leader", leader.Name)
	leader.Kill()
	for _, s := range sites {
		s.do(t, "killed", 5)
	}
	// The fleet keeps answering: every site's can_do (once north's
	// heartbeats are back), a do_ at south.
	waitUntil(t, "can_do from every site after the kill", 30*time.Second, func() bool {
		rep, _ := fleetCanDo(t, fc, heating)
		got := heaterBySite(rep)
		return got["north"] == "candidate:allowed" && got["south"] == "candidate:allowed" && got["east"] == "candidate:allowed"
	})
	if r := structured(t, heat(operatorToken, "south", 31, "fleet-south-4")); r["status"] != "success" {
		t.Errorf("do_heater at south after the kill: %v", r)
	}
	south.keys = append(south.keys, "fleet-south-4")
	allExactlyOnce(t, js, sites, 45*time.Second)
	for _, s := range sites {
		if code := readyz(t, s.d); code != 200 {
			t.Errorf("%s /readyz: %d", s.name, code)
		}
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if info, err := streamInfo(ctx, js); err != nil || info.Cluster.Leader == leader.Name || info.Config.Replicas != 3 {
		t.Errorf("after the kill: %v %+v", err, info)
	} else {
		t.Logf("the audit stream's new leader: %s", info.Cluster.Leader)
	}
	if code, _ := f.request(t, http.MethodGet, "/readyz", ""); code != 200 {
		t.Errorf("the fleet's /readyz after the kill: %d", code)
	}
}

// startClusterFleet runs physd fleet connected to the hub's servers as
// the fleet endpoint's user, in the hub's JetStream domain, creating its
// streams with three replicas, with the example's fleet policy.
func startClusterFleet(t *testing.T, h *natscluster.Hub) *daemon {
	t.Helper()
	dir := t.TempDir()
	pw := filepath.Join(dir, "fleet.pw")
	if err := os.WriteFile(pw, []byte(fleetUser+"-pw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	urls, _ := json.Marshal(h.URLs())
	cfg := fmt.Sprintf(`id: fleet_hq
call_timeout_ms: 1000
do_timeout_ms: 3000
replicas: 3
nats:
  urls: %s
  domain: %s
  user: %s
  password_file: %s
  connect_timeout_ms: 2000
`, urls, h.Domain(), fleetUser, pw)
	path := filepath.Join(dir, "fleet.yml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state")
	d := &daemon{cmd: exec.Command(physdBin, "fleet", "--config", path, "--policy", repoPath("examples/fleet/fleet.policy.yml"), "--http", "127.0.0.1:0",
		"--state", state), state: state, stderr: &syncBuffer{}, done: make(chan error, 1), token: operatorToken}
	return d.serve(t)
}

// waitUntil polls cond until it holds or d passes.
func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s", what, d)
		}
	}
}

// fleetCanDo asks the fleet's can_do and how long it took.
func fleetCanDo(t *testing.T, cs *mcp.ClientSession, args map[string]any) (map[string]any, time.Duration) {
	t.Helper()
	start := time.Now()
	rep := structured(t, call(t, cs, "can_do", args))
	return rep, time.Since(start)
}

// heaterBySite is what a can_do says of each site's do_heater:
// candidate:<permission> or blocked:<code>.
func heaterBySite(rep map[string]any) map[string]string {
	out := map[string]string{}
	for list, what := range map[string]string{"candidates": "permission", "blocked": "code"} {
		entries, _ := rep[list].([]any)
		for _, e := range entries {
			e := e.(map[string]any)
			if strings.HasPrefix(fmt.Sprint(e["capability"]), "do_heater") {
				out[fmt.Sprint(e["site"])] = strings.TrimSuffix(list, "s") + ":" + fmt.Sprint(e[what])
			}
		}
	}
	return out
}

func streamInfo(ctx context.Context, js jetstream.JetStream) (*jetstream.StreamInfo, error) {
	st, err := js.Stream(ctx, fleetStream)
	if err != nil {
		return nil, err
	}
	return st.Info(ctx)
}

// TestFleetClusterKillMidReplay: a site's gateway has a backlog of three
// hundred records after a cut of its leaf's link (two batches of the
// replay's window); the link comes back slow (a 300 ms round trip), and
// the gateway is SIGKILLed as soon as the first batch's records appear in
// the hub's stream (a batch is committed whole and applied record by
// record: the kill may see it part applied), before the batch's
// acknowledgement can have reached the gateway (half a round trip
// later). Restarted, it finds what the stream holds: every record
// exactly once.
func TestFleetClusterKillMidReplay(t *testing.T) {
	t.Parallel() // its own servers on free ports, its own daemon
	hub, js := startFleetHub(t, 3, "north")
	north := startFleetSite(t, hub, "north", siteOpts{})
	north.do(t, "a", 5)
	north.waitCopied(t, js, 30*time.Second)

	// The kill must fall between the first batch's arrival and the
	// second's (a round trip): a machine too loaded to look in time
	// sees the replay end, and the cut is made again.
	north.leaf.Link.SetDelay(150 * time.Millisecond)
	for attempt := 1; ; attempt++ {
		north.leaf.Link.Cut()
		north.do(t, fmt.Sprintf("backlog%d", attempt), 300)
		before := exactCount(t, js, north.subject)
		total := uint64(len(localAudit(t, north.state)))
		north.leaf.Link.Heal()
		end := time.Now().Add(30 * time.Second)
		n := before
		for n <= before {
			if time.Now().After(end) {
				t.Fatalf("the replay did not start: %d records, %d before", n, before)
			}
			time.Sleep(2 * time.Millisecond)
			n = subjectCount(js, north.subject)
		}
		if n < total {
			t.Logf("SIGKILL with %d of %d records in the stream", n, total)
			break
		}
		if attempt == 3 {
			t.Fatalf("the replay ended (%d of %d) before the kill, %d times", n, total, attempt)
		}
		t.Logf("the replay ended (%d of %d) before the test looked; again", n, total)
		north.waitCopied(t, js, 30*time.Second)
	}
	if err := north.d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-north.d.done
	north.leaf.Link.SetDelay(0)
	north.start(t)
	north.do(t, "after", 5)
	north.waitCopied(t, js, 30*time.Second)
	north.exactlyOnce(t, js)
	if st := fleetStatus(t, north.d); st["connected"] != true || st["pending"].(float64) != 0 {
		t.Errorf("/status fleet after the restart: %v", st)
	}
}

// TestFleetLeafSitePermissions: north's leaf links to the hub with
// north's credentials; a gateway at that leaf that names itself south
// (by --fleet-site) gets nothing of south's from the hub and puts
// nothing under south: the hub's permissions on the leaf link let
// through neither the read of south's cursor (a direct get naming
// south's subject) nor a publish under south; the gateway keeps serving.
// A client at the same leaf still reads and publishes north's subjects
// (the control), and cannot read another site's records by sequence.
func TestFleetLeafSitePermissions(t *testing.T) {
	t.Parallel() // its own servers on free ports, its own daemon
	fh, js := startFleetHub(t, 1, "north", "south")
	// South has a record the north leaf must not read.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "physd.south.gw_9.audit", []byte(`{"seq":1,"secret":"south"}`)); err != nil {
		t.Fatal(err)
	}
	leaf := fh.StartLeaf(t, natscluster.LeafOptions{Site: "north", User: "north", Password: "north-pw"})
	leaf.WaitLinked(20 * time.Second)
	d := startHTTP(t, daemonOpts{extra: []string{"--fleet-url", leaf.URL(), "--fleet-site", "south", "--fleet-domain", hubDomain}})
	cs := connectHTTP(t, d, "2026-07-28")
	doCalls(t, cs, "perm", 3)

	// A client of north's leaf with north's inbox: the hub sends north's
	// leaf the replies to it, and nothing else.
	nc, err := nats.Connect(leaf.URL(), nats.CustomInboxPrefix(hub.SiteInbox("north")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sjs, _ := jetstream.NewWithDomain(nc, hubDomain)
	try := func(f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return f(ctx)
	}
	// The control: north's subject through the same leaf.
	end := time.Now().Add(20 * time.Second)
	for {
		err := try(func(ctx context.Context) error {
			_, err := sjs.Publish(ctx, "physd.north.gw_x.audit", []byte(`{"seq":1}`), jetstream.WithMsgID("north/gw_x/1"))
			return err
		})
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("north's own subject through north's leaf: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var st jetstream.Stream
	if err := try(func(ctx context.Context) (err error) { st, err = sjs.Stream(ctx, fleetStream); return err }); err != nil {
		t.Fatal(err)
	}
	end = time.Now().Add(20 * time.Second)
	for {
		err := try(func(ctx context.Context) error {
			_, err := st.GetLastMsgForSubject(ctx, "physd.north.gw_x.audit")
			return err
		})
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("north's last record through north's leaf: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := try(func(ctx context.Context) error {
		_, err := sjs.Publish(ctx, "physd.south.gw_x.audit", []byte(`{"seq":1}`), jetstream.WithMsgID("south/gw_x/1"))
		return err
	}); err == nil {
		t.Error("a client at north's leaf published under south")
	}
	if err := try(func(ctx context.Context) error {
		_, err := st.GetLastMsgForSubject(ctx, "physd.south.gw_9.audit")
		return err
	}); err == nil {
		t.Error("a client at north's leaf read south's last record")
	}
	if err := try(func(ctx context.Context) error { _, err := st.GetMsg(ctx, 1); return err }); err == nil {
		t.Error("a client at north's leaf read a record by its stream sequence")
	}

	// The gateway that calls itself south: never synced, nothing sent.
	end = time.Now().Add(20 * time.Second)
	for fleetStatus(t, d)["audit_error"] == nil {
		if time.Now().After(end) {
			t.Fatalf("no audit error: %v", fleetStatus(t, d))
		}
		time.Sleep(100 * time.Millisecond)
	}
	status := fleetStatus(t, d)
	if status["published"].(float64) != 0 || status["synced"] == true || status["audit_error"] == nil {
		t.Errorf("/status fleet: %v, want nothing published and the audit error", status)
	}
	t.Logf("the south-naming gateway's audit error: %v", status["audit_error"])
	for _, subj := range []string{"physd.south.gw_greenhouse_001.audit", "physd.south.gw_x.audit"} {
		if n := subjectCount(js, subj); n != 0 {
			t.Errorf("the stream holds %d messages on %s, sent through north's leaf", n, subj)
		}
	}
	if code := readyz(t, d); code != 200 {
		t.Errorf("/readyz: %d", code)
	}
	doCalls(t, cs, "perm-after", 2)
}
