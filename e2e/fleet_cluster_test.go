package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
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
	var users []natscluster.User
	for _, s := range sites {
		users = append(users, natscluster.SiteUser(s, s+"-pw", "physd", s, hubDomain, fleetStream, "PHYSD_HISTORY", "PHYSD_ALARMS"))
	}
	hub := natscluster.StartHub(t, natscluster.HubOptions{Servers: servers, Domain: hubDomain, Users: users})
	_, js := hub.Admin(t)
	for _, cfg := range []jetstream.StreamConfig{
		{Name: fleetStream, Subjects: fleet.StreamSubjects("physd"), Duplicates: 10 * time.Minute, AllowAtomicPublish: true},
		{Name: "PHYSD_HISTORY", Subjects: fleet.HistorySubjects("physd"), Duplicates: 10 * time.Minute, AllowAtomicPublish: true},
		{Name: "PHYSD_ALARMS", Subjects: fleet.AlarmSubjects("physd"), MaxMsgsPerSubject: 1},
	} {
		cfg.Replicas, cfg.Storage, cfg.AllowDirect = servers, jetstream.FileStorage, true
		natscluster.CreateStream(t, js, cfg)
	}
	return hub, js
}

// startFleetSite runs a site's leaf (its user on the hub is the site's) and
// its gateway, connected to the leaf as the leaf's local user gw. With
// viaFlags the manifest has no network.fleet and the uplink comes from
// physd run's --fleet-* flags.
func startFleetSite(t *testing.T, hub *natscluster.Hub, name string, viaFlags bool) *fleetSite {
	t.Helper()
	leaf := hub.StartLeaf(t, natscluster.LeafOptions{Site: name, User: name, Password: name + "-pw",
		Local: []natscluster.User{{Name: "gw", Password: "gw-pw"}}, JetStreamDomain: name})
	leaf.WaitLinked(20 * time.Second)
	s := &fleetSite{name: name, leaf: leaf, state: t.TempDir(), subject: "physd." + name + ".gw_greenhouse_001.audit"}
	if viaFlags {
		pw := filepath.Join(t.TempDir(), "gw.pw")
		if err := os.WriteFile(pw, []byte("gw-pw\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.args = daemonOpts{manifest: greenhouse, state: s.state, extra: []string{"--fleet-url", leaf.URL(), "--fleet-site", name,
			"--fleet-user", "gw", "--fleet-password-file", pw, "--fleet-domain", hubDomain}}
	} else {
		s.args = daemonOpts{manifest: fleetManifestWith(t, leaf.URL(), name, "gw", "gw-pw", "    domain: "+hubDomain+"\n"), state: s.state}
	}
	s.start(t)
	return s
}

func (s *fleetSite) start(t *testing.T) {
	t.Helper()
	s.d = startHTTP(t, s.args)
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
// gateway (two configured by network.fleet, one by --fleet-* flags),
// publish to the three-server hub. North's WAN link is cut: north keeps
// serving (/readyz 200) while its records wait; south's keep arriving.
// The cut lasts 10 s, at least twice every timeout and keep-alive
// involved (publish 2 s, connect 1 s, the leaf link's pings 2 x 500 ms
// and redial 250 ms, the uplink's retry 1 s, the history and alarm
// copies' refresh 5 s), so every one of them has fired by the heal.
// After the heal every audit record and do_ result of every site is in
// the hub's stream exactly once, compared with the sites' local audit
// files. Then the hub server leading the audit stream is killed: the R3
// stream keeps what it had, elects another leader, and the sites'
// records keep arriving exactly once.
func TestFleetClusterWANCutAndHubKill(t *testing.T) {
	t.Parallel() // its own servers on free ports, its own daemons
	hub, js := startFleetHub(t, 3, "north", "south", "east")
	sites := []*fleetSite{startFleetSite(t, hub, "north", false), startFleetSite(t, hub, "south", false), startFleetSite(t, hub, "east", true)}
	north, south := sites[0], sites[1]
	for _, s := range sites {
		s.do(t, "a", 5)
	}
	allExactlyOnce(t, js, sites, 30*time.Second)

	// North's WAN is cut; north's gateway stays connected to its leaf.
	north.leaf.Link.Cut()
	cutAt := time.Now()
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
	north := startFleetSite(t, hub, "north", false)
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
	hub, js := startFleetHub(t, 1, "north", "south")
	// South has a record the north leaf must not read.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "physd.south.gw_9.audit", []byte(`{"seq":1,"secret":"south"}`)); err != nil {
		t.Fatal(err)
	}
	leaf := hub.StartLeaf(t, natscluster.LeafOptions{Site: "north", User: "north", Password: "north-pw"})
	leaf.WaitLinked(20 * time.Second)
	d := startHTTP(t, daemonOpts{extra: []string{"--fleet-url", leaf.URL(), "--fleet-site", "south", "--fleet-domain", hubDomain}})
	cs := connectHTTP(t, d, "2026-07-28")
	doCalls(t, cs, "perm", 3)

	nc, err := nats.Connect(leaf.URL())
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
