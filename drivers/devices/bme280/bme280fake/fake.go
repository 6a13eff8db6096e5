// Package bme280fake is a stateful fake BME280/BMP280 on periph's i2c.Bus
// interface, for tests: a register file with the chip id and calibration,
// and result registers that a forced-mode measurement fills from the raw
// ADC values the test sets. It lives beside package bme280 and is never
// part of the daemon.
package bme280fake

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/physd/physd/drivers/devices/bme280"
	"periph.io/x/conn/v3/physic"
)

// ErrNACK is what a Tx to an address with no chip returns.
var ErrNACK = errors.New("bme280fake: no ACK (remote I/O error)")

// Chip is one fake sensor at Addr. Its zero value is not usable; use New.
type Chip struct {
	Addr uint16

	mu       sync.Mutex
	regs     [256]byte
	raw      bme280.Raw
	busyFor  int // status reads that still report "measuring"
	Busy     int // status reads a measurement stays busy for (default 0)
	forced   int // measurements started
	writes   [][]byte
	ptr      byte
	humidity bool
}

// New returns a chip with the given id (bme280.ChipBME280 or ChipBMP280)
// and calibration, its result registers at their reset value 0x80000.
func New(addr uint16, chip byte, c bme280.Calibration) *Chip {
	f := &Chip{Addr: addr, humidity: chip == bme280.ChipBME280}
	f.regs[bme280.RegChipID] = chip
	a := f.regs[bme280.RegCalib00:]
	le := binary.LittleEndian
	le.PutUint16(a[0:], c.T1)
	le.PutUint16(a[2:], uint16(c.T2))
	le.PutUint16(a[4:], uint16(c.T3))
	for i, p := range []int16{int16(c.P1), c.P2, c.P3, c.P4, c.P5, c.P6, c.P7, c.P8, c.P9} {
		le.PutUint16(a[6+2*i:], uint16(p))
	}
	a[25] = c.H1
	if f.humidity {
		b := f.regs[bme280.RegCalib26:]
		le.PutUint16(b[0:], uint16(c.H2))
		b[2] = c.H3
		b[3] = byte(c.H4 >> 4)
		b[4] = byte(c.H4&0x0F) | byte(c.H5&0x0F)<<4
		b[5] = byte(c.H5 >> 4)
		b[6] = byte(c.H6)
	}
	copy(f.regs[bme280.RegPressMSB:], []byte{0x80, 0, 0, 0x80, 0, 0, 0x80, 0})
	return f
}

// SetRaw sets the ADC values the next measurement reports.
func (f *Chip) SetRaw(r bme280.Raw) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.raw = r
}

// Measurements is the number of forced measurements started.
func (f *Chip) Measurements() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forced
}

// Writes lists every write (register, data...), in order.
func (f *Chip) Writes() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.writes...)
}

// String implements i2c.Bus.
func (f *Chip) String() string { return fmt.Sprintf("bme280fake@0x%02X", f.Addr) }

// SetSpeed implements i2c.Bus.
func (f *Chip) SetSpeed(physic.Frequency) error { return nil }

// Close implements i2c.BusCloser.
func (f *Chip) Close() error { return nil }

// Tx implements i2c.Bus: a write sets the register pointer (and writes
// the bytes after it); a read reads from the pointer on, auto-incrementing.
func (f *Chip) Tx(addr uint16, w, r []byte) error {
	if addr != f.Addr {
		return ErrNACK
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.txLocked(w, r)
}

// txLocked is Tx after the address check, with the chip's lock held.
func (f *Chip) txLocked(w, r []byte) error {
	if len(w) > 0 {
		f.ptr = w[0]
		if len(w) > 1 {
			f.writes = append(f.writes, append([]byte(nil), w...))
		}
		for i, v := range w[1:] {
			reg := w[0] + byte(i)
			switch {
			case reg == bme280.RegCtrlHum || reg == 0xF5:
				f.regs[reg] = v
			case reg == bme280.RegCtrlMeas:
				f.regs[reg] = v
				if v&0x03 == 0x01 || v&0x03 == 0x02 { // forced
					f.forced++
					f.busyFor = f.Busy
					p, t, h := uint32(f.raw.P)<<4, uint32(f.raw.T)<<4, uint16(f.raw.H)
					d := f.regs[bme280.RegPressMSB:]
					d[0], d[1], d[2] = byte(p>>16), byte(p>>8), byte(p)
					d[3], d[4], d[5] = byte(t>>16), byte(t>>8), byte(t)
					if f.humidity {
						d[6], d[7] = byte(h>>8), byte(h)
					}
				}
			default:
				return fmt.Errorf("bme280fake: write to read-only register 0x%02X", reg)
			}
		}
	}
	for i := range r {
		reg := f.ptr + byte(i)
		v := f.regs[reg]
		if reg == bme280.RegStatus {
			v = 0
			if f.busyFor > 0 {
				f.busyFor--
				v = 0x08
			}
		}
		r[i] = v
	}
	return nil
}
