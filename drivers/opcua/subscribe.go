package opcua

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// The exchange with the server about monitored items (OPC UA Part 4 §5.12,
// §5.13), on the bus's session. physd sends its own Publish requests
// rather than run gopcua's Subscription loop: that loop does not tell its
// user about keep-alives (so a silent subscription cannot be told from a
// quiet one against a deadline), blocks on its channel, and pauses for
// good after an error. Everything else is gopcua's client and types.
//
// One goroutine (run) per bus: it waits for a session (the bus's, shared
// with reads and writes, opened with the bus's deadlines and backoff),
// takes over the previous session's subscriptions when the server did not
// restart (TransferSubscriptions with initial values) or creates them
// afresh, creates and deletes items as the node asks, keeps Publish
// requests outstanding, and delivers what comes back. When the session
// ends, a Publish fails, or a subscription is silent past its keep-alive
// deadline, every item is told at once (an error: the value is no longer
// vouched for), the session is dropped and the loop starts over.

const (
	// lifetimeTarget is how long the server keeps a subscription nobody
	// publishes for (Part 4 lifetime count × publishing interval): long
	// enough for physd to reconnect and take it over.
	lifetimeTarget = time.Minute
	// publishHoldMax widens the session's request timeout (the
	// TimeoutHint the server keeps a Publish request for): a Publish waits
	// at the server until it has notifications or a keep-alive is due,
	// and is never abandoned before the server gives it up (a reply to an
	// abandoned request would be a lost message); silence is judged by
	// the keep-alive deadline. Every other service call is bounded by
	// timeout_ms through its context.
	publishHoldMax = time.Minute
	// maxOutstanding is the most Publish requests kept at the server: one
	// per subscription and one more, so a reply never waits for a request.
	maxOutstanding = 4
	// maxRepublish is the most lost messages asked for again; beyond, the
	// subscription is created afresh (its items send their values again).
	maxRepublish = 16
	// defaultItemsPerCall is the CreateMonitoredItems batch when the
	// server publishes no MaxMonitoredItemsPerCall.
	defaultItemsPerCall = 500
	// maxItemsPerCall bounds a CreateMonitoredItems batch and an audit's
	// Read however many the server allows (node-opcua allows 10 000): a
	// server that works on one thread (node-opcua) answers nothing else,
	// Publish included, until it is through one call, which for 10 000
	// items on a loaded machine can outlast timeout_ms; and a call
	// without a reply drops the session and every item with it.
	maxItemsPerCall = 1000
	// watchdogTick is how often the keep-alive deadlines are checked.
	watchdogTick = 100 * time.Millisecond
)

// run is the monitorSet's goroutine (see above); it returns when the bus
// closes.
func (ms *monitorSet) run() {
	defer close(ms.done)
	for ms.ctx.Err() == nil {
		if !ms.hasItems() {
			select {
			case <-ms.wake:
			case <-ms.ctx.Done():
			}
			continue
		}
		ctx, cancel := context.WithTimeout(ms.ctx, ms.b.spec.ConnectTimeout+ms.b.spec.Timeout)
		c, gen, err := ms.b.session(ctx)
		cancel()
		if err != nil {
			ms.lose(err)
			ms.sleep(max(ms.b.retryIn(), 50*time.Millisecond))
			continue
		}
		err = ms.serve(c)
		if ms.ctx.Err() != nil {
			return
		}
		var trouble *subscriptionTrouble
		if errors.As(err, &trouble) {
			// The session answers: only its subscriptions failed. Reads
			// and writes keep it; the subscriptions are made again on it
			// (the old ones deleted), no sooner than reconnect_backoff_ms.
			ms.log.Warn("opcua: subscriptions lost on a session that still answers; subscribing again on it", "endpoint", ms.b.spec.Endpoint, "err", err)
			ms.lose(err)
			ms.abandon()
			ms.sleep(ms.b.spec.Reconnect)
			continue
		}
		ms.log.Warn("opcua: subscriptions lost; resubscribing", "endpoint", ms.b.spec.Endpoint, "err", err)
		ms.lose(err)
		ms.b.drop(gen, err)
	}
}

func (ms *monitorSet) hasItems() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, it := range ms.items {
		if !it.stopped && !it.gaveUp {
			return true
		}
	}
	return false
}

func (ms *monitorSet) sleep(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ms.ctx.Done():
	}
}

