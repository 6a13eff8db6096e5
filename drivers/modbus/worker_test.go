package modbus

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// These tests drive the worker on a fake link inside testing/synctest:
// every wait below is fake time, so the timings are asserted exactly.

func holdingPoint(t testing.TB, b *Bus, unit, addr int) drivers.Point {
	t.Helper()
	return pointOn(t, b, `{name: r, data_type: int, binding: {type: modbus, unit: `+strconv.Itoa(unit)+`, table: holding, address: `+strconv.Itoa(addr)+`, data_type: uint16}}`)
}

func TestHealthBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHealth("unit 1", 3, time.Second, 5*time.Second)
		fail := func() { h.failure(time.Now(), errors.New("timeout")) }
		fail()
		fail()
		if h.err() != nil || h.admit(time.Now()) != nil {
			t.Fatal("down before down_after failures")
		}
		fail()
		err := h.admit(time.Now())
		if !errors.Is(err, drivers.ErrOffline) || !errors.Is(h.err(), drivers.ErrOffline) {
			t.Fatalf("after 3 failures: admit = %v, err = %v", err, h.err())
		}
		// Backoff 1 s, then 2 s, 4 s, capped at 5 s.
		for _, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second, 5 * time.Second} {
			start := time.Now()
			time.Sleep(want - time.Millisecond)
			if h.admit(time.Now()) == nil {
				t.Fatalf("admitted %v into a %v backoff", time.Since(start), want)
			}
			time.Sleep(time.Millisecond)
			if err := h.admit(time.Now()); err != nil {
				t.Fatalf("not admitted after %v: %v", want, err)
			}
			fail() // the probe fails
		}
		h.success()
		if h.err() != nil || h.admit(time.Now()) != nil || h.fails != 0 {
			t.Fatal("not up after a success")
		}
	})
}

func TestQueueFullFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetDelay(func(modbustest.Request) time.Duration { return 100 * time.Millisecond })
		b, _ := fakeBus(t, bank, "queue_size: 2, timeout_ms: 1000")
		defer b.Close()
		p := holdingPoint(t, b, 1, 0)
		var wg sync.WaitGroup
		for range 3 { // one on the wire, two queued
			wg.Go(func() { readOK(t, p) })
			synctest.Wait()
		}
		if d := b.Stats().QueueDepth; d != 2 {
			t.Fatalf("queue depth %d, want 2", d)
		}
		start := time.Now()
		err := readErr(t, p, time.Second)
		if time.Since(start) != 0 {
			t.Errorf("a full queue made the caller wait %v", time.Since(start))
		}
		if !errors.Is(err, drivers.ErrOffline) {
			t.Errorf("err = %v, want ErrOffline (nothing sent)", err)
		}
		mustContain(t, err, "queue full")
		wg.Wait()
	})
}

func TestCoalesceAdjacentReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(1000)
		for i := range 20 {
			bank.SetHolding(1, uint16(100+i), uint16(1000+i))
		}
		bank.SetDelay(func(r modbustest.Request) time.Duration {
			if r.Unit == 9 {
				return 50 * time.Millisecond // the blocker: keeps the worker busy while the reads queue
			}
			return 0
		})
		b, _ := fakeBus(t, bank, "")
		defer b.Close()
		blocker := holdingPoint(t, b, 9, 0)
		var ps []drivers.Point
		for i := range 20 {
			ps = append(ps, holdingPoint(t, b, 1, 100+i))
		}
		var wg sync.WaitGroup
		wg.Go(func() { readOK(t, blocker) })
		synctest.Wait()
		got := make([]any, 20)
		for i, p := range ps {
			wg.Go(func() { got[i] = readOK(t, p) })
		}
		synctest.Wait()
		wg.Wait()
		for i, v := range got {
			if v != int64(1000+i) {
				t.Errorf("point %d = %v, want %d", i, v, 1000+i)
			}
		}
		reqs := bank.Requests()
		if len(reqs) != 2 || reqs[1].Qty != 20 || reqs[1].Addr != 100 {
			t.Fatalf("requests = %+v, want the blocker and one read of 20 registers at 100", reqs)
		}
		if s := b.Stats(); s.Requests != 2 || s.Coalesced != 19 {
			t.Errorf("stats = %+v", s)
		}
	})
}

