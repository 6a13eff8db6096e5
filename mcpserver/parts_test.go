package mcpserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"periph.io/x/conn/v3/i2c"
	"periph.io/x/conn/v3/i2c/i2creg"
	"periph.io/x/conn/v3/i2c/i2ctest"
	"periph.io/x/conn/v3/physic"
	"periph.io/x/conn/v3/spi"
	"periph.io/x/conn/v3/spi/spireg"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/devices/ads1115/ads1115fake"
	"github.com/physd/physd/drivers/devices/bme280"
	"github.com/physd/physd/drivers/devices/bme280/bme280fake"
	"github.com/physd/physd/drivers/devices/mcp3008/mcp3008fake"
	"github.com/physd/physd/drivers/devices/mcp9808"
	"github.com/physd/physd/drivers/devices/mcp9808/mcp9808fake"
	i2cdrv "github.com/physd/physd/drivers/i2c" // registers i2c
	_ "github.com/physd/physd/drivers/spi"      // registers spi
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
)

// The device profiles end to end: a manifest names profile: (I²C) or
// device: (SPI) on the binding, the bus is one periph registers (i2creg,
// spireg) with the parts' fakes on it, and an MCP client calls read_<cap>
// through mcpserver and the node. The expected numbers are the
// datasheets', not the drivers'.

// partsBus is an I²C adapter with chips on it, as i2creg hands out: a Tx
// goes to the chip at its address; an address with no chip, or a chip
// unplugged, does not acknowledge.
type partsBus struct {
	mu        sync.Mutex
	chips     map[uint16]i2c.Bus
	unplugged map[uint16]bool
	gone      bool // the adapter was removed: every Tx fails with ENODEV
}

var errPartsNACK = fmt.Errorf("remote I/O error (no ACK)")

func (b *partsBus) Tx(addr uint16, w, r []byte) error {
	b.mu.Lock()
	c, ok := b.chips[addr]
	nack, gone := b.unplugged[addr], b.gone
	b.mu.Unlock()
	if gone {
		return fmt.Errorf("i2c adapter: %w", syscall.ENODEV)
	}
	if !ok || nack {
		return errPartsNACK
	}
	return c.Tx(addr, w, r)
}
func (b *partsBus) unplug(addr uint16, v bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.unplugged[addr] = v
}
func (b *partsBus) setGone() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.gone = true
}
func (b *partsBus) String() string                  { return "parts" }
func (b *partsBus) SetSpeed(physic.Frequency) error { return nil }
func (b *partsBus) Close() error                    { return nil }

// registerI2C registers bc with i2creg under name for the test.
func registerI2C(t *testing.T, name string, bc i2c.BusCloser) {
	t.Helper()
	if err := i2creg.Register(name, nil, -1, func() (i2c.BusCloser, error) { return bc, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = i2creg.Unregister(name) })
}

// partsSession opens a node on the manifest src and connects an MCP
// client to it in memory.
func partsSession(t *testing.T, src string) *mcp.ClientSession {
	t.Helper()
	m, err := manifest.Parse("parts.yml", []byte(src))
	if err != nil {
		t.Fatalf("manifest: %v", err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	srv := mcpserver.New(n, mcpserver.Options{StdioRole: "operator", Audit: al})
	ct, stt := mcp.NewInMemoryTransports()
	ss, err := srv.MCP().Connect(context.Background(), stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "parts-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), ct, &mcp.ClientSessionOptions{ProtocolVersion: "2026-07-28"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait(); n.Close(context.Background()); al.Close(); st.Close() })
	return cs
}

// readPart calls read_<cap> with max_age_ms 0 (a device read every time)
// and returns its structured answer; a tool error fails the test.
func readPart(t *testing.T, cs *mcp.ClientSession, tool string) map[string]any {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"max_age_ms": 0}})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error %q", tool, res.Content[0].(*mcp.TextContent).Text)
	}
	var o map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatal(err)
	}
	return o
}

