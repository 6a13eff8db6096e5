//go:build !nohub

package hub_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/internal/natstest"
)

// The permissions are tested against a real nats-server (the embedded
// hub, hub.Start, which gives its sites hub.SitePermissions and its
// endpoint hub.FleetPermissions), with two sites, north and south: every
// way one site's credentials could publish as, listen to or read the
// other is refused by the server itself.

var streams = hub.FleetStreams{Audit: "PHYSD_AUDIT", Catalog: "PHYSD_CATALOG", History: "PHYSD_HISTORY", Alarms: "PHYSD_ALARMS"}

type testHub struct {
	h     *hub.Hub
	fleet *nats.Conn
}

func startHub(t *testing.T) *testHub {
	t.Helper()
	// Another hub on nats-server's default port: :0 must still be a free
	// port, not 4222.
	if l, err := net.Listen("tcp", "127.0.0.1:4222"); err == nil {
		t.Cleanup(func() { l.Close() })
	}
	h, err := hub.Start(hub.Config{Listen: "127.0.0.1:0", StoreDir: t.TempDir(), Prefix: "physd", Streams: streams,
		Sites: []hub.Site{{Name: "north", Password: "north-pw"}, {Name: "south", Password: "south-pw"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Shutdown)
	nc, js := natstest.Open(t, "", append(h.ClientOptions(), nats.CustomInboxPrefix(hub.FleetInboxPrefix))...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, sc := range []jetstream.StreamConfig{fleet.AuditStreamConfig(streams.Audit, "physd", 1), fleet.CatalogStreamConfig(streams.Catalog, "physd", 1),
		fleet.HistoryStreamConfig(streams.History, "physd", 1), fleet.AlarmStreamConfig(streams.Alarms, "physd", 1)} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatalf("the fleet endpoint's user creates %s: %v", sc.Name, err)
		}
	}
	return &testHub{h: h, fleet: nc}
}

// site connects as a site's gateway does (its site's inbox).
func (th *testHub) site(t *testing.T, site string) *natstest.Watched {
	t.Helper()
	return natstest.Watch(t, th.h.URL(), nats.UserInfo(site, site+"-pw"), nats.CustomInboxPrefix(hub.SiteInbox(site)))
}

// TestSitePermissionsAllowTheUplink: what a gateway does through its
// site's user is allowed: its own subjects, its cursors (stream info,
// the direct get of its own subject), its requests and the answers on
// the fleet endpoint's replies for its site.
func TestSitePermissionsAllowTheUplink(t *testing.T) {
	th := startHub(t)
	north := th.site(t, "north")
	js, err := jetstream.New(north.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "physd.north.gw.audit", []byte(`{"seq":1}`)); err != nil {
		t.Fatalf("north's own audit: %v", err)
	}
	st, err := js.Stream(ctx, streams.Audit)
	if err != nil {
		t.Fatalf("north's stream info: %v", err)
	}
	if m, err := st.GetLastMsgForSubject(ctx, "physd.north.gw.audit"); err != nil || string(m.Data) != `{"seq":1}` {
		t.Fatalf("north's direct get of its own cursor: %v %v", m, err)
	}
	if _, err := north.Conn.SubscribeSync("physd.north.*.req.>"); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"physd.north.gw.obs.read_t", "physd.north.gw.hb", "physd.north.gw.alarm.read_t.high", hub.FleetInboxPrefix + ".north.x.1"} {
		if err := north.Conn.Publish(s, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	north.Clean(t)
}

// TestSitePermissionsConfineASite: north's credentials can neither
// publish as south (observations, audit, history, alarms, catalog,
// heartbeat, answers to the fleet's requests to south), nor take south's
// requests or anything else of south's, nor read south's streams through
// the JetStream API (any stream, any form of get, a consumer), nor
// change a stream.
func TestSitePermissionsConfineASite(t *testing.T) {
	th := startHub(t)
	north := th.site(t, "north")
	for _, s := range []string{"physd.south.gw.obs.read_t", "physd.south.gw.audit", "physd.south.gw.hist.read_t", "physd.south.gw.alarms",
		"physd.south.gw.catalog", "physd.south.gw.hb", "physd.south.gw.alarm.read_t.high", "physd.south.gw.req.do", "physd.south.gw.req.go",
		hub.FleetInboxPrefix + ".south.x.1", hub.FleetInboxPrefix + ".x.1", hub.SiteInbox("south") + ".x", "_INBOX.x", "other.subject",
		"$JS.API.DIRECT.GET.PHYSD_AUDIT.physd.south.gw.audit", "$JS.API.DIRECT.GET.PHYSD_HISTORY.physd.south.gw.hist.read_t",
		"$JS.API.DIRECT.GET.PHYSD_ALARMS.physd.south.gw.alarms", "$JS.API.DIRECT.GET.PHYSD_CATALOG.physd.south.gw.catalog",
		"$JS.API.DIRECT.GET.PHYSD_CATALOG.physd.north.gw.catalog", "$JS.API.DIRECT.GET.PHYSD_AUDIT", "$JS.API.STREAM.MSG.GET.PHYSD_AUDIT",
		"$JS.API.STREAM.INFO.PHYSD_CATALOG", "$JS.API.CONSUMER.CREATE.PHYSD_AUDIT", "$JS.API.CONSUMER.CREATE.PHYSD_AUDIT.x.physd.south.gw.audit",
		"$JS.API.CONSUMER.DURABLE.CREATE.PHYSD_AUDIT.x", "$JS.API.STREAM.PURGE.PHYSD_AUDIT", "$JS.API.STREAM.DELETE.PHYSD_AUDIT",
		"$JS.API.STREAM.UPDATE.PHYSD_AUDIT", "$JS.API.STREAM.CREATE.PHYSD_SOUTH", "$JS.API.STREAM.LIST", "$JS.API.STREAM.MSG.DELETE.PHYSD_AUDIT",
		"$JS.hub.API.DIRECT.GET.PHYSD_AUDIT.physd.south.gw.audit"} {
		if err := north.Conn.Publish(s, nil); err != nil {
			t.Fatal(err)
		}
		north.Refused(t, "Publish to", s)
	}
	for _, s := range []string{"physd.south.>", "physd.south.gw.req.>", "physd.*.*.req.>", "physd.*.*.obs.>", "physd.>", ">", "_INBOX.>",
		hub.FleetInboxPrefix + ".>", hub.FleetInboxPrefix + ".north.>", hub.SiteInbox("south") + ".>", "_PHYSD_SITE.>", "$JS.API.>", "physd.north.gw.audit"} {
		if _, err := north.Conn.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
		north.Refused(t, "Subscription to", s)
	}
}

// TestSiteCannotHearAnotherSitesReplies: the JetStream API answers a
// gateway's requests on its reply subject; south's cursors (a direct get
// answers with south's audit record itself) must not reach north, however
// north subscribes. Before the sites had their own inboxes, north's
// _INBOX.> heard every reply of every site.
func TestSiteCannotHearAnotherSitesReplies(t *testing.T) {
	th := startHub(t)
	north, south := th.site(t, "north"), th.site(t, "south")
	var heard []string
	var mu sync.Mutex
	for _, s := range []string{"_INBOX.>", "_PHYSD_SITE.>", hub.SiteInbox("south") + ".>", hub.FleetInboxPrefix + ".>"} {
		_, _ = north.Conn.Subscribe(s, func(m *nats.Msg) {
			mu.Lock()
			heard = append(heard, m.Subject+" "+string(m.Data))
			mu.Unlock()
		})
	}
	_ = north.Conn.Flush()
	js, err := jetstream.New(south.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Publish(ctx, "physd.south.gw.audit", []byte(`{"secret":"south's caller"}`)); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, streams.Audit)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := st.GetLastMsgForSubject(ctx, "physd.south.gw.audit"); err != nil {
			t.Fatal(err)
		}
	}
	_ = north.Conn.Flush()
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(heard) > 0 {
		t.Errorf("north heard south's replies: %v", heard)
	}
}

// TestFleetPermissions: the fleet endpoint's user sends requests, follows
// catalogs, heartbeats and observations, and reads its streams; it
// cannot publish as a site, take a site's requests, hear a site's
// replies, or delete, purge or reconfigure a stream.
func TestFleetPermissions(t *testing.T) {
	th := startHub(t)
	f := natstest.Watch(t, "", append(th.h.ClientOptions(), nats.CustomInboxPrefix(hub.FleetInboxPrefix))...)
	for _, s := range []string{"physd.*.*.catalog", "physd.*.*.hb", "physd.*.*.obs.>", hub.FleetInboxPrefix + ".>"} {
		if _, err := f.Conn.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Conn.Publish("physd.north.gw.req.read", nil); err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(f.Conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, streams.Alarms)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{}); err != nil {
		t.Fatalf("an ordered consumer on the alarm stream: %v", err)
	}
	f.Clean(t)
	for _, s := range []string{"physd.north.gw.audit", "physd.north.gw.obs.read_t", "physd.north.gw.catalog", "physd.north.gw.hb", "physd.north.gw.alarms",
		hub.FleetInboxPrefix + ".north.x.1", hub.SiteInbox("north") + ".x", "$JS.API.STREAM.PURGE.PHYSD_AUDIT", "$JS.API.STREAM.DELETE.PHYSD_AUDIT",
		"$JS.API.STREAM.UPDATE.PHYSD_CATALOG", "$JS.API.STREAM.MSG.DELETE.PHYSD_AUDIT", "$JS.API.STREAM.CREATE.OTHER", "$JS.API.DIRECT.GET.OTHER"} {
		if err := f.Conn.Publish(s, nil); err != nil {
			t.Fatal(err)
		}
		f.Refused(t, "Publish to", s)
	}
	for _, s := range []string{"physd.north.gw.req.>", "physd.>", "_INBOX.>", "_PHYSD_SITE.>", "physd.north.gw.audit"} {
		if _, err := f.Conn.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
		f.Refused(t, "Subscription to", s)
	}
}

// TestPermissionsInADomain: in a JetStream domain a site's user may use
// the domain's API for its own cursors too, and nothing wider: no
// permission of a site reaches past its own subjects, its inbox and its
// answers.
func TestPermissionsInADomain(t *testing.T) {
	p := hub.SitePermissions("physd", "north", "hub", streams.Audit)
	for _, want := range []string{"$JS.hub.API.DIRECT.GET.PHYSD_AUDIT.physd.north.>", "$JS.API.DIRECT.GET.PHYSD_AUDIT.physd.north.>", "$JS.hub.API.STREAM.INFO.PHYSD_AUDIT"} {
		if !contains(p.Publish, want) {
			t.Errorf("site publish permissions lack %s: %v", want, p.Publish)
		}
	}
	for _, s := range append(append([]string{}, p.Publish...), p.Subscribe...) {
		if !strings.Contains(s, ".north.") && !strings.HasPrefix(s, "$JS.") || strings.HasPrefix(s, "$JS.") && strings.Contains(s, "*") ||
			s == ">" || strings.HasPrefix(s, "_INBOX") {
			t.Errorf("a site's permission reaches beyond its site: %s", s)
		}
	}
	if !contains(p.Subscribe, hub.SiteInbox("north")+".>") {
		t.Errorf("a site's subscribe permissions lack its inbox: %v", p.Subscribe)
	}
	f := hub.FleetPermissions("physd", "hub", streams)
	for _, s := range f.Publish {
		if strings.Contains(s, "PURGE") || strings.Contains(s, "DELETE.") && !strings.Contains(s, "CONSUMER.DELETE") || strings.Contains(s, "UPDATE") ||
			!strings.HasPrefix(s, "$JS.") && !strings.HasSuffix(s, ".req.>") {
			t.Errorf("the fleet endpoint may publish %s", s)
		}
	}
}

func contains(list []string, s string) bool {
	for _, l := range list {
		if l == s {
			return true
		}
	}
	return false
}
