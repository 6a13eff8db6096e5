package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// capState is one capability's binding and last observation.
type capState struct {
	cap     *manifest.Capability
	tool    string
	sum     string // the definition (capSum): a reload keeps the state when it is unchanged
	point   drivers.Point
	bus     *busRef
	bindErr error           // why the capability has no point (bus missing)
	vocab   map[string]bool // stemmed words can_do matches against, built once (nil when not exposed: never matched)
	bound   time.Time       // when this definition was bound (the interlocks' first-reading grace)
	safe    any             // the safe value (manifest safe.value) as a do_ argument decodes it; nil without one

	// preds are the device-step turns of the capabilities a reload replaced
	// on this bus; the first actuation waits for them (binding.go).
	preds     []chan struct{}
	predsDone atomic.Bool

	last    atomic.Pointer[sample] // last successful device read
	lastErr atomic.Pointer[error]  // last device error, nil after a success
	// outUnknown (do_ capabilities): a write's outcome was not seen (the
	// read-back failed, or the write's reply was lost), so last may not be
	// what the output holds; the interlocks judge it as unknown until a
	// read or a verified write shows the value again.
	outUnknown atomic.Bool
	latencyUS  atomic.Int64 // EWMA of device latency, microseconds

	flightMu sync.Mutex
	flight   *flight // the cache refresh under way, shared by its waiters

	act actuator // the do_ path of this capability (actuator.go); zero for a read

	mon atomic.Pointer[capMonitor] // the device pushes changes (monitor.go); nil: polled

	// Liveness marks (liveness.go), in nanoseconds since the node opened
	// on the monotonic clock: when the device step under way began (0:
	// none), when the shared device read under way began (0: none), and
	// when the background poll last finished a round.
	stepSince atomic.Int64
	readSince atomic.Int64
	polledAt  atomic.Int64

	// The observation stream's change reference (observe.go).
	refMu      sync.Mutex
	refSet     bool
	refValue   any
	refQuality promcp.Quality
}

type sample struct {
	value   any
	at      time.Time // when the device reported it
	started int64     // when the read that produced it began (unix nanos): orders the cache
	// uncertain is the device's own doubt about the value (drivers.Reading.Uncertain).
	uncertain string
}

// flight is one device read that every reader waiting for a fresh value
// shares; it ends with the read, whatever its waiters do meanwhile.
type flight struct {
	// done is closed when the read ended. The first reader to wait makes
	// it (under the capability's flightMu): a poll's read that nobody
	// joins needs none.
	done chan struct{}
	s    *sample
	err  error
}

// staleLimit is how long a failing capability keeps serving its last value
// as stale before it reads error: ten cache lifetimes, at least 30 s.
func staleLimit(c *manifest.Capability) time.Duration {
	return max(10*c.CacheTTL(), 30*time.Second)
}

// Read returns an observation of a read_ (or do_) capability. maxAge, when
// ≥ 0, bounds the age of a cached value the caller accepts (0 forces a
// device read). The only error is an unknown capability.
func (n *Node) Read(ctx context.Context, tool string, maxAge time.Duration) (promcp.Observation, error) {
	cs, err := n.capability(tool)
	if err != nil {
		return promcp.Observation{}, err
	}
	return n.observe(ctx, cs, maxAge), nil
}

func (n *Node) observe(ctx context.Context, cs *capState, maxAge time.Duration) promcp.Observation {
	o, served, monitored := n.fromMonitor(cs, maxAge)
	if served {
		return o
	}
	ttl := cs.cap.CacheTTL()
	if maxAge >= 0 && maxAge < ttl {
		ttl = maxAge
	}
	// A monitored value its subscription no longer vouches for is never
	// served from the cache: it may be from before a loss.
	if s := cs.last.Load(); !monitored && s != nil && ttl > 0 && time.Since(s.at) <= ttl {
		return n.observation(cs, s, true, nil)
	}
	s, err := n.refresh(ctx, cs)
	if err != nil {
		return n.observation(cs, cs.last.Load(), false, err)
	}
	return n.observation(cs, s, false, nil)
}

