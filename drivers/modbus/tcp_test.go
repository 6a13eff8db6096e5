package modbus

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// Tests against github.com/simonvetter/modbus's TCP server, in process.

// wirePerm spells, for each byte order, where the value's big-endian bytes
// (A = most significant) go on the wire. Written out by hand from the
// vocabulary, independently of the codec.
var wirePerm = map[string]map[int]string{
	"ABCD": {2: "AB", 4: "ABCD", 8: "ABCDEFGH"},
	"CDAB": {2: "AB", 4: "CDAB", 8: "GHEFCDAB"},
	"BADC": {2: "BA", 4: "BADC", 8: "BADCFEHG"},
	"DCBA": {2: "BA", 4: "DCBA", 8: "HGFEDCBA"},
}

// wireRegs lays out big-endian value bytes in the given order as registers.
func wireRegs(be []byte, order string) []uint16 {
	perm := wirePerm[order][len(be)]
	wire := make([]byte, len(be))
	for i, c := range perm {
		wire[i] = be[c-'A']
	}
	regs := make([]uint16, len(wire)/2)
	for i := range regs {
		regs[i] = binary.BigEndian.Uint16(wire[2*i:])
	}
	return regs
}

type typeCase struct {
	dt      string
	capType string
	value   any
	be      []byte // the value's big-endian bytes
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

var i16, i32, i64 = int16(-1234), int32(-123456789), int64(-1234567890123456)

var typeCases = []typeCase{
	{"int16", "int", int64(-1234), be16(uint16(i16))},
	{"uint16", "int", int64(54321), be16(54321)},
	{"int32", "int", int64(-123456789), be32(uint32(i32))},
	{"uint32", "int", int64(3000000000), be32(3000000000)},
	{"int64", "int", int64(-1234567890123456), be64(uint64(i64))},
	{"uint64", "int", int64(1<<53 + 1), be64(1<<53 + 1)}, // exact beyond float64's integers
	{"float32", "float", 21.5, be32(math.Float32bits(21.5))},
	{"float64", "float", -1234.5678, be64(math.Float64bits(-1234.5678))},
	{"int16", "float", -1234.0, be16(uint16(i16))},
	{"uint32", "float", 3000000000.0, be32(3000000000)},
}

func TestTCPEveryTypeAndOrder(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "coalesce: false")
	addr := 0
	for _, tc := range typeCases {
		for _, order := range orderNames {
			t.Run(fmt.Sprintf("%s_%s_%s", tc.dt, tc.capType, order), func(t *testing.T) {
				regs := wireRegs(tc.be, order)
				addr += 4
				// Read: the device holds the wire registers in an input table.
				bank.SetInput(1, uint16(addr), regs...)
				rp := pointOn(t, b, fmt.Sprintf(`{name: r, data_type: %s, binding: {type: modbus, table: input, address: %d, data_type: %s, byte_order: %s}}`,
					tc.capType, addr, tc.dt, order))
				if got := readOK(t, rp); got != tc.value {
					t.Fatalf("read %v (%T), want %v", got, got, tc.value)
				}
				// Write: the point lays the value out in the same order.
				wp := pointOn(t, b, fmt.Sprintf(`{name: w, kind: do, data_type: %s, binding: {type: modbus, table: holding, address: %d, data_type: %s, byte_order: %s}}`,
					tc.capType, addr, tc.dt, order))
				if err := writeCtx(wp, tc.value); err != nil {
					t.Fatal(err)
				}
				if got := bank.Holding(1, uint16(addr), len(regs)); fmt.Sprint(got) != fmt.Sprint(regs) {
					t.Fatalf("device registers %04x, want %04x", got, regs)
				}
				if got := readOK(t, wp); got != tc.value {
					t.Fatalf("read back %v, want %v", got, tc.value)
				}
			})
		}
	}
}

