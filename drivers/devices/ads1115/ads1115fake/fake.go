// Package ads1115fake is a stateful fake ADS1115 on periph's i2c.Bus
// interface, for tests: the test sets the voltage on each input; a
// single-shot start converts the selected input (or pair) with the
// selected gain, clipped to the full scale, and the config register's OS
// bit reads 0 for Busy reads before the result is ready. It is never part
// of the daemon.
package ads1115fake

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/physd/physd/drivers/devices/ads1115"
	"periph.io/x/conn/v3/physic"
)

// ErrNACK is what a Tx to an address with no chip returns.
var ErrNACK = errors.New("ads1115fake: no ACK (remote I/O error)")

// Chip is one fake ADC.
type Chip struct {
	Addr uint16
	Busy int // config reads that show a conversion in progress

	mu      sync.Mutex
	volts   [4]float64
	config  uint16
	conv    uint16
	ptr     byte
	busyFor int
	starts  []uint16
}

// New returns a chip with its power-on config (0x8583).
func New(addr uint16) *Chip { return &Chip{Addr: addr, config: 0x8583} }

// SetInput sets the voltage on AINn (n = 0..3), relative to GND.
func (c *Chip) SetInput(n int, v float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volts[n] = v
}

// Starts lists the config words of the conversions started.
func (c *Chip) Starts() []uint16 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]uint16(nil), c.starts...)
}

// String implements i2c.Bus.
func (c *Chip) String() string { return fmt.Sprintf("ads1115fake@0x%02X", c.Addr) }

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

var pairs = [8][2]int{{0, 1}, {0, 3}, {1, 3}, {2, 3}, {0, -1}, {1, -1}, {2, -1}, {3, -1}}

// txLocked is Tx after the address check, with the chip's lock held.
func (c *Chip) txLocked(w, r []byte) error {
	if len(w) > 0 {
		c.ptr = w[0] & 0x03
		switch {
		case len(w) == 1:
		case len(w) == 3 && c.ptr == ads1115.RegConfig:
			c.config = uint16(w[1])<<8 | uint16(w[2])
			if c.config&0x8000 != 0 {
				c.starts = append(c.starts, c.config)
				c.convert()
				c.busyFor = c.Busy
			}
		default:
			return fmt.Errorf("ads1115fake: unsupported write % X", w)
		}
	}
	v := c.conv
	if c.ptr == ads1115.RegConfig {
		v = c.config &^ 0x8000
		if c.busyFor > 0 {
			c.busyFor--
		} else {
			v |= 0x8000
		}
	}
	for i := range r {
		if i%2 == 0 {
			r[i] = byte(v >> 8)
		} else {
			r[i] = byte(v)
		}
	}
	return nil
}

func (c *Chip) convert() {
	p := pairs[c.config>>12&7]
	v := c.volts[p[0]]
	if p[1] >= 0 {
		v -= c.volts[p[1]]
	}
	pga := int(c.config >> 9 & 7)
	fs := ads1115.FullScale[min(pga, len(ads1115.FullScale)-1)]
	code := math.Round(v / fs * 32768)
	code = min(max(code, -32768), 32767)
	c.conv = uint16(int16(code))
}
