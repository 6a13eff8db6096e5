package i2c

import (
	"fmt"
	"sync"

	"github.com/physd/physd/drivers"
)

// streak marks a device down after limit failed transactions in a row (a
// NACK, a CRC error) and up again on the next success. While it is down the
// node serves the last good value as degraded instead of stale, which tells
// an agent the sensor itself is the problem.
type streak struct {
	limit int

	mu   sync.Mutex
	n    int
	last error
}

func (s *streak) ok() {
	s.mu.Lock()
	s.n, s.last = 0, nil
	s.mu.Unlock()
}

func (s *streak) fail(err error) {
	s.mu.Lock()
	s.n++
	s.last = err
	s.mu.Unlock()
}

// err is nil while the device is up.
func (s *streak) err(what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limit <= 0 || s.n < s.limit {
		return nil
	}
	return fmt.Errorf("%s: %d transactions in a row failed (last: %v): check wiring, power and the address (i2cdetect): %w",
		what, s.n, s.last, drivers.ErrOffline)
}
