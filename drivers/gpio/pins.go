package gpio

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/physd/physd/drivers"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpioreg"
)

// lookupPin finds a pin by name, alias or BCM number. gpioreg resolves
// numbers only where a driver registered them as aliases (bcm283x does,
// gpioioctl does not), so "17" falls back to the kernel's name "GPIO17".
func lookupPin(name string) gpio.PinIO {
	if p := gpioreg.ByName(name); p != nil {
		return p
	}
	if isDigits(name) {
		return gpioreg.ByName("GPIO" + name)
	}
	return nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// realPin unwraps aliases to the pin that does the work.
func realPin(p gpio.PinIO) gpio.PinIO {
	for {
		r, ok := p.(gpio.RealPin)
		if !ok {
			return p
		}
		p = r.Real()
	}
}

// canonical is the key that identifies one physical pin however it is
// written: the real pin's name when it exists, else GPIO<n> for a number.
func canonical(name string) string {
	if p := lookupPin(name); p != nil {
		return realPin(p).Name()
	}
	if isDigits(name) {
		return "GPIO" + name
	}
	return name
}

// pinState is one physical pin, shared by every capability bound to it.
type pinState struct {
	key   string // canonical name
	asked string // the name as the first capability wrote it
	elec  electrical
	users []string // capability names, for messages
	bus   *Bus

	mu         sync.Mutex
	pin        gpio.PinIO // nil until found and configured
	err        error      // why the pin is not usable (missing, busy)
	readable   bool       // Read on an output is safe (see readback.go)
	driven     gpio.Level // physical level last driven, for outputs
	counter    *counter
	lastLookup time.Time
}

// ensure finds and configures the pin if that has not happened yet. A
// missing pin is looked up again at most once a second, so a gateway whose
// GPIO driver comes up late recovers without a restart. st.mu is held.
func (st *pinState) ensure() error {
	if st.pin != nil {
		return nil
	}
	if st.err != nil && time.Since(st.lastLookup) < st.bus.retryEvery {
		return st.err
	}
	st.lastLookup = time.Now()
	p := lookupPin(st.asked)
	if p == nil {
		st.err = fmt.Errorf("gpio pin %q (buses.%s, used by %s) not found: is /dev/gpiochip0 present and readable by this user (sudo usermod -aG gpio $USER), and is the name right (GPIO17, 17 or a registered alias)?: %w",
			st.asked, st.bus.name, strings.Join(st.users, ", "), drivers.ErrOffline)
		return st.err
	}
	if err := st.configure(p); err != nil {
		st.err = fmt.Errorf("gpio pin %s (buses.%s, used by %s) cannot be configured: %v; is another process holding the line (gpioinfo)?: %w",
			st.key, st.bus.name, strings.Join(st.users, ", "), err, drivers.ErrOffline)
		return st.err
	}
	st.pin, st.err = p, nil
	return nil
}

// configure applies the electrical settings. Outputs are driven to their
// initial level first thing, so an actuator is in a known state as soon
// as the daemon owns it.
func (st *pinState) configure(p gpio.PinIO) error {
	e := st.elec
	if e.out {
		lvl := gpio.Level(e.initial != e.activeLow)
		if err := p.Out(lvl); err != nil {
			return err
		}
		st.driven, st.readable = lvl, outputReadable(p)
		return nil
	}
	edge := gpio.NoEdge
	if e.counter != nil {
		edge = physicalEdge(e.counter.edge, e.activeLow)
	}
	if err := p.In(e.pull, edge); err != nil {
		return err
	}
	st.readable = true
	if e.counter != nil {
		st.counter = startCounter(p, e.counter.debounce, st.bus.poll)
	}
	return nil
}

// physicalEdge maps a logical edge to the wire: with active_low, the
// logical rising edge (becoming active) is a falling voltage.
func physicalEdge(e gpio.Edge, activeLow bool) gpio.Edge {
	if !activeLow {
		return e
	}
	switch e {
	case gpio.RisingEdge:
		return gpio.FallingEdge
	case gpio.FallingEdge:
		return gpio.RisingEdge
	}
	return e
}

// health is nil while the pin is usable; a missing pin is looked up again
// (rate limited by ensure), but never after Close, which would start a
// counter nobody stops.
func (st *pinState) health() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ready()
}

// ready is ensure for the read and write paths, which also fail once the
// bus is closed. st.mu is held.
func (st *pinState) ready() error {
	if st.bus.closed.Load() {
		return fmt.Errorf("gpio %s: bus closed: %w", st.bus.name, drivers.ErrOffline)
	}
	return st.ensure()
}

// level reads the logical level (active_low applied).
func (st *pinState) level() (bool, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.ready(); err != nil {
		return false, err
	}
	l := st.driven
	if !st.elec.out || st.readable {
		l = st.pin.Read()
	}
	return bool(l) != st.elec.activeLow, nil
}

// drive sets the logical level of an output.
func (st *pinState) drive(v bool) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.ready(); err != nil {
		return err // not found, not configured or closed: nothing was driven
	}
	lvl := gpio.Level(v != st.elec.activeLow)
	if err := st.pin.Out(lvl); err != nil {
		return fmt.Errorf("gpio pin %s: Out(%v): %w", st.key, lvl, err)
	}
	st.driven = lvl
	return nil
}

// count returns the counted edges since the pin was configured.
func (st *pinState) count() (int64, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if err := st.ready(); err != nil {
		return 0, err
	}
	return st.counter.n.Load(), nil
}

// stop ends the pin's counter goroutine, if any.
func (st *pinState) stop() {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.stopLocked()
}

// stopLocked is stop with st.mu held; the counter goroutine never takes it.
func (st *pinState) stopLocked() {
	if st.counter != nil {
		st.counter.halt(st.pin)
		st.counter = nil
	}
}
