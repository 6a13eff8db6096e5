package i2c

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
)

const (
	shtTemp = `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 2, read_bytes: 6, crc: sht3x, field: 0, scale: 175/65535, offset: -45}`
	// The same sensor's humidity through the PhysMCP address string.
	shtRH = `{type: i2c, bus: i2c1, address: "0x44:cmd=0x2400:wait_ms=2:read_bytes=6:crc=sht3x:field=1", scale: 100/65535}`
)

func near(t *testing.T, what string, got any, want float64) {
	t.Helper()
	f, ok := got.(float64)
	if !ok || math.Abs(f-want) > 1e-9 {
		t.Errorf("%s = %#v, want %v", what, got, want)
	}
}

func TestSHT3xReads(t *testing.T) {
	_, sht, _, _, pts := setup(t, readCap("temp", "float", shtTemp)+readCap("rh", "float", shtRH))
	sht.set(func(s *fakeSHT) { s.minWait = 2 * time.Millisecond })

	near(t, "temperature", mustRead(t, pts["temp"]), 25)             // 0x6666 = 0.4 of full scale
	near(t, "humidity", mustRead(t, pts["rh"]), 100*32768.0/65535.0) // 0x8000
	sht.set(func(s *fakeSHT) { s.rawT, s.rawRH = 0, 0xFFFF })
	near(t, "temperature at raw 0", mustRead(t, pts["temp"]), -45)
	near(t, "humidity at full scale", mustRead(t, pts["rh"]), 100)
	if sht.commands != 4 {
		t.Errorf("%d measurements started, want 4 (one per read)", sht.commands)
	}
}

func TestSHT3xWrongCommandIsAnError(t *testing.T) {
	_, _, _, _, pts := setup(t, readCap("temp", "float",
		`{type: i2c, bus: i2c1, address: 0x44, command: 0x2C06, read_bytes: 6, crc: sht3x}`))
	if _, err := readCtx(t, pts["temp"]); err == nil || !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("a command the sensor NACKs: err = %v, want ErrOffline", err)
	}
}

func TestRegisterDecoding(t *testing.T) {
	caps := readCap("tmp102", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=0x00", width: 16, signed: true, scale: 0.00390625}`) +
		readCap("u8", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0x10}`) +
		readCap("s8", "int", `{type: i2c, bus: i2c1, address: "0x48:reg=0x10:signed=true"}`) +
		readCap("u16le", "int", `{type: i2c, bus: i2c1, address: 0x48, register: 0x20, width: 16, byte_order: little}`) +
		readCap("s24", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=0x30:width=24:signed=true:order=big", scale: 0.01}`) +
		readCap("u32le", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0x40, width: 32, byte_order: little, scale: 0.001, offset: 1}`) +
		readCap("s32", "int", `{type: i2c, bus: i2c1, address: 0x48, register: 0x50, width: 32, signed: true}`) +
		readCap("half", "int", `{type: i2c, bus: i2c1, address: 0x48, register: 0x60, scale: 0.5}`) +
		readCap("flag", "bool", `{type: i2c, bus: i2c1, address: 0x48, register: 0x70}`)
	_, _, regs, _, pts := setup(t, caps)
	regs.poke(0x00, 0xE7, 0x00)             // -25 °C
	regs.poke(0x10, 0xC8)                   // 200 / -56
	regs.poke(0x20, 0x34, 0x12)             // 0x1234 little-endian
	regs.poke(0x30, 0xFF, 0xFF, 0x9C)       // -100
	regs.poke(0x40, 0x10, 0x27, 0x00, 0x00) // 10000 little-endian
	regs.poke(0x50, 0x80, 0x00, 0x00, 0x00) // MinInt32
	regs.poke(0x60, 5)                      // 2.5 rounds to 3
	regs.poke(0x70, 0x02)

	near(t, "tmp102", mustRead(t, pts["tmp102"]), -25)
	near(t, "u8", mustRead(t, pts["u8"]), 200)
	for name, want := range map[string]any{"s8": int64(-56), "u16le": int64(0x1234), "s32": int64(math.MinInt32), "half": int64(3), "flag": true} {
		if got := mustRead(t, pts[name]); got != want {
			t.Errorf("%s = %#v, want %#v", name, got, want)
		}
	}
	near(t, "s24", mustRead(t, pts["s24"]), -1)
	near(t, "u32le", mustRead(t, pts["u32le"]), 11)
	regs.poke(0x70, 0x00)
	if got := mustRead(t, pts["flag"]); got != false {
		t.Errorf("flag = %#v, want false", got)
	}
}

func TestNACKIsAnErrorAndMarksTheDeviceDown(t *testing.T) {
	caps := readCap("t", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=0x00", width: 16}`) +
		readCap("ghost", "float", `{type: i2c, bus: i2c1, address: 0x49, register: 0}`)
	_, _, regs, bus, pts := setup(t, caps)
	p := pts["t"]
	ph := p.(drivers.PointHealth)

	if _, err := readCtx(t, pts["ghost"]); !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "0x49") {
		t.Fatalf("no device at 0x49: err = %v", err)
	}
	regs.nack = true
	for i := 1; i <= defaultDownAfter; i++ {
		v, err := readCtx(t, p)
		if err == nil || v != nil || !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("read %d with a NACKing device = %v, %v; want no value and ErrOffline", i, v, err)
		}
		if h := ph.Health(); (h != nil) != (i == defaultDownAfter) {
			t.Fatalf("after %d failures Health = %v", i, h)
		}
	}
	if h := ph.Health(); !errors.Is(h, drivers.ErrOffline) || !strings.Contains(h.Error(), "3 transactions in a row") {
		t.Fatalf("Health = %v", h)
	}
	if err := bus.Health(); err != nil {
		t.Fatalf("one dead device must not take the bus down: %v", err)
	}
	regs.nack = false
	mustRead(t, p)
	if h := ph.Health(); h != nil {
		t.Fatalf("Health after a good read = %v", h)
	}
}

