package opcua

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/opcua/opcuatest"
	"github.com/physd/physd/manifest"
)

// Monitored items against node-opcua: the process node (ns=1;s=Process,
// EURange 0..200) is driven by writes through a do_ point on it.

// watcher records a monitor's updates.
type watcher struct {
	mu  sync.Mutex
	got []drivers.Update
	ch  chan drivers.Update
}

func newWatcher() *watcher { return &watcher{ch: make(chan drivers.Update, 64)} }

func (w *watcher) deliver(u drivers.Update) {
	w.mu.Lock()
	w.got = append(w.got, u)
	w.mu.Unlock()
	w.ch <- u
}

// next waits up to d for the next update.
func (w *watcher) next(t *testing.T, d time.Duration, what string) drivers.Update {
	t.Helper()
	select {
	case u := <-w.ch:
		return u
	case <-time.After(d):
		t.Fatalf("%s: no update within %v", what, d)
	}
	return drivers.Update{}
}

// none fails if an update comes within d.
func (w *watcher) none(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case u := <-w.ch:
		t.Fatalf("%s: an update %+v, want none", what, u)
	case <-time.After(d):
	}
}

func monitorPlant(t *testing.T, endpoint, extra string) (*Bus, map[string]drivers.Point) {
	t.Helper()
	if !strings.Contains(extra, "connect_timeout_ms") {
		extra += ", connect_timeout_ms: 10000"
	}
	bus := "{type: opcua, endpoint: '" + endpoint + "', reconnect_backoff_ms: 200" + extra + "}"
	caps := readCap("process", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Process'}") +
		doCap("process_set", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Process'}") +
		"  - name: process_quality\n    kind: do\n    description: d\n    data_type: enum\n    enum_values: [Good, UncertainLastUsableValue, BadSensorFailure]\n    semantic_tags: [t]\n    binding: {type: opcua, bus: plc, node: 'ns=1;s=ProcessQuality'}\n" +
		readCap("gain", "float", "{type: opcua, bus: plc, node: 'ns=1;s=Gain', ua_type: Float}") +
		readCap("missing", "float", "{type: opcua, bus: plc, node: 'ns=1;s=NoSuchNode'}") +
		"  - name: subscriptions\n    kind: read\n    description: d\n    data_type: int\n    semantic_tags: [t]\n    binding: {type: opcua, bus: plc, node: 'i=2285', ua_type: UInt32}\n"
	return openAll(t, mustParse(t, bus, caps))
}

func monitor(t *testing.T, p drivers.Point, every time.Duration, db *manifest.Deadband) (drivers.Monitor, *watcher) {
	t.Helper()
	w := newWatcher()
	m, err := p.(drivers.Monitorer).Monitor(drivers.MonitorRequest{Interval: every, Deadband: db}, w.deliver)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Stop)
	return m, w
}

func write(t *testing.T, p drivers.Point, v any) {
	t.Helper()
	if err := p.Write(ctx(t), v); err != nil {
		t.Fatalf("write %v: %v", v, err)
	}
}

func wantValue(t *testing.T, u drivers.Update, v any) {
	t.Helper()
	if u.Err != nil || u.Reading.Value != v {
		t.Fatalf("update %+v, want the value %v", u, v)
	}
}

// TestOPCUAMonitorDeadband: an absolute and a percent deadband reach the
// server as DataChangeFilters: a move inside the band is not reported, a
// move beyond it is; Uncertain and Bad statuses arrive as the read path
// maps them; the subscription vouches for the last value while keep-alives
// come; Stop deletes the item and the empty subscription.
func TestOPCUAMonitorDeadband(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv := opcuatest.Start(t, opcuatest.Options{})
	b, p := monitorPlant(t, srv.Endpoint, ", keepalive_ms: 300")
	set, quality := p["process_set"], p["process_quality"]

	abs, wa := monitor(t, p["process"], 100*time.Millisecond, &manifest.Deadband{Value: 2, Source: "2"})
	first := wa.next(t, 10*time.Second, "the initial value")
	wantValue(t, first, 50.0)
	if first.Seq != 1 {
		t.Fatalf("first Seq %d", first.Seq)
	}
	write(t, set, 51.5) // inside the band of 2
	wa.none(t, time.Second, "a move of 1.5 with deadband 2")
	seq, asOf := abs.Confirmed()
	if seq != first.Seq || time.Since(asOf) > time.Second {
		t.Fatalf("Confirmed %d as of %v ago: the keep-alives (every 300 ms) should vouch for the value", seq, time.Since(asOf))
	}
	write(t, set, 52.5) // 2.5 from the last reported 50
	wantValue(t, wa.next(t, 3*time.Second, "a move of 2.5"), 52.5)

	write(t, quality, "UncertainLastUsableValue")
	u := wa.next(t, 3*time.Second, "an Uncertain status")
	if u.Err != nil || u.Reading.Value != 52.5 || !strings.Contains(u.Reading.Uncertain, "UncertainLastUsableValue") {
		t.Fatalf("Uncertain status: %+v", u)
	}
	write(t, quality, "BadSensorFailure")
	u = wa.next(t, 3*time.Second, "a Bad status")
	if code, _, _ := drivers.CodeOf(u.Err); code != "BadSensorFailure" {
		t.Fatalf("Bad status: %+v (code %q)", u, code)
	}
	if seq, _ := abs.Confirmed(); seq != u.Seq {
		t.Fatalf("Confirmed %d after the Bad status %d: the subscription stands behind the status", seq, u.Seq)
	}
	write(t, quality, "Good")
	wantValue(t, wa.next(t, 3*time.Second, "Good again"), 52.5)

	t.Run("percent", func(t *testing.T) {
		// 5 % of the EURange 0..200: a band of 10.
		_, wp := monitor(t, p["process"], 100*time.Millisecond, &manifest.Deadband{Value: 5, Percent: true, Source: "5%"})
		wantValue(t, wp.next(t, 5*time.Second, "the initial value"), 52.5)
		write(t, set, 60.0)
		wp.none(t, time.Second, "a move of 7.5 with a band of 10")
		write(t, set, 63.0)
		wantValue(t, wp.next(t, 3*time.Second, "a move of 10.5"), 63.0)
	})

	t.Run("percent without EURange", func(t *testing.T) {
		_, wg := monitor(t, p["gain"], 100*time.Millisecond, &manifest.Deadband{Value: 5, Percent: true, Source: "5%"})
		u := wg.next(t, 5*time.Second, "the refusal")
		if !errors.Is(u.Err, drivers.ErrNotMonitored) {
			t.Fatalf("percent deadband on a node without EURange: %+v, want ErrNotMonitored", u)
		}
		code, fix, _ := drivers.CodeOf(u.Err)
		if code != "BadMonitoredItemFilterUnsupported" || !strings.Contains(fix, "EURange") || !strings.Contains(u.Err.Error(), "polled every poll_ms instead") {
			t.Fatalf("refusal %v: code %q fix %q", u.Err, code, fix)
		}
		wg.none(t, 500*time.Millisecond, "after the refusal")
		if st := b.MonitorCounters(); st.Fallbacks != 1 {
			t.Fatalf("counters %+v: want the refused item counted as a fallback", st)
		}
	})

	t.Run("unknown node", func(t *testing.T) {
		m, wm := monitor(t, p["missing"], 100*time.Millisecond, nil)
		u := wm.next(t, 5*time.Second, "the refusal")
		if code, _, _ := drivers.CodeOf(u.Err); code != "BadNodeIdUnknown" || errors.Is(u.Err, drivers.ErrNotMonitored) {
			t.Fatalf("an unknown node: %+v (code %q), want BadNodeIdUnknown, still monitored", u, code)
		}
		if seq, _ := m.Confirmed(); seq != 0 {
			t.Fatalf("Confirmed %d for an item the server refused", seq)
		}
	})

	for len(wa.ch) > 0 {
		<-wa.ch // the moves of the subtests
	}
	st := b.MonitorCounters()
	if st.Subscriptions != 1 || st.Items != 1 || st.Fallbacks != 0 || st.Notifications < 5 || st.KeepAlives < 2 {
		t.Fatalf("counters %+v: want 1 subscription, 1 item (the others stopped), ≥5 notifications, keep-alives", st)
	}
	if r := read(t, p["subscriptions"]); r.Value != int64(1) {
		t.Fatalf("the server holds %v subscriptions, want 1", r.Value)
	}
	abs.Stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := b.MonitorCounters()
		r := read(t, p["subscriptions"])
		if st.Items == 0 && st.Subscriptions == 0 && r.Value == int64(0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after Stop: counters %+v, the server holds %v subscriptions", st, r.Value)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wa.none(t, 300*time.Millisecond, "after Stop")

	// Closing a bus deletes its subscription on the server.
	b2, p2 := monitorPlant(t, srv.Endpoint, "")
	_, w2 := monitor(t, p2["process"], 100*time.Millisecond, nil)
	w2.next(t, 10*time.Second, "the second bus's first value")
	if r := read(t, p["subscriptions"]); r.Value != int64(1) {
		t.Fatalf("the server holds %v subscriptions, want the second bus's 1", r.Value)
	}
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		r := read(t, p["subscriptions"])
		if r.Value == int64(0) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the second bus closed the server holds %v subscriptions, want 0", r.Value)
		}
	}
}

