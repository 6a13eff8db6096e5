package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/physd/physd/drivers/devices/ads1115/ads1115fake"
	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/bme280/bme280fake"
	"github.com/physd/physd/drivers/devices/mcp9808/mcp9808fake"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	"periph.io/x/conn/v3/physic"
)

// chipBus is an I²C bus with the device packages' fakes at their
// addresses; it records every write that carries data.
type chipBus struct {
	mu     sync.Mutex
	chips  map[uint16]i2c.Bus
	writes []string
}

func (b *chipBus) Tx(addr uint16, w, r []byte) error {
	b.mu.Lock()
	c := b.chips[addr]
	if len(w) > 1 {
		b.writes = append(b.writes, string(w))
	}
	b.mu.Unlock()
	if c == nil {
		return errors.New("remote I/O error")
	}
	return c.Tx(addr, w, r)
}
func (b *chipBus) SetSpeed(physic.Frequency) error { return nil }
func (b *chipBus) String() string                  { return "chipbus" }
func (b *chipBus) Close() error                    { return nil }

// unknownChip answers every read with zeros.
type unknownChip struct{}

func (unknownChip) Tx(_ uint16, _, r []byte) error {
	clear(r)
	return nil
}
func (unknownChip) SetSpeed(physic.Frequency) error { return nil }
func (unknownChip) String() string                  { return "unknown" }

// TestScanI2C: physd scan i2c finds the BME280, MCP9808 and ADS1115 on a
// fake bus by their id registers, lists an unknown part for hand binding,
// writes a skeleton that validates, and writes no data to any device.
func TestScanI2C(t *testing.T) {
	b := &chipBus{chips: map[uint16]i2c.Bus{
		0x76: bme280fake.New(0x76, bme280.ChipBME280, bme280.Calibration{T1: 27504, T2: 26435, P1: 36477}),
		0x1A: mcp9808fake.New(0x1A),
		0x49: ads1115fake.New(0x49),
		0x44: unknownChip{},
	}}
	const name = "scan-fake-i2c"
	if err := i2creg.Register(name, nil, -1, func() (i2c.BusCloser, error) { return b, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i2creg.Unregister(name) })
	out := filepath.Join(t.TempDir(), "i2c.yml")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"scan", "i2c", "--bus", name, "--out", out}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if len(b.writes) != 0 {
		t.Fatalf("the scan wrote data: %q", b.writes)
	}
	for _, want := range []string{"0x1A answers: mcp9808", "0x44 answers: not recognised", "0x49 answers: ads1115", "0x76 answers: bme280 (chip id 0x60 at 0xD0)", "4 address(es) answered, 3 recognised"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
	skel, _ := os.ReadFile(out)
	for _, want := range []string{
		"0x44 answers but is not a part physd has a profile for",
		"binding: {type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: humidity}",
		"binding: {type: i2c, bus: i2c1, address: 0x1A, profile: mcp9808, point: temperature}",
		"binding: {type: i2c, bus: i2c1, address: 0x49, profile: ads1115, point: ain3, full_scale_v: 4.096, data_rate_sps: 128}",
		"unit: celsius", "unit: pascal", "unit: percent", "unit: volt",
	} {
		if !strings.Contains(string(skel), want) {
			t.Errorf("skeleton lacks %q", want)
		}
	}
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"validate", out}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "8 read and 0 do capabilities") {
		t.Fatalf("validate: %d %s%s", code, stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"scan", "i2c", "--bus", "no-such-bus"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), `i2c bus "no-such-bus"`) {
		t.Fatalf("missing bus: %d %s", code, stderr.String())
	}
}
