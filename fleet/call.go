package fleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The fleet endpoint's side of the calls (serve.go is the gateway's).

// Errors of a Client call. Every error but ErrOutcomeUnknown means nothing
// was done.
var (
	// ErrNoResponders: no process of the gateway is subscribed (it is
	// not connected, or serves nothing); the request reached nobody.
	ErrNoResponders = errors.New("no responders")
	// ErrNoAck: the gateway did not answer or acknowledge in time (link
	// cut, process stopped or overloaded).
	ErrNoAck = errors.New("did not acknowledge")
	// ErrOutcomeUnknown: a do_ was acknowledged and told to go ahead, and
	// no answer came back within the deadline: it may have run.
	ErrOutcomeUnknown = errors.New("outcome unknown")
)

// RemoteError is the gateway's own error answer (its text as sent).
type RemoteError struct {
	Site, Device, Kind, Msg string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("%s/%s answered %s: %s", e.Site, e.Device, e.Kind, e.Msg)
}

// Client calls serving gateways over one connection: one wildcard
// subscription on its own inbox prefix receives every reply. A reply
// subject names the site the request went to,
// <inbox prefix>.<site>.<client>.<n>, so that the hub can let each site
// answer under its own site only (hub.SitePermissions: a site may publish
// to <inbox prefix>.<site>.>), also through a leaf node, where a reply
// travels only where the site's permissions let it.
type Client struct {
	nc     *nats.Conn
	prefix string
	from   string
	inbox  string // the connection's inbox prefix
	id     string // this client's token in its reply subjects
	sub    *nats.Subscription
	seq    atomic.Uint64
	mu     sync.Mutex
	waits  map[string]chan *nats.Msg
	// Retry is how often an unanswered request (or an unacknowledged
	// do_) is sent again within its deadline.
	Retry time.Duration
}

// NewClient calls the gateways under prefix as from (the endpoint's id and
// a per-process instance: a serving gateway keys its calls by it).
func NewClient(nc *nats.Conn, prefix, from string) (*Client, error) {
	// NewInbox is the connection's inbox prefix and a unique token.
	inbox := nc.NewInbox()
	i := strings.LastIndexByte(inbox, '.')
	c := &Client{nc: nc, prefix: prefix, from: from, inbox: inbox[:i], id: inbox[i+1:], waits: map[string]chan *nats.Msg{}, Retry: 250 * time.Millisecond}
	sub, err := nc.Subscribe(c.inbox+".*."+c.id+".*", func(m *nats.Msg) {
		c.mu.Lock()
		ch := c.waits[m.Subject]
		c.mu.Unlock()
		if ch != nil {
			select {
			case ch <- m:
			default: // a duplicate reply; the first one counts
			}
		}
	})
	if err != nil {
		return nil, err
	}
	c.sub = sub
	return c, nil
}

// From is the requester name the gateways see.
func (c *Client) From() string { return c.from }

// Close ends the reply subscription.
func (c *Client) Close() { _ = c.sub.Unsubscribe() }

// wait registers a reply subject for a request to site.
func (c *Client) wait(site string) (string, chan *nats.Msg, func()) {
	subj := c.inbox + "." + site + "." + c.id + "." + strconv.FormatUint(c.seq.Add(1), 36)
	ch := make(chan *nats.Msg, 4)
	c.mu.Lock()
	c.waits[subj] = ch
	c.mu.Unlock()
	return subj, ch, func() {
		c.mu.Lock()
		delete(c.waits, subj)
		c.mu.Unlock()
	}
}

func (c *Client) msg(ctx context.Context, site, device, kind, id, reply string, payload []byte) *nats.Msg {
	m := nats.NewMsg(Base(c.prefix, site, device) + "." + SuffixRequest + "." + kind)
	m.Reply, m.Data = reply, payload
	m.Header.Set(HeaderFrom, c.from)
	if id != "" {
		m.Header.Set(HeaderCallID, id)
	}
	if dl, ok := ctx.Deadline(); ok {
		m.Header.Set(HeaderBudget, strconv.FormatInt(max(time.Until(dl).Milliseconds(), 1), 10))
	}
	return m
}

