// Package mcp3008 reads a Microchip MCP3008 (8 channels) or MCP3004 (4
// channels) 10-bit SPI ADC on periph.io's conn interfaces (spi.Conn).
//
// Source: Microchip, "MCP3004/3008 2.7V 4-Channel/8-Channel 10-Bit A/D
// Converters with SPI Serial Interface", datasheet DS21295: §6.1 "Using
// the MCP3004/3008 with microcontroller SPI ports", Figure 6-1 (three
// bytes in SPI mode 0,0: start bit 0x01; SGL/DIFF, D2, D1, D0 in the top
// nibble of the second byte; the result's null bit and B9..B8 in the low
// bits of the second byte back, B7..B0 in the third), Table 5-2 (channel
// selection), Equation 4-1 (code = 1024 × V_IN / V_REF). f_CLK is at most
// 1.35 MHz at 2.7 V; 1 MHz is used.
package mcp3008

import (
	"fmt"

	"periph.io/x/conn/v3/physic"
	"periph.io/x/conn/v3/spi"
)

// MaxSpeed is the clock used: within the datasheet's limit at 2.7 V.
const MaxSpeed = 1 * physic.MegaHertz

// Mode is the SPI mode the part speaks (0,0; 1,1 works too).
const Mode = spi.Mode0

// Request is the three bytes that start a conversion of channel ch
// (0..7), single-ended against ground or, with diff, the pseudo-
// differential pair of Table 5-2 (0: CH0+ CH1−, 1: CH0− CH1+, ...).
func Request(ch int, diff bool) ([]byte, error) {
	if ch < 0 || ch > 7 {
		return nil, fmt.Errorf("mcp3008: channel %d is outside 0..7", ch)
	}
	b := byte(ch) << 4
	if !diff {
		b |= 0x80
	}
	return []byte{0x01, b, 0x00}, nil
}

// Code decodes the 10-bit result from the three bytes read back.
func Code(r []byte) (int, error) {
	if len(r) != 3 {
		return 0, fmt.Errorf("mcp3008: reply of %d bytes, want 3", len(r))
	}
	if r[1]&0x04 != 0 {
		// The null bit before B9 is always 0; a 1 means MISO floats
		// high (no chip, or a chip-select on the wrong pin).
		return 0, fmt.Errorf("mcp3008: the null bit reads 1 (reply % X): is the chip there, on this chip select?", r)
	}
	return int(r[1]&0x03)<<8 | int(r[2]), nil
}

// Read converts one channel and returns its code (0..1023).
func Read(c spi.Conn, ch int, diff bool) (int, error) {
	w, err := Request(ch, diff)
	if err != nil {
		return 0, err
	}
	r := make([]byte, 3)
	if err := c.Tx(w, r); err != nil {
		return 0, fmt.Errorf("mcp3008: %w", err)
	}
	return Code(r)
}

// Volts converts a code with the reference voltage (Equation 4-1).
func Volts(code int, vref float64) float64 { return float64(code) * vref / 1024 }
