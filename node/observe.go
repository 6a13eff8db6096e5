package node

import (
	"context"
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
// behind before the stream drops its newest ones (and counts them).
const DefaultSubscriptionBuffer = 256

// Subscription receives the observation stream. Publishing never blocks:
// when C is full the observation is dropped for this subscriber and counted.
type Subscription struct {
	C       <-chan Observed
	ch      chan Observed
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
// buf observations (DefaultSubscriptionBuffer when ≤ 0). After Close the
// subscription is already done.
func (n *Node) Subscribe(buf int) *Subscription {
	if buf <= 0 {
		buf = DefaultSubscriptionBuffer
	}
	ch := make(chan Observed, buf)
	s := &Subscription{C: ch, ch: ch, done: make(chan struct{}), st: &n.obs}
	if !n.obs.add(s) {
		s.once.Do(func() { close(s.done) })
	}
	return s
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

// startPolls reads every capability with poll_ms in the background, through
// the shared read (a poll and a concurrent read_ cost one device read),
// until Close or until the next binding is in force. A capability whose
// device pushes its changes is monitored instead (monitor.go).
func (n *Node) startPolls(b *binding) {
	monitored := n.startMonitors(b)
	for _, cs := range b.caps {
		every := cs.cap.PollInterval()
		if every <= 0 || cs.point == nil || monitored[cs] {
			continue
		}
		n.polls.Add(1)
		n.markPolled(cs)
		go func() {
			defer n.polls.Done()
			t := time.NewTicker(every)
			defer t.Stop()
			for {
				select {
				case <-n.stopPoll:
					return
				case <-b.stopPoll:
					return
				case <-t.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), every+cs.cap.Timeout())
				_, _ = n.refresh(ctx, cs)
				cancel()
				n.markPolled(cs)
			}
		}()
	}
}
