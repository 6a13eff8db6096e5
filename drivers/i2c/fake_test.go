package i2c

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	"periph.io/x/conn/v3/physic"
)

// errNACK is what the Linux driver reports when a device does not answer.
var errNACK = errors.New("sysfs-i2c: remote I/O error")

// fakeDevice answers the Tx addressed to it; the bus holds its lock.
type fakeDevice interface {
	tx(w, r []byte) error
}

// fakeBus is a stateful I²C bus with devices behind addresses. It records
// every Tx and flags a transaction that interleaves with a command-style
// device's open measurement (command sent, frame not yet read).
type fakeBus struct {
	mu          sync.Mutex
	devs        map[uint16]fakeDevice
	unplugged   bool // every Tx fails, as on a vanished adapter
	txs         int
	interleaved []string
	opens       atomic.Int32
}

func newFakeBus() *fakeBus { return &fakeBus{devs: map[uint16]fakeDevice{}} }

func (b *fakeBus) add(addr uint16, d fakeDevice) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.devs[addr] = d
}

func (b *fakeBus) setUnplugged(v bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unplugged = v
}

func (b *fakeBus) interleavings() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.interleaved...)
}

func (b *fakeBus) tx(addr uint16, w, r []byte) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.txs++
	if b.unplugged {
		return errors.New("sysfs-i2c: no such device")
	}
	for a, d := range b.devs {
		if s, ok := d.(*fakeSHT); ok && s.pending && a != addr {
			b.interleaved = append(b.interleaved, fmt.Sprintf("Tx to 0x%02X while 0x%02X measures", addr, a))
		}
	}
	d := b.devs[addr]
	if d == nil {
		return errNACK
	}
	return d.tx(w, r)
}

// fakeHandle is one open of the bus, as i2creg hands out.
type fakeHandle struct {
	bus    *fakeBus
	closed atomic.Bool
}

func (h *fakeHandle) String() string                    { return "fake" }
func (h *fakeHandle) SetSpeed(f physic.Frequency) error { return nil }
func (h *fakeHandle) Close() error {
	if h.closed.Swap(true) {
		return errors.New("fake: closed twice")
	}
	return nil
}
func (h *fakeHandle) Tx(addr uint16, w, r []byte) error {
	if h.closed.Load() {
		return errors.New("fake: Tx on a closed handle")
	}
	return h.bus.tx(addr, w, r)
}

var _ i2c.BusCloser = (*fakeHandle)(nil)

var fakeSeq atomic.Int32

// registerFake registers b with i2creg under a name unique to the test and
// unregisters it when the test ends. It returns the name.
func registerFake(t testing.TB, b *fakeBus) string {
	t.Helper()
	name := fmt.Sprintf("fake-%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), fakeSeq.Add(1))
	if err := i2creg.Register(name, nil, -1, func() (i2c.BusCloser, error) {
		b.opens.Add(1)
		return &fakeHandle{bus: b}, nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i2creg.Unregister(name) })
	return name
}

// fakeSHT is an SHT3x in single-shot mode without clock stretching: it
// takes command 0x2400, needs minWait before the frame can be read (an
// early read is NACKed, as on the real part), and answers 6 bytes: T, CRC,
// RH, CRC.
type fakeSHT struct {
	mu       sync.Mutex
	rawT     uint16
	rawRH    uint16
	minWait  time.Duration
	nack     bool
	badCRC   bool
	pending  bool
	started  time.Time
	commands int
}

func (s *fakeSHT) set(f func(s *fakeSHT)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s)
}

func (s *fakeSHT) tx(w, r []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nack {
		return errNACK
	}
	switch {
	case len(w) > 0 && len(r) == 0:
		if !bytes.Equal(w, []byte{0x24, 0x00}) {
			return fmt.Errorf("fake SHT3x: unknown command % X: %w", w, errNACK)
		}
		s.pending, s.started = true, time.Now()
		s.commands++
		return nil
	case len(w) == 0 && len(r) > 0:
		if !s.pending || time.Since(s.started) < s.minWait {
			return fmt.Errorf("fake SHT3x: no measurement ready: %w", errNACK)
		}
		s.pending = false
		if len(r) != 6 {
			return fmt.Errorf("fake SHT3x: read of %d bytes, want 6", len(r))
		}
		frame := []byte{byte(s.rawT >> 8), byte(s.rawT), 0, byte(s.rawRH >> 8), byte(s.rawRH), 0}
		frame[2] = sensirionCRC(frame[0:2])
		frame[5] = sensirionCRC(frame[3:5])
		if s.badCRC {
			frame[5] ^= 0x01
		}
		copy(r, frame)
		return nil
	}
	return fmt.Errorf("fake SHT3x: unexpected Tx w=% X r=%d", w, len(r))
}

// sensirionCRC is written independently of crc8 (a 9-bit polynomial
// division) so that the fake does not trust the code under test.
func sensirionCRC(b []byte) byte {
	rem := uint16(0xFF)
	for _, x := range b {
		rem ^= uint16(x)
		for range 8 {
			rem <<= 1
			if rem&0x100 != 0 {
				rem ^= 0x131
			}
		}
	}
	return byte(rem)
}

// fakeRegs is a register-mapped device: a write of [reg] sets the register
// pointer, [reg, data...] writes with auto-increment, a read returns bytes
// from the pointer on.
type fakeRegs struct {
	mu     sync.Mutex
	mem    [256]byte
	nack   bool
	writes int
	ptr    byte
}

func (d *fakeRegs) poke(reg byte, data ...byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, x := range data {
		d.mem[reg+byte(i)] = x
	}
}

func (d *fakeRegs) peek(reg byte, n int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]byte, n)
	for i := range out {
		out[i] = d.mem[reg+byte(i)]
	}
	return out
}

func (d *fakeRegs) tx(w, r []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nack {
		return errNACK
	}
	if len(w) > 0 {
		d.ptr = w[0]
		for i, x := range w[1:] {
			d.mem[d.ptr+byte(i)] = x
		}
		if len(w) > 1 {
			d.writes++
		}
	}
	for i := range r {
		r[i] = d.mem[d.ptr+byte(i)]
	}
	return nil
}
