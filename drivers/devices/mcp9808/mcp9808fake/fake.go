// Package mcp9808fake is a stateful fake MCP9808 on periph's i2c.Bus
// interface, for tests: 16-bit registers behind a register pointer, with
// the ambient temperature set by the test. It is never part of the daemon.
package mcp9808fake

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/physd/physd/drivers/devices/mcp9808"
	"periph.io/x/conn/v3/physic"
)

// ErrNACK is what a Tx to an address with no chip returns.
var ErrNACK = errors.New("mcp9808fake: no ACK (remote I/O error)")

// Chip is one fake sensor.
type Chip struct {
	Addr uint16

	mu   sync.Mutex
	regs map[byte]uint16
	ptr  byte
}

// New returns a chip reading 0 °C with the datasheet's ids (revision 0).
func New(addr uint16) *Chip {
	return &Chip{Addr: addr, regs: map[byte]uint16{
		0x01:                    0, // config: continuous conversion
		mcp9808.RegManufacturer: mcp9808.ManufacturerID,
		mcp9808.RegDevice:       mcp9808.DeviceID << 8,
		0x08:                    0x03, // resolution 0.0625 °C
	}}
}

// SetRegister sets a register (e.g. 0x05 with alert flags, or wrong ids).
func (c *Chip) SetRegister(reg byte, v uint16) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.regs[reg] = v
}

// SetTemperature sets the ambient temperature register to t, rounded to
// the chip's 1/16 °C.
func (c *Chip) SetTemperature(t float64) {
	raw := int16(math.Round(t * 16))
	c.SetRegister(mcp9808.RegAmbient, uint16(raw)&0x1FFF)
}

// String implements i2c.Bus.
func (c *Chip) String() string { return fmt.Sprintf("mcp9808fake@0x%02X", c.Addr) }

// SetSpeed implements i2c.Bus.
func (c *Chip) SetSpeed(physic.Frequency) error { return nil }

// Close implements i2c.BusCloser.
func (c *Chip) Close() error { return nil }

// Tx implements i2c.Bus.
func (c *Chip) Tx(addr uint16, w, r []byte) error {
	if addr != c.Addr {
		return ErrNACK
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.txLocked(w, r)
}

// txLocked is Tx after the address check, with the chip's lock held.
func (c *Chip) txLocked(w, r []byte) error {
	if len(w) > 0 {
		c.ptr = w[0] & 0x0F
		if len(w) == 3 {
			switch c.ptr {
			case 0x01, 0x02, 0x03, 0x04, 0x08:
				c.regs[c.ptr] = uint16(w[1])<<8 | uint16(w[2])
			default:
				return fmt.Errorf("mcp9808fake: register 0x%02X is read-only", c.ptr)
			}
		} else if len(w) != 1 {
			return fmt.Errorf("mcp9808fake: a write is the pointer and 0 or 2 bytes, got %d bytes", len(w))
		}
	}
	v := c.regs[c.ptr]
	for i := range r {
		if i%2 == 0 {
			r[i] = byte(v >> 8)
		} else {
			r[i] = byte(v)
		}
	}
	return nil
}
