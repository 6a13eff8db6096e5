// Package bme280 reads a Bosch BME280 (temperature, pressure, humidity) or
// BMP280 (temperature, pressure) over I²C, on periph.io's conn interfaces
// (i2c.Dev), with the datasheet's integer compensation.
//
// Source: Bosch Sensortec, "BME280 Combined humidity and pressure sensor",
// datasheet BST-BME280-DS002 (rev 1.6+): memory map §5.3, calibration data
// §4.2.2 (0x88..0xA1 and 0xE1..0xE7), compensation formulas §4.2.3 (32-bit
// temperature and humidity, 64-bit pressure), forced mode §3.3.3,
// measurement time §9.1. BMP280: datasheet BST-BMP280-DS001, same
// temperature and pressure registers, calibration and formulas, chip id
// 0x58, no humidity.
//
// Each Sense runs one forced-mode measurement with oversampling ×1 on
// every channel (the datasheet's "weather monitoring" setting), waits for
// it, and reads the result registers in one burst, so the three values are
// from the same moment.
package bme280

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"periph.io/x/conn/v3/i2c"
)

// Chip ids (register 0xD0).
const (
	ChipBME280 = 0x60
	ChipBMP280 = 0x58
)

// Registers (datasheet §5.3).
const (
	RegCalib00  = 0x88 // dig_T1 .. dig_P9 (24 bytes), 0xA1 dig_H1
	RegChipID   = 0xD0
	RegCalib26  = 0xE1 // dig_H2 .. dig_H6 (7 bytes)
	RegCtrlHum  = 0xF2
	RegStatus   = 0xF3
	RegCtrlMeas = 0xF4
	RegPressMSB = 0xF7 // press[3], temp[3], hum[2]
)

// Calibration is the chip's trimming parameters (datasheet §4.2.2).
type Calibration struct {
	T1                             uint16
	T2, T3                         int16
	P1                             uint16
	P2, P3, P4, P5, P6, P7, P8, P9 int16
	H1                             uint8
	H2                             int16
	H3                             uint8
	H4, H5                         int16
	H6                             int8
}

// ParseCalibration decodes the 26 bytes from 0x88 and the 7 bytes from
// 0xE1 (nil for a BMP280).
func ParseCalibration(a, b []byte) (Calibration, error) {
	var c Calibration
	if len(a) < 26 {
		return c, fmt.Errorf("calibration block 0x88 is %d bytes, want 26", len(a))
	}
	u := func(i int) uint16 { return binary.LittleEndian.Uint16(a[i:]) }
	s := func(i int) int16 { return int16(u(i)) }
	c.T1, c.T2, c.T3 = u(0), s(2), s(4)
	c.P1, c.P2, c.P3, c.P4, c.P5, c.P6, c.P7, c.P8, c.P9 = u(6), s(8), s(10), s(12), s(14), s(16), s(18), s(20), s(22)
	c.H1 = a[25]
	if b != nil {
		if len(b) < 7 {
			return c, fmt.Errorf("calibration block 0xE1 is %d bytes, want 7", len(b))
		}
		c.H2 = int16(binary.LittleEndian.Uint16(b[0:]))
		c.H3 = b[2]
		c.H4 = int16(int8(b[3]))<<4 | int16(b[4]&0x0F)
		c.H5 = int16(int8(b[5]))<<4 | int16(b[4]>>4)
		c.H6 = int8(b[6])
	}
	return c, nil
}

// Raw is one measurement's ADC values (20-bit temperature and pressure,
// 16-bit humidity).
type Raw struct{ T, P, H int32 }

// Reading is a compensated measurement.
type Reading struct {
	TemperatureC float64 // °C, 0.01 steps
	PressurePa   float64 // Pa, 1/256 steps
	HumidityRH   float64 // %RH, 1/1024 steps; 0 on a BMP280
	HasHumidity  bool
}

// Compensate applies the datasheet's fixed-point formulas (§4.2.3):
// BME280_compensate_T_int32, BME280_compensate_P_int64 and
// bme280_compensate_H_int32.
func (c *Calibration) Compensate(r Raw, humidity bool) Reading {
	// Temperature, 0.01 °C; t_fine carries it to the other two.
	var1 := (((r.T >> 3) - int32(c.T1)<<1) * int32(c.T2)) >> 11
	var2 := (((((r.T >> 4) - int32(c.T1)) * ((r.T >> 4) - int32(c.T1))) >> 12) * int32(c.T3)) >> 14
	tFine := var1 + var2
	t := (tFine*5 + 128) >> 8
	out := Reading{TemperatureC: float64(t) / 100, HasHumidity: humidity}

	// Pressure, Q24.8 Pa.
	v1 := int64(tFine) - 128000
	v2 := v1 * v1 * int64(c.P6)
	v2 += (v1 * int64(c.P5)) << 17
	v2 += int64(c.P4) << 35
	v1 = ((v1 * v1 * int64(c.P3)) >> 8) + ((v1 * int64(c.P2)) << 12)
	v1 = ((int64(1) << 47) + v1) * int64(c.P1) >> 33
	if v1 != 0 { // 0 would divide by zero: the datasheet returns 0
		p := 1048576 - int64(r.P)
		p = (((p << 31) - v2) * 3125) / v1
		v1 = (int64(c.P9) * (p >> 13) * (p >> 13)) >> 25
		v2 = (int64(c.P8) * p) >> 19
		p = ((p + v1 + v2) >> 8) + (int64(c.P7) << 4)
		out.PressurePa = float64(uint32(p)) / 256
	}

	if humidity {
		x := tFine - 76800
		x = ((((r.H << 14) - (int32(c.H4) << 20) - (int32(c.H5) * x)) + 16384) >> 15) *
			(((((((x*int32(c.H6))>>10)*(((x*int32(c.H3))>>11)+32768))>>10)+2097152)*int32(c.H2) + 8192) >> 14)
		x -= ((((x >> 15) * (x >> 15)) >> 7) * int32(c.H1)) >> 4
		x = min(max(x, 0), 419430400)
		out.HumidityRH = float64(uint32(x)>>12) / 1024
	}
	return out
}

