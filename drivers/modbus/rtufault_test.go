package modbus

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// The RTU hazards of issue 11, each against the pty slave with fault
// injection. Timeouts are tens of milliseconds, so the scenarios of the
// issue (timeout 500 ms, replies 1500 ms or 700 ms late) run scaled.

// "Slave replies 1500 ms late, bus timeout_ms: 500, default silence": the
// late [215] for hr 0 was returned as hr 1.
func TestRTULateReplyAt3xTimeoutDefaultSilence(t *testing.T) {
	for _, diag := range []modbustest.Diagnostics{modbustest.DiagEcho, modbustest.DiagException, modbustest.DiagSilent} {
		t.Run(fmt.Sprint("diag", diag), func(t *testing.T) {
			// Every reply 3× the timeout late: nothing can succeed, and
			// nothing may be taken for another request's reply.
			r := newRTURig(t, "timeout_ms: 50, down_after: 1000", 1) // silence_ms left at its default
			r.slave.SetDiagnostics(diag)
			r.bank.SetHolding(1, 0, 215, 2)
			hr0, hr1 := holdingPoint(t, r.bus, 1, 0), holdingPoint(t, r.bus, 1, 1)
			r.slave.SetFault(func(int, modbustest.Request) modbustest.Fault { return modbustest.Fault{Delay: 150 * time.Millisecond} })
			for i := range 6 {
				p := []drivers.Point{hr0, hr1}[i%2]
				if rd, err := p.Read(ctxFor(t, time.Second)); err == nil {
					t.Fatalf("read %d returned %v from a slave that always answers after the timeout", i, rd.Value)
				}
			}
			// The sequence: hr 0's reply late, then hr 1 is 2.
			r = newRTURig(t, "timeout_ms: 50, down_after: 1000", 1)
			r.slave.SetDiagnostics(diag)
			r.bank.SetHolding(1, 0, 215, 2)
			hr0, hr1 = holdingPoint(t, r.bus, 1, 0), holdingPoint(t, r.bus, 1, 1)
			r.slave.SetFault(lateOnce(150 * time.Millisecond))
			if _, err := hr0.Read(ctxFor(t, time.Second)); !errors.Is(err, drivers.ErrTimeout) {
				t.Fatalf("hr 0: %v, want a timeout", err)
			}
			if v := readOK(t, hr1); v != int64(2) {
				t.Fatalf("hr 1 = %v, want 2 (215 is hr 0's late reply)", v)
			}
			if v := readOK(t, hr0); v != int64(215) {
				t.Fatalf("hr 0 = %v, want 215", v)
			}
		})
	}
}

