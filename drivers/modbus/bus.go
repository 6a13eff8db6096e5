package modbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

func init() {
	for t, open := range map[string]drivers.Factory{TypeTCP: OpenTCP, TypeRTU: OpenRTU} {
		drivers.RegisterDriver(t, drivers.Driver{Open: open,
			Check: func(c *manifest.Capability) error { return CheckBinding(t, c) },
			Span:  func(c *manifest.Capability) (drivers.Spanner, error) { return BindingSpan(t, c) }})
	}
}

// Bus is an open Modbus endpoint: one worker goroutine and its link.
type Bus struct {
	name string // "modbus_tcp plc1 (10.0.0.5:502)"
	spec *busSpec
	w    *worker
	hb   *heartbeat // nil: no heartbeat: key
	st   *counters
	stop chan struct{}
	once sync.Once
}

var _ drivers.Bus = (*Bus)(nil)

// OpenTCP is the drivers.Factory for modbus_tcp. A peer that cannot be
// reached does not fail it: the gateway must run without the PLC, so the
// bus opens, Health names the problem, capabilities read quality error, and
// the worker keeps retrying with backoff until the peer answers.
func OpenTCP(ctx context.Context, b *manifest.Bus) (drivers.Bus, error) {
	bus, err := open(ctx, b, TypeTCP)
	if err != nil {
		return nil, err
	}
	return bus, nil
}

// OpenRTU is the drivers.Factory for modbus_rtu. A serial port that cannot
// be opened (missing, busy, no permission, RS-485 mode refused) fails it:
// that is a wiring or configuration problem the node reports at /readyz.
func OpenRTU(ctx context.Context, b *manifest.Bus) (drivers.Bus, error) {
	bus, err := open(ctx, b, TypeRTU)
	if err != nil {
		return nil, err
	}
	return bus, nil
}

// Open opens a bus of either type with the concrete type, for tests and
// tools that want Stats.
func Open(ctx context.Context, b *manifest.Bus) (*Bus, error) {
	if b == nil {
		return nil, errors.New("modbus: nil bus")
	}
	return open(ctx, b, b.Type)
}

func open(_ context.Context, b *manifest.Bus, kind string) (*Bus, error) {
	if b == nil {
		return nil, errors.New("modbus: nil bus")
	}
	if kind != TypeTCP && kind != TypeRTU {
		return nil, fmt.Errorf("modbus: bus %q: type %q is not %s or %s", b.Name, kind, TypeTCP, TypeRTU)
	}
	spec, err := parseBus(b, kind)
	if err != nil {
		return nil, err
	}
	st := &counters{}
	stop := make(chan struct{})
	name := fmt.Sprintf("%s %s (%s)", kind, b.Name, spec.endpoint())
	var l link
	if kind == TypeTCP {
		l = newTCPLink(spec.Address, spec.Timeout, st)
	} else {
		l = newRTULink(spec.Serial, spec.Timeout, spec.silence(), st, stop)
	}
	bus, err := start(name, spec, l, st, stop)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err) // a *serialError: its message carries the fix
	}
	return bus, nil
}

// start connects once (so Health is right from the beginning) and starts
// the worker. A TCP peer that cannot be reached is no error (the worker
// keeps retrying it); a serial port that cannot be opened is. Tests start
// buses on fake links through here.
func start(name string, spec *busSpec, l link, st *counters, stop chan struct{}) (*Bus, error) {
	w := newWorker(name, spec, l, st, stop)
	err := w.connect()
	go w.run()
	b := &Bus{name: name, spec: spec, w: w, st: st, stop: stop}
	if err != nil && spec.kind == TypeRTU {
		_ = b.Close()
		return nil, err
	}
	if spec.Heartbeat != nil {
		// After the worker: its first write (the watchdog time) queues
		// like any request, so Open does not wait for an unreachable peer.
		b.hb = newHeartbeat(*spec.Heartbeat, name, w, st, spec.log, stop)
		go b.hb.run()
	}
	return b, nil
}

