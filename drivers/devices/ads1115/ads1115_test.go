package ads1115_test

import (
	"context"
	"math"
	"testing"

	"github.com/physd/physd/drivers/devices/ads1115"
	"github.com/physd/physd/drivers/devices/ads1115/ads1115fake"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2ctest"
)

// TestConfigWord: the config word for the datasheet's defaults except
// OS=1 and the comparator off: AIN0−AIN1, ±2.048 V, 128 SPS, single-shot
// is 0x8583 (Table 8's reset value 0x8583 has the same fields).
func TestConfigWord(t *testing.T) {
	for _, c := range []struct {
		cfg  ads1115.Config
		want uint16
	}{
		{ads1115.Config{Input: ads1115.Diff01, FullScale: 2.048, Rate: 128}, 0x8583},
		{ads1115.Config{Input: ads1115.AIN0, FullScale: 4.096, Rate: 860}, 0xC3E3},
		{ads1115.Config{Input: ads1115.AIN3, FullScale: 0.256, Rate: 8}, 0xFB03},
	} {
		if w, err := c.cfg.Word(); err != nil || w != c.want {
			t.Errorf("%+v: 0x%04X %v, want 0x%04X", c.cfg, w, err, c.want)
		}
	}
	if _, err := (ads1115.Config{FullScale: 3.3, Rate: 128}).Word(); err == nil {
		t.Error("full scale 3.3 V accepted")
	}
	if _, err := (ads1115.Config{FullScale: 2.048, Rate: 100}).Word(); err == nil {
		t.Error("100 SPS accepted")
	}
}

// TestVolts: the output codes of §9.3.3 / Table 3: LSB = FS/2^15
// (62.5 µV at ±2.048 V), 7FFFh just below +FS, 8000h = −FS.
func TestVolts(t *testing.T) {
	c := ads1115.Config{FullScale: 2.048}
	for _, x := range []struct {
		code int16
		want float64
	}{{1, 62.5e-6}, {0x7FFF, 2.048 * 32767 / 32768}, {-32768, -2.048}, {0x4000, 1.024}, {-1, -62.5e-6}} {
		if got := c.Volts(x.code); math.Abs(got-x.want) > 1e-12 {
			t.Errorf("code %d: %v, want %v", x.code, got, x.want)
		}
	}
	if got := (ads1115.Config{FullScale: 6.144}).Volts(1); math.Abs(got-187.5e-6) > 1e-12 {
		t.Errorf("LSB at 6.144 V: %v, want 187.5 µV", got)
	}
}

// TestFake: single-shot reads of each input with their own gain, through
// the stateful fake that is busy for a while after each start; a voltage
// above the full scale reads as the full-scale code.
func TestFake(t *testing.T) {
	chip := ads1115fake.New(0x48)
	chip.Busy = 3
	chip.SetInput(0, 1.5)
	chip.SetInput(1, 0.25)
	chip.SetInput(3, 3.0)
	d, err := ads1115.New(&i2c.Dev{Bus: chip, Addr: 0x48})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, c := range []struct {
		cfg  ads1115.Config
		want float64
	}{
		{ads1115.Config{Input: ads1115.AIN0, FullScale: 2.048, Rate: 860}, 1.5},
		{ads1115.Config{Input: ads1115.AIN1, FullScale: 0.256, Rate: 860}, 0.25},
		{ads1115.Config{Input: ads1115.Diff01, FullScale: 2.048, Rate: 860}, 1.25},
		{ads1115.Config{Input: ads1115.AIN3, FullScale: 4.096, Rate: 475}, 3.0},
		{ads1115.Config{Input: ads1115.AIN3, FullScale: 2.048, Rate: 860}, 2.048 * 32767 / 32768}, // clipped
	} {
		v, err := d.Read(ctx, c.cfg)
		if err != nil || math.Abs(v-c.want) > c.cfg.FullScale/32768 {
			t.Errorf("%+v: %v %v, want %v", c.cfg, v, err, c.want)
		}
	}
	if n := len(chip.Starts()); n != 5 {
		t.Fatalf("%d conversions started, want 5", n)
	}
}

func TestPlayback(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{
		{Addr: 0x48, W: []byte{0x01}, R: []byte{0x85, 0x83}},
		{Addr: 0x48, W: []byte{0x01, 0xC3, 0xE3}},
		{Addr: 0x48, W: []byte{0x01}, R: []byte{0xC3, 0xE3}},
		{Addr: 0x48, W: []byte{0x00}, R: []byte{0x40, 0x00}},
	}}
	d, err := ads1115.New(&i2c.Dev{Bus: pb, Addr: 0x48})
	if err != nil {
		t.Fatal(err)
	}
	v, err := d.Read(context.Background(), ads1115.Config{Input: ads1115.AIN0, FullScale: 4.096, Rate: 860})
	if err != nil || v != 2.048 {
		t.Fatalf("%v %v", v, err)
	}
	if err := pb.Close(); err != nil {
		t.Fatal(err)
	}
}
