// Package mcp9808 reads a Microchip MCP9808 digital temperature sensor
// (±0.25 °C typical, 0.0625 °C resolution) over I²C, on periph.io's
// conn interfaces (i2c.Dev).
//
// Source: Microchip, "MCP9808 ±0.5°C Maximum Accuracy Digital Temperature
// Sensor", datasheet DS25095A: register map §5.1 (0x05 ambient
// temperature T_A, 0x06 manufacturer ID 0x0054, 0x07 device ID 0x04 and
// revision), T_A format and conversion §5.1.3 (Register 5-4, Equation 5-1).
// The sensor converts continuously after power-up (t_CONV 250 ms at the
// default 0.0625 °C resolution), so a read needs no command.
package mcp9808

import (
	"errors"
	"fmt"

	"periph.io/x/conn/v3/i2c"
)

// Registers (datasheet §5.1).
const (
	RegAmbient      = 0x05
	RegManufacturer = 0x06
	RegDevice       = 0x07
)

// IDs the chip reports.
const (
	ManufacturerID = 0x0054
	DeviceID       = 0x04 // upper byte of register 0x07
)

// ErrWrongChip: the device at the address is not an MCP9808.
var ErrWrongChip = errors.New("wrong chip")

// Decode converts the ambient temperature register (upper, lower byte) to
// °C: bits 15..13 are alert flags, bit 12 the sign, bits 11..0 the
// magnitude in 1/16 °C, i.e. a 13-bit two's complement value.
func Decode(upper, lower byte) float64 {
	raw := int16(uint16(upper&0x1F)<<8|uint16(lower)) << 3 >> 3 // sign-extend 13 bits
	return float64(raw) / 16
}

// Dev is one MCP9808.
type Dev struct{ d *i2c.Dev }

// New checks the manufacturer and device ids. It writes nothing but the
// register pointer.
func New(d *i2c.Dev) (*Dev, error) {
	b := make([]byte, 2)
	if err := d.Tx([]byte{RegManufacturer}, b); err != nil {
		return nil, fmt.Errorf("mcp9808: read manufacturer id: %w", err)
	}
	if id := uint16(b[0])<<8 | uint16(b[1]); id != ManufacturerID {
		return nil, fmt.Errorf("mcp9808: manufacturer id 0x%04X at 0x%02X, an MCP9808 reports 0x0054: %w", id, d.Addr, ErrWrongChip)
	}
	if err := d.Tx([]byte{RegDevice}, b); err != nil {
		return nil, fmt.Errorf("mcp9808: read device id: %w", err)
	}
	if b[0] != DeviceID {
		return nil, fmt.Errorf("mcp9808: device id 0x%02X at 0x%02X, an MCP9808 reports 0x04: %w", b[0], d.Addr, ErrWrongChip)
	}
	return &Dev{d: d}, nil
}

// Temperature reads the ambient temperature in °C.
func (d *Dev) Temperature() (float64, error) {
	b := make([]byte, 2)
	if err := d.d.Tx([]byte{RegAmbient}, b); err != nil {
		return 0, fmt.Errorf("mcp9808: read ambient temperature: %w", err)
	}
	return Decode(b[0], b[1]), nil
}
