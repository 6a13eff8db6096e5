package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// The greenhouse policy's demo tokens.
const (
	operatorToken = "greenhouse-operator-demo-token"
	viewerToken   = "greenhouse-viewer-demo-token"
)

// site is one serving gateway of the greenhouse (its policy, the
// simulator) on a real nats-server, and the fleet endpoint's client.
type site struct {
	rig    *testrig.Rig
	up     *Uplink
	srv    *Server
	client *Client
	admin  *nats.Conn
	clock  atomic.Int64 // added to the server's clock, in ns
}

func startSite(t *testing.T, serve []string) *site {
	t.Helper()
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "north-pw", "physd", "north", stream))
	nc, js := admin(t, h, nats.CustomInboxPrefix("_PHYSD_FLEET"))
	createStream(t, js)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: DefaultCatalogStream, Subjects: CatalogSubjects("physd"), MaxMsgsPerSubject: 1}); err != nil {
		t.Fatal(err)
	}
	s := &site{admin: nc}
	s.rig = testrig.Open(t, testrig.Greenhouse("physmcp.manifest.yml"), testrig.ReadFile(t, testrig.Greenhouse("physmcp.policy.yml")), nil)
	id := s.rig.Guard.Policy().Identity
	authn := func(cred string) (node.Caller, error) {
		p, err := id.AuthenticateFleet(context.Background(), cred)
		if err != nil {
			return node.Caller{}, err
		}
		return node.Caller{ID: p.ID, Role: p.Role, Credentials: p.Credentials}, nil
	}
	u, err := New(Config{URLs: []string{h.URL()}, Site: "north", DeviceID: s.rig.Node.DeviceID(), Stream: stream, Prefix: "physd",
		Options: []nats.Option{nats.UserInfo("north", "north-pw")}, ConnectTimeout: time.Second, PublishTimeout: 2 * time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.srv = NewServer(ServeConfig{Prefix: "physd", Site: "north", Serve: serve, Owner: meshnode.Owner{Node: s.rig.Node, Authn: authn},
		Heartbeat: 100 * time.Millisecond, Hold: time.Second})
	s.srv.now = func() time.Time { return time.Now().Add(time.Duration(s.clock.Load())) }
	s.srv.Start(u)
	u.Start(s.rig.Audit)
	s.up = u
	t.Cleanup(func() { s.srv.Close(); u.Close() })
	if s.client, err = NewClient(nc, "physd", "fleet-test/1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.client.Close)
	// Serving once the catalog is in the stream.
	end := time.Now().Add(10 * time.Second)
	for !s.srv.Stats().CatalogStored {
		if time.Now().After(end) {
			t.Fatalf("the catalog never reached the stream: %+v, uplink %+v", s.srv.Stats(), u.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

func (s *site) device() string { return s.rig.Node.DeviceID() }

func doCall(t *testing.T, tool string, value any, key, credential string) []byte {
	t.Helper()
	v, _ := json.Marshal(value)
	b, _ := json.Marshal(meshnode.DoCall{Tool: tool, Value: v, IdempotencyKey: key, Credential: credential,
		Caller: node.Caller{ID: "what the fleet saw", Role: "admin"}})
	return b
}

func (s *site) do(t *testing.T, tool string, value any, key, credential string, within time.Duration) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	return s.client.Do(ctx, "north", s.device(), doCall(t, tool, value, key, credential), time.Second)
}

func result(t *testing.T, b []byte) promcp.DoResult {
	t.Helper()
	var r promcp.DoResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("not a do_ answer: %s", b)
	}
	return r
}

// auditEvents are the audit records of event for tool.
func auditEvents(t *testing.T, path, event, tool string) []map[string]any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r map[string]any
		if json.Unmarshal(sc.Bytes(), &r) == nil && r["event"] == event && r["tool"] == tool {
			out = append(out, r)
		}
	}
	return out
}

func (s *site) writes(point string) uint64 { return s.rig.Plant.Stats().Points[point].Writes }

// TestServeCatalogAndCalls: the catalog is in the stream and answered on
// request; a heartbeat names it; reads and can_do are answered by the
// node with the caller authenticated here (the role the fleet wrote is
// never taken).
func TestServeCatalogAndCalls(t *testing.T) {
	s := startSite(t, []string{"read", "can_do", "do"})
	js, _ := jetstream.New(s.admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, DefaultCatalogStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, "physd.north.gw_greenhouse_001.catalog")
	if err != nil {
		t.Fatal(err)
	}
	var cat Catalog
	if err := json.Unmarshal(m.Data, &cat); err != nil || !cat.Valid() || cat.State != StateServing || len(cat.Capabilities) != 13 {
		t.Fatalf("stored catalog: %v %+v", err, cat)
	}
	for _, e := range cat.Capabilities {
		if e.Tool == "read_temperature_zone_a" && (e.StaleAfterMS != 10_000 || e.Family != "temperature" || e.Unit != "celsius") {
			t.Errorf("entry %+v", e)
		}
	}
	sub, _ := s.admin.SubscribeSync("physd.north.gw_greenhouse_001.hb")
	hbm, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var hb Heartbeat
	_ = json.Unmarshal(hbm.Data, &hb)
	if hb.Catalog != cat.Hash || hb.Instance != s.srv.Instance() {
		t.Errorf("heartbeat %+v, catalog %s", hb, cat.Hash)
	}
	b, err := s.client.Request(ctx, "north", s.device(), KindCatalog, nil)
	if err != nil || !strings.Contains(string(b), cat.Hash) {
		t.Fatalf("catalog request: %v %s", err, b)
	}

	rb, _ := json.Marshal(meshnode.ReadCall{Tool: "read_temperature_zone_a", MaxAgeMS: -1})
	b, err = s.client.Request(ctx, "north", s.device(), KindRead, rb)
	var o promcp.Observation
	if err != nil || json.Unmarshal(b, &o) != nil || o.Quality != promcp.QualityGood || o.Source != s.device() {
		t.Fatalf("read: %v %s", err, b)
	}

	// can_do with a viewer's token: the owner judges the viewer, not the
	// admin the fleet described.
	cb, _ := json.Marshal(meshnode.NewCanDoCall(promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"heating"}, Action: "increase", Location: "zone_c"}},
		node.Caller{ID: "x", Role: "admin", Credential: viewerToken}))
	b, err = s.client.Request(ctx, "north", s.device(), KindCanDo, cb)
	var rep promcp.CapabilityReport
	if err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("can_do: %v %s", err, b)
	}
	blocked := false
	for _, bl := range rep.Blocked {
		blocked = blocked || bl.Capability == "do_heater_zone_c" && bl.Permission == promcp.PermPermissionInsufficient
	}
	if !blocked {
		t.Errorf("can_do with a viewer token: do_heater_zone_c not blocked permission_insufficient: %s", b)
	}
}

