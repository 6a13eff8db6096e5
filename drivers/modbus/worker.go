package modbus

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
)

// worker owns one endpoint (a TCP connection or a serial line): it is the
// only goroutine that talks to it. Points hand it requests through a
// bounded queue; a full queue is an immediate error, never a wait.
//
// Each turn it takes one request, drains whatever else is queued, and runs
// the batch in arrival order: writes one by one, and each run of reads
// between two writes merged per unit and table (plan). Before every request
// it enforces the unit's health (fail fast while down) and minimum gap;
// after every error that is not a Modbus exception it lets the link recover
// (TCP reconnect, RTU flush) before anything else is sent.
type worker struct {
	name  string // "modbus_tcp plc1 (10.0.0.5:502)"
	spec  *busSpec
	link  link
	queue chan *request
	stop  chan struct{} // closed by Close
	done  chan struct{} // closed when run returns
	st    *counters

	mu       sync.Mutex // guards units and endpoint (Health reads them)
	units    map[byte]*health
	endpoint *health

	lastEnd map[byte]time.Time // worker only: when each unit's last request ended
	batch   []*request         // worker only: reused
}

// counters back Stats.
type counters struct {
	requests, reads, writes, coalesced atomic.Int64
	failures, exceptions, timeouts     atomic.Int64
	rejected, reconnects               atomic.Int64
	flushes, strays, discarded, probes atomic.Int64
	heartbeatCounters
}

func newWorker(name string, spec *busSpec, l link, st *counters, stop chan struct{}) *worker {
	return &worker{
		name: name, spec: spec, link: l, st: st,
		queue:    make(chan *request, spec.QueueSize),
		stop:     stop,
		done:     make(chan struct{}),
		units:    map[byte]*health{},
		endpoint: newHealth(spec.endpoint(), 1, spec.RetryBackoff, spec.MaxBackoff),
		lastEnd:  map[byte]time.Time{},
	}
}

// call queues r and waits for its result, ctx's end, or the bus's close.
func (w *worker) call(ctx context.Context, r *request) (result, error) {
	if err := ctx.Err(); err != nil {
		return result{}, notSent("%s: %s: %w (%v)", w.name, r.what(), drivers.ErrTimeout, err)
	}
	r.ctx, r.done = ctx, make(chan result, 1)
	if err := w.enqueue(r); err != nil {
		return result{}, err
	}
	return w.await(ctx, r)
}

// enqueue puts r in the queue without waiting: a batch of reads (members)
// takes one place, so the poll of a device's hundreds of points never
// fills the queue a do_ needs. The error says nothing was queued.
func (w *worker) enqueue(r *request) error {
	select {
	case <-w.stop:
		return notSent("%s: bus closed", w.name)
	default:
	}
	select {
	case w.queue <- r:
		return nil
	default:
		w.st.rejected.Add(1)
		return notSent("%s: %s: queue full (%d requests waiting; raise queue_size or poll less often)", w.name, r.what(), cap(w.queue))
	}
}

// await waits for the result of r, queued by enqueue, ctx's end, or the
// bus's close.
func (w *worker) await(ctx context.Context, r *request) (result, error) {
	select {
	case res := <-r.done:
		return res, res.err
	case <-ctx.Done():
		if r.op != opRead && r.abandon() {
			// The worker had not taken it: it will never be sent.
			return result{}, notSent("%s: %s: %w before it was sent (%v)", w.name, r.what(), drivers.ErrTimeout, ctx.Err())
		}
		// The request may be on the wire: the outcome of a write is unknown.
		return result{}, fmt.Errorf("%s: %s: %w (%v)", w.name, r.what(), drivers.ErrTimeout, ctx.Err())
	case <-w.done:
		return result{}, notSent("%s: bus closed", w.name)
	}
}

// connect opens the link and records the endpoint's health; Open calls it
// once before the worker starts so Health is right from the beginning.
func (w *worker) connect() error {
	err := w.link.open()
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.endpoint.failure(time.Now(), err)
		return err
	}
	w.endpoint.success()
	return nil
}

func (w *worker) run() {
	defer close(w.done)
	defer w.link.close()
	probe := time.NewTimer(time.Hour)
	defer probe.Stop()
	for {
		// While the endpoint is unreachable, retry it on its backoff even
		// when nobody asks, so Health recovers by itself.
		var probeC <-chan time.Time
		if d, down := w.endpointRetryIn(); down {
			probe.Reset(d)
			probeC = probe.C
		}
		select {
		case <-w.stop: // first, so a closing bus takes no new work
			w.rejectQueued()
			return
		default:
		}
		select {
		case <-w.stop:
			w.rejectQueued()
			return
		case <-probeC:
			_ = w.connect()
		case r := <-w.queue:
			w.batch = r.appendTo(w.batch[:0])
		drain:
			for taken := 1; taken < cap(w.queue); taken++ {
				select {
				case r := <-w.queue:
					w.batch = r.appendTo(w.batch)
				default:
					break drain
				}
			}
			w.process(w.batch)
			clear(w.batch)
		}
	}
}

func (w *worker) endpointRetryIn() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.endpoint.down {
		return 0, false
	}
	return max(time.Until(w.endpoint.retryAt), 0), true
}

func (w *worker) rejectQueued() {
	for {
		select {
		case r := <-w.queue:
			for _, m := range r.appendTo(nil) {
				m.reply(result{err: notSent("%s: bus closed", w.name)})
			}
		default:
			return
		}
	}
}

// process runs a batch in arrival order; reads between writes are merged.
func (w *worker) process(batch []*request) {
	for i := 0; i < len(batch); {
		if batch[i].op != opRead {
			w.write(batch[i])
			w.link.settle()
			i++
			continue
		}
		j := i + 1
		for j < len(batch) && batch[j].op == opRead {
			j++
		}
		w.reads(batch[i:j])
		i = j
	}
}

// unitHealth is a point's view: the endpoint's error, else its unit's.
func (w *worker) unitHealth(id byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.endpoint.err(); err != nil {
		return fmt.Errorf("%s: %w", w.name, err)
	}
	if h := w.units[id]; h != nil {
		if err := h.err(); err != nil {
			return fmt.Errorf("%s: %w", w.name, err)
		}
	}
	return nil
}

func (w *worker) endpointHealth() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.endpoint.err(); err != nil {
		return fmt.Errorf("%s: cannot reach the endpoint: %w", w.name, err)
	}
	return nil
}
