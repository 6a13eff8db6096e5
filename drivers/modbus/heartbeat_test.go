package modbus

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// The heartbeat loop on the fake link inside testing/synctest: every wait
// is fake time, so the period, the timeouts and the log lines are asserted
// exactly.

// logLines is a slog handler's output, safe for the bus's goroutines.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count is the number of lines containing s.
func (l *logLines) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), s)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// hbBus starts a modbus_tcp bus with extra keys on a fake link, its
// heartbeat logging into the returned lines.
func hbBus(t *testing.T, bank *modbustest.Bank, extra string) (*Bus, *logLines) {
	t.Helper()
	spec, err := parseBus(busFrom(t, TypeTCP, `{address: "fake:502", `+extra+`}`), TypeTCP)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logLines{}
	spec.log = slog.New(slog.NewTextHandler(logs, nil))
	l := newFakeLink(bank)
	l.st = &counters{}
	b, err := start("modbus_tcp plc (fake)", spec, l, l.st, make(chan struct{}))
	if err != nil {
		t.Fatal(err)
	}
	return b, logs
}

// holdingWrites lists the holding register writes the bank received since
// its count was last reset, as "addr=value".
func holdingWrites(bank *modbustest.Bank) []string {
	var out []string
	for _, r := range bank.Requests() {
		if r.Write && r.Table == modbustest.HoldingRegisters {
			out = append(out, fmt.Sprintf("%d=%d", r.Addr, r.Regs[0]))
		}
	}
	return out
}

const hbKeys = `heartbeat: {register: 40022, every_ms: 1000, value: counter, timeout_register: 40021, timeout_ms: 5000, timeout_scale_ms: 100}`

// TestHeartbeatLoop: at open the watchdog time (5000 ms / 100 ms = 50)
// goes to 40021, then heartbeat 0 to 40022; then one heartbeat every
// second exactly, the counter counting; the heartbeats are no point
// writes; one log line says it runs; after Close no write goes out and the
// goroutine is gone (synctest.Test fails on a goroutine left blocked).
func TestHeartbeatLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		b, logs := hbBus(t, bank, `timeout_ms: 200, `+hbKeys)
		synctest.Wait()
		if got := strings.Join(holdingWrites(bank), " "); got != "20=50 21=0" {
			t.Fatalf("at open: writes %q, want the watchdog time 20=50 then heartbeat 21=0", got)
		}
		for i := 1; i <= 5; i++ {
			time.Sleep(999 * time.Millisecond)
			synctest.Wait()
			if n := len(holdingWrites(bank)); n != i+1 {
				t.Fatalf("%d ms after heartbeat %d: %d writes, want none new", 999, i-1, n)
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
			w := holdingWrites(bank)
			if len(w) != i+2 || w[len(w)-1] != fmt.Sprintf("21=%d", i) {
				t.Fatalf("at %d s: writes %v, want heartbeat 21=%d last", i, w, i)
			}
		}
		s := b.Stats()
		if s.HeartbeatsSent != 6 || s.HeartbeatErrors != 0 || s.WatchdogArmed != 1 || s.Writes != 0 || !s.LastHeartbeat.Equal(time.Now()) || s.HeartbeatError != "" {
			t.Fatalf("stats %+v", s)
		}
		if bank.Holding(1, 21, 1)[0] != 5 || bank.Holding(1, 20, 1)[0] != 50 {
			t.Fatalf("registers 20, 21 = %v", bank.Holding(1, 20, 2))
		}
		if logs.count("modbus heartbeat running") != 1 || logs.count("level=WARN") != 0 {
			t.Fatalf("logs:\n%s", logs)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		n := bank.Count()
		time.Sleep(10 * time.Second)
		if bank.Count() != n {
			t.Fatalf("%d requests after Close", bank.Count()-n)
		}
	})
}

// TestHeartbeatFixedValue: value: 0x55AA writes that value every time,
// and without timeout_register nothing else is written.
func TestHeartbeatFixedValue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		b, _ := hbBus(t, bank, `timeout_ms: 50, heartbeat: {register: 40050, every_ms: 100, value: 0x55AA, timeout_ms: 300}`)
		defer b.Close()
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		if got := strings.Join(holdingWrites(bank), " "); got != "49=21930 49=21930 49=21930" {
			t.Fatalf("writes %q", got)
		}
	})
}