// TestServeDo: a do_ with a credential this gateway accepts runs once and
// is audited as the caller via the fleet; the same key returns the same
// bytes; a credential it does not know is refused before anything,
// audited, nothing moves; its policy's refusal is its own.
func TestServeDo(t *testing.T) {
	s := startSite(t, []string{"read", "can_do", "do"})
	b, err := s.do(t, "do_heater_zone_c", 30, "k-ok", operatorToken, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if r := result(t, b); r.Status != promcp.StatusSuccess {
		t.Fatalf("do_: %s", b)
	}
	again, err := s.do(t, "do_heater_zone_c", 30, "k-ok", operatorToken, 10*time.Second)
	if err != nil || string(again) != string(b) {
		t.Errorf("the same key again:\n %s\nfirst:\n %s (%v)", again, b, err)
	}
	recs := auditEvents(t, s.rig.AuditFile, "do", "do_heater_zone_c")
	if len(recs) != 1 || recs[0]["caller"] != "token:operator_console" {
		t.Fatalf("audit do records: %v", recs)
	}

	writes := s.writes("zone_c.heater")
	for _, cred := range []string{"not-a-token-of-this-site", ""} {
		b, err := s.do(t, "do_heater_zone_c", 40, "k-unknown-"+cred, cred, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		r := result(t, b)
		if r.Status != promcp.StatusFailed || r.Code != "unauthenticated" || r.Permission != promcp.PermPermissionInsufficient {
			t.Errorf("credential %q: %s", cred, b)
		}
	}
	if got := auditEvents(t, s.rig.AuditFile, "do_refused", "do_heater_zone_c"); len(got) != 2 {
		t.Errorf("refusals audited: %d, want 2: %v", len(got), got)
	}
	// The viewer authenticates; the policy refuses it.
	b, err = s.do(t, "do_heater_zone_c", 40, "k-viewer", viewerToken, 10*time.Second)
	if r := result(t, b); err != nil || r.Status != promcp.StatusFailed || r.Permission != promcp.PermPermissionInsufficient || r.Code == "unauthenticated" {
		t.Errorf("viewer: %v %s", err, b)
	}
	if w := s.writes("zone_c.heater"); w != writes {
		t.Errorf("writes to zone_c.heater: %d, want %d: something moved", w, writes)
	}
	if st := s.srv.Stats(); st.Refused != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestServeDoNotServed: without do in serve, a do_ is refused before
// anything, nothing moves.
func TestServeDoNotServed(t *testing.T) {
	s := startSite(t, []string{"read", "can_do"})
	_, err := s.do(t, "do_vent_zone_c", 40, "k", operatorToken, 5*time.Second)
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(re.Msg, "not_served") || errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err %v", err)
	}
	if w := s.writes("zone_c.vent"); w != 0 {
		t.Errorf("vent written %d times", w)
	}
}

// rawDo sends a do_'s first phase by hand and returns the acknowledging
// instance.
func (s *site) rawDo(t *testing.T, id string, call []byte) string {
	t.Helper()
	m := nats.NewMsg("physd.north." + s.device() + ".req.do")
	m.Header.Set(HeaderFrom, "raw")
	m.Header.Set(HeaderCallID, id)
	m.Data = call
	r, err := s.request(m, 5*time.Second)
	if err != nil || r.Header.Get(HeaderReply) != ReplyAck {
		t.Fatalf("request %s: %v %v", id, err, r)
	}
	return r.Header.Get(HeaderInstance)
}

func (s *site) rawGo(t *testing.T, id, instance string) *nats.Msg {
	t.Helper()
	m := nats.NewMsg("physd.north." + s.device() + ".req.go")
	m.Header.Set(HeaderFrom, "raw")
	m.Header.Set(HeaderCallID, id)
	m.Header.Set(HeaderInstance, instance)
	r, err := s.request(m, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// request sends m as the fleet endpoint does, its reply subject under
// the endpoint's inbox for site north (where north may answer).
func (s *site) request(m *nats.Msg, within time.Duration) (*nats.Msg, error) {
	m.Reply = s.admin.NewInbox()
	m.Reply = "_PHYSD_FLEET.north.raw" + m.Reply[strings.LastIndexByte(m.Reply, '.'):]
	sub, err := s.admin.SubscribeSync(m.Reply)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := s.admin.PublishMsg(m); err != nil {
		return nil, err
	}
	return sub.NextMsg(within)
}

// TestServeTwoPhase: a request is acknowledged again when retried and
// held once; it runs once however many go-aheads arrive; a go-ahead after
// the hold, or for another process, runs nothing.
func TestServeTwoPhase(t *testing.T) {
	s := startSite(t, []string{"do"})
	call := doCall(t, "do_vent_zone_c", 50, "k-twice", operatorToken)
	inst := s.rawDo(t, "1", call)
	if again := s.rawDo(t, "1", call); again != inst {
		t.Errorf("instance %q then %q", inst, again)
	}
	if st := s.srv.Stats(); st.Held != 1 {
		t.Errorf("held %d, want 1", st.Held)
	}
	// Another request under the same requester and id is not a retry.
	m := nats.NewMsg("physd.north." + s.device() + ".req.do")
	m.Header.Set(HeaderFrom, "raw")
	m.Header.Set(HeaderCallID, "1")
	m.Data = doCall(t, "do_vent_zone_c", 90, "k-other-value", operatorToken)
	if r, err := s.request(m, 5*time.Second); err != nil || !strings.HasPrefix(string(r.Data), "conflict:") {
		t.Errorf("another request under a held id: %v %v", err, r)
	}
	r := s.rawGo(t, "1", inst)
	if r.Header.Get(HeaderReply) != ReplyAnswer || result(t, r.Data).Status != promcp.StatusSuccess {
		t.Fatalf("go: %v %s", r.Header, r.Data)
	}
	if again := s.rawGo(t, "1", inst); string(again.Data) != string(r.Data) {
		t.Errorf("a second go-ahead answered %s", again.Data)
	}
	if w := s.writes("zone_c.vent"); w != 1 {
		t.Errorf("vent written %d times, want 1", w)
	}

	// Held past its hold: the go-ahead runs nothing.
	s.rawDo(t, "2", doCall(t, "do_vent_zone_c", 60, "k-late", operatorToken))
	s.clock.Add(int64(1500 * time.Millisecond))
	r = s.rawGo(t, "2", inst)
	if r.Header.Get(HeaderReply) != ReplyError || !strings.HasPrefix(string(r.Data), "not_committed: the go-ahead came 1.5") {
		t.Errorf("late go: %v %s", r.Header, r.Data)
	}
	// A go-ahead for another process, or for nothing held.
	s.rawDo(t, "3", doCall(t, "do_vent_zone_c", 70, "k-other", operatorToken))
	if r := s.rawGo(t, "3", "someone-else"); !strings.Contains(string(r.Data), "not_committed: the go-ahead is for gateway process") {
		t.Errorf("other instance: %s", r.Data)
	}
	if r := s.rawGo(t, "never-sent", inst); !strings.Contains(string(r.Data), "not_committed: no such request") {
		t.Errorf("unknown id: %s", r.Data)
	}
	if w := s.writes("zone_c.vent"); w != 1 {
		t.Errorf("vent written %d times, want 1 (only the committed request)", w)
	}
}

// TestServeOutcomeUnknown: the go-ahead left and the answer did not come
// within the deadline: outcome unknown, never "failed"; the same key
// later returns the answer the gateway recorded, byte for byte.
func TestServeOutcomeUnknown(t *testing.T) {
	s := startSite(t, []string{"do"})
	if err := s.rig.Plant.SetFault("zone_c.vent", sim.Fault{Mode: sim.FaultSlow, Delay: 700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	_, err := s.do(t, "do_vent_zone_c", 35, "k-slow", operatorToken, 500*time.Millisecond)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("err %v, want outcome unknown", err)
	}
	// The gateway finishes the device step regardless.
	var rec []map[string]any
	for end := time.Now().Add(10 * time.Second); len(rec) == 0; rec = auditEvents(t, s.rig.AuditFile, "do", "do_vent_zone_c") {
		if time.Now().After(end) {
			t.Fatal("the do_ never finished at the gateway")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.rig.Plant.ClearFaults()
	b, err := s.do(t, "do_vent_zone_c", 35, "k-slow", operatorToken, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	answer, _ := json.Marshal(rec[0]["answer"])
	var a, want any
	_ = json.Unmarshal(b, &a)
	_ = json.Unmarshal(answer, &want)
	if ab, _ := json.Marshal(a); string(ab) != string(answer) {
		t.Errorf("retry answered\n %s\nthe audit recorded\n %s", b, answer)
	}
	if w := s.writes("zone_c.vent"); w != 1 {
		t.Errorf("vent written %d times, want 1", w)
	}
}

// TestServeSitePermissions: north's credentials can neither take south's
// requests nor answer the fleet endpoint's inbox but for north's requests
// (its replies for south, or outside any site), nor publish as south.
func TestServeSitePermissions(t *testing.T) {
	s := startSite(t, []string{"read"})
	errs := make(chan error, 8)
	rogue, err := nats.Connect(s.up.cfg.URLs[0], nats.UserInfo("north", "north-pw"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer rogue.Close()
	if _, err := rogue.SubscribeSync("physd.south.gw_1.req.>"); err != nil {
		t.Fatal(err)
	}
	_ = rogue.Publish("physd.south.gw_1.hb", []byte(`{}`))
	_ = rogue.Publish("_PHYSD_FLEET.x.1", []byte(`forged`))
	_ = rogue.Publish("_PHYSD_FLEET.south.c1.1", []byte(`forged`))
	_ = rogue.Flush()
	want := []string{`Subscription to "physd.south.gw_1.req.>"`, `Publish to "physd.south.gw_1.hb"`, `Publish to "_PHYSD_FLEET.x.1"`, `Publish to "_PHYSD_FLEET.south.c1.1"`}
	got := ""
	for range want {
		select {
		case e := <-errs:
			got += e.Error() + "\n"
		case <-time.After(5 * time.Second):
		}
	}
	for _, w := range want {
		if !strings.Contains(got, "Permissions Violation for "+w) {
			t.Errorf("no permissions violation for %s; got:\n%s", w, got)
		}
	}
}

// TestServeConcurrentSameKey: sixteen callers send the same do_ (one key)
// at once through the fleet's client: the gateway runs it once, and every
// caller gets the same answer, byte for byte.
func TestServeConcurrentSameKey(t *testing.T) {
	s := startSite(t, []string{"do"})
	const n = 16
	answers := make(chan []byte, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			b, err := s.do(t, "do_vent_zone_c", 45, "k-same", operatorToken, 20*time.Second)
			if err != nil {
				errs <- err
				return
			}
			answers <- b
		}()
	}
	var first []byte
	for range n {
		select {
		case err := <-errs:
			t.Fatal(err)
		case b := <-answers:
			if first == nil {
				first = b
			} else if string(b) != string(first) {
				t.Errorf("answers differ:\n %s\n %s", b, first)
			}
		}
	}
	if r := result(t, first); r.Status != promcp.StatusSuccess {
		t.Errorf("answer %s", first)
	}
	if w := s.writes("zone_c.vent"); w != 1 {
		t.Errorf("vent written %d times, want 1", w)
	}
}