func TestCRCFailureIsAnError(t *testing.T) {
	_, sht, _, _, pts := setup(t, readCap("rh", "float", shtRH)+readCap("temp", "float", shtTemp))
	sht.set(func(s *fakeSHT) { s.badCRC = true })
	for _, name := range []string{"rh", "temp"} { // one bad word spoils the frame
		v, err := readCtx(t, pts[name])
		if !errors.Is(err, ErrCRC) || v != nil {
			t.Fatalf("%s with a bad CRC = %v, %v; want ErrCRC", name, v, err)
		}
	}
	sht.set(func(s *fakeSHT) { s.badCRC = false })
	near(t, "rh after recovery", mustRead(t, pts["rh"]), 100*32768.0/65535.0)
}

func TestRegisterWriteThenReadBack(t *testing.T) {
	const hi = `{type: i2c, bus: i2c1, address: 0x48, register: 0x03, width: 16, signed: true, scale: 0.00390625}`
	caps := doCap("t_high", "float", hi, "") +
		doCap("t_high_loose", "float", hi, "    tolerance: 0.004\n") +
		doCap("level", "int", `{type: i2c, bus: i2c1, address: 0x48, register: 0x05, width: 8}`, "") +
		doCap("enable", "bool", `{type: i2c, bus: i2c1, address: 0x48, register: 0x06}`, "") +
		readCap("t", "float", `{type: i2c, bus: i2c1, address: "0x48:reg=0x00", width: 16}`)
	_, _, regs, _, pts := setup(t, caps)
	ctx := context.Background()
	p := pts["t_high"]

	for _, v := range []float64{30.5, -10.25, 0, 127.99609375, -128} {
		if err := p.Write(ctx, v); err != nil {
			t.Fatalf("Write(%v): %v", v, err)
		}
		near(t, "read-back", mustRead(t, p), v)
	}
	if err := p.Write(ctx, 30.5); err != nil {
		t.Fatal(err)
	}
	if got := regs.peek(0x03, 2); got[0] != 0x1E || got[1] != 0x80 {
		t.Fatalf("register 0x03 = % X, want 1E 80 (30.5 °C, big-endian)", got)
	}

	// Refused before the bus: nothing is written.
	before := regs.writes
	for _, v := range []any{21.3, 128.0, math.NaN(), "hot", true} {
		err := p.Write(ctx, v)
		if !errors.Is(err, drivers.ErrBadValue) {
			t.Errorf("Write(%#v): err = %v, want ErrBadValue", v, err)
		}
	}
	if !strings.Contains(p.Write(ctx, 21.3).Error(), "nearest register value is 21.30078125") {
		t.Errorf("the refusal should name the nearest value: %v", p.Write(ctx, 21.3))
	}
	if err := pts["level"].Write(ctx, 7.5); !errors.Is(err, drivers.ErrBadValue) {
		t.Errorf("int point Write(7.5): %v", err)
	}
	if err := pts["level"].Write(ctx, int64(256)); !errors.Is(err, drivers.ErrBadValue) {
		t.Errorf("u8 Write(256): %v", err)
	}
	if regs.writes != before {
		t.Fatalf("%d writes reached the device for refused values", regs.writes-before)
	}

	// With a tolerance the nearest value is accepted and reads back within it.
	if err := pts["t_high_loose"].Write(ctx, 21.3); err != nil {
		t.Fatalf("Write(21.3) with tolerance 0.004: %v", err)
	}
	near(t, "loose read-back", mustRead(t, pts["t_high_loose"]), 21.30078125)

	if err := pts["level"].Write(ctx, int64(42)); err != nil || mustRead(t, pts["level"]) != int64(42) {
		t.Fatalf("int write/read-back: %v", err)
	}
	if err := pts["enable"].Write(ctx, true); err != nil || mustRead(t, pts["enable"]) != true || regs.peek(0x06, 1)[0] != 1 {
		t.Fatalf("bool write/read-back: %v", err)
	}
	if err := pts["t"].Write(ctx, 1.0); !errors.Is(err, drivers.ErrReadOnly) {
		t.Fatalf("write to a read capability: %v", err)
	}

	// A NACK during the write has an unknown outcome: not ErrOffline, so
	// the node reads back instead of assuming nothing happened.
	regs.nack = true
	err := p.Write(ctx, 20.0)
	if err == nil || errors.Is(err, drivers.ErrOffline) || errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("Write with a NACK: %v", err)
	}
}

