package modbus

import (
	"fmt"
	"math"
	"math/big"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// conv maps a point's raw register value to the capability's value (the Go
// types of drivers: float64, int64, bool, string) and back:
//
//	value = raw*scale + offset            (read)
//	raw   = (value - offset) / scale      (write)
//
// A write whose raw value the register cannot hold exactly (a fraction for
// an integer register, out of range, a float32 overflow or underflow) is
// refused with an error wrapping drivers.ErrBadValue: nothing is sent, and
// the node reports that nothing changed. Bind-time checks (binding.go)
// guarantee the combinations used here make sense: int capabilities have
// integral scale and offset and integer registers; bool and enum
// capabilities have neither scale nor offset.
type conv struct {
	capType    string // manifest.TypeFloat, TypeInt, TypeBool, TypeEnum
	dt         dataType
	scale      float64
	offset     float64
	enumByName map[string]int64
	enumByCode map[int64]string
}

func (c *conv) scaled() bool { return c.scale != 1 || c.offset != 0 }

// toValue converts a raw register value to the capability's value.
func (c *conv) toValue(r raw) (any, error) {
	switch c.capType {
	case manifest.TypeBool:
		switch r.kind {
		case rawBool:
			return r.b, nil
		case rawInt:
			return r.i != 0, nil
		case rawUint:
			return r.u != 0, nil
		}
	case manifest.TypeEnum:
		code, ok := rawCode(r)
		if !ok {
			return nil, fmt.Errorf("device reports %s, which is not an enum code", r)
		}
		name, ok := c.enumByCode[code]
		if !ok {
			return nil, fmt.Errorf("device reports %d, which maps to none of the enum values", code)
		}
		return name, nil
	case manifest.TypeInt:
		var v big.Int
		switch r.kind {
		case rawInt:
			v.SetInt64(r.i)
		case rawUint:
			v.SetUint64(r.u)
		default:
			return nil, fmt.Errorf("raw %s is not an integer", r)
		}
		if c.scaled() {
			v.Mul(&v, big.NewInt(int64(c.scale)))
			v.Add(&v, big.NewInt(int64(c.offset)))
		}
		if !v.IsInt64() {
			return nil, fmt.Errorf("device reports %s, beyond the range of an int capability", v.String())
		}
		return v.Int64(), nil
	case manifest.TypeFloat:
		var x float64
		switch r.kind {
		case rawInt:
			x = float64(r.i)
		case rawUint:
			x = float64(r.u)
		case rawFloat:
			x = r.f
		case rawBool:
			if r.b {
				x = 1
			}
		}
		v := x*c.scale + c.offset
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("device reports %v, not a finite number", v)
		}
		return v, nil
	}
	return nil, fmt.Errorf("data_type %s is not supported by modbus points", c.capType)
}

func rawCode(r raw) (int64, bool) {
	switch r.kind {
	case rawInt:
		return r.i, true
	case rawUint:
		return int64(r.u), r.u <= math.MaxInt64
	}
	return 0, false
}

// badValue formats a refusal that wraps drivers.ErrBadValue.
func badValue(format string, args ...any) error {
	return fmt.Errorf(format+": %w", append(args, drivers.ErrBadValue)...)
}