// refresh reads the device once for every caller that wants a fresh value
// now (single flight): M concurrent readers cost one device read, a failed
// read is not repeated M times, and each caller waits no longer than its
// own context allows — the read itself is bounded by the capability's
// timeout and ends even when nobody waits for it any more.
func (n *Node) refresh(ctx context.Context, cs *capState) (*sample, error) {
	f, mine := cs.join()
	if mine {
		go n.runFlight(cs, f)
	}
	select {
	case <-f.done:
		return f.s, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: the caller's deadline ended before the device answered (%v)", drivers.ErrTimeout, ctx.Err())
	}
}

// join returns the shared read of cs under way, or a new one that the
// caller must run (mine); either way the caller may wait on its done.
func (cs *capState) join() (f *flight, mine bool) {
	cs.flightMu.Lock()
	defer cs.flightMu.Unlock()
	if f = cs.flight; f == nil {
		f, mine = &flight{}, true
		cs.flight = f
	}
	if f.done == nil {
		f.done = make(chan struct{})
	}
	return f, mine
}

// claim begins a new shared read of cs for the caller to run, or returns
// nil when one is under way (its observation serves the caller too).
func (cs *capState) claim() *flight {
	cs.flightMu.Lock()
	defer cs.flightMu.Unlock()
	if cs.flight != nil {
		return nil
	}
	cs.flight = &flight{}
	return cs.flight
}

