package fleet

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

const stream = "PHYSD_AUDIT"

func newUplink(t *testing.T, h *natstest.Hub, al *audit.Log, user, pw, site, device string) *Uplink {
	t.Helper()
	u, err := New(Config{URLs: []string{h.URL()}, Site: site, DeviceID: device, Stream: stream, Prefix: "physd",
		Options: []nats.Option{nats.UserInfo(user, pw)}, ConnectTimeout: time.Second, PublishTimeout: 2 * time.Second,
		ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.Start(al)
	return u
}

func admin(t *testing.T, h *natstest.Hub, opts ...nats.Option) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return natstest.Connect(t, h.URL(), opts...)
}

func createStream(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: StreamSubjects("physd"), Duplicates: time.Minute, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
}

// eachMsg calls fn with every message of the audit stream, in order.
func eachMsg(t *testing.T, js jetstream.JetStream, fn func(*jetstream.RawStreamMsg)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for s := info.State.FirstSeq; s <= info.State.LastSeq && info.State.Msgs > 0; s++ {
		m, err := st.GetMsg(ctx, s)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(m)
	}
}

// streamRecords reads every record of subject: seq -> data, failing on a
// seq held twice.
func streamRecords(t *testing.T, js jetstream.JetStream, subject string) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	eachMsg(t, js, func(m *jetstream.RawStreamMsg) {
		if m.Subject != subject {
			return
		}
		seq, _ := strconv.ParseUint(m.Header.Get(HeaderSeq), 10, 64)
		if seq == 0 {
			seq, _ = strconv.ParseUint(string(m.Data[strings.Index(string(m.Data), ":")+1:strings.IndexAny(string(m.Data), ",}")]), 10, 64)
		}
		if _, dup := out[seq]; dup {
			t.Errorf("audit seq %d is in the stream twice", seq)
		}
		if id := m.Header.Get(jetstream.MsgIDHeader); !strings.HasSuffix(id, "/"+strconv.FormatUint(seq, 10)) || strings.Count(id, "/") != 2 {
			t.Errorf("seq %d: Nats-Msg-Id %q", seq, id)
		}
		out[seq] = string(m.Data)
	})
	return out
}

// localRecords is the local audit: seq -> line.
func localRecords(t *testing.T, al *audit.Log) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	if err := al.ReadAfter(0, func(seq uint64, line []byte) error { out[seq] = string(line); return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func appendN(t *testing.T, al *audit.Log, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := al.Append(&audit.Record{Event: "do", Tool: "do_heater", Status: "success", Requested: i}); err != nil {
			t.Fatal(err)
		}
	}
}

func same(t *testing.T, got, want map[uint64]string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("stream holds %d records, the local audit %d", len(got), len(want))
	}
	for s, line := range want {
		if got[s] != line {
			t.Fatalf("seq %d: stream %q, local %q", s, got[s], line)
		}
	}
}