// Point opens a capability's binding; errors are manifest.Errors naming the
// binding key at fault.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("modbus: nil capability")
	}
	s, err := parseBinding(c, b.spec.kind)
	if err != nil {
		return nil, err
	}
	if s.verify != nil {
		return &verifiedPoint{point: &point{b: b, s: s}, v: s.verify}, nil
	}
	return &point{b: b, s: s}, nil
}

var _ drivers.BatchReader = (*Bus)(nil)

// ReadPoints reads many of the bus's points as one entry of its queue
// (drivers.BatchReader, the node's background polls): the worker merges
// them with each other, and with whatever else is queued, into as few
// requests as their addresses allow, and the queue keeps its room for the
// reads and writes of calls. The members share one channel for their
// answers, and each is reported as its answer comes; those still without
// one when the latest of their deadlines has passed (or when the bus
// closes) are reported as not answered. A point the device answered busy
// (exception 6) is read again on its own, with the resends its Read makes.
func (b *Bus) ReadPoints(ctxs []context.Context, points []drivers.Point, done func(int, drivers.Reading, error)) {
	batch := &request{op: opRead, members: make([]*request, 0, len(points))}
	slot := make([]int, 0, len(points)) // member -> index in points
	own := make([]*point, 0, len(points))
	answers := make(chan *request, len(points))
	var latest time.Time
	for i, dp := range points {
		p := b.own(dp)
		if p == nil {
			r, err := dp.Read(ctxs[i])
			done(i, r, err)
			continue
		}
		m := p.batchRequest()
		m.ctx, m.batched, m.member = ctxs[i], answers, len(batch.members)
		batch.members = append(batch.members, m)
		slot, own = append(slot, i), append(own, p)
		if dl, ok := ctxs[i].Deadline(); !ok {
			latest = time.Now().Add(b.spec.Timeout + time.Hour) // no deadline: the worker's timeouts end it
		} else if dl.After(latest) {
			latest = dl
		}
	}
	if len(batch.members) == 0 {
		return
	}
	if err := b.w.enqueue(batch); err != nil {
		for _, i := range slot {
			done(i, drivers.Reading{}, err)
		}
		return
	}
	reported := make([]bool, len(batch.members))
	late := time.NewTimer(time.Until(latest))
	defer late.Stop()
	for left := len(batch.members); left > 0; left-- {
		select {
		case m := <-answers:
			j := m.member
			reported[j] = true
			res := m.res
			// Answered: the worker is done with it (a member left
			// unanswered below never is reused: the worker may hold it).
			own[j].spare.Store(m)
			b.report(ctxs[slot[j]], own[j], res, slot[j], done)
		case <-late.C:
			b.unanswered(reported, slot, done, "%w: no answer before the deadline (%v)", drivers.ErrTimeout, context.DeadlineExceeded)
			return
		case <-b.w.done:
			b.unanswered(reported, slot, done, "bus closed")
			return
		}
	}
}

// report hands a batch member's answer to done: decoded, an error, or (the
// device was busy) the point's own read with its resends.
func (b *Bus) report(ctx context.Context, p *point, res result, i int, done func(int, drivers.Reading, error)) {
	var ex *ExceptionError
	switch {
	case errors.As(res.err, &ex) && ex.Exception == 6:
		r, err := p.Read(ctx)
		done(i, r, err)
	case res.err != nil:
		done(i, drivers.Reading{}, res.err)
	default:
		r, err := p.decode(res)
		done(i, r, err)
	}
}

// unanswered reports every member not reported yet with the error; the
// worker may still answer them later, into the batch's channel, which
// nobody reads then.
func (b *Bus) unanswered(reported []bool, slot []int, done func(int, drivers.Reading, error), format string, args ...any) {
	for j, ok := range reported {
		if !ok {
			done(slot[j], drivers.Reading{}, fmt.Errorf("%s: "+format, append([]any{b.name}, args...)...))
		}
	}
}

// own is dp as a point of this bus, or nil.
func (b *Bus) own(dp drivers.Point) *point {
	switch p := dp.(type) {
	case *point:
		if p.b == b {
			return p
		}
	case *verifiedPoint:
		if p.b == b {
			return p.point
		}
	}
	return nil
}

