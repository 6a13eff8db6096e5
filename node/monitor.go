package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/promcp"
)

// Monitored capabilities (docs/design.md "The read path"). A capability
// with poll_ms whose point implements drivers.Monitorer (an OPC UA node)
// is not polled: the device samples it every poll_ms and reports changes
// beyond the deadband, and each report takes the same recording path as a
// device read (record: cache, observation stream, interlocks).
//
// With a deadband the device says nothing while the value stays inside
// it, yet the value is current as long as the subscription is alive. So
// a monitored value is served by read_ while the driver vouches for it
// (Monitor.Confirmed: the delivery it still stands behind, and as of
// when), with that moment as its timestamp; a read_ whose max_age_ms is
// shorter than that age, or that comes while nothing is vouched for (no
// report yet, the subscription lost or silent past its keep-alive
// deadline), reads the device instead — never the cache, which may hold
// a value from before a loss. Every poll_ms the node records the vouched
// value again as of its confirmation, so history, alarms (stale_s) and
// the interlocks see a capability that keeps being read, and the liveness
// mark comes round as a poll's does.

// monitors are the capabilities the node monitors, by their state: a
// reload that keeps a capability keeps its monitor (and the device its
// item); one that removes or redefines it stops the monitor.
type monitors struct {
	mu sync.Mutex
	m  map[*capState]*capMonitor
}

// capMonitor is one capability's monitor.
type capMonitor struct {
	cs   *capState
	mon  drivers.Monitor
	cur  atomic.Pointer[monitored] // the last delivery
	poll atomic.Bool               // the monitor gave up: the capability is polled
	stop chan struct{}
	once sync.Once

	mu          sync.Mutex // orders deliveries and confirmations
	ended       bool
	unconfirmed bool      // an error said the last reading is no longer vouched for
	recordedAt  time.Time // the confirmation last recorded
}

// monitored is one delivery as recorded.
type monitored struct {
	seq uint64
	s   *sample // the reading (nil when err is set)
	err error
}

// errUnconfirmed is recorded when the driver stops vouching for a reading
// without having said why (its keep-alive deadline passed before its own
// goroutines noticed).
var errUnconfirmed = fmt.Errorf("%w: the subscription no longer confirms the value (no keep-alive within its deadline)", drivers.ErrTimeout)

// startMonitors monitors every capability of b with poll_ms whose point
// can be monitored, stops the monitors of capabilities b no longer has,
// and returns the capabilities it monitors (startPolls does not poll
// them; a monitor that gives up polls its capability itself).
func (n *Node) startMonitors(b *binding) map[*capState]bool {
	n.mons.mu.Lock()
	defer n.mons.mu.Unlock()
	inForce := make(map[*capState]bool, len(b.caps))
	for _, cs := range b.caps {
		inForce[cs] = true
	}
	for cs, m := range n.mons.m {
		if !inForce[cs] {
			m.end()
			delete(n.mons.m, cs)
		}
	}
	out := map[*capState]bool{}
	for _, cs := range b.caps {
		if cs.cap.PollInterval() <= 0 || cs.point == nil {
			continue
		}
		if n.mons.m[cs] != nil {
			out[cs] = true
			continue
		}
		mp, ok := cs.point.(drivers.Monitorer)
		if !ok {
			continue
		}
		m := &capMonitor{cs: cs, stop: make(chan struct{})}
		mon, err := mp.Monitor(drivers.MonitorRequest{Interval: cs.cap.PollInterval(), Deadband: cs.cap.Deadband},
			func(u drivers.Update) { n.deliver(m, u) })
		if err != nil {
			n.log.Warn("capability polled: its device cannot monitor it", "capability", cs.tool, "err", err)
			continue
		}
		m.mon = mon
		if n.mons.m == nil {
			n.mons.m = map[*capState]*capMonitor{}
		}
		n.mons.m[cs] = m
		cs.mon.Store(m)
		out[cs] = true
		n.polls.Add(1)
		go n.runMonitor(m)
	}
	return out
}

// end stops the monitor: no delivery is recorded after it.
func (m *capMonitor) end() {
	m.once.Do(func() {
		m.mu.Lock()
		m.ended = true
		m.mu.Unlock()
		m.cs.mon.CompareAndSwap(m, nil)
		close(m.stop)
		m.mon.Stop()
	})
}

