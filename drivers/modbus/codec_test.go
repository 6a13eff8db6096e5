package modbus

import (
	"errors"
	"math"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

func TestDecodeTable(t *testing.T) {
	cases := []struct {
		dt    dataType
		order byteOrder
		bit   uint8
		regs  []uint16
		want  raw
	}{
		{dtFloat32, orderABCD, 0, []uint16{0x41AC, 0x0000}, raw{kind: rawFloat, f: 21.5}},
		{dtFloat32, orderCDAB, 0, []uint16{0x0000, 0x41AC}, raw{kind: rawFloat, f: 21.5}},
		{dtFloat32, orderBADC, 0, []uint16{0xAC41, 0x0000}, raw{kind: rawFloat, f: 21.5}},
		{dtFloat32, orderDCBA, 0, []uint16{0x0000, 0xAC41}, raw{kind: rawFloat, f: 21.5}},
		{dtInt16, orderABCD, 0, []uint16{0xFFFF}, raw{kind: rawInt, i: -1}},
		{dtInt16, orderBADC, 0, []uint16{0x0080}, raw{kind: rawInt, i: -32768}},
		{dtInt16, orderCDAB, 0, []uint16{0x0102}, raw{kind: rawInt, i: 0x0102}}, // word swap is moot for one word
		{dtUint16, orderABCD, 0, []uint16{0xFFFF}, raw{kind: rawUint, u: 65535}},
		{dtInt32, orderABCD, 0, []uint16{0xFFFF, 0xFFFE}, raw{kind: rawInt, i: -2}},
		{dtInt32, orderCDAB, 0, []uint16{0xFFFE, 0xFFFF}, raw{kind: rawInt, i: -2}},
		{dtUint32, orderDCBA, 0, []uint16{0x0403, 0x0201}, raw{kind: rawUint, u: 0x01020304}},
		{dtUint64, orderABCD, 0, []uint16{0x0102, 0x0304, 0x0506, 0x0708}, raw{kind: rawUint, u: 0x0102030405060708}},
		{dtUint64, orderCDAB, 0, []uint16{0x0708, 0x0506, 0x0304, 0x0102}, raw{kind: rawUint, u: 0x0102030405060708}},
		{dtUint64, orderBADC, 0, []uint16{0x0201, 0x0403, 0x0605, 0x0807}, raw{kind: rawUint, u: 0x0102030405060708}},
		{dtUint64, orderDCBA, 0, []uint16{0x0807, 0x0605, 0x0403, 0x0201}, raw{kind: rawUint, u: 0x0102030405060708}},
		{dtInt64, orderABCD, 0, []uint16{0x8000, 0, 0, 0}, raw{kind: rawInt, i: math.MinInt64}},
		{dtFloat64, orderABCD, 0, []uint16{0x4035, 0x8000, 0, 0}, raw{kind: rawFloat, f: 21.5}},
		{dtFloat64, orderDCBA, 0, []uint16{0, 0, 0x0080, 0x3540}, raw{kind: rawFloat, f: 21.5}},
		{dtBit, orderABCD, 0, []uint16{0x0001}, raw{kind: rawBool, b: true}},
		{dtBit, orderABCD, 15, []uint16{0x8000}, raw{kind: rawBool, b: true}},
		{dtBit, orderABCD, 14, []uint16{0x8000}, raw{kind: rawBool, b: false}},
		{dtBit, orderBADC, 8, []uint16{0x0001}, raw{kind: rawBool, b: true}},
		{dtBool, orderABCD, 0, []uint16{0x0100}, raw{kind: rawBool, b: true}},
		{dtBool, orderABCD, 0, []uint16{0}, raw{kind: rawBool, b: false}},
	}
	for _, c := range cases {
		cd := regCodec{dt: c.dt, order: c.order, bit: c.bit}
		got, err := cd.decode(c.regs)
		if err != nil || got != c.want {
			t.Errorf("%s %s bit %d %04x: got %+v, %v; want %+v", c.dt, c.order, c.bit, c.regs, got, err, c.want)
			continue
		}
		if c.dt == dtBit || (c.dt == dtBool && c.regs[0] > 1) {
			continue // not a whole-register round trip
		}
		back, err := cd.encode(got)
		if err != nil || len(back) != len(c.regs) {
			t.Errorf("%s %s: encode(%+v) = %04x, %v", c.dt, c.order, got, back, err)
			continue
		}
		for i := range back {
			if back[i] != c.regs[i] {
				t.Errorf("%s %s: encode(%+v) = %04x, want %04x", c.dt, c.order, got, back, c.regs)
				break
			}
		}
	}
	if _, err := (regCodec{dt: dtInt32}).decode([]uint16{1}); err == nil {
		t.Error("decode of a short register slice must fail")
	}
	if _, err := (regCodec{dt: dtInt16}).encode(raw{kind: rawInt, i: 40000}); err == nil {
		t.Error("encode must refuse an out-of-range value")
	}
}

func TestConvRead(t *testing.T) {
	f := &conv{capType: manifest.TypeFloat, dt: dtInt16, scale: 0.1, offset: -40}
	if v, _ := f.toValue(raw{kind: rawInt, i: 615}); v != 21.5 {
		t.Errorf("615*0.1-40 = %v", v)
	}
	i := &conv{capType: manifest.TypeInt, dt: dtUint64, scale: 1}
	if _, err := i.toValue(raw{kind: rawUint, u: math.MaxUint64}); err == nil {
		t.Error("a uint64 beyond int64 must not read as an int")
	}
	i10 := &conv{capType: manifest.TypeInt, dt: dtInt32, scale: 10, offset: 5}
	if v, _ := i10.toValue(raw{kind: rawInt, i: -3}); v != int64(-25) {
		t.Errorf("int scaled = %v", v)
	}
	nan := &conv{capType: manifest.TypeFloat, dt: dtFloat32, scale: 1}
	if _, err := nan.toValue(raw{kind: rawFloat, f: math.NaN()}); err == nil {
		t.Error("NaN from the device must be an error")
	}
	b := &conv{capType: manifest.TypeBool, dt: dtInt16, scale: 1}
	if v, _ := b.toValue(raw{kind: rawInt, i: -7}); v != true {
		t.Error("non-zero register must be true")
	}
}

func TestConvWrite(t *testing.T) {
	cases := []struct {
		c    conv
		v    any
		want raw
		bad  string // non-empty: refused, message contains it
	}{
		{conv{capType: "float", dt: dtInt16, scale: 0.1, offset: -40}, 21.5, raw{kind: rawInt, i: 615}, ""},
		{conv{capType: "float", dt: dtInt16, scale: 0.1}, 0.3, raw{kind: rawInt, i: 3}, ""}, // 0.3/0.1 = 2.9999999999999996
		{conv{capType: "float", dt: dtInt16, scale: 0.1}, 21.55, raw{}, "whole numbers"},
		{conv{capType: "float", dt: dtUint16, scale: 1}, -1.0, raw{}, "outside the range"},
		{conv{capType: "float", dt: dtUint16, scale: 1}, 65535.0, raw{kind: rawUint, u: 65535}, ""},
		{conv{capType: "float", dt: dtUint16, scale: 1}, 65536.0, raw{}, "outside the range"},
		{conv{capType: "float", dt: dtInt64, scale: 1}, 9.3e18, raw{}, "outside the range"},
		{conv{capType: "float", dt: dtFloat32, scale: 1}, 1e39, raw{}, "float32"},
		{conv{capType: "float", dt: dtFloat32, scale: 1}, 1e-50, raw{}, "float32"},
		{conv{capType: "float", dt: dtFloat32, scale: 1}, 21.1, raw{kind: rawFloat, f: float64(float32(21.1))}, ""},
		{conv{capType: "float", dt: dtFloat64, scale: 2}, 5.0, raw{kind: rawFloat, f: 2.5}, ""},
		{conv{capType: "float", dt: dtInt16, scale: 1}, math.Inf(1), raw{}, "finite"},
		{conv{capType: "int", dt: dtInt64, scale: 1}, int64(math.MinInt64), raw{kind: rawInt, i: math.MinInt64}, ""},
		{conv{capType: "int", dt: dtUint64, scale: 1}, int64(math.MaxInt64), raw{kind: rawUint, u: math.MaxInt64}, ""},
		{conv{capType: "int", dt: dtUint64, scale: 1}, int64(-1), raw{}, "outside the range"},
		{conv{capType: "int", dt: dtInt16, scale: 10, offset: 5}, int64(25), raw{kind: rawInt, i: 2}, ""},
		{conv{capType: "int", dt: dtInt16, scale: 10}, int64(25), raw{}, "not reachable"},
		{conv{capType: "int", dt: dtInt16, scale: 1}, 2.5, raw{}, "integer"},
		{conv{capType: "bool", dt: dtUint16, scale: 1}, true, raw{kind: rawUint, u: 1}, ""},
		{conv{capType: "bool", dt: dtBool, scale: 1}, false, raw{kind: rawBool}, ""},
		{conv{capType: "bool", dt: dtBool, scale: 1}, 1.0, raw{}, "want a bool"},
		{conv{capType: "enum", dt: dtInt16, scale: 1, enumByName: map[string]int64{"on": 1}}, "on", raw{kind: rawInt, i: 1}, ""},
		{conv{capType: "enum", dt: dtInt16, scale: 1, enumByName: map[string]int64{"on": 1}}, "off", raw{}, "not one of"},
		{conv{capType: "enum", dt: dtUint16, scale: 1, enumByName: map[string]int64{"neg": -1}}, "neg", raw{}, "outside the range"},
	}
	for _, c := range cases {
		got, err := c.c.toRaw(c.v)
		if c.bad != "" {
			if !errors.Is(err, drivers.ErrBadValue) {
				t.Errorf("%s→%s %v: err %v, want ErrBadValue", c.c.capType, c.c.dt, c.v, err)
			} else {
				mustContain(t, err, c.bad)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s→%s %v: got %+v, %v; want %+v", c.c.capType, c.c.dt, c.v, got, err, c.want)
		}
	}
}
