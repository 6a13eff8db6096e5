// Package ads1115 reads a Texas Instruments ADS1115 16-bit ADC over I²C,
// on periph.io's conn interfaces (i2c.Dev): one single-shot conversion per
// read, with the input multiplexer, programmable gain and data rate chosen
// per read.
//
// Source: Texas Instruments, "ADS111x Ultra-Small, Low-Power, I2C-
// Compatible, 860-SPS, 16-Bit ADCs", datasheet SBAS444: register map §9.6
// (0x00 conversion, 0x01 config), config register fields Table 8 (OS,
// MUX[2:0], PGA[2:0], MODE, DR[2:0], COMP_QUE), full-scale ranges and LSB
// sizes Table 3, single-shot mode §9.4.2, output codes §9.3.3 (16-bit two's
// complement, 7FFFh = +FS·(2^15−1)/2^15, 8000h = −FS).
package ads1115

import (
	"context"
	"errors"
	"fmt"
	"time"

	"periph.io/x/conn/v3/i2c"
)

// Registers.
const (
	RegConversion = 0x00
	RegConfig     = 0x01
)

// Input is the multiplexer setting (MUX[2:0]).
type Input uint8

// Inputs: differential pairs, and single-ended against GND.
const (
	Diff01 Input = iota // AIN0 − AIN1 (the power-on default)
	Diff03              // AIN0 − AIN3
	Diff13              // AIN1 − AIN3
	Diff23              // AIN2 − AIN3
	AIN0                // AIN0 − GND
	AIN1
	AIN2
	AIN3
)

// Inputs by name, as a binding names them.
var Inputs = map[string]Input{"diff01": Diff01, "diff03": Diff03, "diff13": Diff13, "diff23": Diff23, "ain0": AIN0, "ain1": AIN1, "ain2": AIN2, "ain3": AIN3}

// FullScale lists the PGA settings by full-scale voltage (Table 3); the
// index is PGA[2:0].
var FullScale = []float64{6.144, 4.096, 2.048, 1.024, 0.512, 0.256}

// DataRates lists the data rates in samples per second; the index is DR[2:0].
var DataRates = []int{8, 16, 32, 64, 128, 250, 475, 860}

// Config is one conversion's settings.
type Config struct {
	Input     Input
	FullScale float64 // one of FullScale, volts
	Rate      int     // one of DataRates, samples per second
}

// Word encodes the config register for a single-shot start: OS=1, MODE=1
// (single-shot), comparator disabled (COMP_QUE=11).
func (c Config) Word() (uint16, error) {
	pga, dr := -1, -1
	for i, f := range FullScale {
		if f == c.FullScale {
			pga = i
		}
	}
	for i, r := range DataRates {
		if r == c.Rate {
			dr = i
		}
	}
	switch {
	case c.Input > AIN3:
		return 0, fmt.Errorf("ads1115: input %d out of range", c.Input)
	case pga < 0:
		return 0, fmt.Errorf("ads1115: full scale %v V is not one of %v", c.FullScale, FullScale)
	case dr < 0:
		return 0, fmt.Errorf("ads1115: data rate %d SPS is not one of %v", c.Rate, DataRates)
	}
	return 1<<15 | uint16(c.Input)<<12 | uint16(pga)<<9 | 1<<8 | uint16(dr)<<5 | 0b11, nil
}

// Volts converts a conversion result: code × FS / 2^15.
func (c Config) Volts(code int16) float64 { return float64(code) * c.FullScale / 32768 }

// ConversionTime is one conversion at rate, plus the datasheet's ±10 %
// oscillator tolerance.
func ConversionTime(rate int) time.Duration {
	return time.Duration(float64(time.Second) / float64(rate) * 1.1)
}

// Dev is one ADS1115.
type Dev struct{ d *i2c.Dev }

// New returns the device. The ADS1115 has no id register; New reads the
// config register to make sure something answers at the address.
func New(d *i2c.Dev) (*Dev, error) {
	b := make([]byte, 2)
	if err := d.Tx([]byte{RegConfig}, b); err != nil {
		return nil, fmt.Errorf("ads1115: read config: %w", err)
	}
	return &Dev{d: d}, nil
}

// Read starts one single-shot conversion with c, waits for it (the config
// register's OS bit reads 1 when done), and returns the input in volts.
func (d *Dev) Read(ctx context.Context, c Config) (float64, error) {
	w, err := c.Word()
	if err != nil {
		return 0, err
	}
	if err := d.d.Tx([]byte{RegConfig, byte(w >> 8), byte(w)}, nil); err != nil {
		return 0, fmt.Errorf("ads1115: start conversion: %w", err)
	}
	if err := sleep(ctx, ConversionTime(c.Rate)); err != nil {
		return 0, err
	}
	b := make([]byte, 2)
	for i := 0; ; i++ {
		if err := d.d.Tx([]byte{RegConfig}, b); err != nil {
			return 0, fmt.Errorf("ads1115: read config: %w", err)
		}
		if b[0]&0x80 != 0 {
			break
		}
		if i == 20 {
			return 0, errors.New("ads1115: conversion not done after twice its time")
		}
		if err := sleep(ctx, ConversionTime(c.Rate)/10+100*time.Microsecond); err != nil {
			return 0, err
		}
	}
	if err := d.d.Tx([]byte{RegConversion}, b); err != nil {
		return 0, fmt.Errorf("ads1115: read conversion: %w", err)
	}
	return c.Volts(int16(uint16(b[0])<<8 | uint16(b[1]))), nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("ads1115: waiting for the conversion: %w", ctx.Err())
	}
}
