package opcua

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// Monitored items (drivers.Monitorer). A capability with poll_ms becomes
// a monitored item: sampled every poll_ms by the server, queue size 1
// (discard oldest: only the newest sample matters), with a DataChangeFilter
// carrying the capability's deadband (AbsoluteDeadband, or PercentDeadband:
// a percent of the node's EURange, OPC UA Part 8). The bus holds them in
// one subscription per publishing interval (one for every item with
// poll_ms ≥ keepalive_ms, one per faster poll_ms), in the bus's one
// session. subscribe.go runs the exchange with the server.

var _ drivers.Monitorer = (*point)(nil)

// Monitor registers the point's node as a monitored item of its bus.
func (p *point) Monitor(req drivers.MonitorRequest, deliver func(drivers.Update)) (drivers.Monitor, error) {
	if req.Interval <= 0 {
		return nil, fmt.Errorf("opcua %s: monitoring %s needs a sampling interval (poll_ms)", p.bus.spec.name, p.spec.what())
	}
	if deliver == nil {
		return nil, errors.New("opcua: Monitor without a deliver function")
	}
	ms, err := p.bus.monitors()
	if err != nil {
		return nil, err
	}
	return ms.add(p, req, deliver), nil
}

// monitorSet is a bus's monitored items and the subscriptions the server
// holds them in. One goroutine (run, subscribe.go) makes every exchange
// with the server about them and makes every delivery; the node's side
// (Monitor, Confirmed, Stop) only reads and flags under mu.
type monitorSet struct {
	b      *Bus
	log    *slog.Logger
	ctx    context.Context // ends with the bus
	cancel context.CancelFunc
	done   chan struct{} // closed when run returned
	wake   chan struct{} // the items changed: reconcile

	mu         sync.Mutex
	items      map[uint32]*item         // by client handle, until deleted from the server
	subs       map[uint32]*subscription // by id: held by the server, or to take over after a loss
	nextHandle uint32
	resync     bool      // a subscription was dropped: reconcile
	orphans    []uint32  // dropped subscriptions to delete from the server
	startTime  time.Time // the server's StartTime at the last session: another one means it restarted
	batch      int       // monitored items per CreateMonitoredItems call (the server's limit)
	readBatch  int       // nodes per audit Read (the server's MaxNodesPerRead, at most maxItemsPerCall)
	nextRetry  time.Time // when the first refused item is due to be asked for again
	recheck    time.Time // when an audit's suspicion is due to be read again (audit.go)

	notifications, keepAlives, losses atomic.Int64

	notified []delivery // notify's buffer (run's own: reused for every message)
}

// item is one monitored node (drivers.Monitor).
type item struct {
	set     *monitorSet
	p       *point
	req     drivers.MonitorRequest
	deliver func(drivers.Update)
	handle  uint32 // the ClientHandle its notifications carry

	// Under set.mu.
	sub      *subscription // the subscription holding it; nil: not on the server
	id       uint32        // its MonitoredItemID
	si       time.Duration // the sampling interval the server revised
	seq      uint64        // the last delivery's Seq
	vouched  bool          // the live subscription stands behind the last delivery
	errored  bool          // the last delivery was an error: a loss is said once
	stopped  bool          // Stop: delete it from the server, deliver nothing more
	gaveUp   bool          // the server refused it: ErrNotMonitored was delivered
	failedAt time.Time     // when the server last refused to create it (BadNodeIdUnknown…): retried after retryFailed
	// What the server last reported for it, and an audit's finding that
	// the server holds something else, pending confirmation (audit.go).
	reported   *ua.DataValue
	suspect    time.Time // when an audit read first found it unreported; zero: nothing pending
	suspectSeq uint64    // the item's seq then: a delivery since clears the suspicion
	audited    time.Time // when an audit last read it: the longest unread go first
}

// retryFailed is how long an item the server refused to create waits
// before it is asked for again (a node a PLC download adds later is then
// monitored without a restart), as a poll would find it.
const retryFailed = 10 * time.Second

// failed marks the item refused now (mu held).
func (it *item) failed() {
	it.failedAt = time.Now()
	if due := it.failedAt.Add(retryFailed); it.set.nextRetry.IsZero() || due.Before(it.set.nextRetry) {
		it.set.nextRetry = due
	}
}

