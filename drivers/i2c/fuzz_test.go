package i2c

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// FuzzDecodeRegister checks the register codec on arbitrary bytes and
// formats: decoding never panics, the raw integer is in range and encodes
// back to the same bytes, and for sane scales the value inverts to the
// same raw integer (what a write of a value just read must do).
func FuzzDecodeRegister(f *testing.F) {
	f.Add([]byte{0x19, 0x00}, uint8(1), true, false, 0.00390625, 0.0)
	f.Add([]byte{0xFF}, uint8(0), true, false, 1.0, 0.0)
	f.Add([]byte{0x01, 0x02, 0x03}, uint8(2), false, true, 0.5, -40.0)
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFE}, uint8(3), true, true, 175.0/65535, -45.0)
	f.Add([]byte{}, uint8(1), false, false, 1.0, 0.0)
	f.Fuzz(func(t *testing.T, data []byte, w uint8, signed, little bool, scale, offset float64) {
		fm := Format{Width: []int{8, 16, 24, 32}[w%4], Signed: signed, Little: little, Scale: scale, Offset: offset}
		if fm.check() != nil {
			if _, err := fm.Value(data); err == nil && len(data) == fm.Bytes() {
				t.Fatalf("Value accepted an unusable format %+v", fm)
			}
			return
		}
		n := fm.Bytes()
		raw, err := fm.Raw(data)
		if len(data) != n {
			if err == nil {
				t.Fatalf("Raw accepted %d bytes for width %d", len(data), fm.Width)
			}
			return
		}
		if err != nil {
			t.Fatalf("Raw(% X): %v", data, err)
		}
		if lo, hi := fm.rawRange(); raw < lo || raw > hi {
			t.Fatalf("raw %d outside %d..%d", raw, lo, hi)
		}
		enc, err := fm.Encode(raw)
		if err != nil || !bytes.Equal(enc, data) {
			t.Fatalf("Encode(%d) = % X, %v; want % X", raw, enc, err, data)
		}
		v, err := fm.Value(data)
		if err != nil {
			t.Fatalf("Value: %v", err)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return // a huge scale can overflow; the point reports it
		}
		if a := math.Abs(scale); a < 1e-6 || a > 1e6 || math.Abs(offset) > 1e6 {
			_, _, _ = fm.RawFor(v) // must not panic; precision is not promised
			return
		}
		r2, got, err := fm.RawFor(v)
		if err != nil || r2 != raw {
			t.Fatalf("RawFor(%v) = %d, %v; want %d (format %+v)", v, r2, err, raw, fm)
		}
		if math.Abs(got-v) > 1e-9*math.Max(1, math.Abs(v)) {
			t.Fatalf("RawFor(%v) stands for %v", v, got)
		}
	})
}

// FuzzSHT3xFrame checks frame decoding on arbitrary bytes: a frame is
// accepted exactly when it is whole words each with a valid CRC, an
// accepted frame re-encodes to itself, and words framed by encodeWords
// always decode.
func FuzzSHT3xFrame(f *testing.F) {
	f.Add([]byte{0x66, 0x66, 0x93, 0x80, 0x00, 0xA2})
	f.Add([]byte{0xBE, 0xEF, 0x92})
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Add([]byte{0x00, 0x00, 0x81, 0x00})
	f.Fuzz(func(t *testing.T, frame []byte) {
		words, err := decodeWords(frame, true)
		valid := len(frame) > 0 && len(frame)%3 == 0
		for i := 0; valid && i < len(frame); i += 3 {
			valid = sensirionCRC(frame[i:i+2]) == frame[i+2]
		}
		switch {
		case valid && err != nil:
			t.Fatalf("decodeWords(% X) rejected a valid frame: %v", frame, err)
		case !valid && err == nil:
			t.Fatalf("decodeWords(% X) accepted an invalid frame: %04X", frame, words)
		case err == nil && !bytes.Equal(encodeWords(words, true), frame):
			t.Fatalf("re-encoding %04X gives % X, want % X", words, encodeWords(words, true), frame)
		case err != nil && len(frame)%3 == 0 && len(frame) > 0 && !errors.Is(err, ErrCRC):
			t.Fatalf("a whole frame with a bad CRC must wrap ErrCRC: %v", err)
		}
		// Any words, framed properly, decode back.
		var ws []uint16
		for i := 0; i+1 < len(frame); i += 2 {
			ws = append(ws, uint16(frame[i])<<8|uint16(frame[i+1]))
		}
		if len(ws) == 0 {
			return
		}
		for _, withCRC := range []bool{true, false} {
			got, err := decodeWords(encodeWords(ws, withCRC), withCRC)
			if err != nil || len(got) != len(ws) {
				t.Fatalf("round trip of %04X (crc %v): %04X, %v", ws, withCRC, got, err)
			}
			for i := range ws {
				if got[i] != ws[i] {
					t.Fatalf("round trip of %04X (crc %v): %04X", ws, withCRC, got)
				}
			}
		}
	})
}