func TestCommandWaitHonoursTheDeadline(t *testing.T) {
	const slow = `{type: i2c, bus: i2c1, address: 0x44, command: 0x2400, wait_ms: 200, read_bytes: 6, crc: sht3x}`
	_, sht, _, _, pts := setup(t, readCap("slow", "float", slow)+readCap("fast", "float", shtTemp))
	p := pts["slow"]

	// A deadline shorter than the measurement: fail fast, bus untouched.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Read(ctx); !errors.Is(err, drivers.ErrTimeout) || !strings.Contains(err.Error(), "wait_ms 200") {
		t.Fatalf("err = %v, want ErrTimeout naming wait_ms", err)
	}
	if sht.commands != 0 || time.Since(start) > 15*time.Millisecond {
		t.Fatalf("a read that cannot finish must not start a measurement (%d commands, %v)", sht.commands, time.Since(start))
	}

	// Cancelled during the wait: the sleep ends at once, with ErrTimeout,
	// and the bus lock is released for the next reader.
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(10*time.Millisecond, cancel2)
	start = time.Now()
	if _, err := p.Read(ctx2); !errors.Is(err, drivers.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want ErrTimeout wrapping context.Canceled", err)
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Fatalf("the wait ignored cancellation (%v)", d)
	}
	near(t, "next read", mustRead(t, pts["fast"]), 25)
	if h := p.(drivers.PointHealth).Health(); h != nil {
		t.Fatalf("deadlines are not device failures: %v", h)
	}
}

func TestReadAfterClose(t *testing.T) {
	_, _, _, bus, pts := setup(t, readCap("t", "float", `{type: i2c, bus: i2c1, address: 0x48, register: 0}`))
	if err := bus.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bus.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := readCtx(t, pts["t"]); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := pts["t"].Write(context.Background(), 1.0); !errors.Is(err, drivers.ErrReadOnly) {
		t.Fatalf("write: %v", err)
	}
	if err := bus.Health(); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("Health after Close: %v", err)
	}
}
