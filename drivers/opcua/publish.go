package opcua

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/physd/physd/drivers"
)

// The Publish side of the subscriptions (OPC UA Part 4 §5.13.5): Publish
// requests kept outstanding, their replies taken in order (keep-alives
// noted, notifications delivered, acknowledged in the next request),
// missed messages republished, and subscriptions the server ended or
// lost dropped to be created again.

// publisher keeps Publish requests outstanding on one session.
type publisher struct {
	ctx         context.Context
	c           *opcua.Client
	results     chan publishResult
	wg          sync.WaitGroup
	outstanding int
	limit       int // lowered when the server says it has too many
	acks        []*ua.SubscriptionAcknowledgement
}

type publishResult struct {
	res  *ua.PublishResponse
	err  error
	sent time.Time // when the request left
	at   time.Time // when the reply arrived
	acks []*ua.SubscriptionAcknowledgement
}

// fill sends Publish requests until one per subscription and one more
// are outstanding (none without a subscription: the server would answer
// BadNoSubscription at once).
func (p *publisher) fill(subs int) {
	want := min(subs+1, maxOutstanding)
	if p.limit > 0 {
		want = min(want, p.limit)
	}
	for subs > 0 && p.outstanding < want {
		p.outstanding++
		acks := p.acks
		p.acks = []*ua.SubscriptionAcknowledgement{}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			sent := time.Now()
			res, err := send[*ua.PublishResponse](p.ctx, p.c, &ua.PublishRequest{SubscriptionAcknowledgements: acks})
			select {
			case p.results <- publishResult{res: res, err: err, sent: sent, at: time.Now(), acks: acks}:
			case <-p.ctx.Done():
			}
		}()
	}
}

// handle takes one Publish reply: notifications delivered, keep-alives
// noted, missed messages republished. Only a lost session is an error.
func (ms *monitorSet) handle(ctx context.Context, c *opcua.Client, pub *publisher, r publishResult) error {
	pub.outstanding--
	if r.err != nil {
		pub.acks = append(r.acks, pub.acks...) // not acknowledged yet
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(r.err, ua.StatusBadTooManyPublishRequests):
			pub.limit = max(pub.outstanding, 1)
			return nil
		case errors.Is(r.err, ua.StatusBadNoSubscription):
			// The server held none of the session's subscriptions when it
			// answered: those that existed before the request are gone
			// (one created since is not judged by it: a request answered
			// while physd replaced a subscription says nothing of the new).
			ms.mu.Lock()
			var gone []*subscription
			for _, s := range ms.subs {
				if s.live && s.since.Before(r.sent) {
					gone = append(gone, s)
				}
			}
			ms.mu.Unlock()
			for _, s := range gone {
				ms.dropSubscriptions(s, "the server holds no subscription for the session")
			}
			return nil
		case errors.Is(r.err, ua.StatusBadTimeout), errors.Is(r.err, context.DeadlineExceeded):
			return nil // a slow reply: the keep-alive deadline judges silence
		}
		if !sessionLost(r.err) {
			return &subscriptionTrouble{err: fmt.Errorf("publish: %w", r.err)}
		}
		return fmt.Errorf("publish: %w", r.err)
	}
	res := r.res
	msg := res.NotificationMessage
	ms.mu.Lock()
	s := ms.subs[res.SubscriptionID]
	if s == nil || !s.live || msg == nil {
		ms.mu.Unlock()
		return nil // a subscription deleted meanwhile
	}
	from := s.nextSeq
	keepAlive := len(msg.NotificationData) == 0
	ms.mu.Unlock()
	if from != 0 && msg.SequenceNumber > from {
		// Messages from..SequenceNumber-1 never arrived (a keep-alive
		// carries the number of the next message).
		if !ms.republish(ctx, c, pub, s, from, msg.SequenceNumber, r.at) {
			return ctx.Err()
		}
	}
	if keepAlive {
		ms.keepAlives.Add(1)
		ms.mu.Lock()
		if s.live {
			s.nextSeq, s.last, s.heard = msg.SequenceNumber, r.at, true
		}
		ms.mu.Unlock()
		return nil
	}
	ms.notify(s, msg, r.at)
	pub.acks = append(pub.acks, &ua.SubscriptionAcknowledgement{SubscriptionID: s.id, SequenceNumber: msg.SequenceNumber})
	return nil
}