// toRaw converts a value to write into the raw register value, or refuses it
// with an error wrapping drivers.ErrBadValue.
func (c *conv) toRaw(v any) (raw, error) {
	switch c.capType {
	case manifest.TypeBool:
		b, ok := v.(bool)
		if !ok {
			return raw{}, badValue("want a bool, got %T", v)
		}
		if c.dt == dtBool || c.dt == dtBit {
			return raw{kind: rawBool, b: b}, nil
		}
		var n int64
		if b {
			n = 1
		}
		return c.intRaw(big.NewInt(n), fmt.Sprint(b))
	case manifest.TypeEnum:
		s, ok := v.(string)
		if !ok {
			return raw{}, badValue("want an enum string, got %T", v)
		}
		code, ok := c.enumByName[s]
		if !ok {
			return raw{}, badValue("%q is not one of the enum values", s)
		}
		return c.intRaw(big.NewInt(code), s)
	case manifest.TypeInt:
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case int:
			n = int64(x)
		case float64:
			if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
				return raw{}, badValue("want an integer, got %v", x)
			}
			n = int64(x)
		default:
			return raw{}, badValue("want an integer, got %T", v)
		}
		r := big.NewInt(n)
		if c.scaled() {
			r.Sub(r, big.NewInt(int64(c.offset)))
			var rem big.Int
			r.QuoRem(r, big.NewInt(int64(c.scale)), &rem)
			if rem.Sign() != 0 {
				return raw{}, badValue("%d is not reachable with scale %g and offset %g (raw (%d-%g)/%g is not a whole number)",
					n, c.scale, c.offset, n, c.offset, c.scale)
			}
		}
		return c.intRaw(r, fmt.Sprint(n))
	case manifest.TypeFloat:
		var f float64
		switch x := v.(type) {
		case float64:
			f = x
		case int64:
			f = float64(x)
		case int:
			f = float64(x)
		default:
			return raw{}, badValue("want a number, got %T", v)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return raw{}, badValue("%v is not a finite number", f)
		}
		return c.floatRaw(f)
	}
	return raw{}, badValue("data_type %s cannot be written to a modbus point", c.capType)
}

// floatRaw computes and checks the raw value of a float capability.
func (c *conv) floatRaw(v float64) (raw, error) {
	x := (v - c.offset) / c.scale
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return raw{}, badValue("%v gives raw %v with scale %g and offset %g", v, x, c.scale, c.offset)
	case c.dt == dtFloat64:
		return raw{kind: rawFloat, f: x}, nil
	case c.dt == dtFloat32:
		f32 := float32(x)
		back := float64(f32)
		if math.IsInf(back, 0) || (x != 0 && math.Abs(back-x) > math.Abs(x)*(1.0/(1<<23))) {
			return raw{}, badValue("%v (raw %v) cannot be represented as a float32", v, x)
		}
		return raw{kind: rawFloat, f: back}, nil
	case c.dt.isInt():
		r := math.Round(x)
		// One LSB is the register's resolution: accept only float noise
		// (215.00000000000003 for 21.5/0.1), never a real fraction.
		if math.Abs(x-r) > 1e-6+math.Abs(x)*4e-16 {
			return raw{}, badValue("%v needs raw %v with scale %g and offset %g, but %s holds whole numbers only (nearest: %v)",
				v, x, c.scale, c.offset, c.dt, r*c.scale+c.offset)
		}
		var b big.Int
		if _, acc := new(big.Float).SetFloat64(r).Int(&b); acc != big.Exact {
			return raw{}, badValue("%v is not representable", v)
		}
		return c.intRaw(&b, fmt.Sprint(v))
	}
	return raw{}, badValue("a float value cannot be written to a %s point", c.dt)
}

// intRaw range-checks an integer raw value for the point's type.
func (c *conv) intRaw(n *big.Int, what string) (raw, error) {
	if !c.dt.isInt() {
		return raw{}, badValue("%s cannot be written to a %s point", what, c.dt)
	}
	if c.dt.signed() {
		lo, hi := intLimits(c.dt)
		if !n.IsInt64() || n.Int64() < lo || n.Int64() > hi {
			return raw{}, badValue("%s (raw %s) is outside the range of %s [%d, %d]", what, n, c.dt, lo, hi)
		}
		return raw{kind: rawInt, i: n.Int64()}, nil
	}
	if n.Sign() < 0 || !n.IsUint64() || n.Uint64() > uintMax(c.dt) {
		return raw{}, badValue("%s (raw %s) is outside the range of %s [0, %d]", what, n, c.dt, uintMax(c.dt))
	}
	return raw{kind: rawUint, u: n.Uint64()}, nil
}