// lose tells every item that still has a value its subscription is gone
// (once), and keeps the subscriptions to take over in the next session.
func (ms *monitorSet) lose(why error) {
	ms.mu.Lock()
	var ds []delivery
	lost := false
	for _, s := range ms.subs {
		lost = lost || s.live
		s.live = false
	}
	if lost {
		ms.losses.Add(1)
	}
	for _, it := range ms.items {
		if it.stopped || it.gaveUp || it.errored {
			continue
		}
		err := fmt.Errorf("opcua %s: no subscription for %s: %w", ms.b.spec.name, it.p.spec.what(), offline(why))
		ds = append(ds, it.next(drivers.Update{Err: err}, false))
	}
	ms.mu.Unlock()
	deliverAll(ds)
}

// subscriptionTrouble is a serve that ended with the session still
// answering: the server refused a Publish request with a status that is
// no session's end (BadSubscriptionIdInvalid, BadInternalError…), or a
// subscription was silent past its deadline while a Read still went
// through. Dropping the session for it would fail every read and write
// of the bus until it is open again.
type subscriptionTrouble struct{ err error }

func (e *subscriptionTrouble) Error() string { return e.err.Error() }
func (e *subscriptionTrouble) Unwrap() error { return e.err }

// abandon gives up every subscription (after lose): the next reconcile
// deletes them from the server and creates the items afresh.
func (ms *monitorSet) abandon() {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	var ids []uint32
	for id := range ms.subs {
		ids = append(ids, id)
	}
	ms.forgetLocked(ids...)
	ms.orphans = append(ms.orphans, ids...)
}

// offline is err as an offline device's: the node serves nothing it
// fetched as good until the device reports again.
func offline(err error) error {
	if errors.Is(err, drivers.ErrOffline) {
		return err
	}
	return fmt.Errorf("%w: %w", err, drivers.ErrOffline)
}

// serve runs the subscriptions on one session until it fails (the error
// says why) or the bus closes.
func (ms *monitorSet) serve(c *opcua.Client) error {
	ctx, cancel := context.WithCancel(ms.ctx)
	pub := &publisher{ctx: ctx, c: c, results: make(chan publishResult, maxOutstanding), acks: []*ua.SubscriptionAcknowledgement{}}
	defer func() {
		cancel()
		pub.wg.Wait()
	}()
	if err := ms.resume(ctx, c); err != nil {
		return err
	}
	tick := time.NewTicker(watchdogTick)
	defer tick.Stop()
	audit := time.NewTicker(auditKeepAlives * ms.b.spec.KeepAlive)
	defer audit.Stop()
	dirty := true
	for {
		if dirty || ms.takeResync() {
			if err := ms.reconcile(ctx, c); err != nil {
				return err
			}
			dirty = false
		}
		pub.fill(ms.liveSubs())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ms.wake:
			dirty = true
		case r := <-pub.results:
			if err := ms.handle(ctx, c, pub, r); err != nil {
				return err
			}
		case <-audit.C:
			if err := ms.audit(ctx, c); err != nil {
				return err
			}
		case <-tick.C:
			// Replies that arrived count before a deadline is judged.
			for drained := false; !drained; {
				select {
				case r := <-pub.results:
					if err := ms.handle(ctx, c, pub, r); err != nil {
						return err
					}
				default:
					drained = true
				}
			}
			if err := ms.overdue(); err != nil {
				// The items are told now; the probe that tells a
				// silent server from a silent network may take
				// timeout_ms.
				ms.lose(err)
				if ms.b.answers(ctx, c) {
					return &subscriptionTrouble{err: err}
				}
				return err
			}
			dirty = dirty || ms.retryDue()
			if ms.recheckDue() {
				if err := ms.audit(ctx, c); err != nil {
					return err
				}
			}
		}
	}
}

// retryDue reports whether an item the server refused is due to be
// asked for again.
func (ms *monitorSet) retryDue() bool { return ms.takeDue(&ms.nextRetry) }

// takeDue reports whether the moment *at (under mu) has come, and clears
// it if so: whoever set it sets it again while there is cause.
func (ms *monitorSet) takeDue(at *time.Time) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if at.IsZero() || time.Now().Before(*at) {
		return false
	}
	*at = time.Time{}
	return true
}

func (ms *monitorSet) takeResync() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	r := ms.resync
	ms.resync = false
	return r
}

// liveSubs is how many subscriptions the server holds for the session.
func (ms *monitorSet) liveSubs() (n int) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, s := range ms.subs {
		if s.live {
			n++
		}
	}
	return n
}