// TestUplinkCutAndRestart: records written while the hub is down reach it
// after it returns, exactly once; a new uplink (a restart of physd) sends
// nothing twice; a record the stream holds whose ack was lost is not sent
// again.
func TestUplinkCutAndRestart(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js)
	var u *Uplink
	al, err := audit.OpenWith(t.TempDir(), audit.Options{MaxBytes: 4096, Sink: sinkFunc(func() {
		if u != nil {
			u.wake()
		}
	})})
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	appendN(t, al, 20)
	u = newUplink(t, h, al, "north", "pw", "north", "gw_1")
	waitFor(t, "20 records", 10*time.Second, func() bool { return u.Stats().Cursor == 20 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))

	// The WAN cut: the gateway keeps auditing.
	h.Stop()
	waitFor(t, "disconnected", 5*time.Second, func() bool { return !u.Stats().Connected })
	appendN(t, al, 50)
	if s := u.Stats(); s.Pending != 50 || s.Local != 70 {
		t.Errorf("during the cut: %+v", s)
	}
	h.Start()
	_, js = admin(t, h)
	waitFor(t, "70 records after the heal", 15*time.Second, func() bool { return u.Stats().Cursor == 70 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
	if s := u.Stats(); !s.Connected || !s.Synced || s.Pending != 0 || s.Published != 70 {
		t.Errorf("after the heal: %+v", s)
	}
	u.Close()

	// A record that reached the stream but whose ack never came back
	// (physd killed right after sending it): published here by hand,
	// byte for byte, before the next uplink starts.
	appendN(t, al, 1)
	line := localRecords(t, al)[71]
	m := nats.NewMsg("physd.north.gw_1.audit")
	m.Data = []byte(line)
	m.Header.Set(jetstream.MsgIDHeader, "north/gw_1/71")
	m.Header.Set(HeaderSeq, "71")
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	appendN(t, al, 4)
	u = newUplink(t, h, al, "north", "pw", "north", "gw_1")
	defer u.Close()
	waitFor(t, "75 records", 10*time.Second, func() bool { return u.Stats().Cursor == 75 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
	if p := u.Stats().Published; p != 4 {
		t.Errorf("the restarted uplink published %d records, want 4 (71 was there)", p)
	}
}

// TestUplinkRefusesForeignTrail: a stream record under this device id
// that is not the local one (a reset state directory) stops the uplink
// instead of mixing two trails.
func TestUplinkRefusesForeignTrail(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js)
	m := nats.NewMsg("physd.north.gw_1.audit")
	m.Data = []byte(`{"seq":1,"event":"other"}`)
	m.Header.Set(HeaderSeq, "1")
	m.Header.Set(jetstream.MsgIDHeader, "north/gw_1/1")
	if _, err := js.PublishMsg(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	appendN(t, al, 3)
	u := newUplink(t, h, al, "north", "pw", "north", "gw_1")
	defer u.Close()
	waitFor(t, "the error", 10*time.Second, func() bool { return strings.Contains(u.Stats().LastError, "not the local record") })
	if n := len(streamRecords(t, js, u.AuditSubject())); n != 1 {
		t.Errorf("stream holds %d records of gw_1, want the 1 it had", n)
	}
}

// TestSitePermissions: a site's user cannot publish under another site.
func TestSitePermissions(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js)
	// As the uplink connects: with its site's inbox.
	nc, err := nats.Connect(h.URL(), nats.UserInfo("north", "pw"), nats.CustomInboxPrefix(hub.SiteInbox("north")))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sjs, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := sjs.Publish(ctx, "physd.south.gw_9.audit", []byte(`{"seq":1}`)); err == nil {
		t.Fatal("north published under south")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if _, err := sjs.Publish(ctx2, "physd.north.gw_1.audit", []byte(`{"seq":1}`), jetstream.WithMsgID("gw_1/1")); err != nil {
		t.Fatalf("north under north: %v", err)
	}
	if n := len(streamRecords(t, js, "physd.south.gw_9.audit")); n != 0 {
		t.Errorf("the stream holds %d records under south", n)
	}

	// Nor read another site's records: the last message of a subject is
	// a direct get whose subject names it, north's only.
	if _, err := js.Publish(ctx2, "physd.south.gw_9.audit", []byte(`{"seq":1,"secret":true}`)); err != nil {
		t.Fatal(err)
	}
	st, err := sjs.Stream(ctx2, stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx2, "physd.north.gw_1.audit"); err != nil {
		t.Errorf("north's own last record: %v", err)
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), time.Second)
	defer cancel3()
	if m, err := st.GetLastMsgForSubject(ctx3, "physd.south.gw_9.audit"); err == nil {
		t.Errorf("north read south's record: %s", m.Data)
	}
	if m, err := st.GetMsg(ctx3, 1); err == nil {
		t.Errorf("north read stream message 1 by sequence: %s", m.Data)
	}
}

type sinkFunc func()

func (f sinkFunc) Send([]byte) { f() }
func (sinkFunc) Close() error  { return nil }

// TestUplinkStartsWithoutHub: a gateway that starts while its hub is
// down is not held up, and publishes once the hub is there.
func TestUplinkStartsWithoutHub(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js)
	h.Stop()
	al, err := audit.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	appendN(t, al, 3)
	began := time.Now()
	u := newUplink(t, h, al, "north", "pw", "north", "gw_1")
	defer u.Close()
	if d := time.Since(began); d > 100*time.Millisecond {
		t.Errorf("Start took %s with the hub down", d)
	}
	if s := u.Stats(); s.Connected || s.Pending != 3 {
		t.Errorf("hub down: %+v", s)
	}
	h.Start()
	_, js = admin(t, h)
	waitFor(t, "3 records", 15*time.Second, func() bool { return u.Stats().Cursor == 3 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
}

// TestCoreObservationsAndAlarms: observations that count as a change and
// alarm events go out on their subjects; not connected, they are dropped
// and counted.
func TestCoreObservationsAndAlarms(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	nc, _ := admin(t, h)
	createStream(t, jsOf(t, nc))
	sub, err := nc.SubscribeSync("physd.north.gw_1.>")
	if err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	al, err := audit.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	u := newUplink(t, h, al, "north", "pw", "north", "gw_1")
	defer u.Close()
	waitFor(t, "connected", 5*time.Second, func() bool { return u.Stats().Connected })
	c := &manifest.Capability{Name: "temp", Kind: manifest.KindRead}
	u.Observe(node.Observed{Cap: c, Obs: promcp.Observation{Value: 21.5, Quality: promcp.QualityGood}, Changed: false}) // not a change: not sent
	u.Observe(node.Observed{Cap: c, Obs: promcp.Observation{Value: 22.5, Quality: promcp.QualityGood}, Changed: true})
	u.Alarm(alarms.Event{Capability: "read_temp", Kind: "high", State: "raised", Message: "too hot"})
	for _, want := range []struct{ subject, has string }{
		{"physd.north.gw_1.obs.read_temp", `22.5`},
		{"physd.north.gw_1.alarm.read_temp.high", `"raised"`},
	} {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if m.Subject != want.subject || !strings.Contains(string(m.Data), want.has) {
			t.Errorf("got %s %s, want %s with %s", m.Subject, m.Data, want.subject, want.has)
		}
	}
	h.Stop()
	waitFor(t, "disconnected", 5*time.Second, func() bool { return !u.Stats().Connected })
	u.Observe(node.Observed{Cap: c, Obs: promcp.Observation{Value: 23.5, Quality: promcp.QualityGood}, Changed: true})
	if s := u.Stats(); s.Core != 2 || s.Dropped != 1 {
		t.Errorf("stats: %+v", s)
	}
}

func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestUplinkCloseDoesNotWaitForASilentHub: a hub that never answers (here
// the replies to a gateway that names another site are not delivered to
// it) holds up no shutdown: Close ends the requests under way at once,
// not after their timeout, so the outputs' safe states on shutdown (which
// come after the uplink stops) are not delayed by a cut WAN.
func TestUplinkCloseDoesNotWaitForASilentHub(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js)
	al, err := audit.OpenWith(t.TempDir(), audit.Options{MaxBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	appendN(t, al, 3)
	u, err := New(Config{URLs: []string{h.URL()}, Site: "south", DeviceID: "gw_1", Stream: stream, Prefix: "physd",
		Options: []nats.Option{nats.UserInfo("north", "pw")}, ConnectTimeout: time.Second, PublishTimeout: 30 * time.Second,
		ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.Start(al)
	waitFor(t, "connected", 5*time.Second, func() bool { return u.Stats().Connected })
	time.Sleep(500 * time.Millisecond) // its first request to the stream is under way, unanswered
	start := time.Now()
	u.Close()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Close took %v with a request under way to a hub that does not answer (its timeout is 30 s)", took)
	}
	if s := u.Stats(); s.Published != 0 {
		t.Errorf("published %d records through a hub that answers nothing", s.Published)
	}
}