const partsHeader = `physmcp_version: "0.1"
device: {id: gw_parts, type: gateway, location: {zone: shed}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
`

func partsCap(name, unit, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: " + name + ".\n    data_type: float\n    unit: " + unit +
		"\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

// datasheetBME280 is the calibration of the worked example in the
// BMP280 datasheet (BST-BMP280-DS001 §3.12, table 16; the BME280 uses the
// same temperature and pressure formulas) with a real BME280's humidity
// trimming.
var datasheetBME280 = bme280.Calibration{
	T1: 27504, T2: 26435, T3: -1000,
	P1: 36477, P2: -10685, P3: 3024, P4: 2855, P5: 140, P6: -7, P7: 15500, P8: -14600, P9: 6000,
	H1: 75, H2: 362, H3: 0, H4: 313, H5: 50, H6: 30,
}

// bmp280Playback is the exact bus traffic of one BMP280 read, for
// periph's i2ctest.Playback: chip id, calibration (the datasheet
// example's, little-endian), forced measurement, status, 6-byte burst
// with adc_P 415148 and adc_T 519888.
func bmp280Playback(addr uint16) []i2ctest.IO {
	cal := make([]byte, 26)
	for i, v := range []uint16{27504, 26435, uint16(0xFC18) /* -1000 */, 36477, uint16(0xD643) /* -10685 */, 3024, 2855, 140,
		uint16(0xFFF9) /* -7 */, 15500, uint16(0xC6F8) /* -14600 */, 6000} {
		cal[2*i], cal[2*i+1] = byte(v), byte(v>>8)
	}
	return []i2ctest.IO{
		{Addr: addr, W: []byte{0xD0}, R: []byte{0x58}},
		{Addr: addr, W: []byte{0x88}, R: cal},
		{Addr: addr, W: []byte{0xF4, 0x25}},
		{Addr: addr, W: []byte{0xF3}, R: []byte{0x00}},
		{Addr: addr, W: []byte{0xF7}, R: []byte{0x65, 0x5A, 0xC0, 0x7E, 0xED, 0x00}},
	}
}

// TestProfilesOverMCP: each I²C part (BME280, BMP280, MCP9808, ADS1115)
// and the SPI MCP3008, bound by profile in a manifest, answers read_<cap>
// over MCP with the value its datasheet computes for the fake's
// registers, quality good, in the manifest's unit.
func TestProfilesOverMCP(t *testing.T) {
	bme := bme280fake.New(0x76, bme280.ChipBME280, datasheetBME280)
	bme.SetRaw(bme280.Raw{T: 519888, P: 415148, H: 30000})
	mcp98 := mcp9808fake.New(0x18)
	// T_A register with the three alert flags set and −7.25 °C
	// (datasheet Equation 5-1: sign bit 12, 1/16 °C): the flags are not
	// part of the temperature.
	mcp98.SetRegister(mcp9808.RegAmbient, 0xE000|0x1F8C)
	adc := ads1115fake.New(0x48)
	adc.Busy = 2
	adc.SetInput(0, 1.23456) // FS ±4.096 V: 125 µV a code (Table 3), code 9876
	adc.SetInput(2, 0.0412)
	adc.SetInput(3, 0.0100) // AIN2−AIN3 = 31.2 mV at FS ±0.256 V: 7.8125 µV a code, code 3994
	bus := &partsBus{chips: map[uint16]i2c.Bus{0x76: bme, 0x18: mcp98, 0x48: adc}, unplugged: map[uint16]bool{}}
	registerI2C(t, "parts-i2c-a", bus)
	registerI2C(t, "parts-i2c-b", &i2ctest.Playback{Ops: bmp280Playback(0x77), DontPanic: true})

	spiChip := mcp3008fake.New(3.3)
	spiChip.SetInput(5, 2.0) // 1024·2.0/3.3 = 620.6: code 620 (Equation 4-1)
	if err := spireg.Register("parts-spi", nil, -1, func() (spi.PortCloser, error) { return spiChip, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spireg.Unregister("parts-spi") })

	cs := partsSession(t, partsHeader+`buses:
  i2c1: {type: i2c, bus: parts-i2c-a}
  i2c2: {type: i2c, bus: parts-i2c-b}
  adc: {type: spi, port: parts-spi}
capabilities:
`+partsCap("air_temperature", "celsius", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: temperature}")+
		partsCap("air_pressure", "hPa", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: pressure, scale: 0.01}")+
		partsCap("air_humidity", "percent", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: humidity}")+
		partsCap("loft_pressure", "pascal", "{type: i2c, bus: i2c2, address: 0x77, profile: bmp280, point: pressure}")+
		partsCap("pipe_temperature", "celsius", "{type: i2c, bus: i2c1, address: 0x18, profile: mcp9808}")+
		partsCap("supply_voltage", "volt", "{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0, full_scale_v: 4.096, data_rate_sps: 860}")+
		partsCap("shunt_millivolts", "millivolt", "{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: diff23, full_scale_v: 0.256, data_rate_sps: 860, scale: 1000}")+
		partsCap("soil_voltage", "volt", "{type: spi, bus: adc, profile: mcp3008, channel: 5, vref: 3.3}"))

	for _, c := range []struct {
		tool, unit string
		want, tol  float64
	}{
		// BMP280 datasheet §3.12: adc_T 519888 → 25.08 °C, adc_P 415148 →
		// 100653.27 Pa (its double-precision result; the 64-bit integer
		// formula lands within 0.02 Pa).
		{"read_air_temperature", "celsius", 25.08, 0},
		{"read_air_pressure", "hPa", 1006.5327, 0.0002},
		// BME280 §8.1, bme280_compensate_H_double with this trimming,
		// t_fine 128422 and adc_H 30000: 55.0007 %RH.
		{"read_air_humidity", "percent", 55.0007, 0.05},
		{"read_loft_pressure", "pascal", 100653.27, 0.02},
		{"read_pipe_temperature", "celsius", -7.25, 0},
		{"read_supply_voltage", "volt", 9876 * 0.000125, 1e-9},
		{"read_shunt_millivolts", "millivolt", 3994 * 0.0078125, 1e-9},
		{"read_soil_voltage", "volt", 620 * 3.3 / 1024, 1e-9},
	} {
		o := readPart(t, cs, c.tool)
		v, ok := o["value"].(float64)
		if !ok || math.Abs(v-c.want) > c.tol || o["quality"] != "good" || o["unit"] != c.unit {
			t.Errorf("%s: value %v quality %v unit %v, want %v (±%v) good %s (reason %v)", c.tool, o["value"], o["quality"], o["unit"], c.want, c.tol, c.unit, o["reason"])
		}
	}
	if n := bme.Measurements(); n != 3 {
		t.Errorf("the BME280 ran %d forced measurements for 3 reads", n)
	}
	if s := adc.Starts(); len(s) != 2 || s[0] != 0xC3E3 || s[1] != 0xBBE3 {
		// OS=1, MUX 100 (AIN0/GND), PGA 001 (±4.096), single-shot, DR 111 (860 SPS),
		// comparator off; then MUX 011 (AIN2−AIN3), PGA 101 (±0.256).
		t.Errorf("ADS1115 config words % X, want C3E3 BBE3", s)
	}
	// The datasheet's f_CLK limit at 2.7 V is 1.35 MHz; SPI mode 0,0.
	if f, m := spiChip.Connected(); f > 1350*physic.KiloHertz || m != spi.Mode0 {
		t.Errorf("MCP3008 connected at %v mode %v, want ≤ 1.35 MHz, mode 0", f, m)
	}
}

// TestProfileFailuresOverMCP: a part that stops answering, a wrong part at
// the address, traffic the part would not give, an SPI chip that is not
// there, and an adapter that goes away are each a read answer of
// quality stale, degraded or error naming the device, never a value of
// quality good.
func TestProfileFailuresOverMCP(t *testing.T) {
	bme := bme280fake.New(0x76, bme280.ChipBME280, datasheetBME280)
	bme.SetRaw(bme280.Raw{T: 519888, P: 415148, H: 30000})
	// A TMP117 at 0x18? No: something that answers at 0x18 but reports
	// another manufacturer id (0x0054 is Microchip's).
	other := mcp9808fake.New(0x18)
	other.SetRegister(mcp9808.RegManufacturer, 0x1190)
	other.SetTemperature(21)
	bus := &partsBus{chips: map[uint16]i2c.Bus{0x76: bme, 0x18: other}, unplugged: map[uint16]bool{}}
	registerI2C(t, "parts-fail-a", bus)
	// The BMP280's playback is one read long: a second read finds the
	// recorded traffic used up, as a part that stopped answering.
	registerI2C(t, "parts-fail-b", &i2ctest.Playback{Ops: bmp280Playback(0x77), DontPanic: true})
	caseSensor := mcp9808fake.New(0x19)
	caseSensor.SetTemperature(21.5)
	usb := &partsBus{chips: map[uint16]i2c.Bus{0x19: caseSensor}, unplugged: map[uint16]bool{}}
	registerI2C(t, "parts-fail-usb", usb)
	spiChip := mcp3008fake.New(3.3)
	spiChip.SetAbsent(true)
	if err := spireg.Register("parts-fail-spi", nil, -1, func() (spi.PortCloser, error) { return spiChip, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spireg.Unregister("parts-fail-spi") })

	cs := partsSession(t, partsHeader+`buses:
  i2c1: {type: i2c, bus: parts-fail-a}
  i2c2: {type: i2c, bus: parts-fail-b}
  usb: {type: i2c, bus: parts-fail-usb, down_after: 10}
  adc: {type: spi, port: parts-fail-spi}
capabilities:
`+partsCap("air_temperature", "celsius", "{type: i2c, bus: i2c1, address: 0x76, profile: bme280, point: temperature}")+
		partsCap("pipe_temperature", "celsius", "{type: i2c, bus: i2c1, address: 0x18, profile: mcp9808}")+
		partsCap("loft_temperature", "celsius", "{type: i2c, bus: i2c2, address: 0x77, profile: bmp280, point: temperature}")+
		partsCap("supply_voltage", "volt", "{type: i2c, bus: i2c1, address: 0x48, profile: ads1115, point: ain0}")+
		partsCap("soil_voltage", "volt", "{type: spi, bus: adc, profile: mcp3008, channel: 5}")+
		partsCap("case_temperature", "celsius", "{type: i2c, bus: usb, address: 0x19, profile: mcp9808}"))

	notGood := func(tool, quality string, reason ...string) {
		t.Helper()
		o := readPart(t, cs, tool)
		r, _ := o["reason"].(string)
		if o["quality"] != quality {
			t.Errorf("%s: quality %v value %v, want %s (reason %q)", tool, o["quality"], o["value"], quality, r)
		}
		if o["quality"] == "error" && o["value"] != nil {
			t.Errorf("%s: quality error with value %v", tool, o["value"])
		}
		for _, w := range reason {
			if !strings.Contains(r, w) {
				t.Errorf("%s: reason %q lacks %q", tool, r, w)
			}
		}
	}

	// The BME280 answers, then stops acknowledging: the last value is
	// served as stale (never good), the reason names the part and address.
	if o := readPart(t, cs, "read_air_temperature"); o["quality"] != "good" || o["value"] != 25.08 {
		t.Fatalf("before unplugging: %v", o)
	}
	bus.unplug(0x76, true)
	notGood("read_air_temperature", "stale", "i2c i2c1 0x76 bme280 temperature", "no ACK")

	// Another part at an MCP9808's address: the id registers say so.
	notGood("read_pipe_temperature", "error", "0x18 mcp9808", "manufacturer id 0x1190", "wrong chip")
	// Nothing at 0x48.
	notGood("read_supply_voltage", "error", "i2c i2c1 0x48 ads1115 ain0", "no ACK")
	// The playback gives one good read, then fails.
	if o := readPart(t, cs, "read_loft_temperature"); o["quality"] != "good" || o["value"] != 25.08 {
		t.Fatalf("bmp280 playback: %v", o)
	}
	notGood("read_loft_temperature", "stale", "i2c i2c2 0x77 bmp280 temperature")
	// The adapter itself goes (a USB I²C bridge unplugged: the kernel
	// answers ENODEV and the name leaves the registry): the whole bus is
	// gone (the bus's health fails, so the node marks the device down and
	// serves the last value as degraded), and the next answer says what
	// to check.
	if o := readPart(t, cs, "read_case_temperature"); o["quality"] != "good" || o["value"] != 21.5 {
		t.Fatalf("before the adapter goes: %v", o)
	}
	usb.setGone()
	_ = i2creg.Unregister("parts-fail-usb")
	notGood("read_case_temperature", "degraded", "i2c usb 0x19 mcp9808 temperature", "no such device")
	notGood("read_case_temperature", "degraded", `i2c bus "parts-fail-usb"`, "is gone", "check the adapter")
	// No MCP3008 on the chip select: MISO floats high.
	notGood("read_soil_voltage", "error", "spi adc mcp3008 channel 5")
}

// TestScanI2CSkeletonOverMCP: the physd scan i2c engine sweeps a bus with
// a BME280, an MCP9808 and an ADS1115, and a node started on the skeleton
// it writes, untouched, answers each part's read_ tool over MCP with the
// datasheet's value and the skeleton's unit.
func TestScanI2CSkeletonOverMCP(t *testing.T) {
	bme := bme280fake.New(0x77, bme280.ChipBME280, datasheetBME280)
	bme.SetRaw(bme280.Raw{T: 519888, P: 415148, H: 30000})
	mcp98 := mcp9808fake.New(0x1C)
	mcp98.SetTemperature(4.0625)
	adc := ads1115fake.New(0x4A)
	adc.SetInput(1, 1.0)
	bus := &partsBus{chips: map[uint16]i2c.Bus{0x77: bme, 0x1C: mcp98, 0x4A: adc}, unplugged: map[uint16]bool{}}
	registerI2C(t, "parts-scan", bus)

	found := i2cdrv.Sweep(bus)
	if len(found) != 3 {
		t.Fatalf("sweep found %+v", found)
	}
	skel := string(i2cdrv.I2CSkeleton("parts-scan", "parts-scan", "physd scan i2c --bus parts-scan", found))
	cs := partsSession(t, skel)
	for _, c := range []struct {
		tool, unit string
		want, tol  float64
	}{
		{"read_x77_temperature", "celsius", 25.08, 0},
		{"read_x77_pressure", "pascal", 100653.27, 0.02},
		{"read_x77_humidity", "percent", 55.0007, 0.05},
		{"read_x1c_temperature", "celsius", 4.0625, 0},
		// The skeleton's full scale is ±4.096 V: 125 µV a code.
		{"read_x4a_ain1", "volt", 1.0, 0.000125},
	} {
		o := readPart(t, cs, c.tool)
		v, ok := o["value"].(float64)
		if !ok || math.Abs(v-c.want) > c.tol || o["quality"] != "good" || o["unit"] != c.unit {
			t.Errorf("%s: value %v quality %v unit %v, want %v (±%v) good %s (reason %v)", c.tool, o["value"], o["quality"], o["unit"], c.want, c.tol, c.unit, o["reason"])
		}
	}
}
