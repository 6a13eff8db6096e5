package fleet

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/internal/natscluster"
	"github.com/physd/physd/internal/natstest"
)

// createAtomicStream is the audit stream taking atomic batches.
func createAtomicStream(t testing.TB, js jetstream.JetStream, replicas int) {
	t.Helper()
	natscluster.CreateStream(t, js, jetstream.StreamConfig{Name: stream, Subjects: StreamSubjects("physd"), Duplicates: time.Minute,
		AllowDirect: true, AllowAtomicPublish: true, Replicas: replicas, Storage: jetstream.FileStorage})
}

// startUplink starts an uplink to urls with the user, for site north as
// gw_1.
func startUplink(t *testing.T, urls []string, user, pw, domain string, window int, al *audit.Log) *Uplink {
	t.Helper()
	u, err := New(Config{URLs: urls, Site: "north", DeviceID: "gw_1", Stream: stream, Prefix: "physd", Domain: domain, Window: window,
		Options: []nats.Option{nats.UserInfo(user, pw)}, ConnectTimeout: time.Second, PublishTimeout: time.Second,
		ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.Start(al)
	t.Cleanup(u.Close)
	return u
}

func openAudit(t *testing.T) *audit.Log {
	t.Helper()
	al, err := audit.OpenWith(t.TempDir(), audit.Options{MaxBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	return al
}

// batchIDs counts the atomic batches the stream's copy of subject came in.
func batchIDs(t *testing.T, js jetstream.JetStream, subject string) int {
	t.Helper()
	ids := map[string]bool{}
	eachMsg(t, js, func(m *jetstream.RawStreamMsg) {
		if m.Subject == subject && m.Header.Get(headerBatchID) != "" {
			ids[m.Header.Get(headerBatchID)] = true
		}
	})
	return len(ids)
}

// TestUplinkReplaysInBatches: a backlog goes out in atomic batches of the
// window, every record exactly once and in order; a hub whose batches
// are smaller than the window (jetstream max_batch_size) makes the
// uplink use its size.
func TestUplinkReplaysInBatches(t *testing.T) {
	h := natstest.StartWith(t, t.TempDir(), func(o *server.Options) { o.JetStreamLimits.MaxBatchSize = 50 },
		natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createAtomicStream(t, js, 1)
	al := openAudit(t)
	appendN(t, al, 1000)
	u := startUplink(t, []string{h.URL()}, "north", "pw", "", 200, al)
	began := time.Now()
	waitFor(t, "1000 records", 20*time.Second, func() bool { return u.Stats().Cursor == 1000 })
	t.Logf("%s %+v", time.Since(began), u.Stats())
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
	if n := batchIDs(t, js, u.AuditSubject()); n < 20 || n > 21 {
		t.Errorf("%d batches, want 20 of the hub's 50 (perhaps the first record alone)", n)
	}
	// (Published counts acknowledgements: one lost on a loaded machine
	// leaves it short while the stream holds every record.)
	if s := u.Stats(); s.Published == 0 || s.Published > 1000 || s.Pending != 0 {
		t.Errorf("stats: %+v", s)
	}
	appendN(t, al, 3)
	waitFor(t, "1003 records", 10*time.Second, func() bool { return u.Stats().Cursor == 1003 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
}

// TestUplinkWindowOfOneWithoutAtomic: a stream that does not take atomic
// batches gets one conditional publish per record.
func TestUplinkWindowOfOneWithoutAtomic(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createStream(t, js) // allow_atomic false
	al := openAudit(t)
	appendN(t, al, 30)
	u := startUplink(t, []string{h.URL()}, "north", "pw", "", 200, al)
	waitFor(t, "30 records", 10*time.Second, func() bool { return u.Stats().Cursor == 30 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
	if n := batchIDs(t, js, u.AuditSubject()); n != 0 {
		t.Errorf("%d batches on a stream without allow_atomic", n)
	}
}

// TestUplinkStallMidBatch: the link stalls while batches are in flight
// (the commit's acknowledgement times out, the syncs too), then delivers
// everything late: the batch that was in flight may commit after the
// uplink gave up on it, and the uplink's resent records must then be
// refused; every record ends up in the stream once, in order.
func TestUplinkStallMidBatch(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream))
	_, js := admin(t, h)
	createAtomicStream(t, js, 1)
	p := natscluster.NewProxy(t, strings.TrimPrefix(h.URL(), "nats://"))
	p.SetDelay(20 * time.Millisecond)
	al := openAudit(t)
	appendN(t, al, 3000)
	u := startUplink(t, []string{"nats://" + p.Addr()}, "north", "pw", "", 100, al)
	waitFor(t, "the replay under way", 20*time.Second, func() bool { return u.Stats().Cursor >= 100 })
	p.Stall()
	time.Sleep(2500 * time.Millisecond) // > 2 publish timeouts: the uplink gives up on what is in flight, and its syncs time out
	if s := u.Stats(); s.Synced || s.Cursor == 3000 {
		t.Errorf("during the stall: %+v", s)
	}
	appendN(t, al, 10)
	p.Heal()
	waitFor(t, "3010 records", 30*time.Second, func() bool { return u.Stats().Cursor == 3010 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
}

// TestUplinkAcrossLeaf: the gateway talks to its site's leaf node; the
// stream lives in a 3-server hub (R3) in the domain "hub". A cut of the
// leaf's link keeps the gateway connected to its leaf (no disconnect, no
// reconnect event): the uplink notices the hub does not answer, keeps
// trying, and replays after the heal without a reconnect, exactly once.
func TestUplinkAcrossLeaf(t *testing.T) {
	hub := natscluster.StartHub(t, natscluster.HubOptions{Users: []natscluster.User{
		natscluster.SiteUser("north", "north-pw", "physd", "north", "hub", stream)}})
	_, js := hub.Admin(t)
	createAtomicStream(t, js, 3)
	leaf := hub.StartLeaf(t, natscluster.LeafOptions{Site: "north", User: "north", Password: "north-pw",
		Local: []natscluster.User{{Name: "gw", Password: "gw-pw"}}, JetStreamDomain: "north"})
	leaf.WaitLinked(10 * time.Second)

	al := openAudit(t)
	appendN(t, al, 20)
	u := startUplink(t, []string{leaf.URL()}, "gw", "gw-pw", hub.Domain(), DefaultWindow, al)
	waitFor(t, "20 records", 20*time.Second, func() bool { return u.Stats().Cursor == 20 })

	leaf.Link.Cut()
	waitFor(t, "the leaf unlinked", 10*time.Second, func() bool { return !leaf.Linked() })
	appendN(t, al, 500)
	waitFor(t, "the uplink noticing the cut", 10*time.Second, func() bool { return !u.Stats().Synced })
	// The cut lasts well past every timeout involved (publish 1 s,
	// reconnect wait 100 ms, leaf ping 500 ms x 2).
	time.Sleep(3 * time.Second)
	s := u.Stats()
	if !s.Connected || s.Cursor != 20 || s.Pending != 500 || s.AuditError == "" {
		t.Errorf("during the cut: %+v", s)
	}
	leaf.Link.Heal()
	waitFor(t, "520 records after the heal", 20*time.Second, func() bool { return u.Stats().Cursor == 520 })
	same(t, streamRecords(t, js, u.AuditSubject()), localRecords(t, al))
	if r := u.nc.Load().Stats().Reconnects; r != 0 {
		t.Errorf("the gateway reconnected %d times: the cut was the leaf's link, not the gateway's connection", r)
	}
	if s := u.Stats(); s.Published == 0 || s.Published > 520 || s.Pending != 0 || s.AuditError != "" {
		t.Errorf("after the heal: %+v", s)
	}
}

// TestUplinkSameDeviceIDTwoSites: device ids are unique within a site
// only; two sites' gw_1 share the stream without their Nats-Msg-Ids
// colliding. A publisher that does use this gateway's ids (on another
// subject) is reported, not retried forever.
func TestUplinkSameDeviceIDTwoSites(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream), natstest.SiteUser("south", "pw", "physd", "south", stream))
	_, js := admin(t, h)
	createAtomicStream(t, js, 1)
	alN, alS := openAudit(t), openAudit(t)
	appendN(t, alN, 5)
	appendN(t, alS, 5)
	n := startUplink(t, []string{h.URL()}, "north", "pw", "", DefaultWindow, alN)
	s, err := New(Config{URLs: []string{h.URL()}, Site: "south", DeviceID: "gw_1", Stream: stream, Prefix: "physd",
		Options: []nats.Option{nats.UserInfo("south", "pw")}, ConnectTimeout: time.Second, PublishTimeout: time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.Start(alS)
	defer s.Close()
	waitFor(t, "both sites' records", 10*time.Second, func() bool { return n.Stats().Cursor == 5 && s.Stats().Cursor == 5 })
	same(t, streamRecords(t, js, n.AuditSubject()), localRecords(t, alN))
	same(t, streamRecords(t, js, s.AuditSubject()), localRecords(t, alS))

	// Someone publishes north/gw_1's next ids on another subject.
	for seq := 6; seq <= 8; seq++ {
		m := nats.NewMsg("physd.north.gw_2.audit")
		m.Data = []byte(`{}`)
		m.Header.Set(jetstream.MsgIDHeader, "north/gw_1/"+strconv.Itoa(seq))
		if _, err := js.PublishMsg(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	appendN(t, alN, 3)
	waitFor(t, "the collision reported", 10*time.Second, func() bool {
		return strings.Contains(n.Stats().AuditError, "another publisher uses the same Nats-Msg-Ids")
	})
	if c := n.Stats().Cursor; c != 5 {
		t.Errorf("cursor %d, want 5", c)
	}
}
