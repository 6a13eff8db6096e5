package i2c

import (
	"context"
	"sync"
)

// busLock serialises device transactions on one physical bus. It is a
// channel rather than a sync.Mutex so that waiting for it honours ctx: a
// read stuck behind a slow command-style sensor gives up at its deadline
// instead of piling up.
type busLock struct{ ch chan struct{} }

// locks holds one lock per physical bus, keyed by the i2creg name the bus
// resolves to ("/dev/i2c-1"). Two manifest entries that name the same bus
// ("1" and "/dev/i2c-1") therefore share one lock: the wire is what needs
// protecting, not the handle.
var (
	locksMu sync.Mutex
	locks   = map[string]*busLock{}
)

func lockFor(key string) *busLock {
	locksMu.Lock()
	defer locksMu.Unlock()
	l, ok := locks[key]
	if !ok {
		l = &busLock{ch: make(chan struct{}, 1)}
		locks[key] = l
	}
	return l
}

// acquire takes the lock or returns ctx's error.
func (l *busLock) acquire(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	select {
	case l.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// tryAcquire takes the lock only if it is free.
func (l *busLock) tryAcquire() bool {
	select {
	case l.ch <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *busLock) release() { <-l.ch }
