package i2c

import (
	"bytes"
	"errors"
	"slices"
	"testing"
)

func TestCRC8(t *testing.T) {
	// Check values from the SHT3x datasheet (§4.12) and a few more,
	// cross-checked against an independent implementation.
	if got := crc8([]byte{0xBE, 0xEF}); got != 0x92 {
		t.Fatalf("crc8(BE EF) = 0x%02X, want 0x92", got)
	}
	for _, in := range [][]byte{{0, 0}, {0xFF, 0xFF}, {0x66, 0x66}, {0x80, 0x00}, {}, {1, 2, 3, 4, 5}} {
		if got, want := crc8(in), sensirionCRC(in); got != want {
			t.Errorf("crc8(% X) = 0x%02X, independent = 0x%02X", in, got, want)
		}
	}
}

func TestDecodeWords(t *testing.T) {
	sht := []byte{0x66, 0x66, crc8([]byte{0x66, 0x66}), 0x80, 0x00, crc8([]byte{0x80, 0x00})}
	for _, tc := range []struct {
		name  string
		frame []byte
		crc   bool
		want  []uint16
		err   error // nil: any error is fine when want is nil
	}{
		{"sht3x", sht, true, []uint16{0x6666, 0x8000}, nil},
		{"no crc", []byte{0x01, 0x02, 0xA0, 0x0B}, false, []uint16{0x0102, 0xA00B}, nil},
		{"bad crc in 2nd word", append(slices.Clone(sht[:5]), sht[5]^0x80), true, nil, ErrCRC},
		{"floating bus", []byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, true, nil, ErrCRC},
		{"short", sht[:5], true, nil, nil},
		{"empty", nil, true, nil, nil},
		{"odd without crc", []byte{1, 2, 3}, false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeWords(tc.frame, tc.crc)
			if tc.want != nil {
				if err != nil || !slices.Equal(got, tc.want) {
					t.Fatalf("decodeWords = %04X, %v; want %04X", got, err, tc.want)
				}
				if enc := encodeWords(got, tc.crc); !bytes.Equal(enc, tc.frame) {
					t.Fatalf("encodeWords = % X, want % X", enc, tc.frame)
				}
				return
			}
			if err == nil {
				t.Fatalf("decodeWords(% X) = %04X, want an error", tc.frame, got)
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
		})
	}
}
