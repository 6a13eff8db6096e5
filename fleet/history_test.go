package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/history"
	"github.com/physd/physd/internal/natstest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// plantManifest is the greenhouse example with a high alarm on zone A's
// temperature.
func plantManifest(t *testing.T) *manifest.Manifest {
	t.Helper()
	b, err := os.ReadFile(testrig.Greenhouse("physmcp.manifest.yml"))
	if err != nil {
		t.Fatal(err)
	}
	const at = "  - name: temperature_zone_a\n    kind: read\n"
	text := strings.Replace(string(b), at, at+"    alarms: {high: 30, hysteresis: 1}\n", 1)
	if text == string(b) {
		t.Fatal("the greenhouse's temperature_zone_a moved")
	}
	m, err := manifest.Parse("physmcp.manifest.yml", []byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// histUplink is an uplink of site north, gw_1, copying history and alarms.
func histUplink(t *testing.T, url string, al *audit.Log) *Uplink {
	t.Helper()
	u, err := New(Config{URLs: []string{url}, Site: "north", DeviceID: "gw_1", Stream: stream, Prefix: "physd",
		History: true, Alarms: true, Refresh: 100 * time.Millisecond,
		Options: []nats.Option{nats.UserInfo("north", "pw")}, ConnectTimeout: time.Second, PublishTimeout: time.Second, ReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	u.Start(al)
	t.Cleanup(u.Close)
	return u
}

func createHistoryStreams(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, cfg := range []jetstream.StreamConfig{
		{Name: "PHYSD_HISTORY", Subjects: HistorySubjects("physd"), AllowAtomicPublish: true, AllowDirect: true, Duplicates: time.Minute},
		{Name: "PHYSD_ALARMS", Subjects: AlarmSubjects("physd"), MaxMsgsPerSubject: 1, AllowDirect: true},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
}

// histMessages reads every message of subject in the history stream:
// bucket starts in stream order.
func histMessages(t *testing.T, js jetstream.JetStream, subject string) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []int64
	err := scan(ctx, js, "PHYSD_HISTORY", jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}}, 100000, func(m jetstream.Msg) (bool, error) {
		var b HistoryBucket
		if err := json.Unmarshal(m.Data(), &b); err != nil {
			t.Fatal(err)
		}
		if id := m.Headers().Get(jetstream.MsgIDHeader); !strings.HasPrefix(id, "north/gw_1/read_") || !strings.HasSuffix(id, "/"+m.Headers().Get(HeaderBucketStart)) {
			t.Errorf("Nats-Msg-Id %q", id)
		}
		out = append(out, b.Start)
		return false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestHistoryCopyAndReader: the sealed buckets of every recorded
// capability reach the history stream once each, in order, also after a
// cut of the hub (the buckets sealed meanwhile follow); the reader
// answers a window across them like the local history does, lists the
// series, and refuses a wildcard and a series the stream lacks.
func TestHistoryCopyAndReader(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream, "PHYSD_HISTORY", "PHYSD_ALARMS"))
	_, js := admin(t, h)
	createHistoryStreams(t, js)
	m := plantManifest(t)
	// One-second buckets, so that seconds of observations make many.
	hist, err := history.Open(filepath.Join(t.TempDir(), history.FileName), m, history.Config{Resolution: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer hist.Close()
	temp, hum := m.Capability("temperature_zone_a"), m.Capability("humidity_zone_c")
	// Stamped ahead of now (a sealed bucket is one a later one follows).
	t0 := time.Now().Truncate(time.Second).Add(time.Second)
	record := func(from, to int) {
		for s := from; s < to; s++ {
			for k := range 3 {
				at := t0.Add(time.Duration(s)*time.Second + time.Duration(k)*300*time.Millisecond)
				hist.Record(node.Observed{Cap: temp, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: float64(20 + s%7 + k)}})
				hist.Record(node.Observed{Cap: hum, At: at, Obs: promcp.Observation{Quality: promcp.QualityGood, Value: float64(s)}})
			}
		}
		hist.Flush()
	}
	record(0, 300)
	al := openAudit(t)
	u := histUplink(t, h.URL(), al)
	u.FollowHistory(hist)
	tempSubj, humSubj := u.HistSubject("read_temperature_zone_a"), u.HistSubject("read_humidity_zone_c")
	// What the stream holds, not what was acknowledged: an
	// acknowledgement lost on a loaded machine leaves the count short.
	copied := func(n int) func() bool {
		return func() bool { return len(histMessages(t, js, tempSubj)) == n && len(histMessages(t, js, humSubj)) == n }
	}
	waitFor(t, "299 buckets of each series", 20*time.Second, copied(299))

	// The hub goes away; the history goes on; the hub returns.
	h.Stop()
	record(300, 600)
	h.Start()
	_, js = admin(t, h)
	waitFor(t, "599 buckets of each series after the cut", 20*time.Second, copied(599))
	for _, subj := range []string{tempSubj, humSubj} {
		got := histMessages(t, js, subj)
		if len(got) != 599 {
			t.Fatalf("%s: %d buckets in the stream, want 599 (the last one is open)", subj, len(got))
		}
		for i, s := range got {
			if s != t0.Unix()+int64(i) {
				t.Fatalf("%s: bucket %d starts at %d, want %d (in order, each once)", subj, i, s-t0.Unix(), i)
			}
		}
	}
	if s := u.Stats(); s.HistoryError != "" {
		t.Errorf("history error: %+v", s)
	}

	r := &HistoryReader{JS: js}
	ctx := context.Background()
	key := SeriesKey{Site: "north", Device: "gw_1", Tool: "read_temperature_zone_a"}
	since, until := t0.Add(100*time.Second), t0.Add(400*time.Second)
	got, err := r.Query(ctx, key, since, until, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want, err := hist.Query("temperature_zone_a", since, until, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Buckets) < 30 || !reflect.DeepEqual(got.Buckets, want.Buckets) || got.Unit != "celsius" || got.StepS != 10 || got.ResolutionS != 1 {
		t.Errorf("the hub's answer:\n %+v\nthe local one:\n %+v", got, want)
	}
	keys, err := r.List(ctx, "north")
	if err != nil || len(keys) != 2 || keys[0].Tool != "read_humidity_zone_c" || keys[1] != key {
		t.Errorf("List: %+v %v", keys, err)
	}
	if keys, _ := r.List(ctx, "south"); len(keys) != 0 {
		t.Errorf("List(south): %+v", keys)
	}
	var qe *history.QueryError
	for _, k := range []SeriesKey{{Site: "*", Device: "gw_1", Tool: "read_temperature_zone_a"}, {Site: "north", Device: "gw_1", Tool: "read_temperature_zone_a.>"}} {
		if _, err := r.Query(ctx, k, since, until, 0); !errors.As(err, &qe) {
			t.Errorf("%+v: %v, want a QueryError", k, err)
		}
	}
	if _, err := r.Query(ctx, SeriesKey{Site: "north", Device: "gw_9", Tool: "read_temperature_zone_a"}, since, until, 0); !errors.As(err, &qe) || !strings.Contains(err.Error(), "no history") {
		t.Errorf("a series the stream lacks: %v", err)
	}
	if _, err := r.Query(ctx, key, since, until, 1500*time.Millisecond); !errors.As(err, &qe) || !strings.Contains(err.Error(), "not a multiple") {
		t.Errorf("a step that is not a multiple: %v", err)
	}
	small := &HistoryReader{JS: js, MaxScan: 50}
	if _, err := small.Query(ctx, key, since, until, 10*time.Second); !errors.As(err, &qe) || !strings.Contains(err.Error(), "more than 50") {
		t.Errorf("a window past MaxScan: %v", err)
	}
	// A window after the last bucket is empty, at once.
	if s, err := r.Query(ctx, key, t0.Add(time.Hour), t0.Add(2*time.Hour), time.Minute); err != nil || len(s.Buckets) != 0 {
		t.Errorf("after the last bucket: %+v %v", s, err)
	}
}

// TestAlarmStateAndReader: the engine's active alarms reach the alarm
// stream as the device's state (raised, then cleared), the reader reads
// every device's state in one pass with the site and device the subject
// names (not what the payload claims), and a stale snapshot can never
// overwrite a newer one.
func TestAlarmStateAndReader(t *testing.T) {
	h := natstest.Start(t, t.TempDir(), natstest.SiteUser("north", "pw", "physd", "north", stream, "PHYSD_HISTORY", "PHYSD_ALARMS"))
	_, js := admin(t, h)
	createHistoryStreams(t, js)
	m := plantManifest(t)
	e := alarms.New(m)
	temp := m.Capability("temperature_zone_a")
	al := openAudit(t)
	u := histUplink(t, h.URL(), al)
	u.FollowAlarms(e)
	r := &AlarmReader{JS: js}
	ctx := context.Background()
	read := func() []DeviceAlarms {
		t.Helper()
		got, err := r.Active(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	waitFor(t, "the empty state", 10*time.Second, func() bool { return len(read()) == 1 })
	if got := read(); len(got) != 1 || got[0].Site != "north" || got[0].Device != "gw_1" || len(got[0].Active) != 0 {
		t.Fatalf("no alarm: %+v", got)
	}
	e.Observe(node.Observed{Cap: temp, At: time.Now(), Obs: promcp.Observation{Quality: promcp.QualityGood, Value: 35.0}})
	waitFor(t, "the raised alarm", 10*time.Second, func() bool { g := read(); return len(g) == 1 && len(g[0].Active) == 1 })
	got := read()
	if len(got) != 1 || len(got[0].Active) != 1 || got[0].Active[0].Capability != "read_temperature_zone_a" || got[0].Active[0].Kind != alarms.KindHigh || got[0].Stored.IsZero() {
		t.Fatalf("raised: %+v", got)
	}

	// Another site's device, as the hub's operator publishes it (a
	// payload claiming to be north's): the subject decides.
	nc, _ := admin(t, h)
	if err := nc.Publish("physd.south.gw_7.alarms", []byte(`{"site":"north","device":"gw_1","active":[{"capability":"read_x","kind":"high"}]}`)); err != nil {
		t.Fatal(err)
	}
	nc.Flush()
	waitFor(t, "two devices", 10*time.Second, func() bool { return len(read()) == 2 })
	got = read()
	if got[0].Site != "north" || got[1].Site != "south" || got[1].Device != "gw_7" || len(got[1].Active) != 1 {
		t.Fatalf("two sites: %+v", got)
	}
	if got, err := r.Active(ctx, "south"); err != nil || len(got) != 1 || got[0].Device != "gw_7" {
		t.Fatalf("south only: %+v %v", got, err)
	}
	if _, err := r.Active(ctx, "*"); err == nil {
		t.Error("a wildcard site was read")
	}

	// A stale snapshot (one a stalled link delivers late) is refused: it
	// expects a last sequence the subject no longer has.
	stale := nats.NewMsg(u.AlarmStateSubject())
	stale.Data = []byte(`{"site":"north","device":"gw_1","active":[]}`)
	stale.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "1")
	if _, err := jsOf(t, nc).PublishMsg(ctx, stale); err == nil {
		t.Error("a stale snapshot was stored")
	}

	e.Observe(node.Observed{Cap: temp, At: time.Now(), Obs: promcp.Observation{Quality: promcp.QualityGood, Value: 20.0}})
	waitFor(t, "the cleared alarm", 10*time.Second, func() bool {
		g := read()
		return len(g) == 2 && len(g[0].Active) == 0
	})
	if s := u.Stats(); s.AlarmsPublished < 3 || s.AlarmsError != "" {
		t.Errorf("stats: %+v", s)
	}
}
