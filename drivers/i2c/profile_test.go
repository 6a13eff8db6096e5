package i2c

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/devices/ads1115/ads1115fake"
	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/bme280/bme280fake"
	"github.com/physd/physd/drivers/devices/mcp9808/mcp9808fake"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// chipDev puts a device package's fake (a periph i2c.Bus for one chip)
// on the test bus.
type chipDev struct {
	addr uint16
	c    interface {
		Tx(addr uint16, w, r []byte) error
	}
}

func (d chipDev) tx(w, r []byte) error { return d.c.Tx(d.addr, w, r) }

// datasheetCal: the BMP280 datasheet's worked example (adc_T 519888 →
// 25.08 °C, adc_P 415148 → 100653.27 Pa) plus a real chip's humidity
// trimming.
var datasheetCal = bme280.Calibration{
	T1: 27504, T2: 26435, T3: -1000,
	P1: 36477, P2: -10685, P3: 3024, P4: 2855, P5: 140, P6: -7, P7: 15500, P8: -14600, P9: 6000,
	H1: 75, H2: 362, H3: 0, H4: 313, H5: 50, H6: 30,
}

// TestProfilesThroughNode: a manifest binding a BME280, a BMP280, an
// MCP9808 and an ADS1115 by profile reads, through the node, the values
// the parts' datasheets give for the fakes' register contents; a wrong
// part is an error, never a number.
func TestProfilesThroughNode(t *testing.T) {
	fb := newFakeBus()
	bme := bme280fake.New(0x76, bme280.ChipBME280, datasheetCal)
	bme.SetRaw(bme280.Raw{T: 519888, P: 415148, H: 30000})
	bmp := bme280fake.New(0x77, bme280.ChipBMP280, datasheetCal)
	bmp.SetRaw(bme280.Raw{T: 519888, P: 415148})
	mcp := mcp9808fake.New(0x18)
	mcp.SetTemperature(-7.25)
	adc := ads1115fake.New(0x48)
	adc.Busy = 1
	adc.SetInput(0, 1.5)
	adc.SetInput(2, 0.1)
	for _, c := range []chipDev{{0x76, bme}, {0x77, bmp}, {0x18, mcp}, {0x48, adc}} {
		fb.add(c.addr, c)
	}
	name := registerFake(t, fb)
	m := parse(t, "{type: i2c, bus: "+name+"}",
		readCap("air_temperature", "float", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: temperature}")+
			readCap("air_pressure", "float", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: pressure, scale: 0.01}")+
			readCap("air_humidity", "float", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: humidity}")+
			readCap("loft_temperature", "float", "{type: i2c, bus: i2c1, address: 0x77, profile: bmp280, point: temperature}")+
			readCap("loft_humidity", "float", "{type: i2c, bus: i2c1, address: 0x77, profile: bme280, point: humidity}")+
			readCap("pipe_temperature", "float", "{type: i2c, bus: i2c1, address: 0x18, profile: mcp9808}")+
			readCap("supply_voltage", "float", "{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0, full_scale_v: 4.096, data_rate_sps: 860}")+
			readCap("shunt_millivolts", "int", "{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain2, full_scale_v: 0.256, data_rate_sps: 860, scale: 1000}"))
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	ctx := context.Background()
	humidity := datasheetCal.Compensate(bme280.Raw{T: 519888, P: 415148, H: 30000}, true).HumidityRH
	for tool, want := range map[string]any{
		"read_air_temperature": 25.08, "read_air_pressure": 1006.5327, "read_air_humidity": humidity,
		"read_loft_temperature": 25.08, "read_pipe_temperature": -7.25, "read_supply_voltage": 1.5, "read_shunt_millivolts": int64(100),
	} {
		o, err := n.Read(ctx, tool, 0)
		if err != nil || o.Quality != promcp.QualityGood {
			t.Fatalf("%s: %+v %v", tool, o, err)
		}
		if w, ok := want.(float64); ok {
			if g, _ := o.Value.(float64); math.Abs(g-w) > 1e-3 {
				t.Errorf("%s = %v, want %v", tool, o.Value, w)
			}
		} else if o.Value != want {
			t.Errorf("%s = %v (%T), want %v", tool, o.Value, o.Value, want)
		}
	}
	if humidity < 10 || humidity > 90 {
		t.Fatalf("humidity %v: pick a raw value that gives a plausible reading", humidity)
	}
	o, _ := n.Read(ctx, "read_loft_humidity", 0)
	if o.Quality != promcp.QualityError || !strings.Contains(o.Reason, "is a BMP280, which has no humidity sensor") {
		t.Fatalf("humidity from a BMP280: %+v", o)
	}
	if bme.Measurements() != 3 {
		t.Fatalf("the BME280 ran %d measurements for 3 reads", bme.Measurements())
	}
}

// TestProfileBindingErrors: profile bindings are checked at validate with
// file:line:col, naming the profile's points and addresses.
func TestProfileBindingErrors(t *testing.T) {
	for _, c := range []struct{ binding, want string }{
		{"{type: i2c, bus: i2c1, address: 0x76, profile: bme680}", "binding.profile: no I²C device profile \"bme680\"; fix: use one of ads1115, bme280, bmp280, mcp9808"},
		{"{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: dewpoint}", "rpi.yml:12:76: capabilities[0].binding.point: profile bme280 has no point \"dewpoint\"; fix: use one of its points: temperature, pressure, humidity"},
		{"{type: i2c, bus: i2c1, address: 0x76, profile: bme280}", "profile bme280 needs point:"},
		{"{type: i2c, bus: i2c1, address: 0x48, profile: bme280, point: temperature}", "binding.address: profile bme280: the part answers at 0x76, 0x77, not at 0x48"},
		{"{type: i2c, bus: i2c1, address: 0x76, profile: bmp280, point: humidity}", "profile bmp280 has no point \"humidity\""},
		{"{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: temperature, register: 0xFA}", "binding.register: register does not apply to profile bme280"},
		{"{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain4}", "use one of its points: ain0, ain1, ain2, ain3, diff01"},
		{"{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0, full_scale_v: 5}", "binding.full_scale_v: full_scale_v 5 is not a gain the ADS1115 has"},
		{"{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0, data_rate_sps: 100}", "data_rate_sps 100 is not a rate"},
		{"{type: i2c, bus: i2c1, address: 0x18, profile: mcp9808, full_scale_v: 4.096}", "full_scale_v applies to profile ads1115, not mcp9808"},
		{"{type: i2c, bus: i2c1, address: 0x18, point: temperature}", "binding.point: point, full_scale_v and data_rate_sps belong to a device profile"},
	} {
		c2 := parse(t, "{type: i2c, bus: x}", readCap("p", "float", c.binding)).Capabilities[0]
		err := CheckBinding(c2)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err  %v\n  want %q", c.binding, err, c.want)
		}
	}
	c := parse(t, "{type: i2c, bus: x}", doCap("p", "float", "{type: i2c, bus: i2c1, address: 0x18, profile: mcp9808}", "")).Capabilities[0]
	if err := CheckBinding(c); err == nil || !strings.Contains(err.Error(), "capabilities[0].kind: profile mcp9808 is a sensor: its points are read-only") {
		t.Errorf("do on a sensor: %v", err)
	}
}