func TestTCPBitsCoilsAndScale(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "")
	bank.SetDiscrete(1, 7, true)
	bank.SetHolding(1, 20, 0b1010_0000_0000_0101)

	coil := pointOn(t, b, `{name: c, kind: do, data_type: bool, binding: {type: modbus, address: "slave=1:reg=00003"}}`)
	coil15 := pointOn(t, b, `{name: c, kind: do, data_type: bool, binding: {type: modbus, table: coil, address: 3, write_function: 15}}`)
	di := pointOn(t, b, `{name: d, data_type: bool, binding: {type: modbus, address: "slave=1:reg=10008"}}`)
	bit2 := pointOn(t, b, `{name: b, kind: do, data_type: bool, binding: {type: modbus, table: holding, address: 20, bit: 2}}`)
	bit13 := pointOn(t, b, `{name: b, data_type: bool, binding: {type: modbus, table: holding, address: 20, data_type: bit, bit: 13}}`)
	// A byte-swapped register: bit 0 of the value is bit 8 on the wire.
	swapped := pointOn(t, b, `{name: b, kind: do, data_type: bool, binding: {type: modbus, table: holding, address: 21, bit: 0, byte_order: BADC}}`)
	nonzero := pointOn(t, b, `{name: n, kind: do, data_type: bool, binding: {type: modbus, table: holding, address: 22, data_type: uint16}}`)
	temp := pointOn(t, b, `{name: t, kind: do, data_type: float, binding: {type: modbus, table: holding, address: 23, data_type: int16, scale: 0.1, offset: -40}}`)
	mode := pointOn(t, b, `{name: m, kind: do, data_type: enum, enum_values: [auto, low, high], binding: {type: modbus, table: holding, address: 24, enum_map: {auto: 0, low: 10, high: 20}}}`)
	byIndex := pointOn(t, b, `{name: m, data_type: enum, enum_values: [off, on], binding: {type: modbus, table: holding, address: 25}}`)

	if readOK(t, di) != true || readOK(t, coil) != false {
		t.Fatal("discrete/coil initial values")
	}
	for _, v := range []bool{true, false, true} {
		if err := writeCtx(coil, v); err != nil || bank.Coil(1, 2) != v || readOK(t, coil) != v {
			t.Fatalf("coil write %v: err %v, device %v", v, err, bank.Coil(1, 2))
		}
	}
	if err := writeCtx(coil15, false); err != nil || bank.Coil(1, 3) || readOK(t, coil15) != false {
		t.Fatalf("coil via fc15: %v", err)
	}
	if readOK(t, bit2) != true || readOK(t, bit13) != true {
		t.Fatal("bit reads")
	}
	if err := writeCtx(bit2, false); err != nil {
		t.Fatal(err)
	}
	if got := bank.Holding(1, 20, 1)[0]; got != 0b1010_0000_0000_0001 {
		t.Fatalf("after clearing bit 2: %016b (other bits must stay)", got)
	}
	if err := writeCtx(swapped, true); err != nil || bank.Holding(1, 21, 1)[0] != 0x0100 || readOK(t, swapped) != true {
		t.Fatalf("byte-swapped bit: err %v, register %04x", err, bank.Holding(1, 21, 1)[0])
	}
	if err := writeCtx(nonzero, true); err != nil || bank.Holding(1, 22, 1)[0] != 1 {
		t.Fatalf("bool register: %v", err)
	}
	bank.SetHolding(1, 22, 7)
	if readOK(t, nonzero) != true {
		t.Fatal("non-zero register must read true")
	}
	// value = raw*0.1 - 40
	if err := writeCtx(temp, 21.5); err != nil || bank.Holding(1, 23, 1)[0] != 615 || readOK(t, temp) != 21.5 {
		t.Fatalf("scaled write: %v, raw %d", err, bank.Holding(1, 23, 1)[0])
	}
	if err := writeCtx(temp, -45.0); err != nil || int16(bank.Holding(1, 23, 1)[0]) != -50 {
		t.Fatalf("negative scaled write: %v", err)
	}
	if err := writeCtx(mode, "high"); err != nil || bank.Holding(1, 24, 1)[0] != 20 || readOK(t, mode) != "high" {
		t.Fatalf("enum write: %v", err)
	}
	bank.SetHolding(1, 24, 11)
	mustContain(t, readErr(t, mode, time.Second), "11", "none of the enum values")
	bank.SetHolding(1, 25, 1)
	if readOK(t, byIndex) != "on" {
		t.Fatal("enum by index")
	}

	// Values the register cannot hold are refused before anything is sent.
	n := bank.Count()
	for _, v := range []any{21.55, 3300.0, -3400.0, math.NaN(), "hot"} {
		err := writeCtx(temp, v)
		if !errors.Is(err, drivers.ErrBadValue) {
			t.Errorf("write %v: %v, want ErrBadValue", v, err)
		}
	}
	if bank.Count() != n {
		t.Errorf("%d requests sent for refused values", bank.Count()-n)
	}
	ro := pointOn(t, b, `{name: r, data_type: bool, binding: {type: modbus, table: coil, address: 0}}`)
	if err := writeCtx(ro, true); !errors.Is(err, drivers.ErrReadOnly) {
		t.Errorf("write to a read capability: %v", err)
	}
}

