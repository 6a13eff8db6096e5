package gpio

import (
	"sync/atomic"
	"time"

	"periph.io/x/conn/v3/gpio"
)

// counter counts edges on an input in its own goroutine. The kernel
// filters the edge direction (In was called with the physical edge); the
// counter applies the debounce: an edge within debounce of the last
// counted edge is contact bounce and is ignored. A lockout from the last
// counted edge (rather than from the last edge seen) keeps counting a fast
// clean pulse train correctly up to 1/debounce.
type counter struct {
	debounce time.Duration
	n        atomic.Int64 // counted edges
	bounced  atomic.Int64 // ignored edges, for tests and diagnostics
	stopping atomic.Bool
	done     chan struct{}
}

func startCounter(p gpio.PinIO, debounce, poll time.Duration) *counter {
	c := &counter{debounce: debounce, done: make(chan struct{})}
	go c.run(p, poll)
	return c
}

// run waits for edges with a timeout of poll, so that halt is noticed even
// on pins whose Halt does not interrupt WaitForEdge.
func (c *counter) run(p gpio.PinIO, poll time.Duration) {
	defer close(c.done)
	var last time.Time
	counted := false
	for !c.stopping.Load() {
		start := time.Now()
		if !p.WaitForEdge(poll) {
			// A pin that returns false at once (not configured for
			// edges, or an I/O error) would otherwise spin a CPU.
			if time.Since(start) < poll/2 && !c.stopping.Load() {
				time.Sleep(poll)
			}
			continue
		}
		now := time.Now()
		if counted && now.Sub(last) < c.debounce {
			c.bounced.Add(1)
			continue
		}
		counted, last = true, now
		c.n.Add(1)
	}
}

// halt stops the goroutine and waits for it.
func (c *counter) halt(p gpio.PinIO) {
	c.stopping.Store(true)
	_ = p.Halt() // interrupts WaitForEdge on gpioioctl lines
	<-c.done
}