// runMonitor comes round every poll_ms until Close or the monitor ends:
// it records the vouched value again (confirm), or, once the monitor gave
// up, polls the device.
func (n *Node) runMonitor(m *capMonitor) {
	defer n.polls.Done()
	defer m.end()
	every := m.cs.cap.PollInterval()
	n.markPolled(m.cs)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-n.stopPoll:
			return
		case <-m.stop:
			return
		case <-t.C:
		}
		if m.poll.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), every+m.cs.cap.Timeout())
			_, _ = n.refresh(ctx, m.cs)
			cancel()
		} else {
			n.confirm(m)
		}
		n.markPolled(m.cs)
	}
}

// deliver records one update of the monitor (the driver's goroutine).
func (n *Node) deliver(m *capMonitor, u drivers.Update) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended || m.poll.Load() {
		return
	}
	cs := m.cs
	switch {
	case errors.Is(u.Err, drivers.ErrNotMonitored):
		n.log.Warn("capability polled: its device gave up monitoring it", "capability", cs.tool, "every", cs.cap.PollInterval(), "err", u.Err)
		m.poll.Store(true)
		m.cur.Store(nil)
	case u.Err != nil:
		_, err := n.record(cs, drivers.Reading{}, u.Err, time.Now())
		m.cur.Store(&monitored{seq: u.Seq, err: err})
	default:
		if u.Reading.At.IsZero() {
			u.Reading.At = time.Now()
		}
		// started is when the value is known to have held, so a do_'s
		// read-back that began after it stays the cached value.
		s, err := n.record(cs, u.Reading, nil, u.Reading.At)
		m.cur.Store(&monitored{seq: u.Seq, s: s, err: err})
		m.unconfirmed, m.recordedAt = false, u.Reading.At
	}
}

// confirm records the reading the driver still vouches for as of its
// confirmation, or, when it stopped vouching without saying why, an error.
func (n *Node) confirm(m *capMonitor) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.cur.Load()
	if m.ended || cur == nil {
		return
	}
	seq, asOf := m.mon.Confirmed()
	switch {
	case seq == 0 && cur.err == nil && !m.unconfirmed:
		m.unconfirmed = true
		_, _ = n.record(m.cs, drivers.Reading{}, errUnconfirmed, time.Now())
	case seq == 0 || seq != cur.seq || cur.err != nil || !asOf.After(m.recordedAt):
		// Nothing new: a delivery under way, an error the driver already
		// recorded, or no confirmation since the last one.
	default:
		m.unconfirmed, m.recordedAt = false, asOf
		_, _ = n.record(m.cs, drivers.Reading{Value: cur.s.value, At: asOf, Uncertain: cur.s.uncertain}, nil, asOf)
	}
}

// fromMonitor answers a read_ of a monitored capability when its driver
// vouches for the value fresh enough for maxAge (served); monitored says
// the capability is monitored, so that observe reads the device rather
// than trust the cache when it is not served.
func (n *Node) fromMonitor(cs *capState, maxAge time.Duration) (o promcp.Observation, served, monitored bool) {
	m := cs.mon.Load()
	if m == nil || m.poll.Load() {
		return o, false, false
	}
	cur := m.cur.Load()
	seq, asOf := m.mon.Confirmed()
	switch {
	case cur == nil || seq == 0 || seq != cur.seq:
		return o, false, true // nothing vouched for: read the device
	case maxAge >= 0 && time.Since(asOf) > maxAge, maxAge < 0 && !cs.cap.Cacheable:
		return o, false, true // the caller needs fresher than the subscription vouches for
	case cur.err != nil:
		return n.observation(cs, cs.last.Load(), true, cur.err), true, true
	}
	s := *cur.s
	s.at, s.started = asOf, asOf.UnixNano()
	if cur.s.at.After(asOf) {
		s.at = cur.s.at
	}
	// A device read that began after the confirmation (a do_'s
	// read-back) is newer than what the subscription vouches for.
	if last := cs.last.Load(); last != nil && last.started > s.started {
		s = *last
	}
	return n.observation(cs, &s, true, nil), true, true
}

// monitoredNow reports whether the device pushes the capability's changes
// (not polled) now.
func (cs *capState) monitoredNow() bool {
	m := cs.mon.Load()
	return m != nil && !m.poll.Load()
}
