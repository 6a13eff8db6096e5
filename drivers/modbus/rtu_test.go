package modbus

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/modbus/modbustest"
)

// Tests over a pty pair: the driver opens the tty side with goburrow/serial
// (termios and all), and a modbustest.RTUSlave, with its own framing and
// CRC, answers on the master side.

type rtuRig struct {
	bus   *Bus
	bank  *modbustest.Bank
	slave *modbustest.RTUSlave
	port  string
}

func newRTURig(t *testing.T, extra string, units ...byte) *rtuRig {
	t.Helper()
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pty: %v", err)
	}
	// The test keeps the tty open so the master never sees a hang-up while
	// the bus reopens its port. Cleanups run last-in first-out: the bus
	// closes its port first; then closing the last tty fd makes the
	// slave's blocking read of the master fail (EIO), which stops it.
	bank := modbustest.NewBank(1000)
	slave := modbustest.ServeRTU(ptmx, bank, units...)
	t.Cleanup(func() {
		_ = tty.Close()
		<-slave.Done()
		_ = ptmx.Close()
	})
	src := fmt.Sprintf("{port: %s, baud: 115200, parity: N, stop_bits: 2", tty.Name())
	if extra != "" {
		src += ", " + extra
	}
	b, err := Open(context.Background(), busFrom(t, TypeRTU, src+"}"))
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return &rtuRig{bus: b, bank: bank, slave: slave, port: tty.Name()}
}

func TestRTUFramingAndTypes(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 200", 1)
	r.bank.SetInput(1, 10, 0x0000, 0x41AC) // 21.5 as float32, CDAB
	r.bank.SetDiscrete(1, 4, true)
	b := r.bus
	temp := pointOn(t, b, `{name: t, data_type: float, binding: {type: modbus, unit: 1, address: "reg=30011", data_type: float32, byte_order: CDAB}}`)
	sp := pointOn(t, b, `{name: s, kind: do, data_type: float, binding: {type: modbus, address: "slave=1:reg=40001", data_type: int16, scale: 0.5}}`)
	big := pointOn(t, b, `{name: s, kind: do, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 2, data_type: int64, byte_order: DCBA}}`)
	coil := pointOn(t, b, `{name: c, kind: do, data_type: bool, binding: {type: modbus, unit: 1, table: coil, address: 9, write_function: 15}}`)
	di := pointOn(t, b, `{name: d, data_type: bool, binding: {type: modbus, unit: 1, table: discrete, address: 4}}`)
	if v := readOK(t, temp); v != 21.5 {
		t.Fatalf("float32 = %v", v)
	}
	if err := writeCtx(sp, -12.5); err != nil || int16(r.bank.Holding(1, 0, 1)[0]) != -25 || readOK(t, sp) != -12.5 {
		t.Fatalf("scaled int16 write: %v", err)
	}
	if err := writeCtx(big, int64(-9_000_000_000_000)); err != nil || readOK(t, big) != int64(-9_000_000_000_000) {
		t.Fatalf("int64 write: %v", err)
	}
	if err := writeCtx(coil, true); err != nil || !r.bank.Coil(1, 9) || readOK(t, coil) != true {
		t.Fatalf("coil: %v", err)
	}
	if readOK(t, di) != true {
		t.Fatal("discrete input")
	}
	if n := r.slave.BadCRC(); n != 0 {
		t.Fatalf("the slave dropped %d frames for bad CRC", n)
	}
	if s := b.Stats(); s.Failures != 0 || s.Strays != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// goburrow v0.1.0's RTU transport computes the exception function as
// fc&0x80 (always 0) instead of fc|0x80, so it reads exception replies by
// luck or not at all; this driver's framer reads exactly five bytes.
func TestRTUExceptions(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 200", 1)
	r.bank.Hole(1, modbustest.HoldingRegisters, 7)
	hole := pointOn(t, r.bus, `{name: h, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 7, data_type: uint16}}`)
	ok := pointOn(t, r.bus, `{name: o, kind: do, data_type: int, binding: {type: modbus, unit: 1, table: holding, address: 8, data_type: uint16}}`)
	r.bank.SetHolding(1, 8, 88)
	for range 3 {
		err := readErr(t, hole, time.Second)
		var ex *ExceptionError
		if !errors.As(err, &ex) || ex.Exception != 2 || ex.Function != 3 {
			t.Fatalf("err = %v, want exception 2", err)
		}
		mustContain(t, err, "illegal data address", "holding 40008 (address 7)")
		// Nothing of the exception frame is left on the line.
		if v := readOK(t, ok); v != int64(88) {
			t.Fatalf("read after the exception = %v", v)
		}
	}
	r.bank.SetFault(func(q modbustest.Request) error {
		if q.Write {
			return modbustest.IllegalDataValue
		}
		return nil
	})
	err := writeCtx(ok, int64(1))
	if !errors.Is(err, drivers.ErrBadValue) {
		t.Fatalf("refused write = %v, want ErrBadValue", err)
	}
	mustContain(t, err, "function 6", "illegal data value")
	if s := r.bus.Stats(); s.Strays != 0 || s.Failures != 0 || s.Exceptions != 4 {
		t.Fatalf("stats %+v", s)
	}
}

func TestRTUCorruptReplies(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 100, silence_ms: 20, down_after: 10", 1)
	r.bank.SetHolding(1, 0, 4242)
	p := holdingPoint(t, r.bus, 1, 0)
	cases := []struct {
		name   string
		mangle func([]byte) []byte
		want   string
	}{
		{"crc", func(f []byte) []byte { f[len(f)-1] ^= 0x55; return f }, "CRC mismatch"},
		{"unit", func(f []byte) []byte { f[0] = 2; return f }, "reply from unit 2"},
		{"count", func(f []byte) []byte { f[2] = 4; return f }, "4 data bytes"},
		{"trailing", func(f []byte) []byte { return append(f, 0x01, 0x03) }, "follow a complete"},
		{"short", func(f []byte) []byte { return f[:len(f)-1] }, "no complete reply"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.slave.SetMangle(c.mangle)
			mustContain(t, readErr(t, p, time.Second), c.want)
			r.slave.SetMangle(nil)
			if v := readOK(t, p); v != int64(4242) {
				t.Fatalf("read after a corrupt reply = %v", v)
			}
		})
	}
}

