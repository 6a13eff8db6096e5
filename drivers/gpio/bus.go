package gpio

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// Bus is the host's GPIO, opened as one manifest bus. It is safe for
// concurrent use; each pin has its own lock.
type Bus struct {
	name       string
	poll       time.Duration // counter WaitForEdge timeout (how fast Close is noticed)
	retryEvery time.Duration // how often a missing pin is looked up again
	closed     atomic.Bool

	mu   sync.Mutex
	pins map[string]*pinState // by canonical pin name
}

var _ drivers.Bus = (*Bus)(nil)

// Point binds a capability to its pin and configures the pin now: outputs
// are driven to their initial level, inputs get their pull and edge
// detection. A pin that does not exist is not an error here (the daemon
// keeps running); the point reads ErrOffline and Health names the pin.
// Configuration errors are manifest.Errors naming the binding key.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("gpio: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	if b.closed.Load() {
		return nil, fmt.Errorf("gpio %s: bus closed: %w", b.name, drivers.ErrOffline)
	}
	key := canonical(s.pin)
	b.mu.Lock()
	st := b.pins[key]
	if st == nil {
		st = &pinState{key: key, asked: s.pin, elec: s.elec, bus: b}
		b.pins[key] = st
	}
	b.mu.Unlock()

	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.join(c, s); err != nil {
		return nil, err
	}
	st.users = append(st.users, c.Name)
	_ = st.ensure() // a missing pin is reported by Health and on read
	what := fmt.Sprintf("gpio %s %s", b.name, key)
	if s.counting {
		return &countPoint{st: st, what: what}, nil
	}
	return &levelPoint{st: st, what: what, writable: s.writable}, nil
}

// join adds a capability to a pin: its electrical keys must match those of
// the capabilities already on the pin. An edge counter may join a plain
// input, which is then reconfigured with edge detection. st.mu is held.
func (st *pinState) join(c *manifest.Capability, s *pinSpec) error {
	if len(st.users) == 0 {
		return nil
	}
	a, e := st.elec, s.elec
	sameCounter := a.counter == nil || e.counter == nil || *a.counter == *e.counter
	if a.out != e.out || a.activeLow != e.activeLow || a.pull != e.pull || a.initial != e.initial || !sameCounter {
		p := manifest.NewBindingErrors(c)
		p.Add("pin", fmt.Sprintf("pin %s is also bound by %v as %s; every capability on one pin must agree on direction, active_low, pull, initial and edge_count",
			st.key, st.users, describe(a)), "give this binding the same keys (e.g. direction: out to read back an output), or use another pin")
		return p.Errs
	}
	if a.counter == nil && e.counter != nil {
		st.stopLocked()
		st.elec.counter = e.counter
		st.pin, st.err = nil, nil // reconfigure with edge detection
	}
	return nil
}

func describe(e electrical) string {
	dir := "an input"
	if e.out {
		dir = "an output"
	}
	s := fmt.Sprintf("%s (active_low %v, pull %s", dir, e.activeLow, e.pull)
	if e.out {
		s += fmt.Sprintf(", initial %v", e.initial)
	}
	if e.counter != nil {
		s += fmt.Sprintf(", edge_count %s debounce %v", e.counter.edge, e.counter.debounce)
	}
	return s + ")"
}

// Health is nil while every bound pin is usable; otherwise it names the
// pins that are missing or could not be configured (each error wraps
// drivers.ErrOffline). Missing pins are looked up again here, rate
// limited, so readiness recovers without a restart.
func (b *Bus) Health() error {
	if b.closed.Load() {
		return fmt.Errorf("gpio %s: bus closed: %w", b.name, drivers.ErrOffline)
	}
	var errs []error
	for _, st := range b.states() {
		if err := st.health(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// states returns the pins sorted by name, for stable messages.
func (b *Bus) states() []*pinState {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]*pinState, 0, len(b.pins))
	for _, st := range b.pins {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key < out[j].key })
	return out
}

// Close stops the edge counters. Outputs keep their level: whether a
// daemon restart should switch actuators off is the manifest's initial:,
// applied at the next start. Later reads and writes fail with
// drivers.ErrOffline. It is idempotent.
func (b *Bus) Close() error {
	if b.closed.Swap(true) {
		return nil
	}
	for _, st := range b.states() {
		st.stop()
	}
	return nil
}