// TestOPCUAMonitorKeepAliveLoss: the network goes silent (no close, no
// reset): once the subscription's keep-alive deadline passes (keepalive_ms
// + a publishing interval + timeout_ms) the item is told it has no subscription and Confirmed
// vouches for nothing; when the network mends, the item's value is sent
// again. The server run is the same, so physd asks to take its
// subscription over (TransferSubscriptions): node-opcua grants it to the
// same application certificate and user (an X.509 identity here) on a
// secured channel, and refuses an anonymous unsecured session (Part 4
// §5.13.7), which then gets a new subscription.
func TestOPCUAMonitorKeepAliveLoss(t *testing.T) {
	t.Parallel() // its own server on a free port
	for _, secure := range []bool{false, true} {
		name := "None: created afresh"
		if secure {
			name = "Basic256Sha256: taken over"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			o := opcuatest.Options{}
			cert, key := writeUserCert(t, "urn:physd:user:operator")
			if secure {
				o = opcuatest.Options{Secure: true, UserCert: cert}
			}
			srv := opcuatest.Start(t, o)
			px := opcuatest.StartLossProxy(t, srv)
			extra := ", keepalive_ms: 200, timeout_ms: 500, connect_timeout_ms: 2000"
			if secure {
				extra += ", security_policy: Basic256Sha256, server_certificate: " + srv.ServerCertificate() + ", user_certificate: " + cert + ", user_private_key: " + key
			}
			b, p := monitorPlant(t, px.Endpoint, extra)
			m, w := monitor(t, p["process"], 100*time.Millisecond, &manifest.Deadband{Value: 1, Source: "1"})
			wantValue(t, w.next(t, 10*time.Second, "the initial value"), 50.0)
			b.mon.mu.Lock()
			var before uint32
			for id := range b.mon.subs {
				before = id
			}
			b.mon.mu.Unlock()

			px.Freeze()
			frozen := time.Now()
			u := w.next(t, 3*time.Second, "the loss")
			took := time.Since(frozen)
			if !errors.Is(u.Err, drivers.ErrOffline) || !strings.Contains(u.Err.Error(), "beyond its deadline") {
				t.Fatalf("after the network went silent: %+v, want the keep-alive deadline named", u)
			}
			// The deadline: a keep-alive every 2 publishing intervals of
			// 100 ms, one interval of margin, 500 ms for its reply;
			// checked every 100 ms.
			if took < 700*time.Millisecond || took > 1500*time.Millisecond {
				t.Fatalf("the loss was told %v after the network went silent, want 800 ms ± the check interval", took)
			}
			if seq, _ := m.Confirmed(); seq != 0 {
				t.Fatalf("Confirmed %d after the loss", seq)
			}
			t.Logf("the loss was told %v after the network went silent", took)

			px.Thaw()
			u = w.next(t, 10*time.Second, "the value after the network mended")
			wantValue(t, u, 50.0)
			if seq, _ := m.Confirmed(); seq != u.Seq {
				t.Fatalf("Confirmed %d, want the new delivery %d", seq, u.Seq)
			}
			b.mon.mu.Lock()
			_, same := b.mon.subs[before]
			b.mon.mu.Unlock()
			if same != secure {
				t.Fatalf("subscription %d kept: %v, want %v", before, same, secure)
			}
			if st := b.MonitorCounters(); st.Losses < 1 || st.Subscriptions != 1 || st.Items != 1 {
				t.Fatalf("counters %+v", st)
			}
		})
	}
}