// Dev is one BME280 or BMP280.
type Dev struct {
	d    *i2c.Dev
	chip byte
	cal  Calibration
}

// New checks the chip id and reads the calibration. It writes nothing.
func New(d *i2c.Dev) (*Dev, error) {
	id := []byte{0}
	if err := d.Tx([]byte{RegChipID}, id); err != nil {
		return nil, fmt.Errorf("bme280: read chip id: %w", err)
	}
	if id[0] != ChipBME280 && id[0] != ChipBMP280 {
		return nil, fmt.Errorf("bme280: chip id 0x%02X at 0x%02X is neither a BME280 (0x60) nor a BMP280 (0x58): %w", id[0], d.Addr, ErrWrongChip)
	}
	a := make([]byte, 26)
	if err := d.Tx([]byte{RegCalib00}, a); err != nil {
		return nil, fmt.Errorf("bme280: read calibration: %w", err)
	}
	var b []byte
	if id[0] == ChipBME280 {
		b = make([]byte, 7)
		if err := d.Tx([]byte{RegCalib26}, b); err != nil {
			return nil, fmt.Errorf("bme280: read humidity calibration: %w", err)
		}
	}
	cal, err := ParseCalibration(a, b)
	if err != nil {
		return nil, err
	}
	return &Dev{d: d, chip: id[0], cal: cal}, nil
}

// ErrWrongChip: the device at the address is not the part the profile
// names.
var ErrWrongChip = errors.New("wrong chip")

// HasHumidity reports a BME280 (a BMP280 has no humidity sensor).
func (d *Dev) HasHumidity() bool { return d.chip == ChipBME280 }

// Calibration returns the chip's trimming parameters.
func (d *Dev) Calibration() Calibration { return d.cal }

// MeasureTime is the longest a forced measurement with ×1 oversampling on
// all three channels takes (datasheet §9.1: 1.25 + 2.3 + 2.875 + 2.875 ms).
const MeasureTime = 9300 * time.Microsecond

// Sense runs one forced measurement and returns it compensated. It waits
// MeasureTime, then polls the status register's "measuring" bit; ctx
// bounds the wait.
func (d *Dev) Sense(ctx context.Context) (Reading, error) {
	if d.HasHumidity() {
		// ctrl_hum takes effect only after a write to ctrl_meas (§5.4.3).
		if err := d.d.Tx([]byte{RegCtrlHum, 0x01}, nil); err != nil {
			return Reading{}, fmt.Errorf("bme280: write ctrl_hum: %w", err)
		}
	}
	// osrs_t ×1, osrs_p ×1, forced mode.
	if err := d.d.Tx([]byte{RegCtrlMeas, 0b001_001_01}, nil); err != nil {
		return Reading{}, fmt.Errorf("bme280: start measurement: %w", err)
	}
	if err := sleep(ctx, MeasureTime); err != nil {
		return Reading{}, err
	}
	st := []byte{0}
	for i := 0; ; i++ {
		if err := d.d.Tx([]byte{RegStatus}, st); err != nil {
			return Reading{}, fmt.Errorf("bme280: read status: %w", err)
		}
		if st[0]&0x08 == 0 {
			break
		}
		if i == 50 {
			return Reading{}, errors.New("bme280: still measuring 100 ms after the measurement should have ended")
		}
		if err := sleep(ctx, 2*time.Millisecond); err != nil {
			return Reading{}, err
		}
	}
	n := 6
	if d.HasHumidity() {
		n = 8
	}
	b := make([]byte, n)
	if err := d.d.Tx([]byte{RegPressMSB}, b); err != nil {
		return Reading{}, fmt.Errorf("bme280: read data: %w", err)
	}
	r := Raw{
		P: int32(b[0])<<12 | int32(b[1])<<4 | int32(b[2])>>4,
		T: int32(b[3])<<12 | int32(b[4])<<4 | int32(b[5])>>4,
	}
	if d.HasHumidity() {
		r.H = int32(b[6])<<8 | int32(b[7])
	}
	if r.T == 0x80000 || r.P == 0x80000 {
		return Reading{}, errors.New("bme280: the chip reports no measurement (0x80000: channel skipped or not started)")
	}
	return d.cal.Compensate(r, d.HasHumidity()), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bme280: waiting for the measurement: %w", ctx.Err())
	}
}
