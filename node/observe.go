package node

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// Observed is one entry of the node's observation stream: every device
// read of a capability (a read_ that missed the cache, a background poll,
// the read before and the read-back after a do_ write) produces one, good
// or not. Cached answers produce none: they are not device reads.
type Observed struct {
	Cap *manifest.Capability
	// Obs is the observation as read_ would answer it at that moment.
	Obs promcp.Observation
	// At is when the read ended.
	At time.Time
	// Changed is true when the value moved beyond the capability's
	// deadband from the last observation that counted as a change, or
	// the quality changed; the first observation of a capability counts.
	Changed bool
	// Safe, when set, makes this entry a change of the output's fail-safe
	// state (safe.go) rather than a device read: Obs is empty.
	Safe *SafeStatus
}

// DefaultSubscriptionBuffer is how many observations a subscriber may fall
// behind before the stream drops its newest ones (and counts them), at
// least (SubscriptionBuffer).
const DefaultSubscriptionBuffer = 256

// Subscription receives the observation stream. Publishing never blocks:
// when C is full the observation is dropped for this subscriber and counted.
type Subscription struct {
	C       <-chan Observed
	ch      chan Observed
	keep    func(Observed) bool // nil: every observation
	done    chan struct{}
	once    sync.Once
	dropped atomic.Uint64
	st      *stream
}

// Done is closed when the subscription ends (Close, or the node closed).
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Dropped is how many observations this subscriber missed because it was
// behind.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close ends the subscription; C is never closed (a publish may be under
// way), so readers select on Done.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.st.remove(s)
		close(s.done)
	})
}

// stream fans observations out to subscribers. The subscriber list is
// copied on write so a publish is one atomic load and one non-blocking
// send per subscriber: nothing more on a do_'s path.
type stream struct {
	mu      sync.Mutex
	subs    atomic.Pointer[[]*Subscription]
	dropped atomic.Uint64
	closed  bool
}

func (st *stream) add(s *Subscription) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return false
	}
	var list []*Subscription
	if p := st.subs.Load(); p != nil {
		list = append(list, *p...)
	}
	list = append(list, s)
	st.subs.Store(&list)
	return true
}

func (st *stream) remove(s *Subscription) {
	st.mu.Lock()
	defer st.mu.Unlock()
	p := st.subs.Load()
	if p == nil {
		return
	}
	var list []*Subscription
	for _, x := range *p {
		if x != s {
			list = append(list, x)
		}
	}
	st.subs.Store(&list)
}

func (st *stream) active() bool {
	p := st.subs.Load()
	return p != nil && len(*p) > 0
}

func (st *stream) publish(o Observed) {
	p := st.subs.Load()
	if p == nil {
		return
	}
	for _, s := range *p {
		if s.keep != nil && !s.keep(o) {
			continue
		}
		select {
		case s.ch <- o:
		default:
			s.dropped.Add(1)
			st.dropped.Add(1)
		}
	}
}

// close ends every subscription (Node.Close).
func (st *stream) close() {
	st.mu.Lock()
	st.closed = true
	var list []*Subscription
	if p := st.subs.Load(); p != nil {
		list = *p
	}
	st.mu.Unlock()
	for _, s := range list {
		s.Close()
	}
}

// Subscribe returns a subscription to the observation stream with room for
// buf observations (SubscriptionBuffer when ≤ 0). After Close the
// subscription is already done.
func (n *Node) Subscribe(buf int) *Subscription { return n.SubscribeWhere(buf, nil) }

// SubscribeWhere is Subscribe for the observations keep accepts (nil:
// all): keep runs on the publisher's goroutine for every observation, so
// it must be quick and must not block, and what it refuses never takes
// room in the subscriber's buffer. A consumer that acts only on changes,
// or only on some capabilities, says so here. (o is a copy: a pointer to
// the publisher's would make every publish allocate.)
func (n *Node) SubscribeWhere(buf int, keep func(o Observed) bool) *Subscription {
	if buf <= 0 {
		buf = n.SubscriptionBuffer()
	}
	ch := make(chan Observed, buf)
	s := &Subscription{C: ch, ch: ch, keep: keep, done: make(chan struct{}), st: &n.obs}
	if !n.obs.add(s) {
		s.once.Do(func() { close(s.done) })
	}
	return s
}

// SubscriptionBuffer is the default room of a subscription: one
// observation of every polled capability, at least
// DefaultSubscriptionBuffer. A poll round reads a bus's capabilities
// together (poll.go), so a round's observations arrive at once; a
// subscriber must hold a round's worth not to lose any while it catches up.
func (n *Node) SubscriptionBuffer() int {
	polledCaps := 0
	for _, cs := range n.bound().caps {
		if polled(cs) {
			polledCaps++
		}
	}
	return max(DefaultSubscriptionBuffer, polledCaps)
}

// ObservationsDropped is how many observations subscribers missed in all
// (for /metrics).
func (n *Node) ObservationsDropped() uint64 { return n.obs.dropped.Load() }

// publishRead puts the outcome of one device read of cs on the stream. It
// costs one atomic load when nobody subscribes.
func (n *Node) publishRead(cs *capState, s *sample, err error) {
	if !n.obs.active() {
		return
	}
	var o promcp.Observation
	if err != nil {
		o = n.observation(cs, cs.last.Load(), false, err)
	} else {
		o = n.observation(cs, s, false, nil)
	}
	n.obs.publish(Observed{Cap: cs.cap, Obs: o, At: time.Now(), Changed: cs.noteChange(o)})
}

// noteChange decides whether o counts as a change (deadband, quality) and,
// if so, makes it the reference for the next one.
func (cs *capState) noteChange(o promcp.Observation) bool {
	cs.refMu.Lock()
	defer cs.refMu.Unlock()
	if cs.refSet && cs.refQuality == o.Quality && !cs.cap.Changed(cs.refValue, o.Value) {
		return false
	}
	cs.refSet, cs.refValue, cs.refQuality = true, o.Value, o.Quality
	return true
}

// startPolls starts the background polls of b's capabilities with
// poll_ms: one goroutine per bus and interval reads all of its due
// capabilities together each round (poll.go), until Close or until the
// next binding is in force. Every capability is marked polled now, so the
// liveness bound counts from the start. A capability whose device pushes
// its changes is monitored instead (monitor.go).
func (n *Node) startPolls(b *binding) {
	monitored := n.startMonitors(b)
	caps := make([]*capState, 0, len(b.caps))
	for _, cs := range b.caps {
		if !monitored[cs] {
			caps = append(caps, cs)
		}
	}
	for _, g := range pollGroups(caps) {
		for _, cs := range g.caps {
			n.markPolled(cs)
		}
		n.polls.Add(1)
		go n.pollLoop(b, g)
	}
}

// polled reports whether cs is read in the background, by a poll or by
// its device pushing its changes (a monitored item): it has poll_ms and a
// bound point.
func polled(cs *capState) bool {
	return cs.cap.PollInterval() > 0 && cs.point != nil
}
