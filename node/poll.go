package node

import (
	"context"
	"time"

	"github.com/physd/physd/drivers"
)

// The background polls (poll_ms). One goroutine per bus and interval reads
// all of that bus's capabilities due at that interval together, each
// round: a driver that merges reads (drivers.BatchReader: Modbus) serves a
// device's hundreds of points in a few requests, and a site of 10 000
// points runs one goroutine per bus, not 10 000. Every read is still the
// capability's shared read (single flight: a read_ arriving meanwhile
// joins it rather than reading again, and a capability whose shared read
// is already under way is not read twice) and ends in finishRead, so the
// cache, the observation stream, the interlocks and the liveness marks
// see a poll's read as any other.

// pollGroup is the polled capabilities of one bus at one interval, and the
// buffers its rounds reuse (one goroutine owns them).
type pollGroup struct {
	bus   *busRef
	every time.Duration
	caps  []*capState

	due     []*capState // this round's: the capabilities without a shared read under way
	flights []*flight
	points  []drivers.Point
	ctxs    []context.Context
}

// pollGroups groups the polled capabilities by bus and interval, in the
// manifest's order.
func pollGroups(caps []*capState) []*pollGroup {
	type key struct {
		bus   *busRef
		every time.Duration
	}
	var out []*pollGroup
	index := map[key]*pollGroup{}
	for _, cs := range caps {
		if !polled(cs) {
			continue
		}
		k := key{cs.bus, cs.cap.PollInterval()}
		g := index[k]
		if g == nil {
			g = &pollGroup{bus: cs.bus, every: k.every}
			index[k] = g
			out = append(out, g)
		}
		g.caps = append(g.caps, cs)
	}
	return out
}

// pollLoop runs g's rounds every interval until Close or until the next
// binding is in force. A round that outlasts the interval delays the next
// (the ticker drops the ticks missed); each capability is marked polled
// when its round ends, which is what the liveness bound watches.
func (n *Node) pollLoop(b *binding, g *pollGroup) {
	defer n.polls.Done()
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		select {
		case <-n.stopPoll:
			return
		case <-b.stopPoll:
			return
		case <-t.C:
		}
		n.pollRound(g)
		for _, cs := range g.caps {
			n.markPolled(cs)
		}
	}
}

// pollRound reads every capability of g that has no shared read under way.
func (n *Node) pollRound(g *pollGroup) {
	g.due, g.flights = g.due[:0], g.flights[:0]
	for _, cs := range g.caps {
		if f := cs.claim(); f != nil {
			g.due, g.flights = append(g.due, cs), append(g.flights, f)
		}
	}
	if len(g.due) == 0 {
		return
	}
	if br, ok := g.bus.Bus.(drivers.BatchReader); ok {
		n.readBatch(g, br)
	} else {
		n.readEach(g)
	}
	clear(g.due)
	clear(g.flights)
	clear(g.points)
	clear(g.ctxs)
}

// readEach runs each due capability's shared read on its own goroutine,
// as a read_'s runs, and waits for them, each within the interval plus
// its timeout: a bus that cannot merge reads keeps them concurrent.
func (n *Node) readEach(g *pollGroup) {
	var longest time.Duration
	done := make([]<-chan struct{}, len(g.due))
	for i, cs := range g.due {
		done[i] = cs.doneOf(g.flights[i])
		go n.runFlight(cs, g.flights[i])
		longest = max(longest, cs.cap.Timeout())
	}
	wait := time.NewTimer(g.every + longest)
	defer wait.Stop()
	for _, d := range done {
		select {
		case <-d:
		case <-wait.C:
			return // the reads end by themselves, bounded by their timeouts
		}
	}
}

// readBatch reads the due capabilities through the bus at once, each
// within its capability's timeout, and ends each shared read with its
// outcome as it comes.
func (n *Node) readBatch(g *pollGroup, br drivers.BatchReader) {
	if !g.bus.enter() {
		err := busClosed(g.bus)
		for i, cs := range g.due {
			g.flights[i].err = err
			cs.endFlight(g.flights[i])
		}
		return
	}
	defer g.bus.leave()
	// One context per distinct timeout: the reads begin together, so one
	// deadline serves every capability that has the same timeout.
	var timeouts []time.Duration
	var ctxs []context.Context
	mark, start := n.monoNow(), time.Now()
	g.points, g.ctxs = g.points[:0], g.ctxs[:0]
	for _, cs := range g.due {
		cs.readSince.Store(mark)
		d, j := cs.cap.Timeout(), 0
		for j < len(timeouts) && timeouts[j] != d {
			j++
		}
		if j == len(timeouts) {
			ctx, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			timeouts, ctxs = append(timeouts, d), append(ctxs, ctx)
		}
		g.points, g.ctxs = append(g.points, cs.point), append(g.ctxs, ctxs[j])
	}
	br.ReadPoints(g.ctxs, g.points, func(i int, r drivers.Reading, err error) {
		cs, f := g.due[i], g.flights[i]
		f.s, f.err = n.finishRead(g.ctxs[i], cs, start, r, err)
		cs.readSince.Store(0)
		cs.endFlight(f)
	})
}