// A write cuts a batch: reads queued before it are served before it, reads
// queued after it see its value; nothing is served from a cache.
func TestWriteIsABarrier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetHolding(1, 5, 7)
		bank.SetDelay(func(r modbustest.Request) time.Duration {
			if r.Unit == 9 {
				return 50 * time.Millisecond
			}
			return 0
		})
		b, _ := fakeBus(t, bank, "")
		defer b.Close()
		blocker := holdingPoint(t, b, 9, 0)
		rd := holdingPoint(t, b, 1, 5)
		wr := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 5, data_type: uint16}}`)
		var wg sync.WaitGroup
		var before, after any
		wg.Go(func() { readOK(t, blocker) })
		synctest.Wait()
		wg.Go(func() { before = readOK(t, rd) })
		synctest.Wait()
		wg.Go(func() {
			if err := writeCtx(wr, int64(42)); err != nil {
				t.Error(err)
			}
		})
		synctest.Wait()
		wg.Go(func() { after = readOK(t, rd) })
		synctest.Wait()
		wg.Wait()
		if before != int64(7) || after != int64(42) {
			t.Fatalf("before = %v, after = %v; want 7 then 42", before, after)
		}
		if n := bank.Count(); n != 4 {
			t.Fatalf("%d requests, want 4 (blocker, read, write, read)", n)
		}
	})
}

func TestUnitDownFailsFastAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetHolding(1, 0, 11)
		bank.SetHolding(2, 0, 22)
		bank.Absent(1, true)
		b, _ := fakeBus(t, bank, "timeout_ms: 100, down_after: 3, retry_backoff_ms: 1000, max_backoff_ms: 4000")
		defer b.Close()
		p1, p2 := holdingPoint(t, b, 1, 0), holdingPoint(t, b, 2, 0)
		h1 := p1.(drivers.PointHealth)
		for i := range 3 {
			start := time.Now()
			err := readErr(t, p1, time.Second)
			if !errors.Is(err, drivers.ErrTimeout) || time.Since(start) != 100*time.Millisecond {
				t.Fatalf("read %d: %v after %v, want a timeout after 100ms", i, err, time.Since(start))
			}
		}
		if err := h1.Health(); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("Health = %v, want down", err)
		}
		if err := p2.(drivers.PointHealth).Health(); err != nil {
			t.Fatalf("unit 2 Health = %v; one unit's failures must not mark another down", err)
		}
		if v := readOK(t, p2); v != int64(22) {
			t.Fatalf("unit 2 = %v", v)
		}
		// Down: fail fast, nothing sent.
		n := bank.Count()
		start := time.Now()
		err := readErr(t, p1, time.Second)
		if !errors.Is(err, drivers.ErrOffline) || time.Since(start) != 0 || bank.Count() != n {
			t.Fatalf("down read: %v after %v, %d requests sent; want ErrOffline at once, none sent", err, time.Since(start), bank.Count()-n)
		}
		mustContain(t, err, "unit 1 is down")
		// At the retry time one read goes out as the probe; it fails, and the
		// backoff doubles.
		time.Sleep(time.Second)
		readErr(t, p1, time.Second)
		if bank.Count() != n+1 {
			t.Fatalf("probe: %d requests, want 1", bank.Count()-n)
		}
		time.Sleep(time.Second)
		if err := readErr(t, p1, time.Second); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("1 s into a 2 s backoff: %v", err)
		}
		bank.Absent(1, false)
		time.Sleep(time.Second)
		if v := readOK(t, p1); v != int64(11) {
			t.Fatalf("after recovery = %v", v)
		}
		if err := h1.Health(); err != nil {
			t.Fatalf("Health after recovery = %v", err)
		}
	})
}

func TestMinGapPerUnit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		var mu sync.Mutex
		at := map[byte][]time.Time{}
		bank.SetDelay(func(r modbustest.Request) time.Duration {
			mu.Lock()
			defer mu.Unlock()
			at[r.Unit] = append(at[r.Unit], time.Now())
			return 10 * time.Millisecond
		})
		b, _ := fakeBus(t, bank, "min_gap_ms: 50, coalesce: false")
		defer b.Close()
		u1a, u1b, u2 := holdingPoint(t, b, 1, 0), holdingPoint(t, b, 1, 50), holdingPoint(t, b, 2, 0)
		start := time.Now()
		readOK(t, u1a) // ends at +10ms
		readOK(t, u2)  // unit 2 has no gap to wait: starts at +10ms
		readOK(t, u1b) // unit 1 waits until +10+50
		mu.Lock()
		defer mu.Unlock()
		if got := at[2][0].Sub(start); got != 10*time.Millisecond {
			t.Errorf("unit 2 started at +%v, want +10ms", got)
		}
		if got := at[1][1].Sub(start); got != 60*time.Millisecond {
			t.Errorf("unit 1's second request started at +%v, want +60ms (50ms after the first ended)", got)
		}
	})
}

func TestExpiredInQueueIsNotSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetDelay(func(r modbustest.Request) time.Duration { return 200 * time.Millisecond })
		b, _ := fakeBus(t, bank, "")
		defer b.Close()
		p := holdingPoint(t, b, 1, 0)
		w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 1, data_type: uint16}}`)
		var wg sync.WaitGroup
		wg.Go(func() { readOK(t, p) })
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := w.Write(ctx, int64(3))
		if !errors.Is(err, drivers.ErrTimeout) || !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("err = %v, want a timeout that says nothing was sent (ErrOffline)", err)
		}
		wg.Wait()
		synctest.Wait()
		if n := bank.Count(); n != 1 {
			t.Fatalf("%d requests: the expired write was sent", n)
		}
		if got := bank.Holding(1, 1, 1)[0]; got != 0 {
			t.Fatalf("register = %d: the expired write reached the device", got)
		}
	})
}

