package modbus

import (
	"fmt"
	"time"

	"github.com/physd/physd/drivers"
)

// health tracks one unit (or one endpoint) for the worker: it goes down
// after downAfter consecutive failures and is then retried with
// exponential backoff (base, 2·base, … capped at max). While it is down,
// admit refuses at once with an error wrapping drivers.ErrOffline, so
// callers fail fast instead of each waiting out a timeout, except when a
// retry is due: that one request goes to the wire as the probe. Any success
// brings it back up.
//
// It is pure bookkeeping over the times it is given, so it is tested with
// testing/synctest; the worker guards it with its mutex.
type health struct {
	what      string // "unit 3", "10.0.0.5:502"
	downAfter int
	base, max time.Duration

	fails   int // consecutive
	down    bool
	delay   time.Duration // current backoff
	retryAt time.Time
	since   time.Time // down since
	lastErr error
}

func newHealth(what string, downAfter int, base, max time.Duration) *health {
	return &health{what: what, downAfter: downAfter, base: base, max: max}
}

// admit reports whether a request may go to the wire now.
func (h *health) admit(now time.Time) error {
	if !h.down || !now.Before(h.retryAt) {
		return nil
	}
	return fmt.Errorf("%s is down after %d consecutive failures (last: %v); next retry in %v: %w",
		h.what, h.fails, h.lastErr, h.retryAt.Sub(now).Round(time.Millisecond), drivers.ErrOffline)
}

func (h *health) success() {
	h.fails, h.down, h.delay, h.lastErr = 0, false, 0, nil
}

func (h *health) failure(now time.Time, err error) {
	h.fails++
	h.lastErr = err
	switch {
	case h.down:
		h.delay = min(2*h.delay, h.max)
	case h.fails >= h.downAfter:
		h.down, h.since, h.delay = true, now, h.base
	default:
		return
	}
	h.retryAt = now.Add(h.delay)
}

// err is nil while up; while down it says why and since when, wrapping
// drivers.ErrOffline.
func (h *health) err() error {
	if !h.down {
		return nil
	}
	return fmt.Errorf("%s is down since %s after %d consecutive failures (last: %v): %w",
		h.what, h.since.UTC().Format(time.RFC3339), h.fails, h.lastErr, drivers.ErrOffline)
}