func TestRTUTimeoutAbsentUnit(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 100, silence_ms: 30", 1)
	r.bank.SetHolding(1, 0, 1)
	absent := holdingPoint(t, r.bus, 5, 0)
	start := time.Now()
	err := readErr(t, absent, time.Second)
	if !errors.Is(err, drivers.ErrTimeout) {
		t.Fatalf("err = %v, want a timeout", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("timed out after %v, want about 100ms", d)
	}
	if v := readOK(t, holdingPoint(t, r.bus, 1, 0)); v != int64(1) {
		t.Fatalf("unit 1 = %v", v)
	}
	// The absent unit answers no probe either: the line was watched for
	// a probe's timeout and two quarantines before unit 1 was asked.
	if s := r.bus.Stats(); s.Timeouts != 1 || s.Probes != 1 || s.Flushes != 2 {
		t.Fatalf("stats %+v, want one timeout, one probe and two quarantines", s)
	}
}

// Two units on one line: callers race, the line never carries two requests
// at once (the slave counts any request that arrives while it is busy).
func TestRTUTwoUnitsSerialized(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 200, coalesce: false", 1, 2)
	r.bank.SetDelay(func(modbustest.Request) time.Duration { return time.Millisecond })
	for i := range 8 {
		r.bank.SetHolding(1, uint16(i), uint16(100+i))
		r.bank.SetHolding(2, uint16(i), uint16(200+i))
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			p1, p2 := holdingPoint(t, r.bus, 1, g), holdingPoint(t, r.bus, 2, g)
			for range 5 {
				if v := readOK(t, p1); v != int64(100+g) {
					t.Errorf("unit 1 reg %d = %v", g, v)
				}
				if v := readOK(t, p2); v != int64(200+g) {
					t.Errorf("unit 2 reg %d = %v", g, v)
				}
			}
		})
	}
	wg.Wait()
	if n := r.slave.Overlaps(); n != 0 {
		t.Fatalf("%d requests reached the slave while it was still answering", n)
	}
	if s := r.bus.Stats(); s.Requests != 80 || s.Failures != 0 || r.slave.BadCRC() != 0 {
		t.Fatalf("stats %+v, bad CRC %d", s, r.slave.BadCRC())
	}
}

// The RTU hazard: the slave answers request A after A timed out. That reply
// must never be returned as the answer to B, a read of another register of
// the same shape (same unit, function and length, valid CRC).
func TestRTULateReplyNeverAnswersNextRequest(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 100, silence_ms: 300", 1)
	r.bank.SetHolding(1, 0, 111)  // A
	r.bank.SetHolding(1, 50, 222) // B
	var once sync.Once
	r.bank.SetDelay(func(q modbustest.Request) time.Duration {
		d := time.Duration(0)
		if q.Addr == 0 {
			once.Do(func() { d = 250 * time.Millisecond })
		}
		return d
	})
	a, bp := holdingPoint(t, r.bus, 1, 0), holdingPoint(t, r.bus, 1, 50)
	if err := readErr(t, a, time.Second); !errors.Is(err, drivers.ErrTimeout) {
		t.Fatalf("A = %v, want a timeout", err)
	}
	// B is queued at once; the worker flushes until 300ms of silence first.
	if v := readOK(t, bp); v != int64(222) {
		t.Fatalf("B = %v, want 222 (111 is A's late reply)", v)
	}
	if v := readOK(t, a); v != int64(111) {
		t.Fatalf("A again = %v", v)
	}
	if s := r.bus.Stats(); s.Discarded != 7 {
		t.Fatalf("stats %+v: want A's 7-byte reply discarded", s)
	}
}

