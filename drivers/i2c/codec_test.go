package i2c

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

func TestFormatDecode(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Format
		in   []byte
		raw  int64
		val  float64
	}{
		{"u8", Format{Width: 8, Scale: 1}, []byte{0xFF}, 255, 255},
		{"s8", Format{Width: 8, Signed: true, Scale: 1}, []byte{0xFF}, -1, -1},
		{"u16 big", Format{Width: 16, Scale: 1}, []byte{0x12, 0x34}, 0x1234, 0x1234},
		{"u16 little", Format{Width: 16, Little: true, Scale: 1}, []byte{0x34, 0x12}, 0x1234, 0x1234},
		{"s16 big", Format{Width: 16, Signed: true, Scale: 1}, []byte{0xFF, 0x38}, -200, -200},
		{"s16 little", Format{Width: 16, Signed: true, Little: true, Scale: 1}, []byte{0x38, 0xFF}, -200, -200},
		{"s16 max", Format{Width: 16, Signed: true, Scale: 1}, []byte{0x7F, 0xFF}, 32767, 32767},
		{"u24 little", Format{Width: 24, Little: true, Scale: 1}, []byte{0x01, 0x02, 0x03}, 0x030201, 0x030201},
		{"s24 min", Format{Width: 24, Signed: true, Scale: 1}, []byte{0x80, 0x00, 0x00}, -8388608, -8388608},
		{"u32 max", Format{Width: 32, Scale: 1}, []byte{0xFF, 0xFF, 0xFF, 0xFF}, 4294967295, 4294967295},
		{"s32 big", Format{Width: 32, Signed: true, Scale: 1}, []byte{0xFF, 0xFF, 0xFF, 0xFE}, -2, -2},
		{"s32 little", Format{Width: 32, Signed: true, Little: true, Scale: 1}, []byte{0xFE, 0xFF, 0xFF, 0xFF}, -2, -2},
		// TMP102: 12-bit left-justified two's complement, 0.0625 °C/LSB,
		// read as a signed 16-bit register with scale 0.0625/16.
		{"tmp102 +25", Format{Width: 16, Signed: true, Scale: 0.00390625}, []byte{0x19, 0x00}, 6400, 25},
		{"tmp102 -25", Format{Width: 16, Signed: true, Scale: 0.00390625}, []byte{0xE7, 0x00}, -6400, -25},
		{"offset", Format{Width: 8, Scale: 0.5, Offset: -40}, []byte{100}, 100, 10},
		{"negative scale", Format{Width: 8, Scale: -2, Offset: 10}, []byte{3}, 3, 4},
		{"sht3x T", Format{Width: 16, Scale: 175.0 / 65535, Offset: -45}, []byte{0x66, 0x66}, 0x6666, 25},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := tc.f.Raw(tc.in)
			if err != nil || raw != tc.raw {
				t.Fatalf("Raw(% X) = %d, %v; want %d", tc.in, raw, err, tc.raw)
			}
			v, err := tc.f.Value(tc.in)
			if err != nil || math.Abs(v-tc.val) > 1e-9 {
				t.Fatalf("Value(% X) = %v, %v; want %v", tc.in, v, err, tc.val)
			}
			// Inverse: the value maps back to the same raw and bytes.
			r2, got, err := tc.f.RawFor(tc.val)
			if err != nil || r2 != tc.raw || math.Abs(got-tc.val) > 1e-9 {
				t.Fatalf("RawFor(%v) = %d, %v, %v; want %d", tc.val, r2, got, err, tc.raw)
			}
			b, err := tc.f.Encode(r2)
			if err != nil || !bytes.Equal(b, tc.in) {
				t.Fatalf("Encode(%d) = % X, %v; want % X", r2, b, err, tc.in)
			}
		})
	}
}

func TestFormatErrors(t *testing.T) {
	u8 := Format{Width: 8, Scale: 1}
	s16 := Format{Width: 16, Signed: true, Scale: 1}
	if _, err := u8.Raw([]byte{1, 2}); err == nil {
		t.Error("Raw with 2 bytes for a u8 must fail")
	}
	if _, err := (Format{Width: 12, Scale: 1}).Raw([]byte{1, 2}); err == nil {
		t.Error("width 12 must fail")
	}
	if _, err := (Format{Width: 8}).Value([]byte{1}); err == nil {
		t.Error("scale 0 must fail")
	}
	for _, tc := range []struct {
		f Format
		v float64
	}{
		{u8, 256}, {u8, -1}, {u8, math.NaN()}, {u8, math.Inf(1)},
		{s16, 32768}, {s16, -32769},
		{Format{Width: 32, Scale: 1}, 1 << 32},
		{Format{Width: 16, Signed: true, Scale: 0.00390625}, 128}, // TMP102 tops out at 127.996
	} {
		if _, _, err := tc.f.RawFor(tc.v); !errors.Is(err, errNotRepresentable) {
			t.Errorf("RawFor(%v) with %+v: err = %v, want errNotRepresentable", tc.v, tc.f, err)
		}
	}
	if _, err := u8.Encode(256); !errors.Is(err, errNotRepresentable) {
		t.Errorf("Encode(256) u8: %v", err)
	}
	if lo, hi := (Format{Width: 16, Signed: true, Scale: 0.00390625}).ValueRange(); lo != -128 || hi != 127.99609375 {
		t.Errorf("TMP102 range = [%v, %v]", lo, hi)
	}
	if lo, hi := (Format{Width: 8, Scale: -1}).ValueRange(); lo != -255 || hi != 0 {
		t.Errorf("negative scale range = [%v, %v]", lo, hi)
	}
	// Rounding: the nearest raw wins, and the value it stands for is returned.
	if raw, got, err := (Format{Width: 16, Signed: true, Scale: 0.0625}).RawFor(21.3); err != nil || raw != 341 || got != 21.3125 {
		t.Errorf("RawFor(21.3) = %d, %v, %v", raw, got, err)
	}
}

func TestParseNumber(t *testing.T) {
	for in, want := range map[string]float64{
		"0.5": 0.5, "-45": -45, "0x10": 16, "175/65535": 175.0 / 65535, " 100 / 65535 ": 100.0 / 65535, "1e-3": 0.001, "-1/4": -0.25,
	} {
		if got, err := parseNumber(in); err != nil || got != want {
			t.Errorf("parseNumber(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "1/0", "1/", "/2", "NaN", "Inf", "1e999", "1/2/3"} {
		if got, err := parseNumber(in); err == nil {
			t.Errorf("parseNumber(%q) = %v, want an error", in, got)
		}
	}
}