func TestEndpointDownAtStartRecoversByItself(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetHolding(1, 0, 5)
		spec, err := parseBus(busFrom(t, TypeTCP, `{address: "fake:502", retry_backoff_ms: 100}`), TypeTCP)
		if err != nil {
			t.Fatal(err)
		}
		l := newFakeLink(bank)
		l.setRefuse(true)
		b, err := start("modbus_tcp plc (fake)", spec, l, &counters{}, make(chan struct{}))
		if err != nil {
			t.Fatalf("a TCP peer that is down must not fail Open: %v", err)
		}
		defer b.Close()
		if err := b.Health(); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("Health = %v, want the endpoint down", err)
		}
		mustContain(t, b.Health(), "fake:502", "connection refused")
		p := holdingPoint(t, b, 1, 0)
		if err := readErr(t, p, time.Second); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("read while down = %v", err)
		}
		l.setRefuse(false)
		time.Sleep(100 * time.Millisecond) // first backoff
		synctest.Wait()
		if err := b.Health(); err != nil {
			t.Fatalf("Health after the peer came back = %v (the worker should have reconnected by itself)", err)
		}
		if v := readOK(t, p); v != int64(5) {
			t.Fatalf("read = %v", v)
		}
	})
}

func TestCloseFailsQueuedRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetDelay(func(r modbustest.Request) time.Duration { return 100 * time.Millisecond })
		b, _ := fakeBus(t, bank, "coalesce: false")
		p := holdingPoint(t, b, 1, 0)
		errs := make(chan error, 3)
		for i := range 3 {
			q := holdingPoint(t, b, 1, 10*i)
			go func() {
				_, err := q.Read(context.Background())
				errs <- err
			}()
			synctest.Wait()
		}
		_ = b.Close()
		var closed int
		for range 3 {
			if err := <-errs; err != nil {
				if !errors.Is(err, drivers.ErrOffline) {
					t.Errorf("err = %v", err)
				}
				closed++
			}
		}
		if closed != 2 {
			t.Errorf("%d requests failed on close, want the 2 queued ones", closed)
		}
		if err := readErr(t, p, time.Second); !errors.Is(err, drivers.ErrOffline) {
			t.Errorf("read after close = %v", err)
		}
		if !errors.Is(b.Health(), drivers.ErrOffline) {
			t.Errorf("Health after close = %v", b.Health())
		}
	})
}