// Bytes on an idle line (a reply later than any bound, another device,
// noise) are found by the quiet check before the next send: the line is
// quarantined, their unit re-synchronised, and the request then answered
// by its own reply, never by the stray frame of the same shape.
func TestRTUStrayBytesBeforeSend(t *testing.T) {
	r := newRTURig(t, "timeout_ms: 50, silence_ms: 20", 1)
	r.bank.SetHolding(1, 50, 222)
	bp := holdingPoint(t, r.bus, 1, 50)
	if v := readOK(t, bp); v != int64(222) {
		t.Fatalf("B = %v", v)
	}
	fake := []byte{1, 3, 2, 0x03, 0xE7} // unit 1, 1 register: 999, B's shape exactly
	c := modbustest.CRC(fake)
	r.slave.Inject(append(fake, byte(c), byte(c>>8)))
	if v := readOK(t, bp); v != int64(222) {
		t.Fatalf("B = %v, want 222 (999 is the stray frame)", v)
	}
	if s := r.bus.Stats(); s.Strays != 1 || s.Discarded != 7 || s.Probes != 1 {
		t.Fatalf("stats %+v, want one stray frame of 7 bytes discarded and its unit probed", s)
	}
}

func TestRTUPortErrors(t *testing.T) {
	_, err := Open(context.Background(), busFrom(t, TypeRTU, `{port: /dev/ttyNOSUCH0, baud: 9600}`))
	mustContain(t, err, "modbus_rtu plc (/dev/ttyNOSUCH0)", "no such file or directory", "fix:", "plugged in")
	if code, _, _ := drivers.CodeOf(err); code != CodePortMissing || !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("code %q (%v)", code, err)
	}
	// A pty has no RS-485 mode: the kernel answers TIOCSRS485 with ENOTTY.
	ptmx, tty, perr := pty.Open()
	if perr != nil {
		t.Skip(perr)
	}
	defer ptmx.Close()
	defer tty.Close()
	_, err = Open(context.Background(), busFrom(t, TypeRTU, `{port: `+tty.Name()+`, rs485: {enabled: true, delay_rts_before_send_ms: 1}}`))
	mustContain(t, err, "cannot do RS-485 mode", "rs485.enabled: false", "inappropriate ioctl")
	code, fix, _ := drivers.CodeOf(err)
	if code != CodeRS485Unsupported || strings.Contains(fix, "plugged in") {
		t.Fatalf("code %q fix %q", code, fix)
	}
	// Not a tty at all.
	_, err = Open(context.Background(), busFrom(t, TypeRTU, `{port: /dev/null}`))
	if code, _, _ := drivers.CodeOf(err); code != CodeNotASerialPort {
		t.Fatalf("/dev/null: code %q (%v)", code, err)
	}
}

// What the kernel says when RS-485 mode is refused depends on the adapter
// and kernel; each means the same thing and gets the same fix.
func TestSerialErrorClassifier(t *testing.T) {
	rs485 := func(errno syscall.Errno) error { return os.NewSyscallError("SYS_IOCTL (RS485)", errno) }
	cases := []struct {
		err   error
		rs485 bool
		code  string
		fix   string
	}{
		{rs485(syscall.ENOTTY), true, CodeRS485Unsupported, "rs485.enabled: false"},
		{rs485(syscall.EINVAL), true, CodeRS485Unsupported, "rs485.enabled: false"},
		{rs485(syscall.EOPNOTSUPP), true, CodeRS485Unsupported, "rs485.enabled: false"},
		{rs485(syscall.ENOSYS), true, CodeRS485Unsupported, "rs485.enabled: false"},
		{syscall.ENOENT, false, CodePortMissing, "plugged in"},
		{syscall.ENODEV, false, CodePortMissing, "plugged in"},
		{syscall.EACCES, false, CodePortPermission, "dialout"},
		{syscall.EBUSY, false, CodePortBusy, "another program"},
		{errors.New("serial: could not set setting: inappropriate ioctl for device"), false, CodeNotASerialPort, "serial device"},
		{syscall.EIO, false, CodePortError, "check port"},
	}
	for _, c := range cases {
		e := &serialError{port: "/dev/ttyX", rs485: c.rs485, err: c.err}
		if e.Code() != c.code || !strings.Contains(e.Fix(), c.fix) || !errors.Is(e, drivers.ErrOffline) {
			t.Errorf("%v: code %q fix %q", c.err, e.Code(), e.Fix())
		}
		if c.code == CodeRS485Unsupported && strings.Contains(e.Fix(), "plugged in") {
			t.Errorf("%v: RS-485 refusal told to check the plug", c.err)
		}
	}
}
