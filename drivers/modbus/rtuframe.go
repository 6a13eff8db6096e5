package modbus

import (
	"encoding/binary"
	"fmt"
)

// RTU framing: [unit][function][data…][crc lo][crc hi]. RTU has no length
// field and no transaction id, so the reader must know from the request how
// long the reply is, and must refuse anything that does not fit it exactly.

const (
	rtuMaxFrame     = 256
	rtuExceptionLen = 5
)

// crc16 is the Modbus CRC (polynomial 0xA001 reflected, initial 0xFFFF),
// sent low byte first.
func crc16(b []byte) uint16 {
	crc := uint16(0xFFFF)
	for _, x := range b {
		crc ^= uint16(x)
		for range 8 {
			if crc&1 != 0 {
				crc = crc>>1 ^ 0xA001
			} else {
				crc >>= 1
			}
		}
	}
	return crc
}

// appendCRC appends the CRC of frame to it.
func appendCRC(frame []byte) []byte {
	c := crc16(frame)
	return append(frame, byte(c), byte(c>>8))
}

// crcOK checks the CRC at the end of a whole frame.
func crcOK(frame []byte) bool {
	if len(frame) < 4 {
		return false
	}
	n := len(frame) - 2
	return binary.LittleEndian.Uint16(frame[n:]) == crc16(frame[:n])
}

// frameError is a reply that cannot be the answer to the request: wrong
// unit, wrong function, wrong length, bad CRC. The line must be flushed.
type frameError struct{ msg string }

func (e *frameError) Error() string { return "rtu frame: " + e.msg }

func frameErr(format string, args ...any) error { return &frameError{fmt.Sprintf(format, args...)} }

// rtuReplyLen returns the total length of the reply to req, judged from the
// first bytes got so far, or 0 when more bytes are needed to tell. It
// errors as soon as got cannot start a valid reply to req. Unlike goburrow
// v0.1.0 (which tests the request's function code with &0x80 instead of
// |0x80, so it never recognises an exception and leaves bytes behind), an
// exception reply is req's function with the top bit set.
func rtuReplyLen(req, got []byte) (int, error) {
	if len(req) < 4 {
		return 0, frameErr("request of %d bytes is too short", len(req))
	}
	if len(got) >= 1 && got[0] != req[0] {
		return 0, frameErr("reply from unit %d to a request for unit %d", got[0], req[0])
	}
	if len(got) < 2 {
		return 0, nil
	}
	fc := req[1]
	switch got[1] {
	case fc | 0x80:
		return rtuExceptionLen, nil
	case fc:
	default:
		return 0, frameErr("reply function %d to a request with function %d", got[1], fc)
	}
	switch fc {
	case 1, 2, 3, 4:
		if len(req) < 8 {
			return 0, frameErr("read request of %d bytes is too short", len(req))
		}
		q := int(binary.BigEndian.Uint16(req[4:6]))
		want := 2 * q
		if fc <= 2 {
			want = (q + 7) / 8
		}
		if len(got) < 3 {
			return 0, nil
		}
		if int(got[2]) != want {
			return 0, frameErr("reply carries %d data bytes, the request asked for %d", got[2], want)
		}
		return 3 + want + 2, nil
	case 5, 6, 15, 16:
		return 8, nil // echo of address and value/quantity
	case 43:
		return meiReplyLen(got)
	}
	return 0, frameErr("function %d is not supported over RTU here", fc)
}

// checkReply validates a complete reply frame against its request. Echo
// checks of writes are left to goburrow's client, which compares them.
func checkReply(req, frame []byte) error {
	n, err := rtuReplyLen(req, frame)
	if err != nil {
		return err
	}
	if n == 0 {
		return frameErr("reply of %d bytes is incomplete", len(frame))
	}
	if len(frame) != n {
		return frameErr("reply is %d bytes, want %d", len(frame), n)
	}
	if !crcOK(frame) {
		return frameErr("CRC mismatch")
	}
	return nil
}

// rtuExpectedLen is the length of a normal reply to req, for the time it
// takes on the wire (rtuMaxFrame when it cannot be told).
func rtuExpectedLen(req []byte) int {
	if len(req) >= 8 {
		switch req[1] {
		case 1, 2:
			return 5 + (int(binary.BigEndian.Uint16(req[4:6]))+7)/8
		case 3, 4:
			return 5 + 2*int(binary.BigEndian.Uint16(req[4:6]))
		case 5, 6, 8, 15, 16:
			return 8
		}
	}
	return rtuMaxFrame
}

// probeReplyLen frames the reply to a re-synchronisation probe (function 8
// sub-function 0 to unit id): an 8-byte echo or a 5-byte exception 0x88.
// Anything else is a stray: a late reply to a real request, or noise.
func probeReplyLen(id byte, got []byte) (int, error) {
	if len(got) >= 1 && got[0] != id {
		return 0, frameErr("reply from unit %d to a probe of unit %d", got[0], id)
	}
	if len(got) < 2 {
		return 0, nil
	}
	switch got[1] {
	case 8:
		return 8, nil
	case 8 | 0x80:
		return rtuExceptionLen, nil
	}
	return 0, frameErr("reply function %d to a probe (function 8): a late reply", got[1])
}

// meiReplyLen frames a function 43 / MEI 14 (read device identification)
// reply: unit, 43, 14, read code, conformity, more follows, next object,
// number of objects, then per object its id, length and value; then CRC.
func meiReplyLen(got []byte) (int, error) {
	if len(got) < 8 {
		return 0, nil
	}
	if got[2] != 14 {
		return 0, frameErr("function 43 reply of MEI type %d, want 14", got[2])
	}
	p := 8
	for range int(got[7]) {
		if len(got) < p+2 {
			return 0, nil
		}
		p += 2 + int(got[p+1])
		if p+2 > rtuMaxFrame {
			return 0, frameErr("device identification reply exceeds %d bytes", rtuMaxFrame)
		}
	}
	return p + 2, nil
}
