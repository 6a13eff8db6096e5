package mcp9808_test

import (
	"errors"
	"testing"

	"github.com/physd/physd/drivers/devices/mcp9808"
	"github.com/physd/physd/drivers/devices/mcp9808/mcp9808fake"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2ctest"
)

// TestDecode: T_A register values against Equation 5-1 of the datasheet,
// alert flags (bits 15..13) ignored, negative values in 13-bit two's
// complement.
func TestDecode(t *testing.T) {
	for _, c := range []struct {
		upper, lower byte
		want         float64
	}{
		{0x01, 0x94, 25.25},  // 0x0194 = 404/16
		{0xC1, 0x94, 25.25},  // same, with T_A > T_CRIT and T_A > T_UPPER flags
		{0x00, 0x01, 0.0625}, // one LSB
		{0x1F, 0xF0, -1.0},   // 0x1FF0: 256 - 255
		{0x1E, 0x70, -25.0},  // 0x1E70
		{0x1D, 0x80, -40.0},  // 0x1D80
		{0x07, 0xD0, 125.0},  // 0x07D0
		{0x10, 0x00, -256.0}, // the most negative code
		{0x00, 0x00, 0},
	} {
		if got := mcp9808.Decode(c.upper, c.lower); got != c.want {
			t.Errorf("0x%02X%02X = %v, want %v", c.upper, c.lower, got, c.want)
		}
	}
}

func TestFake(t *testing.T) {
	chip := mcp9808fake.New(0x18)
	d, err := mcp9808.New(&i2c.Dev{Bus: chip, Addr: 0x18})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []float64{21.5, -12.3125, 0.0625, 99.875} {
		chip.SetTemperature(want)
		if got, err := d.Temperature(); err != nil || got != want {
			t.Errorf("%v: got %v, %v", want, got, err)
		}
	}
	chip.SetRegister(mcp9808.RegDevice, 0x0200)
	if _, err := mcp9808.New(&i2c.Dev{Bus: chip, Addr: 0x18}); !errors.Is(err, mcp9808.ErrWrongChip) {
		t.Fatalf("device id 0x02 accepted: %v", err)
	}
}

func TestPlayback(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{
		{Addr: 0x18, W: []byte{0x06}, R: []byte{0x00, 0x54}},
		{Addr: 0x18, W: []byte{0x07}, R: []byte{0x04, 0x00}},
		{Addr: 0x18, W: []byte{0x05}, R: []byte{0xC1, 0x94}},
	}}
	d, err := mcp9808.New(&i2c.Dev{Bus: pb, Addr: 0x18})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := d.Temperature(); err != nil || v != 25.25 {
		t.Fatalf("%v %v", v, err)
	}
	if err := pb.Close(); err != nil {
		t.Fatal(err)
	}
	pb = &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{{Addr: 0x18, W: []byte{0x06}, R: []byte{0x00, 0x41}}}}
	if _, err := mcp9808.New(&i2c.Dev{Bus: pb, Addr: 0x18}); !errors.Is(err, mcp9808.ErrWrongChip) {
		t.Fatalf("manufacturer 0x0041 accepted: %v", err)
	}
}
