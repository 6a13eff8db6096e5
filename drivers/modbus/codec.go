package modbus

import (
	"fmt"
	"math"
	"strings"
)

// dataType is how a point's registers encode its raw value (binding key
// data_type). It says nothing about scale, offset or the capability's own
// data_type; value.go maps between the two.
type dataType uint8

const (
	dtBool    dataType = iota + 1 // a coil or discrete input; on a register: non-zero is true
	dtBit                         // one bit (bit: 0..15) of a 16-bit register
	dtInt16                       // 1 register, two's complement
	dtUint16                      // 1 register
	dtInt32                       // 2 registers
	dtUint32                      // 2 registers
	dtInt64                       // 4 registers
	dtUint64                      // 4 registers
	dtFloat32                     // 2 registers, IEEE 754
	dtFloat64                     // 4 registers, IEEE 754
)

var dataTypes = []struct {
	name string
	dt   dataType
}{
	{"bool", dtBool}, {"bit", dtBit},
	{"int16", dtInt16}, {"uint16", dtUint16},
	{"int32", dtInt32}, {"uint32", dtUint32},
	{"int64", dtInt64}, {"uint64", dtUint64},
	{"float32", dtFloat32}, {"float64", dtFloat64},
}

func dataTypeNames() []string {
	out := make([]string, len(dataTypes))
	for i, d := range dataTypes {
		out[i] = d.name
	}
	return out
}

func parseDataType(s string) (dataType, bool) {
	for _, d := range dataTypes {
		if d.name == s {
			return d.dt, true
		}
	}
	return 0, false
}

func (d dataType) String() string {
	for _, x := range dataTypes {
		if x.dt == d {
			return x.name
		}
	}
	return fmt.Sprintf("dataType(%d)", uint8(d))
}

// words is the number of 16-bit registers the type occupies.
func (d dataType) words() int {
	switch d {
	case dtInt32, dtUint32, dtFloat32:
		return 2
	case dtInt64, dtUint64, dtFloat64:
		return 4
	}
	return 1
}

func (d dataType) isFloat() bool { return d == dtFloat32 || d == dtFloat64 }
func (d dataType) isInt() bool   { return d >= dtInt16 && d <= dtUint64 }

// signed reports whether an integer type is two's complement.
func (d dataType) signed() bool {
	return d == dtInt16 || d == dtInt32 || d == dtInt64
}

func (d dataType) bits() uint { return uint(16 * d.words()) }

// byteOrder is the order of the bytes of a multi-register value on the wire,
// in the vocabulary Telegraf and most device manuals use: the value's bytes
// most significant first are A B C D (E F G H for 64-bit types), and the
// name spells the order they arrive in. ABCD is the Modbus standard (big
// endian, high word first); CDAB swaps the words; BADC swaps the bytes in
// each word; DCBA does both. A 16-bit value is AB: only the byte swap
// applies. For 64-bit values the same two swaps generalise (CDAB reverses
// the four words, BADC swaps within each word).
type byteOrder uint8

const (
	orderABCD byteOrder = iota
	orderCDAB
	orderBADC
	orderDCBA
)

var orderNames = []string{"ABCD", "CDAB", "BADC", "DCBA"}

func parseOrder(s string) (byteOrder, bool) {
	for i, n := range orderNames {
		if strings.EqualFold(s, n) {
			return byteOrder(i), true
		}
	}
	return 0, false
}

func (o byteOrder) String() string {
	if int(o) < len(orderNames) {
		return orderNames[o]
	}
	return fmt.Sprintf("byteOrder(%d)", uint8(o))
}

func (o byteOrder) swapBytes() bool { return o == orderBADC || o == orderDCBA }
func (o byteOrder) swapWords() bool { return o == orderCDAB || o == orderDCBA }

// canonical converts registers as they came off the wire into ABCD order
// (most significant word first, each word big endian), or back: the
// transformation is its own inverse. It never modifies regs.
func (o byteOrder) canonical(regs []uint16) []uint16 {
	out := make([]uint16, len(regs))
	n := len(regs)
	for i, r := range regs {
		if o.swapBytes() {
			r = r<<8 | r>>8
		}
		if o.swapWords() {
			out[n-1-i] = r
		} else {
			out[i] = r
		}
	}
	return out
}

// rawKind tells which field of a raw holds the value.
type rawKind uint8

const (
	rawBool rawKind = iota + 1
	rawInt
	rawUint
	rawFloat
)

// raw is a register value decoded by its dataType, before scale and offset.
type raw struct {
	kind rawKind
	b    bool
	i    int64
	u    uint64
	f    float64
}

func (r raw) String() string {
	switch r.kind {
	case rawBool:
		return fmt.Sprint(r.b)
	case rawInt:
		return fmt.Sprint(r.i)
	case rawUint:
		return fmt.Sprint(r.u)
	case rawFloat:
		return fmt.Sprint(r.f)
	}
	return "?"
}

