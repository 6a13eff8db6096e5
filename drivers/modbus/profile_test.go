package modbus

import (
	"math"
	"strings"
	"testing"

	"github.com/physd/physd/drivers/modbus/modbustest"
)

// setFloat stores a float32 at an input address, high word first.
func setFloat(b *modbustest.Bank, unit byte, addr uint16, v float32) {
	u := math.Float32bits(v)
	b.SetInput(unit, addr, uint16(u>>16), uint16(u))
}

// TestProfileEnergyMeter: bindings that name the Eastron SDM120 profile
// read a Modbus TCP server serving the meter's documented register map
// (float32 input registers at 30001, 30007, 30013, 30071, 30343).
func TestProfileEnergyMeter(t *testing.T) {
	srv, bank := peer(t)
	setFloat(bank, 3, 0x0000, 231.4)
	setFloat(bank, 3, 0x0006, 5.25)
	setFloat(bank, 3, 0x000C, -1210.5)
	setFloat(bank, 3, 0x0046, 49.98)
	setFloat(bank, 3, 0x0156, 12345.6)
	b := openTCP(t, srv.Addr, "")
	for point, want := range map[string]float64{"voltage": 231.4, "current": 5.25, "active_power": -1210.5, "frequency": 49.98, "total_active_energy": 12345.6} {
		p := pointOn(t, b, `{data_type: float, binding: {type: modbus, unit: 3, profile: eastron_sdm120, point: `+point+`}}`)
		if got := readOK(t, p).(float64); got != float64(float32(want)) {
			t.Errorf("%s = %v, want %v", point, got, float32(want))
		}
	}
	// A scaled integer point of the drive profile: 0103 OUTPUT FREQ, 0.1 Hz.
	bank.SetHolding(1, 102, 487)
	p := pointOn(t, b, `{data_type: float, binding: {type: modbus, profile: abb_acs550, point: output_frequency}}`)
	if got := readOK(t, p).(float64); math.Abs(got-48.7) > 1e-9 {
		t.Errorf("output_frequency = %v, want 48.7", got)
	}
}

// TestProfileBindingErrors: a profile binding that names an unknown
// profile or point, restates a key the profile sets, or writes a
// read-only point is refused at file:line:col, naming the profile's
// points and the fix.
func TestProfileBindingErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{`{data_type: float, binding: {type: modbus, profile: sdm999, point: voltage}}`,
			`capabilities[0].binding.profile: no Modbus profile "sdm999"; the library has abb_acs550, eastron_sdm120, eastron_sdm630`},
		{`{data_type: float, binding: {type: modbus, profile: eastron_sdm120, point: volts}}`,
			`m.yml:1:76: capabilities[0].binding.point: profile eastron_sdm120 (Eastron SDM120-Modbus) has no point "volts"; fix: use one of its points: active_power, apparent_power, current, export_active_energy`},
		{`{data_type: float, binding: {type: modbus, profile: eastron_sdm120}}`, "profile eastron_sdm120 needs point:"},
		{`{data_type: float, binding: {type: modbus, point: voltage}}`, "binding.point: point: names a point of a device profile, but the binding has no profile:"},
		{`{data_type: float, binding: {type: modbus, profile: eastron_sdm120, point: voltage, data_type: int16}}`,
			"binding.data_type: data_type is set by profile eastron_sdm120 point voltage; fix: remove data_type:"},
		{`{data_type: float, binding: {type: modbus, profile: eastron_sdm120, point: voltage, scale: 2}}`, "binding.scale: scale is set by profile"},
		{`{data_type: float, binding: {type: modbus, profile: eastron_sdm120, point: voltage, address: "reg=30001"}}`, "the register is set by profile eastron_sdm120 point voltage (input 0)"},
		{`{kind: do, data_type: float, binding: {type: modbus, profile: abb_acs550, point: current}}`,
			"profile abb_acs550 point current is read-only (0104 CURRENT: motor current (40104)); fix: make the capability kind: read, or use a point the profile marks writable: control_word, reference_1, reference_2"},
		{`{kind: do, data_type: float, binding: {type: modbus, profile: eastron_sdm120, point: voltage}}`, "profile eastron_sdm120 has no writable points"},
		{`{data_type: bool, binding: {type: modbus, profile: eastron_sdm120, point: voltage}}`, "a float32 point cannot be a bool capability"},
	}
	for _, c := range cases {
		_, err := parseBinding(capFrom(t, c.src), TypeTCP)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err  %v\n  want %q", c.src, err, c.want)
		}
	}
	// A writable point takes the profile's encoding and the binding's unit.
	s, err := parseBinding(capFrom(t, `{kind: do, data_type: int, binding: {type: modbus, unit: 7, profile: abb_acs550, point: reference_1, write_function: 6}}`), TypeRTU)
	if err != nil || s.unit != 7 || s.table != tableHolding || s.addr != 1 || s.codec.dt != dtInt16 || s.writeFC != 6 {
		t.Fatalf("reference_1: %+v, %v", s, err)
	}
}