// Health is nil while the endpoint is reachable (or has not failed yet);
// otherwise it wraps drivers.ErrOffline and says why.
func (b *Bus) Health() error {
	select {
	case <-b.stop:
		return fmt.Errorf("%s: closed: %w", b.name, drivers.ErrOffline)
	default:
	}
	return b.w.endpointHealth()
}

// Close stops the heartbeat and the worker (queued requests fail with
// drivers.ErrOffline) and closes the link. It waits for a request on the
// wire to finish. With a heartbeat, the device's watchdog then runs out:
// a bus that closes for good leaves the device to its safe state.
func (b *Bus) Close() error {
	b.once.Do(func() { close(b.stop) })
	<-b.w.done
	if b.hb != nil {
		<-b.hb.done
	}
	return nil
}

// Name is "modbus_tcp plc1 (10.0.0.5:502)".
func (b *Bus) Name() string { return b.name }

// Stats are a bus's counters since Open.
type Stats struct {
	Requests   int64 `json:"requests"`   // Modbus requests sent (a merged read counts once)
	Reads      int64 `json:"reads"`      // point reads answered from the wire
	Writes     int64 `json:"writes"`     // point writes attempted
	Coalesced  int64 `json:"coalesced"`  // point reads that shared another read's request
	Failures   int64 `json:"failures"`   // requests that failed other than by exception
	Exceptions int64 `json:"exceptions"` // Modbus exception replies
	Timeouts   int64 `json:"timeouts"`   // requests without a timely reply
	Rejected   int64 `json:"rejected"`   // refused unsent: queue full, unit down, expired
	Reconnects int64 `json:"reconnects"` // TCP connections / serial opens
	Flushes    int64 `json:"flushes"`    // RTU: waits for a silent line after an error
	Strays     int64 `json:"strays"`     // RTU: unexpected bytes seen before a send
	Discarded  int64 `json:"discarded"`  // RTU: bytes thrown away by flushes
	Probes     int64 `json:"probes"`     // RTU: re-synchronisation probes (function 8) sent
	QueueDepth int   `json:"queue_depth"`

	// The heartbeat (zero without a heartbeat: key).
	HeartbeatsSent  int64     `json:"heartbeats_sent"`           // heartbeat writes the device acknowledged
	HeartbeatErrors int64     `json:"heartbeat_errors"`          // heartbeat and watchdog time writes that failed
	WatchdogArmed   int64     `json:"watchdog_armed"`            // watchdog time writes acknowledged (open, reconnects, recoveries)
	LastHeartbeat   time.Time `json:"last_heartbeat,omitzero"`   // when the last heartbeat was acknowledged
	HeartbeatError  string    `json:"heartbeat_error,omitempty"` // the last failure, until a write works again
}

// Counters implements drivers.Counters (/metrics).
func (b *Bus) Counters() drivers.BusCounters {
	s := b.Stats()
	return drivers.BusCounters{QueueDepth: s.QueueDepth, Requests: s.Requests, Coalesced: s.Coalesced, Failures: s.Failures,
		Timeouts: s.Timeouts, Exceptions: s.Exceptions, Heartbeats: s.HeartbeatsSent, HeartbeatErrors: s.HeartbeatErrors}
}

// Stats returns the counters.
func (b *Bus) Stats() Stats {
	s := b.st
	st := Stats{
		Requests: s.requests.Load(), Reads: s.reads.Load(), Writes: s.writes.Load(), Coalesced: s.coalesced.Load(),
		Failures: s.failures.Load(), Exceptions: s.exceptions.Load(), Timeouts: s.timeouts.Load(),
		Rejected: s.rejected.Load(), Reconnects: s.reconnects.Load(), Flushes: s.flushes.Load(),
		Strays: s.strays.Load(), Discarded: s.discarded.Load(), Probes: s.probes.Load(), QueueDepth: len(b.w.queue),
		HeartbeatsSent: s.hbSent.Load(), HeartbeatErrors: s.hbErrors.Load(), WatchdogArmed: s.hbArmed.Load(),
	}
	if ns := s.hbLast.Load(); ns != 0 {
		st.LastHeartbeat = time.Unix(0, ns)
	}
	if e := s.hbErr.Load(); e != nil {
		st.HeartbeatError = *e
	}
	return st
}