// noResponders reports whether m is the server's status for a request
// nobody was subscribed to.
func noResponders(m *nats.Msg) bool {
	return len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// exchange sends m until a reply arrives (again every retry while none
// has; 0: once), within until; the reply is returned as is.
func (c *Client) exchange(ctx context.Context, m *nats.Msg, ch chan *nats.Msg, until time.Time, retry time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var again <-chan time.Time
	if retry > 0 {
		t := time.NewTicker(retry)
		defer t.Stop()
		again = t.C
	}
	for {
		if err := c.nc.PublishMsg(m); err != nil {
			return nil, fmt.Errorf("the fleet endpoint cannot send (%w)", err)
		}
		select {
		case r := <-ch:
			if noResponders(r) {
				return nil, ErrNoResponders
			}
			return r, nil
		case <-again:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Request asks a gateway for a read, a can_do or its catalog (kinds a
// gateway may serve twice) within ctx's deadline. A read or a catalog is
// sent again every Retry until answered (NATS loses a message only across
// a reconnect); a can_do is sent once: its budget is short, and a slow
// gateway asked again would only be slower (it is reported blocked).
func (c *Client) Request(ctx context.Context, site, device, kind string, payload []byte) ([]byte, error) {
	reply, ch, done := c.wait(site)
	defer done()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(5 * time.Second)
	}
	retry := c.Retry
	if kind == KindCanDo {
		retry = 0
	}
	r, err := c.exchange(ctx, c.msg(ctx, site, device, kind, "", reply, payload), ch, dl, retry)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("%w: %s/%s did not answer %s within the deadline", ErrNoAck, site, device, kind)
	case errors.Is(err, ErrNoResponders):
		return nil, fmt.Errorf("%w: no process of %s/%s is connected to answer %s", ErrNoResponders, site, device, kind)
	case err != nil:
		return nil, err
	}
	return c.result(site, device, kind, r)
}

func (c *Client) result(site, device, kind string, r *nats.Msg) ([]byte, error) {
	switch r.Header.Get(HeaderReply) {
	case ReplyAnswer:
		return r.Data, nil
	case ReplyError:
		return nil, &RemoteError{Site: site, Device: device, Kind: kind, Msg: string(r.Data)}
	}
	return nil, &RemoteError{Site: site, Device: device, Kind: kind, Msg: "an unexpected reply (" + r.Header.Get(HeaderReply) + ")"}
}

// Do runs a do_ on a gateway in two phases: the request is sent (again
// every Retry) until the gateway acknowledges it within ackWithin; then
// the go-ahead is sent once, naming the process that acknowledged, and
// the answer awaited until ctx's deadline. An error before the go-ahead
// left means nothing was done (a refusal before the hold is the
// gateway's answer, not an error); after it, no answer is
// ErrOutcomeUnknown. The go-ahead is not repeated: an answer lost on the
// way is recovered by calling again with the same idempotency key (the
// gateway's ledger answers it byte for byte).
func (c *Client) Do(ctx context.Context, site, device string, payload []byte, ackWithin time.Duration) ([]byte, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, errors.New("fleet: a do_ needs a deadline")
	}
	id := strconv.FormatUint(c.seq.Add(1), 36)
	reply, ch, done := c.wait(site)
	defer done()
	start := time.Now()
	r, err := c.exchange(ctx, c.msg(ctx, site, device, KindDo, id, reply, payload), ch, earliest(dl, start.Add(ackWithin)), c.Retry)
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("%w: %s/%s did not acknowledge the do_ within %v (link cut, process stopped or overloaded); nothing was done",
			ErrNoAck, site, device, time.Since(start).Round(time.Millisecond))
	case errors.Is(err, ErrNoResponders):
		return nil, fmt.Errorf("%w: no process of %s/%s is connected to serve the do_; nothing was done", ErrNoResponders, site, device)
	case err != nil:
		return nil, fmt.Errorf("%w; nothing was done", err)
	}
	if r.Header.Get(HeaderReply) != ReplyAck {
		return c.result(site, device, KindDo, r) // refused before the hold
	}
	instance := r.Header.Get(HeaderInstance)
	reply2, ch2, done2 := c.wait(site)
	defer done2()
	g := c.msg(ctx, site, device, KindGo, id, reply2, nil)
	g.Header.Set(HeaderInstance, instance)
	if err := c.nc.PublishMsg(g); err != nil {
		// Not handed to the connection: the held request expires unrun.
		return nil, fmt.Errorf("the go-ahead could not be sent (%w); nothing was done", err)
	}
	select {
	case r := <-ch2:
		if noResponders(r) {
			return nil, fmt.Errorf("%w: %s/%s left between its acknowledgement and the go-ahead; nothing was done", ErrNoResponders, site, device)
		}
		switch r.Header.Get(HeaderReply) {
		case ReplyAnswer, ReplyError:
		default:
			// Not an answer the protocol knows (none, an ack, a kind of
			// another version, a lying or broken gateway): the go-ahead
			// reached it, so the do_ may have run.
			return nil, fmt.Errorf("%w: %s/%s answered the go-ahead with an unexpected reply (%q): the do_ may have run",
				ErrOutcomeUnknown, site, device, r.Header.Get(HeaderReply))
		}
		b, err := c.result(site, device, KindDo, r)
		var re *RemoteError
		if errors.As(err, &re) && !strings.HasPrefix(re.Msg, "not_committed") && !strings.Contains(re.Msg, "nothing was done") {
			// The gateway's error text says what happened; an error the
			// node returned is bad input or a fault before the device.
			re.Msg += "; nothing was done"
		}
		return b, err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: %s/%s acknowledged the do_ and was told to go ahead, but did not answer within the deadline (%v)",
			ErrOutcomeUnknown, site, device, ctx.Err())
	}
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