// doneOf is closed when the shared read f of cs has ended (made now when
// nobody waited for f yet).
func (cs *capState) doneOf(f *flight) <-chan struct{} {
	cs.flightMu.Lock()
	defer cs.flightMu.Unlock()
	if f.done == nil {
		if cs.flight != f {
			return closedChan // it ended with nobody waiting
		}
		f.done = make(chan struct{})
	}
	return f.done
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// runFlight performs the shared read f of cs and ends it.
func (n *Node) runFlight(cs *capState, f *flight) {
	cs.readSince.Store(n.monoNow())
	f.s, f.err = n.readDevice(context.Background(), cs)
	cs.readSince.Store(0)
	cs.endFlight(f)
}

// endFlight ends the shared read f (its s and err set): its waiters wake,
// and the next reader begins a new one.
func (cs *capState) endFlight(f *flight) {
	cs.flightMu.Lock()
	defer cs.flightMu.Unlock()
	cs.flight = nil
	if f.done != nil {
		close(f.done)
	}
}

// readDevice reads the point within the capability's timeout and records
// the result in the cache. The do_ path calls it directly: a read-back
// must be a read that began after the write, never a shared earlier one.
func (n *Node) readDevice(ctx context.Context, cs *capState) (*sample, error) {
	if cs.point == nil {
		return nil, cs.bindErr
	}
	if !cs.bus.enter() {
		return nil, busClosed(cs.bus)
	}
	defer cs.bus.leave()
	ctx, cancel := context.WithTimeout(ctx, cs.cap.Timeout())
	defer cancel()
	start := time.Now()
	r, err := cs.point.Read(ctx)
	return n.finishRead(ctx, cs, start, r, err)
}

// busClosed is the error of a read of a bus a manifest reload closed.
func busClosed(b *busRef) error {
	return fmt.Errorf("%w: bus %q was closed by a manifest reload; read again", drivers.ErrOffline, b.name)
}

// finishRead records one device read of cs that began at start and ended
// now with r or err (within ctx): the latency, the cache, the last error,
// the observation stream and the interlocks that read cs. Every device
// read of a capability's own point ends here, alone or in a poll's batch.
func (n *Node) finishRead(ctx context.Context, cs *capState, start time.Time, r drivers.Reading, err error) (*sample, error) {
	cs.noteLatency(time.Since(start))
	if err != nil && ctx.Err() != nil && !errors.Is(err, drivers.ErrTimeout) {
		err = errors.Join(drivers.ErrTimeout, err)
	}
	return n.record(cs, r, err, start)
}

// record puts what the device said about cs — a read's outcome, or a
// monitored item's update (monitor.go) — in the cache, on the observation
// stream and before the interlocks: the one path every reading of a
// capability's own point takes. started orders the cache (remember).
func (n *Node) record(cs *capState, r drivers.Reading, err error, started time.Time) (*sample, error) {
	if err == nil {
		err = checkValueType(cs.cap, r.Value)
	}
	if err != nil {
		cs.lastErr.Store(&err)
		if n.onDeviceErr != nil {
			n.onDeviceErr(cs.cap.Binding.Bus, err)
		}
		n.publishRead(cs, nil, err)
		n.afterRead(cs)
		return nil, err
	}
	if r.At.IsZero() {
		r.At = time.Now()
	}
	s := &sample{value: quantise(cs.cap, r.Value), at: r.At, started: started.UnixNano(), uncertain: r.Uncertain}
	cs.remember(s)
	cs.lastErr.Store(nil)
	cs.outUnknown.Store(false)
	n.publishRead(cs, s, nil)
	n.afterRead(cs)
	return s, nil
}

// remember caches s unless a read that began later is already cached (a
// slow shared read must not overwrite a do_'s newer read-back).
func (cs *capState) remember(s *sample) {
	for {
		old := cs.last.Load()
		if old != nil && old.started > s.started {
			return
		}
		if cs.last.CompareAndSwap(old, s) {
			return
		}
	}
}

// markedDown reports whether the driver has marked this capability's
// device (or its whole bus) down.
func (cs *capState) markedDown() bool {
	if ph, ok := cs.point.(drivers.PointHealth); ok && ph.Health() != nil {
		return true
	}
	return cs.bus != nil && cs.bus.Health() != nil
}

func (cs *capState) noteLatency(d time.Duration) {
	us := d.Microseconds()
	old := cs.latencyUS.Load()
	if old == 0 {
		cs.latencyUS.Store(us)
		return
	}
	cs.latencyUS.Store((old*7 + us) / 8)
}

// observation builds the proMCP read response. With readErr set, s is the
// last good sample (or nil): stale while it is recent, error after that.
func (n *Node) observation(cs *capState, s *sample, cached bool, readErr error) promcp.Observation {
	now := time.Now()
	o := promcp.Observation{
		Unit:       cs.cap.Unit,
		Capability: cs.tool,
		Source:     n.DeviceID(),
		Cached:     cached,
	}
	switch {
	case readErr == nil:
		o.Value, o.Timestamp = s.value, s.at
		o.Quality = promcp.QualityGood
		switch {
		case !inRange(cs.cap, s.value):
			o.Quality = promcp.QualityDegraded
			o.Reason = "value outside the capability's physical range " + rangeText(cs.cap) + ": check the sensor before acting"
		case s.uncertain != "":
			o.Quality = promcp.QualityDegraded
			o.Reason = "the device reports this value as uncertain: " + s.uncertain
		}
	case s != nil && now.Sub(s.at) <= staleLimit(cs.cap):
		o.Value, o.Timestamp = s.value, s.at
		o.Quality = promcp.QualityStale
		o.Reason = "device read failed, serving the last good value: " + readErr.Error()
		if cs.markedDown() {
			o.Quality = promcp.QualityDegraded
			o.Reason = "device is marked down, serving the last good value: " + readErr.Error()
		}
	default:
		o.Timestamp = now
		o.Quality = promcp.QualityError
		o.Reason = "no usable value: " + readErr.Error()
	}
	o.AgeMS = max(now.Sub(o.Timestamp).Milliseconds(), 0)
	o.Timestamp = o.Timestamp.UTC()
	return o
}
