package modbus

import (
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	type want struct {
		unit  int // -1: not given
		table table
		addr  int
	}
	ok := []struct {
		in string
		want
	}{
		{"17", want{-1, 0, 17}},
		{"0x11", want{-1, 0, 17}},
		{"010", want{-1, 0, 10}}, // not octal
		{"slave=1:reg=40001:type=holding", want{1, tableHolding, 0}},
		{"slave=1:reg=40001", want{1, tableHolding, 0}},
		{"reg=400001", want{-1, tableHolding, 0}},
		{"reg=465536", want{-1, tableHolding, 65535}},
		{"reg=49999", want{-1, tableHolding, 9998}},
		{"reg=00001", want{-1, tableCoil, 0}},
		{"reg=10001", want{-1, tableDiscrete, 0}},
		{"reg=30010", want{-1, tableInput, 9}},
		{"unit=3:addr=5:table=input", want{3, tableInput, 5}},
		{" slave = 2 : addr = 0x10 : type = coils ", want{2, tableCoil, 16}},
	}
	for _, c := range ok {
		a, err := parseAddress(c.in)
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		got := want{-1, 0, -1}
		if a.unit != nil {
			got.unit = *a.unit
		}
		if a.table != nil {
			got.table = *a.table
		}
		if a.addr != nil {
			got.addr = int(*a.addr)
		}
		if got != c.want {
			t.Errorf("%q = %+v, want %+v", c.in, got, c.want)
		}
	}
	bad := []struct{ in, msg string }{
		{"reg=40000", "1-based"},
		{"reg=20001", "starts with 0 (coil)"},
		{"reg=4001", "5- or 6-digit"},
		{"reg=465537", "1..65536"},
		{"reg=4x001", "digits only"},
		{"reg=40001:type=coil", "disagrees"},
		{"type=coil:reg=40001", "coil"},
		{"reg=40001:addr=0", "not both"},
		{"slave=1:unit=2", "twice"},
		{"foo=1", "unknown key"},
		{"slave=300:reg=40001", "above the maximum 255"},
		{"70000", "above the maximum 65535"},
		{"slave=1:reg", "key=value"},
		{"type=register:addr=1", "unknown table"},
		{"forty", "neither"},
	}
	for _, c := range bad {
		_, err := parseAddress(c.in)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%q: err %v, want one containing %q", c.in, err, c.msg)
		}
	}
}

func TestBindingOK(t *testing.T) {
	cases := []struct {
		bus, src string
		unit     byte
		table    table
		addr     uint16
		dt       dataType
		fc       byte
	}{
		{TypeTCP, `{kind: do, data_type: float, binding: {type: modbus, address: "slave=1:reg=40001:type=holding", data_type: int16, scale: 0.1}}`, 1, tableHolding, 0, dtInt16, 6},
		{TypeTCP, `{kind: do, data_type: float, binding: {type: modbus, unit: 0, table: holding, address: 10, data_type: float32, byte_order: CDAB}}`, 0, tableHolding, 10, dtFloat32, 16},
		{TypeTCP, `{kind: do, data_type: int, binding: {type: modbus, table: holding, address: 10, data_type: uint16, write_function: 16}}`, 1, tableHolding, 10, dtUint16, 16},
		{TypeTCP, `{kind: do, data_type: bool, binding: {type: modbus, address: "reg=00005"}}`, 1, tableCoil, 4, dtBool, 5},
		{TypeTCP, `{kind: do, data_type: bool, binding: {type: modbus, table: holding, address: 3, bit: 7}}`, 1, tableHolding, 3, dtBit, 6},
		{TypeTCP, `{data_type: enum, enum_values: [a, b], binding: {type: modbus, table: input, address: 3}}`, 1, tableInput, 3, dtUint16, 0},
		{TypeRTU, `{data_type: bool, binding: {type: modbus, address: "slave=7:reg=10001"}}`, 7, tableDiscrete, 0, dtBool, 0},
		{TypeRTU, `{data_type: float, binding: {type: modbus, unit: 7, address: "slave=7:addr=0x20:type=input", data_type: float64}}`, 7, tableInput, 32, dtFloat64, 0},
	}
	for _, c := range cases {
		s, err := parseBinding(capFrom(t, c.src), c.bus)
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		if s.unit != c.unit || s.table != c.table || s.addr != c.addr || s.codec.dt != c.dt || s.writeFC != c.fc {
			t.Errorf("%s: got unit %d %s %d %s fc %d", c.src, s.unit, s.table, s.addr, s.codec.dt, s.writeFC)
		}
	}
}