// republish asks the server again for the messages from..to-1 of s and
// delivers them before the message that showed the gap; when the server
// no longer has one, s is dropped and created afresh (a lost notification
// could leave a value inside its deadband for good). false: ctx ended.
func (ms *monitorSet) republish(ctx context.Context, c *opcua.Client, pub *publisher, s *subscription, from, to uint32, at time.Time) bool {
	if to-from > maxRepublish {
		ms.dropSubscriptions(s, fmt.Sprintf("notification messages %d to %d of subscription %d were lost", from, to-1, s.id))
		return true
	}
	for seq := from; seq != to; seq++ {
		res, err := call[*ua.RepublishResponse](ctx, ms, c, &ua.RepublishRequest{SubscriptionID: s.id, RetransmitSequenceNumber: seq})
		if err == nil && (res.NotificationMessage == nil || res.NotificationMessage.SequenceNumber != seq) {
			err = fmt.Errorf("the server answered without message %d", seq) // an empty message: it has none
		}
		if err != nil {
			if ctx.Err() != nil {
				return false
			}
			ms.dropSubscriptions(s, fmt.Sprintf("notification message %d of subscription %d was lost and could not be republished (%v)", seq, s.id, err))
			return true
		}
		ms.notify(s, res.NotificationMessage, at)
		pub.acks = append(pub.acks, &ua.SubscriptionAcknowledgement{SubscriptionID: s.id, SequenceNumber: seq})
	}
	return true
}

// notify delivers one notification message of s: value changes to their
// items; a status change (the subscription ended on the server) drops it.
func (ms *monitorSet) notify(s *subscription, msg *ua.NotificationMessage, at time.Time) {
	ms.mu.Lock()
	if !s.live {
		ms.mu.Unlock()
		return
	}
	// One message may carry a change of every item (10 000 at a plant's
	// scale): the deliveries go in run's buffer, kept from message to
	// message rather than grown afresh for each.
	ds := ms.notified[:0]
	ended := ""
	for _, eo := range msg.NotificationData {
		if eo == nil {
			continue
		}
		switch v := eo.Value.(type) {
		case *ua.DataChangeNotification:
			for _, mn := range v.MonitoredItems {
				it := ms.items[mn.ClientHandle]
				if it == nil || it.sub != s || it.stopped || it.gaveUp {
					continue
				}
				ms.notifications.Add(1)
				// The subscription reports the item's every change of
				// value or status: it stands behind a Bad status too.
				it.reported = mn.Value
				ds = append(ds, it.next(it.update(mn.Value, at), true))
			}
		case *ua.StatusChangeNotification:
			ended = "the server ended subscription " + fmt.Sprint(s.id) + ": " + statusName(v.Status)
		}
	}
	s.nextSeq, s.last, s.heard = msg.SequenceNumber+1, at, true
	ms.mu.Unlock()
	deliverAll(ds)
	clear(ds) // the buffer holds no update past its delivery
	ms.notified = ds[:0]
	if ended != "" {
		ms.dropSubscriptions(s, ended)
	}
}

// dropSubscriptions gives up s (every live one when nil) on this
// session: its items are told they have no subscription and are created
// afresh by the next reconcile.
func (ms *monitorSet) dropSubscriptions(s *subscription, why string) {
	ms.mu.Lock()
	var ids []uint32
	for id, x := range ms.subs {
		if x.live && (s == nil || x == s) {
			ids = append(ids, id)
		}
	}
	var ds []delivery
	for _, it := range ms.items {
		if it.sub != nil && (s == nil || it.sub == s) && !it.stopped && !it.gaveUp {
			err := fmt.Errorf("opcua %s: %s: no value for %s until it is subscribed again: %w", ms.b.spec.name, why, it.p.spec.what(), drivers.ErrOffline)
			ds = append(ds, it.next(drivers.Update{Err: err}, false))
		}
	}
	if len(ids) == 0 {
		ms.mu.Unlock()
		return // nothing live: Publish replies after physd deleted its last subscription
	}
	ms.losses.Add(1)
	ms.forgetLocked(ids...)
	ms.orphans = append(ms.orphans, ids...) // the server may still hold them
	ms.resync = true
	ms.mu.Unlock()
	ms.log.Warn("opcua: subscription dropped; subscribing again", "endpoint", ms.b.spec.Endpoint, "why", why)
	deliverAll(ds)
}