func TestTCPExceptions(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "down_after: 2, busy_backoff_ms: 5")
	bank.Hole(1, modbustest.HoldingRegisters, 100)
	hole := pointOn(t, b, `{name: h, kind: do, data_type: int, binding: {type: modbus, address: "slave=1:reg=40101", data_type: uint16}}`)
	readErr(t, hole, time.Second)
	err := readErr(t, hole, time.Second)
	var ex *ExceptionError
	if !errors.As(err, &ex) || ex.Exception != 2 || ex.Function != 3 {
		t.Fatalf("err = %v, want exception 2 to function 3", err)
	}
	mustContain(t, err, "illegal data address", "holding 40101 (address 100)", "unit 1")
	if hole.(drivers.PointHealth).Health() != nil {
		t.Fatal("an exception is an answer: the unit must stay up")
	}
	// A refused write: nothing changed (ErrBadValue); busy: ErrOffline.
	w := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 5, data_type: uint16}}`)
	bank.SetFault(func(r modbustest.Request) error {
		if r.Write {
			return modbustest.IllegalDataValue
		}
		return nil
	})
	err = writeCtx(w, int64(9))
	if !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("refused write: %v, want ErrBadValue", err)
	}
	mustContain(t, err, "illegal data value", "holding 40006")
	bank.SetFault(func(r modbustest.Request) error { return modbustest.DeviceBusy })
	if err := writeCtx(w, int64(9)); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("busy: %v, want ErrOffline", err)
	}
	bank.SetFault(func(r modbustest.Request) error { return modbustest.DeviceFailure })
	if err := writeCtx(w, int64(9)); errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("device failure: %v: the outcome is unknown, so no 'nothing written' sentinel", err)
	}
	bank.SetFault(nil)
	if err := writeCtx(w, int64(9)); err != nil {
		t.Fatal(err)
	}
}

// The PLC reboots: same port, new process. The next read must succeed (a
// stale connection earns one retry) and return the right value.
func TestTCPServerRestart(t *testing.T) {
	srv, bank := peer(t)
	bank.SetHolding(1, 0, 1)
	b := openTCP(t, srv.Addr, "timeout_ms: 200, retry_backoff_ms: 20")
	p := holdingPoint(t, b, 1, 0)
	if readOK(t, p) != int64(1) {
		t.Fatal("first read")
	}
	// Restart while idle: invisible to the caller.
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	bank.SetHolding(1, 0, 2)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	if v := readOK(t, p); v != int64(2) {
		t.Fatalf("after restart = %v", v)
	}
	// Down for a while: reads fail, then recover when it is back.
	_ = srv.Stop()
	err := readErr(t, p, time.Second)
	if !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read while the server is down = %v, want ErrOffline", err)
	}
	bank.SetHolding(1, 0, 3)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the bus to reconnect", func() bool { return b.Health() == nil })
	if v := readOK(t, p); v != int64(3) {
		t.Fatalf("after the second restart = %v", v)
	}
}

// A reply later than the timeout must never be taken as the answer to the
// next request (goburrow#64: the connection stays a transaction id behind).
func TestTCPSlowServerRecovery(t *testing.T) {
	srv, bank := peer(t)
	bank.SetHolding(1, 0, 111)
	bank.SetHolding(1, 50, 222)
	var slowOnce sync.Once
	bank.SetDelay(func(r modbustest.Request) time.Duration {
		d := time.Duration(0)
		if r.Addr == 0 {
			slowOnce.Do(func() { d = 300 * time.Millisecond })
		}
		return d
	})
	b := openTCP(t, srv.Addr, "timeout_ms: 100")
	a, c := holdingPoint(t, b, 1, 0), holdingPoint(t, b, 1, 50)
	err := readErr(t, a, time.Second)
	if !errors.Is(err, drivers.ErrTimeout) {
		t.Fatalf("slow read = %v, want a timeout", err)
	}
	reconnects := b.Stats().Reconnects
	if v := readOK(t, c); v != int64(222) {
		t.Fatalf("the read after the timeout = %v, want 222 (111 is the late reply)", v)
	}
	if v := readOK(t, a); v != int64(111) {
		t.Fatalf("read = %v", v)
	}
	if b.Stats().Reconnects != reconnects+1 {
		t.Errorf("reconnects %d -> %d: the connection must be closed after a timeout", reconnects, b.Stats().Reconnects)
	}
}

func TestTCPConcurrentCallers(t *testing.T) {
	srv, bank := peer(t)
	for i := range 64 {
		bank.SetHolding(1, uint16(i), uint16(i*3))
		bank.SetInput(2, uint16(i), uint16(i*5))
	}
	b := openTCP(t, srv.Addr, "queue_size: 1000")
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			hp := holdingPoint(t, b, 1, g)
			ip := pointOn(t, b, fmt.Sprintf(`{name: i, data_type: int, binding: {type: modbus, unit: 2, table: input, address: %d, data_type: uint16}}`, 32+g))
			wp := pointOn(t, b, fmt.Sprintf(`{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: %d, data_type: uint16}}`, 100+g))
			for i := range 50 {
				if v := readOK(t, hp); v != int64(g*3) {
					t.Errorf("holding %d = %v", g, v)
				}
				if v := readOK(t, ip); v != int64((32+g)*5) {
					t.Errorf("input %d = %v", 32+g, v)
				}
				if i%10 == 0 {
					if err := writeCtx(wp, int64(i)); err != nil {
						t.Error(err)
					} else if v := readOK(t, wp); v != int64(i) {
						t.Errorf("read-back %v, want %d", v, i)
					}
				}
			}
		})
	}
	wg.Wait()
	s := b.Stats()
	if s.Failures != 0 || s.Rejected != 0 {
		t.Fatalf("stats %+v", s)
	}
	t.Logf("%d point reads took %d requests (%d coalesced)", s.Reads, s.Requests-s.Writes, s.Coalesced)
}

func TestTCPPeerDownAtOpen(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	b := openTCP(t, addr, "timeout_ms: 200, retry_backoff_ms: 20, max_backoff_ms: 50")
	if err := b.Health(); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("Health = %v, want the endpoint down", err)
	}
	mustContain(t, b.Health(), addr)
	p := holdingPoint(t, b, 1, 0)
	if err := readErr(t, p, time.Second); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read = %v", err)
	}
	bank := modbustest.NewBank(100)
	bank.SetHolding(1, 0, 77)
	srv, err := modbustest.StartTCP(addr, bank)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	waitFor(t, 5*time.Second, "Health to recover", func() bool { return b.Health() == nil })
	if v := readOK(t, p); v != int64(77) {
		t.Fatalf("read = %v", v)
	}
}

// coalesceRig queues n point reads behind a slow blocker and returns once
// they are all waiting, so they are drained as one batch.
func coalesceRig(t *testing.T, b *Bus, bank *modbustest.Bank, points []drivers.Point) []any {
	t.Helper()
	release := make(chan struct{})
	bank.SetDelay(func(r modbustest.Request) time.Duration {
		if r.Unit == 9 {
			<-release
		}
		return 0
	})
	defer bank.SetDelay(nil)
	var wg sync.WaitGroup
	wg.Go(func() { readOK(t, holdingPoint(t, b, 9, 0)) })
	waitFor(t, 2*time.Second, "the blocker", func() bool { return bank.Count() == 1 })
	got := make([]any, len(points))
	for i, p := range points {
		wg.Go(func() { got[i] = readOK(t, p) })
	}
	waitFor(t, 2*time.Second, "the reads to queue", func() bool { return b.Stats().QueueDepth == len(points) })
	close(release)
	wg.Wait()
	return got
}

func TestTCPCoalescing(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "")
	var ps []drivers.Point
	for i := range 20 {
		bank.SetHolding(1, uint16(200+2*i), 0, uint16(i))
		ps = append(ps, pointOn(t, b, fmt.Sprintf(`{name: p, data_type: int, binding: {type: modbus, table: holding, address: %d, data_type: uint32}}`, 200+2*i)))
	}
	bank.SetInput(1, 0, 5)
	ps = append(ps, pointOn(t, b, `{name: p, data_type: int, binding: {type: modbus, table: input, address: 0, data_type: uint16}}`))
	got := coalesceRig(t, b, bank, ps)
	for i := range 20 {
		if got[i] != int64(i) {
			t.Errorf("point %d = %v", i, got[i])
		}
	}
	if got[20] != int64(5) {
		t.Errorf("input = %v", got[20])
	}
	// 20 uint32 points (40 registers) in one request, the input register in
	// another (in either order: the callers raced to the queue).
	var holding, input []modbustest.Request
	for _, r := range bank.Requests() {
		switch {
		case r.Unit == 1 && r.Table == modbustest.HoldingRegisters:
			holding = append(holding, r)
		case r.Unit == 1:
			input = append(input, r)
		}
	}
	if len(holding) != 1 || holding[0].Qty != 40 || holding[0].Addr != 200 || len(input) != 1 {
		t.Fatalf("server saw %+v and %+v, want one 40-register read at 200 and one input read", holding, input)
	}
}

// A merged read that crosses a hole draws an exception; the points are then
// asked for one by one and each gets its own answer.
func TestTCPCoalesceSplitsOnException(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "coalesce_gap: 4")
	bank.SetHolding(1, 300, 1)
	bank.SetHolding(1, 303, 2)
	bank.Hole(1, modbustest.HoldingRegisters, 301)
	got := coalesceRig(t, b, bank, []drivers.Point{holdingPoint(t, b, 1, 300), holdingPoint(t, b, 1, 303)})
	if got[0] != int64(1) || got[1] != int64(2) {
		t.Fatalf("got %v", got)
	}
	if n := bank.Count(); n != 4 {
		t.Fatalf("%d requests, want 4 (blocker, merged read, two single reads)", n)
	}
}

// The node's read-back after a write must see the device: there is no
// driver-side cache, even for a value read a moment ago.
func TestTCPReadAfterWriteSeesDevice(t *testing.T) {
	srv, bank := peer(t)
	b := openTCP(t, srv.Addr, "")
	p := pointOn(t, b, `{name: w, kind: do, data_type: int, binding: {type: modbus, table: holding, address: 1, data_type: int16}}`)
	for _, v := range []int64{5, -5, 7} {
		if err := writeCtx(p, v); err != nil {
			t.Fatal(err)
		}
		if got := readOK(t, p); got != v {
			t.Fatalf("read-back %v, want %d", got, v)
		}
	}
	bank.SetHolding(1, 1, 99) // the device changes by itself (a local override)
	if got := readOK(t, p); got != int64(99) {
		t.Fatalf("read %v, want the device's 99", got)
	}
}

func TestTCPContextDeadlineBoundsRequest(t *testing.T) {
	srv, bank := peer(t)
	bank.SetDelay(func(modbustest.Request) time.Duration { return 500 * time.Millisecond })
	b := openTCP(t, srv.Addr, "timeout_ms: 5000")
	p := holdingPoint(t, b, 1, 0)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := p.Read(ctx)
	if !errors.Is(err, drivers.ErrTimeout) || time.Since(start) > 400*time.Millisecond {
		t.Fatalf("err %v after %v, want a timeout at the caller's 100ms deadline", err, time.Since(start))
	}
}