// lateOnce delays the first reply only.
func lateOnce(d time.Duration) func(int, modbustest.Request) modbustest.Fault {
	var once sync.Once
	return func(_ int, q modbustest.Request) modbustest.Fault {
		var f modbustest.Fault
		once.Do(func() { f.Delay = d })
		return f
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// "Every second reply 700 ms late, parallel reads": callers' deadlines
// were shorter than the timeout and cut each request's wait, so late
// replies answered later requests (hr 6–7 returned hr 22–23's registers).
func TestRTUEverySecondReplyLateParallelShortDeadlines(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 50", 1)
	fillBank(r.bank, 1)
	r.slave.SetFault(func(n int, q modbustest.Request) modbustest.Fault {
		if n%2 == 0 && q.Function != 8 {
			return modbustest.Fault{Delay: 70 * time.Millisecond} // 1.4× the timeout
		}
		return modbustest.Fault{}
	})
	// Callers' deadlines from 10 to 150 ms: many shorter than the timeout.
	res := hammer(t, r, []byte{1}, 6, 100, 10*time.Millisecond, 150*time.Millisecond)
	res.check(t)
}

// The core of that scenario, deterministic: a caller whose deadline is
// shorter than the timeout gives up, but its request keeps the line for
// the full timeout, so its reply 1.4× the timeout late cannot answer the
// next caller's read of another register of the same shape.
func TestRTUCallerDeadlineDoesNotShortenTheWait(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 50", 1)
	fillBank(r.bank, 1)
	r.slave.SetFault(lateOnce(70 * time.Millisecond))
	a, b := holdingPoint(t, r.bus, 1, 6), holdingPoint(t, r.bus, 1, 22)
	if _, err := a.Read(ctxFor(t, 10*time.Millisecond)); !errors.Is(err, drivers.ErrTimeout) {
		t.Fatalf("A: %v, want the caller's deadline", err)
	}
	if v := readOK(t, b); v != int64(regValue(1, 22)) {
		t.Fatalf("B = %v, want %d (%d is A's late reply)", v, regValue(1, 22), regValue(1, 6))
	}
}

// TestRTUNoMisattributionUnderFaults is the soak of issue 11's "must
// show": parallel readers on two units with merged reads of different
// shapes, against a slave that answers late at 1.2×, 2× and 3× the
// timeout, every Nth reply late, drops replies and puts stray bytes on the
// line. Every read is the right value or an error; the counts are printed.
func TestRTUNoMisattributionUnderFaults(t *testing.T) {
	reads := 10_000
	if testing.Short() {
		reads = 1_000
	}
	const T = 15 * time.Millisecond
	r := newRTURig(t, fmt.Sprintf("timeout_ms: %d, down_after: 1000", T.Milliseconds()), 1, 2)
	fillBank(r.bank, 1)
	fillBank(r.bank, 2)
	var strays atomic.Int64
	r.slave.SetFault(func(n int, q modbustest.Request) modbustest.Fault {
		var f modbustest.Fault
		switch {
		case n%193 == 0:
			f.Delay = 3 * T
		case n%127 == 0:
			f.Delay = 2 * T
		case n%83 == 0:
			f.Delay = T * 6 / 5
		case n%107 == 0:
			f.Drop = true
		case n%101 == 0:
			// A well-formed reply of another shape, then the real one.
			strays.Add(1)
			f.Stray = frameOf(q.Unit, 3, 0x12, 0x34, 0x56, 0x78)
		case n%89 == 0:
			strays.Add(1)
			f.Stray = []byte{0xFF, 0x00, 0x55}
		case n%37 == 0:
			f.Delay = T / 2 // slow but in time
		}
		return f
	})
	res := hammer(t, r, []byte{1, 2}, 16, reads/16, T/2, 10*T)
	res.check(t)
	s := r.bus.Stats()
	t.Logf("%d reads: %d correct, %d errors, 0 wrong; %d requests on the wire, %d probes, %d quarantines, %d timeouts, %d stray events (%d bytes discarded); slave: %d replies, %d dropped, %d stray injections",
		res.total(), res.ok.Load(), res.errs.Load(), s.Requests, s.Probes, s.Flushes, s.Timeouts, s.Strays, s.Discarded, r.slave.Replies(), r.slave.Dropped(), strays.Load())
	// Liveness, not speed: under CPU contention (a loaded CI machine) the
	// callers' deadlines (tens of milliseconds) end most reads; what must
	// never happen is a wrong value (res.check). A line that stopped
	// recovering answers none at all.
	if res.ok.Load() == 0 {
		t.Errorf("none of %d reads succeeded: the line does not recover", res.total())
	}
}

// fillBank gives every holding register of unit u its own value.
func fillBank(b *modbustest.Bank, u byte) {
	for a := range 100 {
		b.SetHolding(u, uint16(a), regValue(u, a))
	}
}

func regValue(u byte, a int) uint16 { return uint16(int(u)*1000 + a) }

// frameOf builds an RTU frame with its CRC.
func frameOf(b ...byte) []byte {
	c := modbustest.CRC(b)
	return append(b, byte(c), byte(c>>8))
}

type hammerResult struct {
	ok, errs, wrong atomic.Int64
	mu              sync.Mutex
	wrongs          []string
}

func (h *hammerResult) total() int64 { return h.ok.Load() + h.errs.Load() + h.wrong.Load() }

func (h *hammerResult) check(t *testing.T) {
	t.Helper()
	if n := h.wrong.Load(); n > 0 {
		t.Fatalf("%d of %d reads returned another request's value: %v", n, h.total(), h.wrongs)
	}
	t.Logf("%d reads: %d correct, %d errors, 0 wrong", h.total(), h.ok.Load(), h.errs.Load())
}

// hammer runs g readers doing n reads each over uint16 and uint32 points
// of the units, each with a deadline between minWait and maxWait, and
// tallies the results against the bank's values.
func hammer(t *testing.T, r *rtuRig, units []byte, g, n int, minWait, maxWait time.Duration) *hammerResult {
	type pt struct {
		p    drivers.Point
		want int64
	}
	var pts []pt
	for _, u := range units {
		for a := 0; a < 60; a += 3 {
			pts = append(pts, pt{holdingPoint(t, r.bus, int(u), a), int64(regValue(u, a))})
			p32 := pointOn(t, r.bus, fmt.Sprintf(`{name: w, data_type: int, binding: {type: modbus, unit: %d, table: holding, address: %d, data_type: uint32}}`, u, a+1))
			pts = append(pts, pt{p32, int64(regValue(u, a+1))<<16 | int64(regValue(u, a+2))})
		}
	}
	res := &hammerResult{}
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(i), 11))
			for range n {
				x := pts[rng.IntN(len(pts))]
				ctx, cancel := context.WithTimeout(context.Background(), minWait+time.Duration(rng.Int64N(int64(maxWait-minWait))))
				rd, err := x.p.Read(ctx)
				cancel()
				switch {
				case err != nil:
					res.errs.Add(1)
				case rd.Value != x.want:
					res.wrong.Add(1)
					res.mu.Lock()
					res.wrongs = append(res.wrongs, fmt.Sprintf("%v for %v", rd.Value, x.want))
					res.mu.Unlock()
				default:
					res.ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return res
}
