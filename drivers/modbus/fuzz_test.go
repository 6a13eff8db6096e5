package modbus

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/manifest"
)

// FuzzDecode runs the register decoders over every type and byte order:
// decoding never fails on the right number of registers, and encoding the
// result gives back the same registers (the wire layout is lossless), also
// through the capability conversion.
func FuzzDecode(f *testing.F) {
	f.Add(uint8(8), uint8(1), uint8(0), []byte{0x00, 0x00, 0x41, 0xAC})
	f.Add(uint8(6), uint8(3), uint8(0), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(uint8(1), uint8(2), uint8(9), []byte{0x02, 0x00})
	f.Fuzz(func(t *testing.T, dtIdx, ord, bit uint8, data []byte) {
		dt := dataTypes[int(dtIdx)%len(dataTypes)].dt
		cd := regCodec{dt: dt, order: byteOrder(ord % 4), bit: bit % 16}
		buf := make([]byte, 2*dt.words())
		copy(buf, data)
		regs := registersFromBytes(buf)
		r, err := cd.decode(regs)
		if err != nil {
			t.Fatalf("%s %s: decode(%04x): %v", dt, cd.order, regs, err)
		}
		if dt == dtBit || dt == dtBool {
			if r.kind != rawBool {
				t.Fatalf("%s gave %+v", dt, r)
			}
			return
		}
		if r.kind == rawFloat && math.IsNaN(r.f) {
			return // NaN payloads need not survive float32<->float64
		}
		back, err := cd.encode(r)
		if err != nil || !bytes.Equal(registersToBytes(back), buf) {
			t.Fatalf("%s %s: %04x -> %+v -> %04x, %v", dt, cd.order, regs, r, back, err)
		}
		capType := manifest.TypeInt
		if dt.isFloat() {
			capType = manifest.TypeFloat
		}
		cv := &conv{capType: capType, dt: dt, scale: 1}
		v, err := cv.toValue(r)
		if err != nil {
			return // a uint64 beyond int64, an infinity: refused on read
		}
		r2, err := cv.toRaw(v)
		if err != nil {
			t.Fatalf("%s: value %v read from the device cannot be written back: %v", dt, v, err)
		}
		again, err := cd.encode(r2)
		if err != nil {
			t.Fatalf("%s: %04x -> %v: %v", dt, regs, v, err)
		}
		// Equal as numbers: -0 reads as 0 (value = raw*scale + offset).
		if r3, _ := cd.decode(again); r3 != r && !(r.kind == rawFloat && r3.f == r.f) {
			t.Fatalf("%s: %04x -> %v -> %04x", dt, regs, v, again)
		}
	})
}

// FuzzRTUFrame feeds the RTU reply framer arbitrary request/reply bytes.
// It must never panic, must judge a reply's length the same way however
// the bytes are split, and must accept only frames that fit the request
// (unit, function, length, CRC). Valid replies built from the fuzz input
// must be accepted.
func FuzzRTUFrame(f *testing.F) {
	req := appendCRC([]byte{1, 3, 0, 0, 0, 2})
	f.Add(req, appendCRC([]byte{1, 3, 4, 0, 1, 0, 2}), uint8(3), uint16(2))
	f.Add(req, appendCRC([]byte{1, 0x83, 2}), uint8(1), uint16(1))
	f.Add(appendCRC([]byte{7, 1, 0, 3, 0, 10}), appendCRC([]byte{7, 1, 2, 0xff, 0x03}), uint8(2), uint16(17))
	f.Add(appendCRC([]byte{2, 16, 0, 1, 0, 1, 2, 0, 5}), appendCRC([]byte{2, 16, 0, 1, 0, 1}), uint8(4), uint16(125))
	f.Fuzz(func(t *testing.T, req, reply []byte, fc uint8, qty uint16) {
		// Arbitrary bytes.
		first := 0
		for k := 0; k <= len(reply); k++ {
			n, err := rtuReplyLen(req, reply[:k])
			if err != nil {
				break
			}
			if first == 0 {
				first = n
			} else if n != first {
				t.Fatalf("length judged %d after %d bytes, %d before", n, k, first)
			}
		}
		if checkReply(req, reply) == nil {
			if !crcOK(reply) || reply[0] != req[0] || (reply[1] != req[1] && reply[1] != req[1]|0x80) {
				t.Fatalf("accepted % x as the reply to % x", reply, req)
			}
			if modbustest.CRC(reply[:len(reply)-2]) != binary.LittleEndian.Uint16(reply[len(reply)-2:]) {
				t.Fatal("CRC disagrees with the independent implementation")
			}
		}
		// A well-formed read and its reply, built from the input.
		fc = fc%4 + 1
		q := int(qty)%125 + 1
		nbytes := 2 * q
		if fc <= 2 {
			q = int(qty)%2000 + 1
			nbytes = (q + 7) / 8
		}
		unit := byte(1)
		if len(req) > 0 {
			unit = req[0]
		}
		r := appendCRC(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint16([]byte{unit, fc}, 0), uint16(q)))
		payload := make([]byte, nbytes)
		copy(payload, reply)
		good := appendCRC(append([]byte{unit, fc, byte(nbytes)}, payload...))
		if err := checkReply(r, good); err != nil {
			t.Fatalf("refused a valid reply % x to % x: %v", good, r, err)
		}
		exc := appendCRC([]byte{unit, fc | 0x80, 2})
		if err := checkReply(r, exc); err != nil {
			t.Fatalf("refused an exception reply: %v", err)
		}
		if len(reply) > 0 {
			bad := append([]byte(nil), good...)
			bad[int(qty)%len(bad)] ^= 1 << (fc % 8)
			if checkReply(r, bad) == nil {
				t.Fatalf("accepted a corrupted reply % x", bad)
			}
		}
	})
}

// FuzzAddress: the address parser never panics, and a Modicon reference it
// accepts names the register ref() prints.
func FuzzAddress(f *testing.F) {
	for _, s := range []string{"17", "0x11", "slave=1:reg=40001:type=holding", "reg=400001", "unit=3:addr=5:table=input", "reg=30010", "slave=1:reg"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := parseAddress(s)
		if err != nil || a.modicon == "" {
			return
		}
		back := fmt.Sprintf("reg=%d%0*d", a.table.modicon(), len(a.modicon)-1, int(*a.addr)+1)
		b, err := parseAddress(back)
		if err != nil || *b.table != *a.table || *b.addr != *a.addr {
			t.Fatalf("%q -> %s %d -> %q -> %v", s, *a.table, *a.addr, back, err)
		}
	})
}