// overdue is an error when a live subscription with items has sent
// nothing (no data, no keep-alive) past its deadline.
func (ms *monitorSet) overdue() error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	now := time.Now()
	for _, s := range ms.subs {
		if !s.live {
			continue
		}
		if d := s.deadline(ms.b.spec.Timeout); now.Sub(s.last) > d {
			return fmt.Errorf("subscription %d sent nothing (no data, no keep-alive) for %v, beyond its deadline %v (publishing interval %v × (max keep-alive count %d + 1) + timeout_ms)",
				s.id, now.Sub(s.last).Round(time.Millisecond), d, s.pi, s.ka)
		}
	}
	return nil
}

// call sends one service request, bounded by timeout_ms, and returns its
// typed response.
func call[T ua.Response](ctx context.Context, ms *monitorSet, c *opcua.Client, req ua.Request) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, ms.b.spec.Timeout)
	defer cancel()
	return send[T](ctx, c, req)
}

// send sends one service request within ctx and returns its typed
// response.
func send[T ua.Response](ctx context.Context, c *opcua.Client, req ua.Request) (T, error) {
	var out T
	err := c.Send(ctx, req, func(r ua.Response) error {
		v, ok := r.(T)
		if !ok {
			return fmt.Errorf("opcua: %T answered with %T", req, r)
		}
		out = v
		return nil
	})
	return out, err
}

// sessionLost reports whether a service error means the session (or its
// channel) is gone, rather than that the server refused one request.
func sessionLost(err error) bool {
	var st ua.StatusCode
	if !errors.As(err, &st) {
		return true // no reply at all: transport, deadline, closed client
	}
	switch st {
	case ua.StatusBadSessionIDInvalid, ua.StatusBadSessionClosed, ua.StatusBadSessionNotActivated,
		ua.StatusBadSecureChannelIDInvalid, ua.StatusBadSecureChannelClosed, ua.StatusBadConnectionClosed,
		ua.StatusBadServerNotConnected, ua.StatusBadNotConnected, ua.StatusBadTimeout, ua.StatusBadCommunicationError,
		ua.StatusBadShutdown, ua.StatusBadServerHalted:
		return true
	}
	return false
}

// resume starts a session's subscriptions: those of the previous session
// are taken over when the server is the same run (its StartTime has not
// changed), with their initial values sent again; after a restart, or
// when the server refuses, they are created afresh by reconcile. It also
// reads the server's batch limit for CreateMonitoredItems.
func (ms *monitorSet) resume(ctx context.Context, c *opcua.Client) error {
	if err := ms.quiet(ctx, c); err != nil {
		return err
	}
	rctx, cancel := ms.b.call(ctx)
	defer cancel()
	rr, err := c.Read(rctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{
		{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_StartTime), AttributeID: ua.AttributeIDValue},
		{NodeID: ua.NewNumericNodeID(0, id.Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall), AttributeID: ua.AttributeIDValue},
		{NodeID: ua.NewNumericNodeID(0, id.Server_ServerCapabilities_OperationLimits_MaxNodesPerRead), AttributeID: ua.AttributeIDValue},
	}, TimestampsToReturn: ua.TimestampsToReturnNeither})
	if err != nil && sessionLost(err) {
		return err
	}
	var start time.Time
	batch, readBatch := defaultItemsPerCall, defaultItemsPerCall
	if err == nil && len(rr.Results) == 3 {
		if v := rr.Results[0].Value; rr.Results[0].Status == ua.StatusOK && v != nil {
			start, _ = v.Value().(time.Time)
		}
		limit := func(dv *ua.DataValue, n *int) {
			if dv.Status == ua.StatusOK && dv.Value != nil {
				if v, ok := dv.Value.Value().(uint32); ok && v > 0 {
					*n = int(v)
				}
			}
		}
		limit(rr.Results[1], &batch)
		limit(rr.Results[2], &readBatch)
	}
	ms.mu.Lock()
	ms.batch, ms.readBatch = min(batch, maxItemsPerCall), min(readBatch, maxItemsPerCall)
	sameRun := !start.IsZero() && start.Equal(ms.startTime)
	ms.startTime = start
	var ids []uint32
	for id := range ms.subs {
		ids = append(ids, id)
	}
	if !sameRun {
		ms.forgetLocked(ids...)
		ids = nil
	}
	ms.mu.Unlock()
	if len(ids) == 0 {
		return nil
	}
	res, err := call[*ua.TransferSubscriptionsResponse](ctx, ms, c, &ua.TransferSubscriptionsRequest{SubscriptionIDs: ids, SendInitialValues: true})
	if err != nil && sessionLost(err) {
		return err
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if err != nil || len(res.Results) != len(ids) {
		ms.log.Info("opcua: the server did not transfer the subscriptions; creating them afresh", "endpoint", ms.b.spec.Endpoint, "err", err)
		ms.forgetLocked(ids...)
		return nil
	}
	now := time.Now()
	for i, r := range res.Results {
		s := ms.subs[ids[i]]
		if r.StatusCode != ua.StatusOK {
			ms.log.Info("opcua: the server did not transfer a subscription; creating it afresh", "endpoint", ms.b.spec.Endpoint, "id", ids[i], "status", statusName(r.StatusCode))
			ms.forgetLocked(ids[i])
			continue
		}
		ms.log.Info("opcua: subscription taken over by the new session", "endpoint", ms.b.spec.Endpoint, "id", ids[i])
		s.live, s.since, s.last, s.nextSeq = true, now, now, 0
	}
	return nil
}