// TestReadPointsTakesOneQueuePlace: a batch of 300 reads (the node's poll
// of a device) takes one place in a queue of 2, so a write queued behind
// it while the worker is busy still finds room; the batch is served in the
// fewest requests its addresses allow (three spans of at most 125
// registers here, and one of another unit); each point gets its own value,
// once; a read the device answers busy is resent on its own; a point of
// another bus is read through its own Read.
func TestReadPointsTakesOneQueuePlace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(1000)
		for i := range 300 {
			bank.SetHolding(1, uint16(i), uint16(1000+i))
		}
		bank.SetHolding(2, 0, 7)
		busy := 1
		bank.SetFault(func(r modbustest.Request) error {
			if r.Unit == 2 && busy > 0 {
				busy--
				return modbustest.DeviceBusy
			}
			return nil
		})
		bank.SetDelay(func(r modbustest.Request) time.Duration {
			if r.Unit == 9 {
				return 50 * time.Millisecond // the blocker: keeps the worker busy while the batch and the write queue
			}
			return 0
		})
		b, _ := fakeBus(t, bank, "queue_size: 2, timeout_ms: 1000, busy_backoff_ms: 10")
		defer b.Close()
		other, _ := fakeBus(t, bank, "")
		defer other.Close()
		var points []drivers.Point
		for i := range 300 {
			points = append(points, holdingPoint(t, b, 1, i))
		}
		points = append(points, holdingPoint(t, b, 2, 0), holdingPoint(t, other, 1, 5))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ctxs := make([]context.Context, len(points))
		for i := range ctxs {
			ctxs[i] = ctx
		}
		got := make([]any, len(points))
		seen := make([]int, len(points))
		var wg sync.WaitGroup
		wg.Go(func() { readOK(t, holdingPoint(t, b, 9, 0)) })
		synctest.Wait()
		wg.Go(func() {
			b.ReadPoints(ctxs, points, func(i int, r drivers.Reading, err error) {
				seen[i]++
				if err != nil {
					t.Errorf("point %d: %v", i, err)
				}
				got[i] = r.Value
			})
		})
		synctest.Wait()
		w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 500, data_type: uint16}}`)
		if err := w.Write(ctx, int64(42)); err != nil {
			t.Errorf("a write queued behind the batch: %v", err)
		}
		wg.Wait()
		for i := range 300 {
			if got[i] != int64(1000+i) || seen[i] != 1 {
				t.Fatalf("point %d = %v (reported %d times), want %d once", i, got[i], seen[i], 1000+i)
			}
		}
		if got[300] != int64(7) || got[301] != int64(1005) {
			t.Errorf("the busy unit's point = %v, the other bus's = %v; want 7 and 1005", got[300], got[301])
		}
		// The blocker, 3 spans of unit 1, unit 2 busy and its resend, the write.
		if s := b.Stats(); s.Requests != 7 || s.Coalesced != 297 || s.Rejected != 0 {
			t.Errorf("stats = %+v, want 7 requests, 297 coalesced reads, none rejected", s)
		}
		// The next round (each point's answered request is reused) reads
		// the same values again, in as few requests.
		for i := range 300 {
			bank.SetHolding(1, uint16(i), uint16(2000+i))
		}
		b.ReadPoints(ctxs, points, func(i int, r drivers.Reading, err error) {
			if want := int64(2000 + i); i < 300 && (err != nil || r.Value != want) {
				t.Errorf("second round, point %d = %v, %v; want %d", i, r.Value, err, want)
			}
		})
		if s := b.Stats(); s.Requests != 11 {
			t.Errorf("second round: %d requests in all, want 11", s.Requests)
		}
	})
}
