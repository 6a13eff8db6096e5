package opcua

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// The bookkeeping of monitored items without a server: what the Publish
// replies do to an item's deliveries and to what the subscription vouches
// for, against the keep-alive deadline (synctest's clock).

func unitSet(t *testing.T) (*monitorSet, *item, *subscription, *watcher) {
	t.Helper()
	spec := &busSpec{name: "plc", Config: DefaultConfig()}
	spec.Timeout, spec.KeepAlive = 500*time.Millisecond, 200*time.Millisecond
	b := &Bus{spec: spec, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ms := &monitorSet{b: b, log: b.log, ctx: ctx, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
		items: map[uint32]*item{}, subs: map[uint32]*subscription{}, batch: defaultItemsPerCall}
	typ, _ := lookupType("Double")
	p := &point{bus: b, spec: &pointSpec{node: nodeRef{text: "ns=1;s=Process"}, typ: typ, index: -1, floatCap: true}}
	w := newWatcher()
	it := ms.add(p, drivers.MonitorRequest{Interval: 100 * time.Millisecond}, w.deliver)
	// Subscription 7 as the server revised it: a keep-alive every 2 × 100 ms.
	s := &subscription{id: 7, interval: 100 * time.Millisecond, pi: 100 * time.Millisecond, ka: 2, live: true, last: time.Now(), nextSeq: 1}
	ms.subs[s.id] = s
	it.sub, it.id, it.si = s, 1, 100*time.Millisecond
	return ms, it, s, w
}

// reply is a Publish reply for subscription 7: a keep-alive without
// values, else one data change per value (a ua.StatusCode: that status).
func reply(seq uint32, handle uint32, values ...any) publishResult {
	msg := &ua.NotificationMessage{SequenceNumber: seq}
	if len(values) > 0 {
		dcn := &ua.DataChangeNotification{}
		for _, v := range values {
			dv := &ua.DataValue{EncodingMask: ua.DataValueValue}
			if st, ok := v.(ua.StatusCode); ok {
				dv.EncodingMask, dv.Status = ua.DataValueStatusCode, st
			} else {
				dv.Value = ua.MustVariant(v)
			}
			dcn.MonitoredItems = append(dcn.MonitoredItems, &ua.MonitoredItemNotification{ClientHandle: handle, Value: dv})
		}
		msg.NotificationData = []*ua.ExtensionObject{ua.NewExtensionObject(dcn)}
	}
	return publishResult{res: &ua.PublishResponse{SubscriptionID: 7, NotificationMessage: msg}, at: time.Now()}
}

func TestMonitorKeepAliveDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, it, _, w := unitSet(t)
		pub := &publisher{outstanding: 2}
		ctx := context.Background()

		if seq, _ := it.Confirmed(); seq != 0 {
			t.Fatalf("Confirmed %d before any value", seq)
		}
		if err := ms.handle(ctx, nil, pub, reply(1, it.handle, 42.0)); err != nil {
			t.Fatal(err)
		}
		u := w.next(t, time.Second, "the value")
		if u.Err != nil || u.Reading.Value != 42.0 || !u.Reading.At.Equal(time.Now().Add(-100*time.Millisecond)) {
			t.Fatalf("update %+v, want 42 as of one sampling interval ago", u)
		}
		if len(pub.acks) != 1 || pub.acks[0].SequenceNumber != 1 {
			t.Fatalf("acks %+v, want message 1 acknowledged", pub.acks)
		}
		if seq, asOf := it.Confirmed(); seq != u.Seq || !asOf.Equal(u.Reading.At) {
			t.Fatalf("Confirmed %d as of %v, want %d as of %v", seq, asOf, u.Seq, u.Reading.At)
		}

		// Keep-alives keep it vouched for; their deadline is (2 + 1) ×
		// 100 ms + timeout_ms 500 ms.
		time.Sleep(750 * time.Millisecond)
		if seq, _ := it.Confirmed(); seq != u.Seq || ms.overdue() != nil {
			t.Fatalf("750 ms after the last reply: Confirmed %d, overdue %v", seq, ms.overdue())
		}
		if err := ms.handle(ctx, nil, pub, reply(2, it.handle)); err != nil {
			t.Fatal(err)
		}
		if _, asOf := it.Confirmed(); !asOf.Equal(time.Now().Add(-100 * time.Millisecond)) {
			t.Fatalf("a keep-alive confirms as of %v", asOf)
		}
		if ms.keepAlives.Load() != 1 {
			t.Fatalf("%d keep-alives counted", ms.keepAlives.Load())
		}
		time.Sleep(799 * time.Millisecond)
		if seq, _ := it.Confirmed(); seq != u.Seq {
			t.Fatal("not vouched for within the deadline")
		}
		time.Sleep(2 * time.Millisecond)
		if seq, _ := it.Confirmed(); seq != 0 {
			t.Fatalf("Confirmed %d past the keep-alive deadline, with run not told yet", seq)
		}
		err := ms.overdue()
		if err == nil || !strings.Contains(err.Error(), "beyond its deadline 800ms") {
			t.Fatalf("overdue: %v", err)
		}

		// The loss is told once, however many attempts fail after it.
		ms.lose(err)
		u = w.next(t, time.Second, "the loss")
		if !errors.Is(u.Err, drivers.ErrOffline) || strings.Count(u.Err.Error(), "device offline") != 1 {
			t.Fatalf("the loss: %v", u.Err)
		}
		ms.lose(errors.New("connection refused"))
		w.none(t, 100*time.Millisecond, "a second failed attempt")
		if ms.losses.Load() != 1 {
			t.Fatalf("%d losses counted", ms.losses.Load())
		}
	})
}