// quiet sends TransferSubscriptions of no subscription before physd
// subscribes. It was meant to end gopcua's own Publish loop, but in gopcua
// v0.8.0 that loop starts paused (NewClient pauses it; only Subscribe
// resumes it), so it sends nothing on physd's sessions: seen against
// python-asyncua, which logs every request. What the call still does:
// servers that refuse it (node-opcua, open62541: Bad_NothingToDo;
// BadServiceUnsupported where the service is missing) answer with a
// ServiceFault, on which gopcua marks the client Closed and stops
// watching it, as it would on any later ServiceFault (a refused Publish
// or Republish); python-asyncua accepts it (Good, no results) and gopcua
// keeps watching. Either way the session answered, so the bus trusts it
// from now on (Bus.usable): its gopcua state says nothing, and a dead
// channel is found by the next call or the session keep-alive.
func (ms *monitorSet) quiet(ctx context.Context, c *opcua.Client) error {
	_, err := call[*ua.TransferSubscriptionsResponse](ctx, ms, c, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{}})
	if err != nil && sessionLost(err) {
		return err
	}
	ms.b.trust(c)
	return nil
}

// forgetLocked drops subscriptions from physd's books (mu held): their
// items are created again by reconcile.
func (ms *monitorSet) forgetLocked(ids ...uint32) {
	for _, id := range ids {
		s := ms.subs[id]
		if s == nil {
			continue
		}
		delete(ms.subs, id)
		for _, it := range ms.items {
			if it.sub == s {
				it.sub, it.id, it.vouched = nil, 0, false
			}
		}
	}
}

// publishInterval is the publishing interval an item's subscription asks
// for: its poll_ms, at most keepalive_ms (a change is then reported at
// most one keep-alive period after the sample that saw it).
func (ms *monitorSet) publishInterval(it *item) time.Duration {
	return min(it.req.Interval, ms.b.spec.KeepAlive)
}

// reconcile brings the server in line with the items: deletes stopped
// items and subscriptions left empty, and creates the items not on the
// server yet (their subscriptions first). A refusal of the server is
// delivered to the items it concerns; only a lost session is an error.
func (ms *monitorSet) reconcile(ctx context.Context, c *opcua.Client) error {
	ms.mu.Lock()
	del := map[*subscription][]uint32{}
	create := map[time.Duration][]*item{}
	used := map[*subscription]bool{}
	for h, it := range ms.items {
		switch {
		case it.stopped:
			if it.sub != nil && it.sub.live {
				del[it.sub] = append(del[it.sub], it.id)
			}
			delete(ms.items, h)
		case it.gaveUp || it.waiting():
		case it.sub == nil:
			k := ms.publishInterval(it)
			create[k] = append(create[k], it)
		default:
			used[it.sub] = true
		}
	}
	var empty []uint32
	for _, s := range ms.subs {
		if s.live && !used[s] && len(create[s.interval]) == 0 {
			empty = append(empty, s.id)
		}
	}
	orphans := ms.orphans
	ms.orphans = nil
	ms.mu.Unlock()

	if len(orphans) > 0 {
		// Dropped subscriptions: the server may still sample and publish
		// them. Its answer does not matter (gone already is fine).
		if _, err := call[*ua.DeleteSubscriptionsResponse](ctx, ms, c, &ua.DeleteSubscriptionsRequest{SubscriptionIDs: orphans}); err != nil && sessionLost(err) {
			return err
		}
	}

	for s, ids := range del {
		if _, err := call[*ua.DeleteMonitoredItemsResponse](ctx, ms, c, &ua.DeleteMonitoredItemsRequest{SubscriptionID: s.id, MonitoredItemIDs: ids}); err != nil && sessionLost(err) {
			return err
		}
	}
	if len(empty) > 0 {
		if _, err := call[*ua.DeleteSubscriptionsResponse](ctx, ms, c, &ua.DeleteSubscriptionsRequest{SubscriptionIDs: empty}); err != nil && sessionLost(err) {
			return err
		}
		ms.mu.Lock()
		ms.forgetLocked(empty...)
		ms.mu.Unlock()
	}
	for interval, items := range create {
		if err := ms.createItems(ctx, c, interval, items); err != nil {
			return err
		}
	}
	return nil
}