// TestHeartbeatFailureLoggedOnce: a device that stops answering makes
// every heartbeat fail (counted, its error in Stats) with one WARN line
// for the whole outage, not one per tick; a point read meanwhile waits at
// most one bus timeout behind a heartbeat; each tick costs one timed-out
// write at most, never the watchdog time too; when the device answers
// again, one INFO line says so and the watchdog time is written again (it
// may have restarted without it).
func TestHeartbeatFailureLoggedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		b, logs := hbBus(t, bank, `timeout_ms: 200, down_after: 1000, heartbeat: {register: 40022, every_ms: 500, timeout_register: 40021, timeout_ms: 2000, timeout_scale_ms: 100}`)
		defer b.Close()
		other := holdingPoint(t, b, 2, 5)
		synctest.Wait()
		bank.Absent(1, true)
		bank.ResetCount()
		time.Sleep(500 * time.Millisecond) // the next tick: its heartbeat is on the wire
		synctest.Wait()
		start := time.Now()
		readOK(t, other)
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Errorf("a read behind a heartbeat to a silent unit waited %v, more than the bus timeout 200ms", d)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		s := b.Stats()
		beats := 0
		for _, w := range holdingWrites(bank) {
			if strings.HasPrefix(w, "20=") {
				t.Fatalf("the watchdog time was written to a silent device: %v", holdingWrites(bank))
			}
			beats++
		}
		if beats != 21 || s.HeartbeatErrors != 21 || s.HeartbeatsSent != 1 || !strings.Contains(s.HeartbeatError, "heartbeat: ") ||
			!strings.Contains(s.HeartbeatError, "no reply within 200ms") {
			t.Fatalf("after 10.5 s of a silent device: %d heartbeats sent, stats %+v; want 21 (one per tick), all failed", beats, s)
		}
		if n := logs.count("level=WARN"); n != 1 || logs.count("modbus heartbeat failing") != 1 || logs.count("unit 1 holding 40022 (address 21)") < 1 {
			t.Fatalf("%d WARN lines for one outage, want 1:\n%s", n, logs)
		}
		bank.Absent(1, false)
		bank.ResetCount()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if got := strings.Join(holdingWrites(bank), " "); !strings.HasPrefix(got, "21=") || !strings.HasSuffix(got, " 20=20") {
			t.Fatalf("the device answers again: writes %q, want a heartbeat then the watchdog time 20=20", got)
		}
		s = b.Stats()
		if s.WatchdogArmed != 2 || s.HeartbeatError != "" || s.HeartbeatsSent != 2 {
			t.Fatalf("after recovery: stats %+v", s)
		}
		if logs.count("modbus heartbeat restored") != 1 || logs.count("failed_writes=21") != 1 {
			t.Fatalf("recovery logs:\n%s", logs)
		}
		time.Sleep(5 * time.Second)
		if logs.count("level=INFO") != 2 || logs.count("level=WARN") != 1 {
			t.Fatalf("logs after recovery, want no new line:\n%s", logs)
		}
	})
}

// TestHeartbeatRefused: a device that refuses the heartbeat register
// (exception 02: a wrong register in the manifest) answers, so it is alive:
// every heartbeat counts as an error, one WARN line names the exception,
// and the watchdog time is not written again each tick.
func TestHeartbeatRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.SetFault(func(r modbustest.Request) error {
			if r.Write && r.Addr == 21 {
				return modbustest.IllegalDataAddress
			}
			return nil
		})
		b, logs := hbBus(t, bank, hbKeys)
		defer b.Close()
		time.Sleep(5500 * time.Millisecond)
		synctest.Wait()
		s := b.Stats()
		if s.HeartbeatErrors != 6 || s.HeartbeatsSent != 0 || s.WatchdogArmed != 1 || !strings.Contains(s.HeartbeatError, "illegal data address") {
			t.Fatalf("stats %+v", s)
		}
		if logs.count("level=WARN") != 1 || logs.count("illegal data address") != 1 {
			t.Fatalf("logs:\n%s", logs)
		}
	})
}

// TestHeartbeatRearmAfterReconnect: when the connection was replaced (here
// after a point read timed out, which closes it), the heartbeat that went
// out on the new connection is followed by the watchdog time.
func TestHeartbeatRearmAfterReconnect(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		bank.Absent(9, true)
		b, _ := hbBus(t, bank, `timeout_ms: 100, `+hbKeys)
		defer b.Close()
		synctest.Wait()
		silent := holdingPoint(t, b, 9, 0)
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		if _, err := silent.Read(ctx); err == nil {
			t.Fatal("a read of a silent unit worked")
		}
		cancel()
		bank.ResetCount()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := strings.Join(holdingWrites(bank), " "); got != "21=1 20=50" {
			t.Fatalf("after a reconnect: writes %q, want heartbeat 21=1 then the watchdog time 20=50", got)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got := strings.Join(holdingWrites(bank), " "); got != "21=1 20=50 21=2" {
			t.Fatalf("the next tick: writes %q, want only heartbeat 21=2 added", got)
		}
		if s := b.Stats(); s.WatchdogArmed != 2 {
			t.Fatalf("stats %+v", s)
		}
	})
}

// TestHeartbeatSerializedWithPoints: heartbeats share the worker with
// point requests: a slow device (every request 300 ms) answers both, a
// heartbeat never runs beside another request, and the heartbeat keeps
// its period.
func TestHeartbeatSerializedWithPoints(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bank := modbustest.NewBank(100)
		var mu sync.Mutex
		inFlight, overlap := 0, 0
		bank.SetDelay(func(modbustest.Request) time.Duration {
			mu.Lock()
			inFlight++
			if inFlight > 1 {
				overlap++
			}
			mu.Unlock()
			time.Sleep(300 * time.Millisecond)
			mu.Lock()
			inFlight--
			mu.Unlock()
			return 0
		})
		b, _ := hbBus(t, bank, `timeout_ms: 1000, heartbeat: {register: 40022, every_ms: 1000, timeout_ms: 3000}`)
		defer b.Close()
		p := holdingPoint(t, b, 1, 3)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				for range 5 {
					readOK(t, p)
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second)
		synctest.Wait()
		s := b.Stats()
		if overlap != 0 || s.HeartbeatErrors != 0 || s.HeartbeatsSent < 2 || s.Reads != 20 {
			t.Fatalf("%d overlapping requests; stats %+v", overlap, s)
		}
	})
}