func TestBindingErrors(t *testing.T) {
	cases := []struct{ bus, src, want string }{
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: 5, data_type: int16}}`, "does not say which table"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001", table: input, data_type: int16}}`, "binding.table: table: input disagrees with the address, which names a holding"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "slave=1:reg=40001", unit: 2, data_type: int16}}`, "unit: 2 disagrees with slave=1"},
		{TypeRTU, `{data_type: float, binding: {type: modbus, address: "reg=40001", data_type: int16}}`, "needs its unit"},
		{TypeRTU, `{data_type: float, binding: {type: modbus, unit: 248, address: "reg=40001", data_type: int16}}`, "outside 1..247"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001"}}`, "binding.data_type: a register binding needs data_type"},
		{TypeTCP, `{data_type: bool, binding: {type: modbus, address: "reg=40001", bit: 16}}`, "bit must be 0..15"},
		{TypeTCP, `{data_type: bool, binding: {type: modbus, address: "reg=40001", data_type: int16, bit: 3}}`, "bit: applies to data_type bit"},
		{TypeTCP, `{data_type: bool, binding: {type: modbus, address: "reg=40001", data_type: bit}}`, "needs bit:"},
		{TypeTCP, `{data_type: int, binding: {type: modbus, address: "reg=00001", data_type: int16}}`, "a coil holds one bit"},
		{TypeTCP, `{kind: do, data_type: float, binding: {type: modbus, address: "reg=30001", data_type: int16}}`, "a input is read-only"},
		{TypeTCP, `{kind: do, data_type: float, binding: {type: modbus, address: "reg=40001", data_type: float32, write_function: 6}}`, "write_function 6 writes one register"},
		{TypeTCP, `{kind: do, data_type: bool, binding: {type: modbus, address: "reg=00001", write_function: 6}}`, "cannot write a coil"},
		{TypeTCP, `{data_type: int, binding: {type: modbus, address: "reg=40001", data_type: int16, write_function: 16}}`, "applies to do capabilities only"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=00001"}}`, "capabilities[0].data_type: a bool point cannot be a float capability"},
		{TypeTCP, `{data_type: int, binding: {type: modbus, address: "reg=40001", data_type: int16, scale: 0.1}}`, "whole-number scale"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001", data_type: int16, scale: 0}}`, "finite non-zero"},
		{TypeTCP, `{data_type: bool, binding: {type: modbus, address: "reg=40001", data_type: int16, offset: 1}}`, "do not apply to a bool"},
		{TypeTCP, `{data_type: string, binding: {type: modbus, address: "reg=40001", data_type: int16}}`, "not supported on modbus"},
		{TypeTCP, `{data_type: enum, enum_values: [a, b], binding: {type: modbus, address: "reg=40001", enum_map: {a: 1}}}`, `no code for enum value "b"`},
		{TypeTCP, `{data_type: enum, enum_values: [a, b], binding: {type: modbus, address: "reg=40001", enum_map: {a: 1, b: 1}}}`, "the same code 1"},
		{TypeTCP, `{data_type: enum, enum_values: [a], binding: {type: modbus, address: "reg=40001", enum_map: {a: 1, c: 2}}}`, `names "c"`},
		{TypeTCP, `{data_type: int, binding: {type: modbus, address: "reg=465535", data_type: int64}}`, "runs past the last address"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001", data_type: int16, byte_order: XYZW}}`, "unknown byte_order"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001", data_type: int32, word_order: CDAB}}`, "did you mean byte_order: CDAB"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=40001", data_type: int17}}`, "unknown data_type"},
		{TypeTCP, `{data_type: float, binding: {type: i2c, address: "reg=40001"}}`, "bindings of type modbus"},
		{TypeTCP, `{data_type: float, binding: {type: modbus, address: "reg=4000"}}`, "binding.address: reg=4000"},
	}
	for _, c := range cases {
		_, err := parseBinding(capFrom(t, c.src), c.bus)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err  %v\n  want %q", c.src, err, c.want)
		}
	}
}

// Errors carry file:line:col of the offending key's value, and strict
// decoding names unknown keys with a suggestion.
func TestBindingErrorPositions(t *testing.T) {
	c := capFrom(t, `name: t
kind: read
data_type: bool
binding:
  type: modbus
  address: "reg=40001"
  bit: 16
`)
	_, err := parseBinding(c, TypeTCP)
	mustContain(t, err, "m.yml:7:8: capabilities[0].binding.bit: bit must be 0..15")
	c = capFrom(t, `{name: t, data_type: float, binding: {type: modbus, address: "reg=40001", data_typ: int16}}`)
	_, err = parseBinding(c, TypeTCP)
	mustContain(t, err, "m.yml:1:", `unknown key "data_typ"`, `did you mean "data_type"`)
}