// waiting reports whether the item was refused less than retryFailed ago
// (mu held).
func (it *item) waiting() bool {
	return !it.failedAt.IsZero() && time.Since(it.failedAt) < retryFailed
}

// subscription is one subscription of the bus's session.
type subscription struct {
	id       uint32
	interval time.Duration // the publishing interval asked for: its items' group
	pi       time.Duration // the publishing interval the server revised
	ka       uint32        // the max keep-alive count the server revised
	live     bool          // held by the server for the current session
	since    time.Time     // when it became live (created, or taken over)
	last     time.Time     // when its last publish response (data or keep-alive) arrived
	heard    bool          // a publish response for it arrived (else last is when its items were created)
	nextSeq  uint32        // the sequence number its next notification message carries; 0: unknown
}

// deadline is how long the subscription may stay silent: a keep-alive
// is due after max keep-alive count publishing intervals without a
// message, counted from a cycle boundary (one interval more), and its
// reply may take timeout_ms.
func (s *subscription) deadline(margin time.Duration) time.Duration {
	return s.pi*time.Duration(s.ka+1) + margin
}

// monitors is the bus's monitorSet, started on first use.
func (b *Bus) monitors() (*monitorSet, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("opcua %s: bus closed: %w", b.spec.name, drivers.ErrOffline)
	}
	if b.mon == nil {
		ctx, cancel := context.WithCancel(context.Background())
		b.mon = &monitorSet{b: b, log: b.log, ctx: ctx, cancel: cancel, done: make(chan struct{}), wake: make(chan struct{}, 1),
			items: map[uint32]*item{}, subs: map[uint32]*subscription{}, batch: defaultItemsPerCall, readBatch: defaultItemsPerCall}
		go b.mon.run()
	}
	return b.mon, nil
}

func (ms *monitorSet) add(p *point, req drivers.MonitorRequest, deliver func(drivers.Update)) *item {
	ms.mu.Lock()
	ms.nextHandle++
	it := &item{set: ms, p: p, req: req, deliver: deliver, handle: ms.nextHandle}
	ms.items[it.handle] = it
	ms.mu.Unlock()
	ms.poke()
	return it
}

// poke wakes run to reconcile the items with the server.
func (ms *monitorSet) poke() {
	select {
	case ms.wake <- struct{}{}:
	default:
	}
}

// Confirmed is the delivery the live subscription stands behind, as of
// its last publish response less the sampling interval; nothing once the
// subscription is silent past its keep-alive deadline, whether or not
// run has noticed yet.
func (it *item) Confirmed() (uint64, time.Time) {
	ms := it.set
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s := it.sub
	if !it.vouched || it.stopped || s == nil || !s.live || time.Since(s.last) > s.deadline(ms.b.spec.Timeout) {
		return 0, time.Time{}
	}
	return it.seq, s.last.Add(-it.si)
}

// Stop deletes the item from the server (run does it) and ends its
// deliveries.
func (it *item) Stop() {
	ms := it.set
	ms.mu.Lock()
	already := it.stopped
	it.stopped, it.vouched = true, false
	ms.mu.Unlock()
	if !already {
		ms.poke()
	}
}

// delivery is one update to hand to the node outside mu.
type delivery struct {
	it *item
	u  drivers.Update
}

// next numbers u as the item's next delivery (mu held); vouched says the
// live subscription stands behind it.
func (it *item) next(u drivers.Update, vouched bool) delivery {
	it.seq++
	u.Seq = it.seq
	it.vouched, it.errored = vouched, u.Err != nil
	return delivery{it: it, u: u}
}

// deliverAll hands the updates to the node, in order, with no lock held.
func deliverAll(ds []delivery) {
	for _, d := range ds {
		if !d.it.isStopped() {
			d.it.deliver(d.u)
		}
	}
}

func (it *item) isStopped() bool {
	it.set.mu.Lock()
	defer it.set.mu.Unlock()
	return it.stopped
}

// update turns a notification's DataValue into an update: a reading (an
// Uncertain status says so), or the Bad status as the error a Read
// returns. at is when the notification arrived; the value is known to
// have held one sampling interval before it.
func (it *item) update(dv *ua.DataValue, at time.Time) drivers.Update {
	if dv == nil {
		return drivers.Update{Err: fmt.Errorf("opcua %s: a notification for %s without a value", it.p.bus.spec.name, it.p.spec.what())}
	}
	if isBad(dv.Status) {
		return drivers.Update{Err: &statusError{what: it.p.spec.what(), status: dv.Status}}
	}
	v, err := it.p.decode(dv.Value)
	if err != nil {
		return drivers.Update{Err: err}
	}
	r := drivers.Reading{Value: v, At: at.Add(-it.si)}
	if isUncertain(dv.Status) {
		r.Uncertain = "OPC UA status " + statusName(dv.Status)
	}
	return drivers.Update{Reading: r}
}