func TestMonitorNotificationStatus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, it, s, w := unitSet(t)
		pub := &publisher{outstanding: 1}
		ctx := context.Background()
		if err := ms.handle(ctx, nil, pub, reply(1, it.handle, ua.StatusBadSensorFailure)); err != nil {
			t.Fatal(err)
		}
		u := w.next(t, time.Second, "the Bad status")
		if code, _, _ := drivers.CodeOf(u.Err); code != "BadSensorFailure" {
			t.Fatalf("a Bad status: %+v", u)
		}
		if seq, _ := it.Confirmed(); seq != u.Seq {
			t.Fatalf("Confirmed %d: the subscription stands behind the status it reported", seq)
		}
		if err := ms.handle(ctx, nil, pub, reply(2, it.handle, ua.StatusUncertainLastUsableValue)); err != nil {
			t.Fatal(err)
		}
		// A status without a value: the item's node holds no value.
		if u := w.next(t, time.Second, "Uncertain without a value"); u.Err == nil {
			t.Fatalf("an Uncertain status without a value: %+v", u)
		}
		if err := ms.handle(ctx, nil, pub, reply(3, it.handle, float32(1.5))); err != nil {
			t.Fatal(err)
		}
		if u := w.next(t, time.Second, "another type"); u.Err == nil || !strings.Contains(u.Err.Error(), "holds a Float") {
			t.Fatalf("a Float for a Double binding: %+v", u)
		}
		// A reply for another subscription, or a stopped item, delivers nothing.
		s.live = false
		if err := ms.handle(ctx, nil, pub, reply(4, it.handle, 1.0)); err != nil {
			t.Fatal(err)
		}
		s.live = true
		it.Stop()
		if err := ms.handle(ctx, nil, pub, reply(4, it.handle, 1.0)); err != nil {
			t.Fatal(err)
		}
		w.none(t, 100*time.Millisecond, "a dead subscription and a stopped item")
		if st := ms.notifications.Load(); st != 3 {
			t.Fatalf("%d notifications counted, want 3", st)
		}
	})
}

// TestMonitorRetryRefused: an item the server refused to create
// (BadNodeIdUnknown) is asked for again retryFailed later, once, and not
// before.
func TestMonitorRetryRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ms, it, _, w := unitSet(t)
		ms.mu.Lock()
		it.sub = nil
		ms.mu.Unlock()
		ms.refuse([]*item{it}, ua.StatusBadNodeIDUnknown)
		if u := w.next(t, time.Second, "the refusal"); errors.Is(u.Err, drivers.ErrNotMonitored) {
			t.Fatalf("an unknown node: %v, want an error that keeps it monitored", u.Err)
		}
		if ms.retryDue() {
			t.Fatal("retry due at once")
		}
		time.Sleep(retryFailed - time.Millisecond)
		ms.mu.Lock()
		waiting := it.waiting()
		ms.mu.Unlock()
		if ms.retryDue() || !waiting {
			t.Fatal("retry due before retryFailed")
		}
		time.Sleep(time.Millisecond)
		if !ms.retryDue() || ms.retryDue() {
			t.Fatal("retry not due once at retryFailed")
		}
	})
}
