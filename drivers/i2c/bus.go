package i2c

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/i2c"
)

// Bus is an open I²C bus. It is safe for concurrent use: every device
// transaction holds the physical bus's lock.
type Bus struct {
	name        string // manifest bus name
	arg         string // bus: as written ("1")
	key         string // the i2creg name it resolved to ("/dev/i2c-1")
	downAfter   int
	lock        *busLock
	reviveEvery time.Duration // at most one reopen attempt per interval

	mu         sync.Mutex // guards the fields below, never held across Tx
	bc         i2c.BusCloser
	closed     bool
	gone       error // non-nil while the adapter has vanished
	lastRevive time.Time
}

var _ drivers.Bus = (*Bus)(nil)

// wireError marks an error returned by a Tx on the wire: the device (or the
// bus) failed, as opposed to the caller's deadline or a closed bus. Only
// wire errors count towards a point's failure streak.
type wireError struct{ err error }

func (e *wireError) Error() string { return e.err.Error() }
func (e *wireError) Unwrap() error { return e.err }

// txFunc issues one Tx on the locked bus.
type txFunc func(addr uint16, w, r []byte) error

// transact gives fn exclusive use of the bus for one device transaction
// (one or several Tx that must not interleave with other devices). Errors
// that happen before fn runs wrap drivers.ErrTimeout (ctx ended while
// waiting for the bus) or drivers.ErrOffline (bus closed or gone): nothing
// reached the device.
func (b *Bus) transact(ctx context.Context, fn func(tx txFunc) error) error {
	if err := b.lock.acquire(ctx); err != nil {
		return fmt.Errorf("i2c %s: waiting for the bus: %w (%w)", b.name, drivers.ErrTimeout, err)
	}
	defer b.lock.release()
	bc, err := b.handle()
	if err != nil {
		return err
	}
	err = fn(func(addr uint16, w, r []byte) error {
		if err := bc.Tx(addr, w, r); err != nil {
			return &wireError{err}
		}
		return nil
	})
	if we := (*wireError)(nil); errors.As(err, &we) {
		b.checkGone(we.err)
	}
	return err
}

// handle returns the open handle, reopening a vanished bus when it is back.
// The caller holds the bus lock.
func (b *Bus) handle() (i2c.BusCloser, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("i2c %s: bus closed: %w", b.name, drivers.ErrOffline)
	}
	if b.gone != nil {
		if err := b.reviveLocked(); err != nil {
			return nil, err
		}
	}
	return b.bc, nil
}

// checkGone runs after a failed Tx: a NACK from one device is that
// device's problem, but if the adapter itself has disappeared (a USB
// bridge unplugged, the i2c-dev node removed) the whole bus is down.
func (b *Bus) checkGone(cause error) {
	if b.present() && !errors.Is(cause, syscall.ENODEV) {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gone = fmt.Errorf("i2c bus %q (%s, buses.%s) is gone (last error: %v): check the adapter, dmesg and that i2c-dev is loaded: %w",
		b.arg, b.key, b.name, cause, drivers.ErrOffline)
	b.lastRevive = time.Now() // the first reopen attempt waits reviveEvery
}

// present reports whether the bus is still registered under the same
// name and, for /dev/i2c-N buses, whether the device node still exists.
func (b *Bus) present() bool {
	r := findRef(b.arg)
	return r != nil && r.Name == b.key && devExists(r.Name)
}

// reviveLocked tries, at most once per reviveEvery, to reopen a vanished
// bus. b.mu and the bus lock are held (no Tx can be using the old handle).
func (b *Bus) reviveLocked() error {
	if time.Since(b.lastRevive) < b.reviveEvery {
		return b.gone
	}
	b.lastRevive = time.Now()
	r := findRef(b.arg)
	if r == nil || r.Name != b.key || !devExists(r.Name) {
		return b.gone
	}
	nbc, err := r.Open()
	if err != nil {
		return b.gone
	}
	_ = b.bc.Close() // the old handle points at a device that went away
	b.bc, b.gone = nbc, nil
	return nil
}

// Health is nil while the bus is usable. A vanished bus is retried here
// too (without waiting behind a transaction), so /readyz recovers when the
// adapter returns even if nothing reads.
func (b *Bus) Health() error {
	if b.lock.tryAcquire() {
		defer b.lock.release()
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.gone != nil && !b.closed {
			_ = b.reviveLocked()
		}
	} else {
		b.mu.Lock()
		defer b.mu.Unlock()
	}
	if b.closed {
		return fmt.Errorf("i2c %s: bus closed: %w", b.name, drivers.ErrOffline)
	}
	return b.gone
}

// Close waits for the transaction in flight, then closes the handle.
// Later reads and writes fail with drivers.ErrOffline. It is idempotent.
func (b *Bus) Close() error {
	_ = b.lock.acquire(context.Background())
	defer b.lock.release()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	return b.bc.Close()
}

// Point opens a capability's binding on this bus. Errors are
// manifest.Errors naming the binding key at fault.
func (b *Bus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c == nil {
		return nil, errors.New("i2c: nil capability")
	}
	s, err := parseBinding(c)
	if err != nil {
		return nil, err
	}
	return &point{bus: b, spec: s, what: fmt.Sprintf("i2c %s %s", b.name, s.label()), health: streak{limit: b.downAfter}}, nil
}
