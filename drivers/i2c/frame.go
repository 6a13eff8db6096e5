package i2c

import (
	"errors"
	"fmt"
)

// ErrCRC is wrapped by reads whose frame fails its checksum: the bytes are
// corrupt (noise, a half-finished measurement, a floating bus reading 0xFF),
// so no value is returned.
var ErrCRC = errors.New("i2c frame CRC mismatch")

// crc8 is the Sensirion CRC-8 (polynomial 0x31, init 0xFF, no reflection,
// no final XOR) used by SHT3x, SHT4x, SCD4x, SGP30 and others. The
// datasheet's check value is crc8(0xBE, 0xEF) == 0x92.
func crc8(b []byte) byte {
	crc := byte(0xFF)
	for _, x := range b {
		crc ^= x
		for range 8 {
			if crc&0x80 != 0 {
				crc = crc<<1 ^ 0x31
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// wordStride is the bytes per word in a frame: 2, plus 1 with a CRC.
func wordStride(withCRC bool) int {
	if withCRC {
		return 3
	}
	return 2
}

// decodeWords splits a command-style frame into 16-bit big-endian words.
// With withCRC every word is followed by its CRC-8, and every word is
// checked: one bad word means the whole frame is suspect.
func decodeWords(frame []byte, withCRC bool) ([]uint16, error) {
	stride := wordStride(withCRC)
	if len(frame) == 0 || len(frame)%stride != 0 {
		return nil, fmt.Errorf("frame of %d bytes is not a whole number of %d-byte words", len(frame), stride)
	}
	words := make([]uint16, 0, len(frame)/stride)
	for i := 0; i < len(frame); i += stride {
		w := frame[i : i+2]
		if withCRC {
			if got, want := frame[i+2], crc8(w); got != want {
				return nil, fmt.Errorf("word %d (% X): CRC 0x%02X, want 0x%02X: %w", i/stride, w, got, want, ErrCRC)
			}
		}
		words = append(words, uint16(w[0])<<8|uint16(w[1]))
	}
	return words, nil
}

// encodeWords is the inverse of decodeWords: the frame a device sends.
func encodeWords(words []uint16, withCRC bool) []byte {
	out := make([]byte, 0, len(words)*wordStride(withCRC))
	for _, w := range words {
		b := []byte{byte(w >> 8), byte(w)}
		out = append(out, b...)
		if withCRC {
			out = append(out, crc8(b))
		}
	}
	return out
}