// regCodec decodes and encodes one point's registers.
type regCodec struct {
	dt    dataType
	order byteOrder
	bit   uint8 // dtBit: 0 (least significant) .. 15
}

// decode turns the point's registers, as read from the wire, into its raw
// value. len(regs) must be c.dt.words().
func (c regCodec) decode(regs []uint16) (raw, error) {
	if len(regs) != c.dt.words() {
		return raw{}, fmt.Errorf("%s needs %d register(s), got %d", c.dt, c.dt.words(), len(regs))
	}
	w := c.order.canonical(regs)
	var u uint64
	for _, r := range w {
		u = u<<16 | uint64(r)
	}
	switch c.dt {
	case dtBool:
		return raw{kind: rawBool, b: u != 0}, nil
	case dtBit:
		return raw{kind: rawBool, b: u>>c.bit&1 == 1}, nil
	case dtInt16:
		return raw{kind: rawInt, i: int64(int16(u))}, nil
	case dtInt32:
		return raw{kind: rawInt, i: int64(int32(u))}, nil
	case dtInt64:
		return raw{kind: rawInt, i: int64(u)}, nil
	case dtUint16, dtUint32, dtUint64:
		return raw{kind: rawUint, u: u}, nil
	case dtFloat32:
		return raw{kind: rawFloat, f: float64(math.Float32frombits(uint32(u)))}, nil
	case dtFloat64:
		return raw{kind: rawFloat, f: math.Float64frombits(u)}, nil
	}
	return raw{}, fmt.Errorf("unknown data type %d", c.dt)
}

// encode turns a raw value into registers in wire order. The raw value must
// already be in range for the type (value.go checks); encode reports a
// mismatch of kinds as an error rather than truncating. dtBit is written by
// read-modify-write in the worker, not here.
func (c regCodec) encode(r raw) ([]uint16, error) {
	var u uint64
	switch c.dt {
	case dtBool:
		if r.kind != rawBool {
			return nil, fmt.Errorf("bool register needs a bool, got %s", r)
		}
		if r.b {
			u = 1
		}
	case dtInt16, dtInt32, dtInt64:
		if r.kind != rawInt {
			return nil, fmt.Errorf("%s needs a signed integer, got %s", c.dt, r)
		}
		lo, hi := intLimits(c.dt)
		if r.i < lo || r.i > hi {
			return nil, fmt.Errorf("%d does not fit in %s", r.i, c.dt)
		}
		u = uint64(r.i) & uintMax(c.dt) // two's complement, truncated to the width
	case dtUint16, dtUint32, dtUint64:
		if r.kind != rawUint {
			return nil, fmt.Errorf("%s needs an unsigned integer, got %s", c.dt, r)
		}
		if r.u > uintMax(c.dt) {
			return nil, fmt.Errorf("%d does not fit in %s", r.u, c.dt)
		}
		u = r.u
	case dtFloat32:
		if r.kind != rawFloat {
			return nil, fmt.Errorf("float32 needs a float, got %s", r)
		}
		u = uint64(math.Float32bits(float32(r.f)))
	case dtFloat64:
		if r.kind != rawFloat {
			return nil, fmt.Errorf("float64 needs a float, got %s", r)
		}
		u = math.Float64bits(r.f)
	default:
		return nil, fmt.Errorf("%s cannot be encoded as a whole register", c.dt)
	}
	n := c.dt.words()
	w := make([]uint16, n)
	for i := n - 1; i >= 0; i-- {
		w[i] = uint16(u)
		u >>= 16
	}
	return c.order.canonical(w), nil
}

// intLimits is the signed range of an integer type.
func intLimits(d dataType) (lo, hi int64) {
	switch d {
	case dtInt16:
		return math.MinInt16, math.MaxInt16
	case dtInt32:
		return math.MinInt32, math.MaxInt32
	}
	return math.MinInt64, math.MaxInt64
}

// uintMax is the unsigned maximum of an integer type.
func uintMax(d dataType) uint64 {
	if d.bits() >= 64 {
		return math.MaxUint64
	}
	return 1<<d.bits() - 1
}

// registersFromBytes splits big-endian Modbus register bytes into words.
func registersFromBytes(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = uint16(b[2*i])<<8 | uint16(b[2*i+1])
	}
	return out
}

// registersToBytes is the inverse of registersFromBytes.
func registersToBytes(regs []uint16) []byte {
	out := make([]byte, 2*len(regs))
	for i, r := range regs {
		out[2*i], out[2*i+1] = byte(r>>8), byte(r)
	}
	return out
}

// bitsFromBytes unpacks n coil or discrete-input states (LSB first per byte,
// as Modbus packs them).
func bitsFromBytes(b []byte, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = b[i/8]>>(i%8)&1 == 1
	}
	return out
}

// bitsToBytes packs coil states for function 15.
func bitsToBytes(bits []bool) []byte {
	out := make([]byte, (len(bits)+7)/8)
	for i, b := range bits {
		if b {
			out[i/8] |= 1 << (i % 8)
		}
	}
	return out
}