// watchProcess starts a server and a bus on it (extra: more bus keys)
// and monitors the process node every 100 ms without a deadband, once its
// first value (50) has come.
func watchProcess(t *testing.T, extra string) (*opcuatest.Server, *Bus, map[string]drivers.Point, drivers.Monitor, *watcher) {
	t.Helper()
	srv := opcuatest.Start(t, opcuatest.Options{})
	b, p := monitorPlant(t, srv.Endpoint, extra)
	m, w := monitor(t, p["process"], 100*time.Millisecond, nil)
	wantValue(t, w.next(t, 10*time.Second, "the initial value"), 50.0)
	return srv, b, p, m, w
}

// TestOPCUAMonitorServerRestart: the server restarts with another value:
// the item is told at once, Confirmed vouches for nothing while it is
// down, and the first value after the restart is the new one (created
// afresh: the restarted server has none of the old subscriptions).
func TestOPCUAMonitorServerRestart(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv, _, _, m, w := watchProcess(t, ", keepalive_ms: 300")
	srv.Stop()
	u := w.next(t, 3*time.Second, "the loss")
	if !errors.Is(u.Err, drivers.ErrOffline) {
		t.Fatalf("server stopped: %+v, want ErrOffline", u)
	}
	if seq, _ := m.Confirmed(); seq != 0 {
		t.Fatalf("Confirmed %d with the server down", seq)
	}
	w.none(t, 500*time.Millisecond, "while the server is down (the loss is told once)")
	v := 77.0
	srv.RestartWith(func(o *opcuatest.Options) { o.Process = &v })
	wantValue(t, w.next(t, 20*time.Second, "the value after the restart"), 77.0)
}

