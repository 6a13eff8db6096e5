// Package mcp3008fake is a fake MCP3008 on periph's spi interfaces
// (spi.PortCloser and spi.Conn), for tests: the test sets each channel's
// input voltage; a request converts it as the chip would (Equation 4-1,
// clipped to 0..1023). It is never part of the daemon.
package mcp3008fake

import (
	"fmt"
	"math"
	"sync"

	"periph.io/x/conn/v3"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/conn/v3/spi"
)

// Chip is one fake ADC; it is both the port and the connection.
type Chip struct {
	VRef float64

	mu      sync.Mutex
	volts   [8]float64
	absent  bool
	txs     int
	speed   physic.Frequency
	mode    spi.Mode
	closed  bool
	connect int
}

// New returns a chip with the given reference voltage.
func New(vref float64) *Chip { return &Chip{VRef: vref} }

// SetInput sets the voltage on channel ch.
func (c *Chip) SetInput(ch int, v float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.volts[ch] = v
}

// SetAbsent makes MISO float high, as with no chip on the select line.
func (c *Chip) SetAbsent(v bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.absent = v
}

// Conversions is the number of transactions seen.
func (c *Chip) Conversions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.txs
}

// Connected reports the speed and mode the driver asked for.
func (c *Chip) Connected() (physic.Frequency, spi.Mode) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.speed, c.mode
}

func (c *Chip) String() string                    { return "mcp3008fake" }
func (c *Chip) LimitSpeed(physic.Frequency) error { return nil }
func (c *Chip) Duplex() conn.Duplex               { return conn.Full }
func (c *Chip) TxPackets([]spi.Packet) error {
	return fmt.Errorf("mcp3008fake: TxPackets not supported")
}
func (c *Chip) Close() error { c.mu.Lock(); c.closed = true; c.mu.Unlock(); return nil }
func (c *Chip) Connect(f physic.Frequency, m spi.Mode, bits int) (spi.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if bits != 8 {
		return nil, fmt.Errorf("mcp3008fake: %d bits per word", bits)
	}
	c.speed, c.mode = f, m
	c.connect++
	return c, nil
}

// Tx answers one three-byte conversion.
func (c *Chip) Tx(w, r []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.txs++
	if c.closed {
		return fmt.Errorf("mcp3008fake: closed")
	}
	if len(w) != 3 || len(r) != 3 {
		return fmt.Errorf("mcp3008fake: want 3 bytes each way, got %d/%d", len(w), len(r))
	}
	if c.absent {
		copy(r, []byte{0xFF, 0xFF, 0xFF})
		return nil
	}
	if w[0] != 0x01 {
		clear(r)
		return nil // no start bit: the chip does nothing
	}
	ch := int(w[1] >> 4 & 7)
	v := c.volts[ch]
	if w[1]&0x80 == 0 { // pseudo-differential: pair (0,1), (2,3), ...
		pair := ch &^ 1
		if ch&1 == 0 {
			v = c.volts[pair] - c.volts[pair+1]
		} else {
			v = c.volts[pair+1] - c.volts[pair]
		}
	}
	code := int(math.Floor(1024 * v / c.VRef))
	code = min(max(code, 0), 1023)
	r[0], r[1], r[2] = 0, byte(code>>8)&0x03, byte(code)
	return nil
}