// subscriptionFor is the live subscription of a publishing interval,
// created when there is none.
func (ms *monitorSet) subscriptionFor(ctx context.Context, c *opcua.Client, interval time.Duration) (*subscription, error) {
	ms.mu.Lock()
	for _, s := range ms.subs {
		if s.live && s.interval == interval {
			ms.mu.Unlock()
			return s, nil
		}
	}
	ms.mu.Unlock()
	ka := max(uint32((ms.b.spec.KeepAlive+interval-1)/interval), 1)
	life := max(3*ka, uint32((lifetimeTarget+interval-1)/interval))
	res, err := call[*ua.CreateSubscriptionResponse](ctx, ms, c, &ua.CreateSubscriptionRequest{
		RequestedPublishingInterval: float64(interval.Milliseconds()),
		RequestedLifetimeCount:      life,
		RequestedMaxKeepAliveCount:  ka,
		PublishingEnabled:           true,
	})
	if err != nil {
		return nil, err
	}
	// A new subscription's first message is number 1 (Part 4 §7.21): one
	// taken by a Publish request that was not physd's (gopcua's own loop
	// sends one at connect, which a server that queues Publish requests
	// without subscriptions holds) is a gap, republished.
	now := time.Now()
	s := &subscription{id: res.SubscriptionID, interval: interval, live: true, since: now, last: now, nextSeq: 1,
		pi: time.Duration(res.RevisedPublishingInterval * float64(time.Millisecond)), ka: max(res.RevisedMaxKeepAliveCount, 1)}
	if s.pi <= 0 {
		s.pi = interval
	}
	ms.mu.Lock()
	ms.subs[s.id] = s
	ms.mu.Unlock()
	ms.log.Info("opcua: subscription created", "endpoint", ms.b.spec.Endpoint, "id", s.id, "publishing_interval", s.pi, "keepalive", s.pi*time.Duration(s.ka))
	if asked := interval * time.Duration(ka); s.pi*time.Duration(s.ka) > asked {
		// The server may revise both (Part 4 §5.13.2); physd keeps to
		// what it granted, so a silent network is noticed that much later.
		ms.log.Warn("opcua: the server granted a longer keep-alive than keepalive_ms asks: a lost subscription is noticed only after its deadline",
			"endpoint", ms.b.spec.Endpoint, "id", s.id, "asked", asked, "granted", s.pi*time.Duration(s.ka), "deadline", s.deadline(ms.b.spec.Timeout))
	}
	return s, nil
}

// createItems creates items in the subscription of interval, in batches
// the server takes.
func (ms *monitorSet) createItems(ctx context.Context, c *opcua.Client, interval time.Duration, items []*item) error {
	s, err := ms.subscriptionFor(ctx, c, interval)
	if err != nil {
		return ms.refused(err, items)
	}
	ms.mu.Lock()
	batch := ms.batch
	ms.mu.Unlock()
	for len(items) > 0 {
		n := min(batch, len(items))
		if err := ms.createBatch(ctx, c, s, items[:n]); err != nil {
			return err
		}
		items = items[n:]
	}
	// No Publish is asked for while the items are created, so until the
	// subscription's first reply its silence counts from now, not from
	// CreateSubscription: 10 000 items created on a busy server took
	// longer than the keep-alive deadline, and the subscription was
	// given up before physd had asked it for anything. No item is vouched
	// for before that first reply.
	ms.mu.Lock()
	if !s.heard && s.live {
		s.last = time.Now()
	}
	ms.mu.Unlock()
	return nil
}

