package modbus

import (
	"fmt"
	"math"
	"strings"

	"github.com/physd/physd/manifest"
)

// How a binding's registers encode the value: data_type, bit, byte_order,
// scale and offset.

// dataType sets the register data type (and bit), from data_type: or what
// the table and the capability imply. It reports false when the type is
// unknown or missing, since every later step depends on it.
func (b *binder) dataType() bool {
	k, tbl := b.k, b.s.table
	dt := dtBool
	switch {
	case k.DataType != nil:
		d, ok := parseDataType(strings.ToLower(strings.TrimSpace(*k.DataType)))
		if !ok {
			b.p.Add(fmt.Sprintf("unknown data_type %q", *k.DataType), oneOf(dataTypeNames()), "data_type")
			return false
		}
		dt = d
	case tbl.isBit():
		dt = dtBool
	case k.Bit != nil:
		dt = dtBit
	case b.c.DataType == manifest.TypeBool || b.c.DataType == manifest.TypeEnum:
		dt = dtUint16
	case tbl != 0:
		b.p.Add("a register binding needs data_type (how the register(s) encode the value)",
			"add data_type: int16, uint16, int32, uint32, int64, uint64, float32 or float64", "data_type")
		return false
	}
	if tbl.isBit() && dt != dtBool {
		b.p.Add(fmt.Sprintf("a %s holds one bit: data_type %s does not apply", tbl, dt), "use data_type: bool (or leave it out)", "data_type")
	}
	if !tbl.isBit() && tbl != 0 && dt == dtBit && k.Bit == nil {
		b.p.Add("data_type bit needs bit: (0 = least significant .. 15)", "add bit: N", "data_type")
	}
	if k.Bit != nil {
		switch {
		case dt != dtBit:
			b.p.Add(fmt.Sprintf("bit: applies to data_type bit, not %s", dt), "use data_type: bit (or leave data_type out)", "bit")
		case *k.Bit < 0 || *k.Bit > 15:
			b.p.Add(fmt.Sprintf("bit must be 0..15, got %d", *k.Bit), "number bits from 0 (least significant) to 15", "bit")
		default:
			b.s.codec.bit = uint8(*k.Bit)
		}
	}
	b.s.codec.dt = dt
	return true
}

// byteOrder sets the register order. word_order was once a silent alias;
// it is refused so that a manifest says the order one way only.
func (b *binder) byteOrder() {
	k, tbl := b.k, b.s.table
	if k.WordOrder != nil {
		b.p.Add(fmt.Sprintf("word_order is not a key: the register order is byte_order (did you mean byte_order: %s?)", strings.TrimSpace(*k.WordOrder)),
			"rename word_order to byte_order; its values are ABCD, CDAB, BADC, DCBA", "word_order")
	}
	if k.ByteOrder == nil {
		return
	}
	o, ok := parseOrder(strings.TrimSpace(*k.ByteOrder))
	switch {
	case !ok:
		b.p.Add(fmt.Sprintf("unknown byte_order %q", *k.ByteOrder), oneOf(orderNames)+" (ABCD is the Modbus standard, high word first)", "byte_order")
	case tbl.isBit():
		b.p.Add(fmt.Sprintf("byte_order does not apply to a %s", tbl), "remove it", "byte_order")
	default:
		b.s.codec.order = o
	}
}

// scaling sets the conversion from raw counts: value = raw*scale + offset.
func (b *binder) scaling() {
	k := b.k
	b.s.conv = conv{capType: b.c.DataType, dt: b.s.codec.dt, scale: 1}
	if k.Scale != nil {
		if *k.Scale == 0 || math.IsNaN(*k.Scale) || math.IsInf(*k.Scale, 0) {
			b.p.Add(fmt.Sprintf("scale must be a finite non-zero number, got %v", *k.Scale), "use the engineering units per raw count, e.g. 0.1", "scale")
		} else {
			b.s.conv.scale = *k.Scale
		}
	}
	if k.Offset != nil {
		if math.IsNaN(*k.Offset) || math.IsInf(*k.Offset, 0) {
			b.p.Add(fmt.Sprintf("offset must be finite, got %v", *k.Offset), "use a number, e.g. -40", "offset")
		} else {
			b.s.conv.offset = *k.Offset
		}
	}
}

func (b *binder) scaled() bool { return b.k.Scale != nil || b.k.Offset != nil }
