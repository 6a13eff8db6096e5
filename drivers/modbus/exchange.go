package modbus

import (
	"context"
	"errors"
	"fmt"
	"time"

	gb "github.com/goburrow/modbus"
	"github.com/physd/physd/drivers"
)

// exch is one request on the wire.
type exch struct {
	unit  byte
	fc    byte
	what  string // the registers: "holding 40001 (address 0)"
	write bool
	ctxs  []context.Context // the callers waiting: their latest deadline bounds the timeout
	// take, for writes, claims the request just before it goes to the wire;
	// false: its caller gave up (and was told nothing was sent).
	take func() bool
	do   func(gb.Client) error
}

func (x *exch) name() string { return fmt.Sprintf("unit %d %s", x.unit, x.what) }

// exchange runs one request: admission (health), gap, timeout, connect,
// send, and recovery after errors. Errors that mean nothing was sent wrap
// drivers.ErrOffline; timeouts wrap drivers.ErrTimeout; exceptions are
// *ExceptionError.
func (w *worker) exchange(x exch) error {
	select {
	case <-w.stop:
		return notSent("%s: bus closed", x.name())
	default:
	}
	u := w.unit(x.unit)
	w.mu.Lock()
	now := time.Now()
	err := w.endpoint.admit(now)
	if err == nil {
		err = u.admit(now)
	}
	w.mu.Unlock()
	if err != nil {
		w.st.rejected.Add(1)
		return fmt.Errorf("%s: %w", x.name(), err)
	}
	if wait := time.Until(w.lastEnd[x.unit].Add(w.spec.MinGap)); wait > 0 && !w.sleep(wait) {
		return notSent("%s: bus closed", x.name())
	}
	timeout, ok := w.timeoutFor(x.ctxs)
	if !ok {
		w.st.rejected.Add(1)
		return notSent("%s: every caller gave up before it could be sent: %w", x.name(), drivers.ErrTimeout)
	}
	if err := w.connect(); err != nil {
		return notSent("%s: cannot reach %s: %v", x.name(), w.spec.endpoint(), err)
	}
	if x.take != nil && !x.take() {
		w.st.rejected.Add(1)
		return notSent("%s: the caller gave up before it was sent: %w", x.name(), drivers.ErrTimeout)
	}
	for attempt := 0; ; attempt++ {
		c := w.link.client(x.unit, timeout)
		w.st.requests.Add(1)
		err := x.do(c)
		w.lastEnd[x.unit] = time.Now()
		if err == nil {
			w.mu.Lock()
			u.success()
			w.mu.Unlock()
			return nil
		}
		if ex, ok := asException(err, x.unit, x.fc, x.what, x.write); ok {
			w.st.exceptions.Add(1)
			w.mu.Lock()
			if ex.unitFault() {
				u.failure(time.Now(), ex)
			} else {
				u.success() // it answered: the unit is alive
			}
			w.mu.Unlock()
			return ex
		}
		w.link.broken(err)
		if isDial(err) {
			w.mu.Lock()
			w.endpoint.failure(time.Now(), err)
			w.mu.Unlock()
			return notSent("%s: cannot reach %s: %v", x.name(), w.spec.endpoint(), err)
		}
		if attempt == 0 && w.link.reused() && isStale(err) && (!x.write || errors.Is(err, drivers.ErrOffline)) {
			// The peer dropped the connection (a restart): a read, or a
			// write that certainly did not leave, is retried once on a
			// fresh one. A write that may have landed never is: that
			// would write twice.
			if cerr := w.connect(); cerr != nil {
				return notSent("%s: cannot reach %s: %v", x.name(), w.spec.endpoint(), cerr)
			}
			continue
		}
		w.st.failures.Add(1)
		w.mu.Lock()
		u.failure(time.Now(), err)
		w.mu.Unlock()
		if isTimeout(err) {
			w.st.timeouts.Add(1)
			if !errors.Is(err, drivers.ErrTimeout) {
				err = fmt.Errorf("%w (%v)", drivers.ErrTimeout, err)
			}
			return fmt.Errorf("%s: no reply within %v: %w", x.name(), timeout, err)
		}
		return fmt.Errorf("%s: %w", x.name(), err)
	}
}

// unit returns (creating) the health record of a unit.
func (w *worker) unit(id byte) *health {
	w.mu.Lock()
	defer w.mu.Unlock()
	h := w.units[id]
	if h == nil {
		h = newHealth(fmt.Sprintf("unit %d", id), w.spec.DownAfter, w.spec.RetryBackoff, w.spec.MaxBackoff)
		w.units[id] = h
	}
	return h
}

// timeoutFor is the request timeout: timeout_ms, or less when every caller
// waiting on it will have given up sooner. false: all have given up.
func (w *worker) timeoutFor(ctxs []context.Context) (time.Duration, bool) {
	var latest time.Time
	for _, ctx := range ctxs {
		if ctx.Err() != nil {
			continue
		}
		dl, ok := ctx.Deadline()
		if !ok {
			return w.spec.Timeout, true
		}
		if dl.After(latest) {
			latest = dl
		}
	}
	if latest.IsZero() {
		return 0, false
	}
	left := time.Until(latest)
	if left <= 0 {
		return 0, false
	}
	return min(w.spec.Timeout, left), true
}

// sleep waits d unless the bus closes first.
func (w *worker) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-w.stop:
		return false
	}
}