// intrude monitors the process node on a fresh server, then sends a
// Publish request of the test's own on physd's session while the value
// moves four times beyond any band, and returns what that request took
// (physd's requests are queued before it, so it takes one of the moves'
// messages). With ack, it acknowledges that message at once: the server
// forgets it.
func intrude(t *testing.T, ack bool) (*Bus, map[string]drivers.Point, *watcher, *ua.PublishResponse) {
	t.Helper()
	_, b, p, _, w := watchProcess(t, "")
	c, _, err := b.session(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	stolen := make(chan *ua.PublishResponse, 1)
	go func() {
		res, err := send[*ua.PublishResponse](ctx(t), c, &ua.PublishRequest{SubscriptionAcknowledgements: []*ua.SubscriptionAcknowledgement{}})
		if ack && err == nil && len(res.NotificationMessage.NotificationData) > 0 {
			// This request waits for a reply nobody reads (the test's
			// context ends it).
			acks := []*ua.SubscriptionAcknowledgement{{SubscriptionID: res.SubscriptionID, SequenceNumber: res.NotificationMessage.SequenceNumber}}
			go func() {
				_, _ = send[*ua.PublishResponse](ctx(t), c, &ua.PublishRequest{SubscriptionAcknowledgements: acks})
			}()
		}
		stolen <- res
	}()
	time.Sleep(200 * time.Millisecond) // the intruder's request is queued behind physd's
	for _, v := range []float64{60, 70, 80, 90} {
		write(t, p["process_set"], v)
		time.Sleep(300 * time.Millisecond)
	}
	var res *ua.PublishResponse
	select {
	case res = <-stolen:
	case <-time.After(5 * time.Second):
		t.Fatal("the intruding Publish request got no reply")
	}
	if res == nil || len(res.NotificationMessage.NotificationData) == 0 {
		t.Fatalf("the intruder took %+v, want a notification message (the test's timing)", res)
	}
	return b, p, w, res
}

// TestOPCUAMonitorRepublish: another Publish request on physd's session
// takes one of the subscription's notification messages (as gopcua's own
// Publish loop does on a server that queues Publish requests before any
// subscription exists): physd sees the gap in the sequence numbers,
// republishes the message, and delivers every value in order, with no
// loss.
func TestOPCUAMonitorRepublish(t *testing.T) {
	t.Parallel() // its own server on a free port
	b, _, w, _ := intrude(t, false)
	for _, v := range []float64{60, 70, 80, 90} {
		wantValue(t, w.next(t, 3*time.Second, fmt.Sprint(v)), v)
	}
	if st := b.MonitorCounters(); st.Losses != 0 || st.Subscriptions != 1 {
		t.Fatalf("counters %+v: the gap was republished, not a loss", st)
	}
}

// TestOPCUAMonitorLostMessage: the intruding Publish request also
// acknowledges the message it took, so the server no longer has it: physd
// cannot republish it, tells the item its value is no longer vouched for,
// deletes the subscription on the server and creates it afresh, whose
// first value is the server's current one.
func TestOPCUAMonitorLostMessage(t *testing.T) {
	t.Parallel() // its own server on a free port
	b, p, w, _ := intrude(t, true)
	lost := false
	deadline := time.After(10 * time.Second)
	for {
		var u drivers.Update
		select {
		case u = <-w.ch:
		case <-deadline:
			t.Fatalf("no 90 after the lost message (lost told: %v)", lost)
		}
		if u.Err != nil {
			if !strings.Contains(u.Err.Error(), "could not be republished") || !errors.Is(u.Err, drivers.ErrOffline) {
				t.Fatalf("update %v, want the lost message named", u.Err)
			}
			lost = true
			continue
		}
		if u.Reading.Value == 90.0 {
			break
		}
	}
	if !lost {
		t.Fatal("the lost message was not told")
	}
	if st := b.MonitorCounters(); st.Losses != 1 || st.Subscriptions != 1 || st.Items != 1 {
		t.Fatalf("counters %+v", st)
	}
	if r := read(t, p["subscriptions"]); r.Value != int64(1) {
		t.Fatalf("the server holds %v subscriptions, want 1 (the dropped one deleted)", r.Value)
	}
}

// TestOPCUAServiceFaultKeepsSession: gopcua marks its client Closed on any
// ServiceFault (here a Republish for a subscription the session does not
// have, as a refused TransferSubscriptions or a lost message would be):
// the session still answers, so physd keeps it — and the subscriptions on
// it — instead of reconnecting.
func TestOPCUAServiceFaultKeepsSession(t *testing.T) {
	t.Parallel() // its own server on a free port
	_, b, p, _, w := watchProcess(t, "")
	c, gen, err := b.session(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = send[*ua.RepublishResponse](ctx(t), c, &ua.RepublishRequest{SubscriptionID: 424242, RetransmitSequenceNumber: 1})
	if !errors.Is(err, ua.StatusBadSubscriptionIDInvalid) {
		t.Fatalf("Republish for another subscription: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for c.State() == opcua.Connected && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("gopcua's state after the ServiceFault: %s", c.State())
	if r := read(t, p["process"]); r.Value != 50.0 {
		t.Fatalf("read after the fault: %+v", r)
	}
	if err := b.Health(); err != nil {
		t.Fatalf("health after the fault: %v", err)
	}
	_, gen2, err := b.session(ctx(t))
	if err != nil || gen2 != gen {
		t.Fatalf("session %d → %d (%v): the fault reconnected", gen, gen2, err)
	}
	write(t, p["process_set"], 60.0)
	wantValue(t, w.next(t, 3*time.Second, "a value after the fault"), 60.0)
	if st := b.MonitorCounters(); st.Losses != 0 {
		t.Fatalf("counters %+v", st)
	}
}

// TestOPCUAWriteAfterRestartTrustedSession: on a bus that subscribed,
// gopcua no longer watches the session's channel (monitor.go, quiet), and
// here no Publish is under way to notice its death either (the only item
// was refused, so the capability is polled). After a server restart a
// write is never sent into the dead channel: it is refused unsent while
// the server is down, and applied through a new session once it is back —
// never an unknown outcome.
func TestOPCUAWriteAfterRestartTrustedSession(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv := opcuatest.Start(t, opcuatest.Options{})
	b, p := monitorPlant(t, srv.Endpoint, "")
	_, w := monitor(t, p["gain"], 100*time.Millisecond, &manifest.Deadband{Value: 5, Percent: true, Source: "5%"})
	if u := w.next(t, 10*time.Second, "the refusal"); !errors.Is(u.Err, drivers.ErrNotMonitored) {
		t.Fatalf("%+v, want the percent deadband refused", u)
	}
	for deadline := time.Now().Add(5 * time.Second); b.MonitorCounters().Subscriptions != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("counters %+v: the empty subscription was not deleted", b.MonitorCounters())
		}
	}
	// ProcessQuality is a String node: no EURange is looked up before its
	// writes, so nothing but the write itself goes to the server.
	write(t, p["process_quality"], "Good")
	c, _, err := b.session(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if c.State() == opcua.Connected {
		t.Fatal("gopcua still watches the session: the test does not test a trusted one")
	}
	srv.Restart()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := p["process_quality"].Write(ctx(t), "UncertainLastUsableValue")
		if err == nil {
			break
		}
		if !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("a write after the restart: %v, want it refused unsent (ErrOffline) or applied", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write 20 s after the restart: %v", err)
		}
	}
	if r := read(t, p["process_quality"]); r.Value != "UncertainLastUsableValue" {
		t.Fatalf("read back %v", r.Value)
	}
}

// TestOPCUAMonitorPublishTroubleKeepsSession: a server that refuses
// Publish requests (a ServiceFault that is no session's end) or answers
// them past the keep-alive deadline still answers reads and writes on the
// session. The subscriptions are lost (each item told, nothing vouched
// for) and made again on the same session; reads and writes go on, and
// are never answered "offline" for a session physd dropped itself.
func TestOPCUAMonitorPublishTroubleKeepsSession(t *testing.T) {
	t.Parallel() // its own servers on free ports
	for name, o := range map[string]opcuatest.Options{
		"refused": {PublishFault: "BadSubscriptionIdInvalid", PublishFaultAfter: 5},
		"late":    {PublishDelay: 3000},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := opcuatest.Start(t, o)
			b, p := monitorPlant(t, srv.Endpoint, ", keepalive_ms: 200, timeout_ms: 2000")
			var mu sync.Mutex
			var losses int
			m, err := p["process"].(drivers.Monitorer).Monitor(drivers.MonitorRequest{Interval: 100 * time.Millisecond}, func(u drivers.Update) {
				mu.Lock()
				defer mu.Unlock()
				if u.Err != nil {
					losses++
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Stop)
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				if _, err := p["gain"].Read(ctx(t)); err != nil {
					t.Fatalf("a read while the subscriptions are in trouble: %v\nserver:\n%s", err, srv.Output())
				}
			}
			write(t, p["process_set"], 60.0)
			mu.Lock()
			defer mu.Unlock()
			if losses == 0 || b.MonitorCounters().Losses == 0 {
				t.Fatalf("the item was never told its subscription was lost (%d errors, counters %+v)", losses, b.MonitorCounters())
			}
		})
	}
}

// TestOPCUAMonitorUnreportedChange: a server whose subscription does not
// report a change beyond the deadband (python-asyncua's filter compares
// samples with each other, and drops status changes) must not have physd
// vouch for the old value for as long as the subscription lives: the
// audit read finds the server holding another value, and once the change
// stays unreported past the time it must have been published, the item
// is given up and the node polls it (ErrNotMonitored, saying why).
func TestOPCUAMonitorUnreportedChange(t *testing.T) {
	t.Parallel() // its own server on a free port
	srv := opcuatest.Start(t, opcuatest.Options{DropChanges: true})
	_, p := monitorPlant(t, srv.Endpoint, ", keepalive_ms: 200, timeout_ms: 1000")
	m, w := monitor(t, p["process"], 100*time.Millisecond, &manifest.Deadband{Value: 5, Source: "5"})
	wantValue(t, w.next(t, 10*time.Second, "the initial value"), 50.0)
	write(t, p["process_set"], 53.0) // inside the deadband: nothing to report
	w.none(t, 3*time.Second, "a change inside the deadband")
	if seq, _ := m.Confirmed(); seq == 0 {
		t.Fatal("a change inside the deadband ended the vouching")
	}
	write(t, p["process_set"], 80.0)
	u := w.next(t, 6*time.Second, "the unreported change")
	if !errors.Is(u.Err, drivers.ErrNotMonitored) || !strings.Contains(u.Err.Error(), "holds 80") {
		t.Fatalf("update %+v, want the item given up, naming the value the server holds", u)
	}
	if seq, _ := m.Confirmed(); seq != 0 {
		t.Fatalf("Confirmed %d after the item was given up", seq)
	}
}

// TestOPCUAMonitorCallSizes: 2 500 monitored items on a server that takes
// 10 000 per call (node-opcua) are created in calls of at most
// maxItemsPerCall, and the audit reads them all in Reads of at most as
// many nodes: a server that works on one thread answers nothing else while
// it works through one call.
func TestOPCUAMonitorCallSizes(t *testing.T) {
	t.Parallel()
	const n = 2500
	srv := opcuatest.Start(t, opcuatest.Options{Points: n, LogSizes: true})
	var caps strings.Builder
	for i := range n {
		caps.WriteString(readCap(fmt.Sprintf("p%05d", i), "float", fmt.Sprintf("{type: opcua, bus: plc, node: 'ns=1;s=P%05d'}", i)))
	}
	_, p := openAll(t, mustParse(t, "{type: opcua, endpoint: '"+srv.Endpoint+"', connect_timeout_ms: 10000}", caps.String()))
	var ws []*watcher
	for i := range n {
		_, w := monitor(t, p[fmt.Sprintf("p%05d", i)], time.Second, nil)
		ws = append(ws, w)
	}
	for i, w := range ws {
		if u := w.next(t, 60*time.Second, fmt.Sprintf("p%05d's first value", i)); u.Err != nil {
			t.Fatalf("p%05d: %v", i, u.Err)
		}
	}
	// An audit comes every 5 keep-alive periods (5 s here).
	sizes := func(name string) []int {
		var out []int
		for _, l := range strings.Split(srv.Output(), "\n") {
			if v, ok := strings.CutPrefix(l, "request "+name+" "); ok {
				var k int
				fmt.Sscan(v, &k)
				out = append(out, k)
			}
		}
		return out
	}
	created, audited := 0, 0
	for deadline := time.Now().Add(30 * time.Second); audited < n && time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		created, audited = 0, 0
		for _, k := range sizes("ReadRequest") {
			if k > 3 { // the session's own reads are of one to three nodes
				audited += k
			}
		}
		for _, k := range sizes("CreateMonitoredItemsRequest") {
			created += k
		}
	}
	if created != n || audited < n {
		t.Fatalf("%d items created, %d nodes audited; want %d and at least %d", created, audited, n, n)
	}
	for _, name := range []string{"CreateMonitoredItemsRequest", "ReadRequest"} {
		for _, k := range sizes(name) {
			if k > maxItemsPerCall {
				t.Errorf("a %s of %d items, more than %d", name, k, maxItemsPerCall)
			}
		}
	}
}