func (ms *monitorSet) createBatch(ctx context.Context, c *opcua.Client, s *subscription, items []*item) error {
	var reqs []*ua.MonitoredItemCreateRequest
	var sent []*item
	var ds []delivery
	for _, it := range items {
		nid, err := it.p.nodeID(c)
		if err != nil {
			ms.mu.Lock()
			it.failed()
			ds = append(ds, it.next(drivers.Update{Err: err}, false))
			ms.mu.Unlock()
			continue
		}
		reqs = append(reqs, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:  &ua.ReadValueID{NodeID: nid, AttributeID: ua.AttributeIDValue, IndexRange: it.p.indexRange(), DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: it.handle, SamplingInterval: float64(it.req.Interval.Milliseconds()),
				Filter: it.filter(), QueueSize: 1, DiscardOldest: true},
		})
		sent = append(sent, it)
	}
	deliverAll(ds)
	if len(reqs) == 0 {
		return nil
	}
	res, err := call[*ua.CreateMonitoredItemsResponse](ctx, ms, c, &ua.CreateMonitoredItemsRequest{SubscriptionID: s.id, TimestampsToReturn: ua.TimestampsToReturnNeither, ItemsToCreate: reqs})
	if err != nil {
		return ms.refused(err, sent)
	}
	if len(res.Results) != len(sent) {
		return fmt.Errorf("CreateMonitoredItems: %d results for %d items", len(res.Results), len(sent))
	}
	ms.mu.Lock()
	ds = nil
	var refused []*item
	var codes []ua.StatusCode
	for i, r := range res.Results {
		it := sent[i]
		if isBad(r.StatusCode) {
			refused, codes = append(refused, it), append(codes, r.StatusCode)
			continue
		}
		// A Stop meanwhile poked run: the next reconcile deletes it.
		it.sub, it.id, it.si = s, r.MonitoredItemID, time.Duration(max(r.RevisedSamplingInterval, 0)*float64(time.Millisecond))
		it.failedAt = time.Time{}
	}
	ms.mu.Unlock()
	for i, it := range refused {
		ms.refuse([]*item{it}, codes[i])
	}
	return nil
}

// refused handles a failed call made for items: a lost session is the
// error; a Bad status the server answered is its refusal of the items
// (refuse), and nil.
func (ms *monitorSet) refused(err error, items []*item) error {
	var st ua.StatusCode
	if sessionLost(err) || !errors.As(err, &st) {
		return err
	}
	ms.refuse(items, st)
	return nil
}

// refuse delivers the server's refusal of items: a refusal of the way they
// are monitored (filter, limits) makes the node poll them; any other Bad
// status (BadNodeIdUnknown, BadNotReadable) is the items' error until
// they are asked for again, retryFailed later.
func (ms *monitorSet) refuse(items []*item, st ua.StatusCode) {
	ms.mu.Lock()
	var ds []delivery
	for _, it := range items {
		if it.stopped {
			continue
		}
		if refusedFilter(st) {
			db := ""
			if it.req.Deadband != nil {
				db = it.req.Deadband.Source
			}
			it.gaveUp = true
			ms.resync = true // its subscription may be left empty
			ds = append(ds, it.next(drivers.Update{Err: &notMonitoredError{bus: ms.b.spec.name, what: it.p.spec.what(), deadband: db, status: st}}, false))
			continue
		}
		it.failed()
		ds = append(ds, it.next(drivers.Update{Err: &statusError{what: it.p.spec.what(), status: st, op: "monitor"}}, false))
	}
	ms.mu.Unlock()
	for _, d := range ds {
		if errors.Is(d.u.Err, drivers.ErrNotMonitored) {
			ms.log.Warn("opcua: monitoring refused; the capability is polled", "err", d.u.Err)
		}
	}
	deliverAll(ds)
}

// close ends run and deletes the subscriptions from the server (c: the
// session, nil when there is none).
func (ms *monitorSet) close(c *opcua.Client) {
	ms.cancel()
	select {
	case <-ms.done:
	case <-time.After(ms.b.spec.Timeout + time.Second):
	}
	ms.mu.Lock()
	var ids []uint32
	for id, s := range ms.subs {
		if s.live {
			ids = append(ids, id)
		}
	}
	ms.mu.Unlock()
	if c == nil || len(ids) == 0 {
		return
	}
	_, _ = call[*ua.DeleteSubscriptionsResponse](context.Background(), ms, c, &ua.DeleteSubscriptionsRequest{SubscriptionIDs: ids})
}
