package bme280_test

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/bme280/bme280fake"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2ctest"
)

// datasheetCal is the calibration of the worked example in the BMP280
// datasheet (BST-BMP280-DS001, §3.12 "Calculating pressure and
// temperature", table 16); the BME280 uses the same formulas. The
// humidity parameters are a real BME280's (there is no worked humidity
// example in the datasheet).
var datasheetCal = bme280.Calibration{
	T1: 27504, T2: 26435, T3: -1000,
	P1: 36477, P2: -10685, P3: 3024, P4: 2855, P5: 140, P6: -7, P7: 15500, P8: -14600, P9: 6000,
	H1: 75, H2: 362, H3: 0, H4: 313, H5: 50, H6: 30,
}

// TestCompensateDatasheetExample: adc_T 519888 and adc_P 415148 give
// 25.08 °C and 100653.27 Pa, as the datasheet's example says (its table
// gives the double-precision result; the 64-bit fixed-point formula lands
// within 0.02 Pa of it, a few of its 1/256 Pa steps).
func TestCompensateDatasheetExample(t *testing.T) {
	r := datasheetCal.Compensate(bme280.Raw{T: 519888, P: 415148}, false)
	if r.TemperatureC != 25.08 {
		t.Errorf("temperature %v, want 25.08", r.TemperatureC)
	}
	if math.Abs(r.PressurePa-100653.27) > 0.02 {
		t.Errorf("pressure %v, want 100653.27", r.PressurePa)
	}
}

// humidityDouble is the datasheet's double-precision humidity formula
// (BME280 §8.1, bme280_compensate_H_double), written out independently of
// the fixed-point one the driver uses.
func humidityDouble(c bme280.Calibration, adcT, adcH float64) float64 {
	v1 := (adcT/16384.0 - float64(c.T1)/1024.0) * float64(c.T2)
	v2 := (adcT/131072.0 - float64(c.T1)/8192.0) * (adcT/131072.0 - float64(c.T1)/8192.0) * float64(c.T3)
	tFine := math.Floor(v1 + v2)
	h := tFine - 76800.0
	h = (adcH - (float64(c.H4)*64.0 + float64(c.H5)/16384.0*h)) *
		(float64(c.H2) / 65536.0 * (1.0 + float64(c.H6)/67108864.0*h*(1.0+float64(c.H3)/67108864.0*h)))
	h *= 1.0 - float64(c.H1)*h/524288.0
	return min(max(h, 0), 100)
}

func TestCompensateHumidity(t *testing.T) {
	for _, adcH := range []int32{26000, 28000, 30000, 33000, 36000} {
		r := datasheetCal.Compensate(bme280.Raw{T: 519888, P: 415148, H: adcH}, true)
		want := humidityDouble(datasheetCal, 519888, float64(adcH))
		if math.Abs(r.HumidityRH-want) > 0.05 || r.HumidityRH <= 0 || r.HumidityRH >= 100 {
			t.Errorf("adc_H %d: %v %%RH, the double formula gives %v", adcH, r.HumidityRH, want)
		}
	}
}

// TestSenseFake: through the stateful fake, New reads the chip id and the
// calibration back exactly as the chip stores them (including the packed
// 12-bit dig_H4/dig_H5), and Sense runs one forced measurement, waits out
// a busy status, and returns the datasheet example's values.
func TestSenseFake(t *testing.T) {
	chip := bme280fake.New(0x76, bme280.ChipBME280, datasheetCal)
	chip.Busy = 2
	chip.SetRaw(bme280.Raw{T: 519888, P: 415148, H: 30000})
	d, err := bme280.New(&i2c.Dev{Bus: chip, Addr: 0x76})
	if err != nil {
		t.Fatal(err)
	}
	if d.Calibration() != datasheetCal || !d.HasHumidity() {
		t.Fatalf("calibration read back %+v", d.Calibration())
	}
	r, err := d.Sense(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.TemperatureC != 25.08 || math.Abs(r.PressurePa-100653.27) > 0.02 || math.Abs(r.HumidityRH-humidityDouble(datasheetCal, 519888, 30000)) > 0.05 {
		t.Fatalf("reading %+v", r)
	}
	if chip.Measurements() != 1 {
		t.Fatalf("%d measurements", chip.Measurements())
	}
	w := chip.Writes()
	if len(w) != 2 || w[0][0] != bme280.RegCtrlHum || w[1][0] != bme280.RegCtrlMeas || w[1][1] != 0x25 {
		t.Fatalf("writes % X", w)
	}

	// A BMP280 has no humidity: no ctrl_hum write, a 6-byte burst.
	bmp := bme280fake.New(0x77, bme280.ChipBMP280, datasheetCal)
	bmp.SetRaw(bme280.Raw{T: 519888, P: 415148})
	d, err = bme280.New(&i2c.Dev{Bus: bmp, Addr: 0x77})
	if err != nil {
		t.Fatal(err)
	}
	r, err = d.Sense(context.Background())
	if err != nil || r.HasHumidity || r.TemperatureC != 25.08 || len(bmp.Writes()) != 1 {
		t.Fatalf("bmp280: %+v %v, writes % X", r, err, bmp.Writes())
	}
}

// TestPlayback: the exact bus traffic for a BMP280, checked against
// periph's i2ctest.Playback: chip id, calibration, start, status, burst.
func TestPlayback(t *testing.T) {
	cal := make([]byte, 26)
	cal[0], cal[1] = 0x70, 0x6B // dig_T1 27504
	cal[2], cal[3] = 0x43, 0x67 // dig_T2 26435
	cal[4], cal[5] = 0x18, 0xFC // dig_T3 -1000
	for i, p := range []int16{-29059 /* 36477 as int16 */, -10685, 3024, 2855, 140, -7, 15500, -14600, 6000} {
		cal[6+2*i], cal[7+2*i] = byte(p), byte(uint16(p)>>8)
	}
	pb := &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{
		{Addr: 0x76, W: []byte{0xD0}, R: []byte{0x58}},
		{Addr: 0x76, W: []byte{0x88}, R: cal},
		{Addr: 0x76, W: []byte{0xF4, 0x25}},
		{Addr: 0x76, W: []byte{0xF3}, R: []byte{0x00}},
		// adc_P 415148 = 0x655AC, adc_T 519888 = 0x7EED0, left-aligned 20 bits.
		{Addr: 0x76, W: []byte{0xF7}, R: []byte{0x65, 0x5A, 0xC0, 0x7E, 0xED, 0x00}},
	}}
	d, err := bme280.New(&i2c.Dev{Bus: pb, Addr: 0x76})
	if err != nil {
		t.Fatal(err)
	}
	r, err := d.Sense(context.Background())
	if err != nil || r.TemperatureC != 25.08 || math.Abs(r.PressurePa-100653.27) > 0.02 {
		t.Fatalf("%+v %v", r, err)
	}
	if err := pb.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWrongChip(t *testing.T) {
	pb := &i2ctest.Playback{DontPanic: true, Ops: []i2ctest.IO{{Addr: 0x76, W: []byte{0xD0}, R: []byte{0x55}}}}
	if _, err := bme280.New(&i2c.Dev{Bus: pb, Addr: 0x76}); !errors.Is(err, bme280.ErrWrongChip) {
		t.Fatalf("%v", err)
	}
}
