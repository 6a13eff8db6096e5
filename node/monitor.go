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
//
// One goroutine per bus and interval does that for all of the bus's
// monitors of that interval (monitorGroup), as one goroutine per bus and
// interval polls (poll.go): a site of 10 000 monitored points runs a
// goroutine per bus, not 10 000 goroutines with a ticker each, whose
// stacks the collector would scan every cycle.

// monitors are the capabilities the node monitors, by their state: a
// reload that keeps a capability keeps its monitor (and the device its
// item); one that removes or redefines it stops the monitor.
type monitors struct {
	mu     sync.Mutex
	m      map[*capState]*capMonitor
	groups map[monitorKey]*monitorGroup
}

// monitorKey is a monitor's group: its bus and its poll_ms.
type monitorKey struct {
	bus   *busRef
	every time.Duration
}

// monitorGroup is the monitors of one bus at one interval, and the
// goroutine that comes round every interval for them (monitorLoop). It
// lives while it has monitors: a reload that keeps a capability keeps it
// in its group.
type monitorGroup struct {
	key  monitorKey
	stop chan struct{} // closed when its last monitor ended (under monitors.mu)

	mu   sync.Mutex
	list []*capMonitor // in no order: a monitor leaves by a swap with the last
}

// capMonitor is one capability's monitor.
type capMonitor struct {
	cs         *capState
	mon        drivers.Monitor
	group      *monitorGroup
	index      int                       // its place in group.list (under group.mu)
	cur        atomic.Pointer[monitored] // the last delivery
	poll       atomic.Bool               // the monitor gave up: the capability is polled
	refreshing atomic.Bool               // a poll of the capability (after poll) is under way
	once       sync.Once

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
			n.leaveGroup(m)
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
		m := &capMonitor{cs: cs}
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
		n.markPolled(cs)
		n.joinGroup(m)
	}
	return out
}

// joinGroup puts m in the group of its bus and interval, started when
// there is none (n.mons.mu held).
func (n *Node) joinGroup(m *capMonitor) {
	k := monitorKey{m.cs.bus, m.cs.cap.PollInterval()}
	g := n.mons.groups[k]
	if g == nil {
		if n.mons.groups == nil {
			n.mons.groups = map[monitorKey]*monitorGroup{}
		}
		g = &monitorGroup{key: k, stop: make(chan struct{})}
		n.mons.groups[k] = g
		n.polls.Add(1)
		go n.monitorLoop(g)
	}
	g.mu.Lock()
	m.group, m.index = g, len(g.list)
	g.list = append(g.list, m)
	g.mu.Unlock()
}

// leaveGroup takes m out of its group, and ends the group's goroutine
// when m was its last monitor (n.mons.mu held).
func (n *Node) leaveGroup(m *capMonitor) {
	g := m.group
	g.mu.Lock()
	last := len(g.list) - 1
	g.list[m.index], g.list[last].index = g.list[last], m.index
	g.list[last] = nil
	g.list = g.list[:last]
	empty := last == 0
	g.mu.Unlock()
	if empty {
		delete(n.mons.groups, g.key)
		close(g.stop)
	}
}

// end stops the monitor: no delivery is recorded after it.
func (m *capMonitor) end() {
	m.once.Do(func() {
		m.mu.Lock()
		m.ended = true
		m.mu.Unlock()
		m.cs.mon.CompareAndSwap(m, nil)
		m.mon.Stop()
	})
}

// monitorLoop comes round every interval for g's monitors until Close or
// until g has none left: it records each vouched value again (confirm)
// and marks the capability polled, or, for a monitor that gave up, polls
// the device. Close ends every monitor of g.
func (n *Node) monitorLoop(g *monitorGroup) {
	defer n.polls.Done()
	every := g.key.every
	t := time.NewTicker(every)
	defer t.Stop()
	var round []*capMonitor // reused: this goroutine owns it
	for {
		select {
		case <-n.stopPoll:
			for _, m := range g.members(round[:0]) {
				m.end()
			}
			return
		case <-g.stop:
			return
		case <-t.C:
		}
		round = g.members(round[:0])
		for _, m := range round {
			if m.poll.Load() {
				n.pollGivenUp(m, every)
				continue
			}
			n.confirm(m)
			n.markPolled(m.cs)
		}
		clear(round)
	}
}

// members appends g's monitors to buf.
func (g *monitorGroup) members(buf []*capMonitor) []*capMonitor {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append(buf, g.list...)
}

// pollGivenUp polls the capability of a monitor that gave up, on a
// goroutine of its own so a slow device holds up no other monitor of the
// round; a poll still under way from an earlier round is not doubled. The
// capability is marked polled when its poll ends, as a poll round's are.
func (n *Node) pollGivenUp(m *capMonitor, every time.Duration) {
	if !m.refreshing.CompareAndSwap(false, true) {
		return
	}
	n.polls.Add(1) // monitorLoop's own count keeps the group counted meanwhile
	go func() {
		defer n.polls.Done()
		defer m.refreshing.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), every+m.cs.cap.Timeout())
		defer cancel()
		_, _ = n.refresh(ctx, m.cs)
		n.markPolled(m.cs)
	}()
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