// filter is the item's DataChangeFilter: the capability's deadband, or
// none (every change of value or status is reported).
func (it *item) filter() *ua.ExtensionObject {
	d := it.req.Deadband
	if d == nil || d.Value == 0 {
		return nil
	}
	typ := ua.DeadbandTypeAbsolute
	if d.Percent {
		typ = ua.DeadbandTypePercent
	}
	return ua.NewExtensionObject(&ua.DataChangeFilter{Trigger: ua.DataChangeTriggerStatusValue, DeadbandType: uint32(typ), DeadbandValue: d.Value})
}

// refusedFilter reports the CreateMonitoredItems results that mean the
// server will not monitor the node this way, now or later: the node is
// polled instead.
func refusedFilter(st ua.StatusCode) bool {
	switch st {
	case ua.StatusBadFilterNotAllowed, ua.StatusBadMonitoredItemFilterUnsupported, ua.StatusBadMonitoredItemFilterInvalid,
		ua.StatusBadDeadbandFilterInvalid, ua.StatusBadTooManyMonitoredItems, ua.StatusBadTooManySubscriptions, ua.StatusBadServiceUnsupported:
		return true
	}
	return false
}

// notMonitoredError is a server's refusal to monitor a node: the node
// polls it instead (drivers.ErrNotMonitored).
type notMonitoredError struct {
	bus, what string
	deadband  string
	status    ua.StatusCode
}

func (e *notMonitoredError) Error() string {
	how := "as a monitored item"
	if e.deadband != "" {
		how += " with deadband " + e.deadband
	}
	msg := fmt.Sprintf("opcua %s: the server refused to monitor %s %s: %s", e.bus, e.what, how, statusName(e.status))
	if d, ok := ua.StatusCodes[e.status]; ok && d.Text != "" {
		msg += " (" + strings.TrimSuffix(d.Text, ".") + ")"
	}
	return msg + "; polled every poll_ms instead"
}

func (e *notMonitoredError) Code() string { return statusName(e.status) }

func (e *notMonitoredError) Fix() string {
	switch e.status {
	case ua.StatusBadMonitoredItemFilterUnsupported:
		if strings.HasSuffix(e.deadband, "%") {
			return "a percent deadband needs the node to publish an EURange (OPC UA Part 8 AnalogItem): write the band in the capability's unit (deadband: 0.5), or have the server's integrator add the EURange"
		}
		return "the server takes no deadband filter on this node: remove deadband (physd still applies it to what it reports)"
	case ua.StatusBadFilterNotAllowed, ua.StatusBadDeadbandFilterInvalid, ua.StatusBadMonitoredItemFilterInvalid:
		return "the node's type takes no deadband (or not this one): remove deadband, or bind a numeric node"
	case ua.StatusBadTooManyMonitoredItems, ua.StatusBadTooManySubscriptions:
		return "the server's limit on monitored items or subscriptions is reached: raise it on the server, or drop poll_ms from capabilities that need no background reads"
	}
	return "the server does not support subscriptions: the capability is polled"
}

func (e *notMonitoredError) Unwrap() error { return drivers.ErrNotMonitored }

// MonitorCounters is the bus's monitoring so far (drivers.MonitorCounters).
func (b *Bus) MonitorCounters() drivers.MonitorStats {
	b.mu.Lock()
	ms := b.mon
	b.mu.Unlock()
	if ms == nil {
		return drivers.MonitorStats{}
	}
	ms.mu.Lock()
	st := drivers.MonitorStats{Notifications: ms.notifications.Load(), KeepAlives: ms.keepAlives.Load(), Losses: ms.losses.Load()}
	for _, s := range ms.subs {
		if s.live {
			st.Subscriptions++
		}
	}
	for _, it := range ms.items {
		switch {
		case it.stopped:
		case it.gaveUp:
			st.Fallbacks++
		case it.sub != nil && it.sub.live:
			st.Items++
		}
	}
	ms.mu.Unlock()
	return st
}
