package modbus

import (
	"fmt"
	"math"
	"math/big"
	"strconv"

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

// refuse is a refusal that names the nearest values the point can hold
// (each checked by writing it through toRaw), so an agent's next try is
// writable.
func refuse(what string, near []any) error {
	if near == nil {
		return badValue("%s", what)
	}
	switch len(near) {
	case 0:
		return badValue("%s", what)
	case 1:
		return badValue("%s; the nearest writable value is %s", what, fmtValue(near[0]))
	}
	return badValue("%s; the nearest writable values are %s and %s", what, fmtValue(near[0]), fmtValue(near[1]))
}

func fmtValue(v any) string {
	if f, ok := v.(float64); ok {
		if f == math.Trunc(f) && math.Abs(f) < 1e21 {
			return strconv.FormatFloat(f, 'f', -1, 64) // 9223372036854774784, not 9.223372036854775e+18
		}
		return strconv.FormatFloat(f, 'g', -1, 64)
	}
	return fmt.Sprint(v)
}

// quantize returns the value the point holds after v is written (what a
// read then returns), or a refusal wrapping drivers.ErrBadValue that names
// writable values.
func (c *conv) quantize(v any) (any, error) {
	r, err := c.toRaw(v)
	if err != nil {
		return nil, err
	}
	return c.toValue(r)
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
		return c.intRaw(big.NewInt(n), fmt.Sprint(b), false)
	case manifest.TypeEnum:
		s, ok := v.(string)
		if !ok {
			return raw{}, badValue("want an enum string, got %T", v)
		}
		code, ok := c.enumByName[s]
		if !ok {
			return raw{}, badValue("%q is not one of the enum values", s)
		}
		return c.intRaw(big.NewInt(code), s, false)
	case manifest.TypeInt:
		return c.intValueRaw(v, true)
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
		return c.floatRaw(f, true)
	}
	return raw{}, badValue("data_type %s cannot be written to a modbus point", c.capType)
}

// intValueRaw converts an int capability's value exactly (big integers:
// no float rounding over the whole int64 range).
func (c *conv) intValueRaw(v any, suggest bool) (raw, error) {
	var n big.Int
	switch x := v.(type) {
	case int64:
		n.SetInt64(x)
	case int:
		n.SetInt64(int64(x))
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return raw{}, badValue("want an integer, got %v", x)
		}
		if x != math.Trunc(x) {
			return raw{}, refuse(fmt.Sprintf("want an integer, got %v", x), c.suggestInts(suggest, new(big.Float).SetFloat64(x)))
		}
		bigFloor(x).Int(&n) // every float64 this large is a whole number: exact
	default:
		return raw{}, badValue("want an integer, got %T", v)
	}
	r := new(big.Int).Set(&n)
	if c.scaled() {
		r.Sub(r, big.NewInt(int64(c.offset)))
		var rem big.Int
		r.QuoRem(r, big.NewInt(int64(c.scale)), &rem)
		if rem.Sign() != 0 {
			return raw{}, refuse(fmt.Sprintf("%s is not reachable with scale %g and offset %g (raw (%s-%g)/%g is not a whole number)",
				&n, c.scale, c.offset, &n, c.offset, c.scale), c.suggestInts(suggest, new(big.Float).SetInt(&n)))
		}
	}
	return c.intRaw(r, n.String(), suggest)
}

func bigFloor(x float64) *big.Float { return new(big.Float).SetFloat64(math.Floor(x)) }

// floatRaw computes and checks the raw value of a float capability.
func (c *conv) floatRaw(v float64, suggest bool) (raw, error) {
	x := (v - c.offset) / c.scale
	switch {
	case math.IsNaN(x) || math.IsInf(x, 0):
		return raw{}, badValue("%v gives raw %v with scale %g and offset %g", v, x, c.scale, c.offset)
	case c.dt == dtFloat64:
		return raw{kind: rawFloat, f: x}, nil
	case c.dt == dtFloat32:
		f32 := float32(x)
		back := float64(f32)
		switch {
		case math.IsInf(back, 0):
			return raw{}, refuse(fmt.Sprintf("%v (raw %v) is beyond the float32 range", v, x), c.suggestFloat32(suggest, math.Copysign(math.MaxFloat32, x)))
		case x != 0 && math.Abs(back-x) > math.Abs(x)*(1.0/(1<<23)):
			// Below float32's normal range the precision falls off.
			return raw{}, refuse(fmt.Sprintf("%v (raw %v) is too small for a float32", v, x), c.suggestFloat32(suggest, 0))
		}
		return raw{kind: rawFloat, f: back}, nil
	case c.dt.isInt():
		r := math.Round(x)
		// One LSB is the register's resolution: accept only float noise
		// (215.00000000000003 for 21.5/0.1), never a real fraction.
		if math.Abs(x-r) > 1e-6+math.Abs(x)*4e-16 {
			return raw{}, refuse(fmt.Sprintf("%v needs raw %v with scale %g and offset %g, but %s holds whole numbers only", v, x, c.scale, c.offset, c.dt),
				c.suggestFloats(suggest, x))
		}
		var b big.Int
		if _, acc := new(big.Float).SetFloat64(r).Int(&b); acc != big.Exact {
			return raw{}, badValue("%v is not representable", v)
		}
		return c.intRaw(&b, fmt.Sprint(v), suggest)
	}
	return raw{}, badValue("a float value cannot be written to a %s point", c.dt)
}

// intRaw range-checks an integer raw value for the point's type.
func (c *conv) intRaw(n *big.Int, what string, suggest bool) (raw, error) {
	if !c.dt.isInt() {
		return raw{}, badValue("%s cannot be written to a %s point", what, c.dt)
	}
	lo, hi := c.rawRange()
	if n.Cmp(lo) < 0 || n.Cmp(hi) > 0 {
		msg := fmt.Sprintf("%s (raw %s) is outside the range of %s [%s, %s]", what, n, c.dt, lo, hi)
		if c.capType == manifest.TypeFloat {
			f, _ := new(big.Float).SetInt(n).Float64()
			return raw{}, refuse(msg, c.suggestFloats(suggest, f))
		}
		if c.capType == manifest.TypeInt {
			return raw{}, refuse(msg, c.suggestInts(suggest, c.valueOfRaw(n)))
		}
		return raw{}, badValue("%s", msg)
	}
	if c.dt.signed() {
		return raw{kind: rawInt, i: n.Int64()}, nil
	}
	return raw{kind: rawUint, u: n.Uint64()}, nil
}

// suggest… compute writable values for a refusal, unless the refusal is
// itself a check made while computing them.
func (c *conv) suggestInts(on bool, t *big.Float) []any {
	if !on {
		return nil
	}
	return c.writableInts(t)
}

func (c *conv) suggestFloats(on bool, x float64) []any {
	if !on {
		return nil
	}
	return c.writableFloats(x)
}

func (c *conv) suggestFloat32(on bool, x float64) []any {
	if !on {
		return nil
	}
	return c.writableFloat32(x)
}

// rawRange is the integer register's range.
func (c *conv) rawRange() (lo, hi *big.Int) {
	if c.dt.signed() {
		l, h := intLimits(c.dt)
		return big.NewInt(l), big.NewInt(h)
	}
	return new(big.Int), new(big.Int).SetUint64(uintMax(c.dt))
}

// valueOfRaw is raw*scale+offset, exactly, for an int capability.
func (c *conv) valueOfRaw(k *big.Int) *big.Float {
	v := new(big.Int).Mul(k, big.NewInt(int64(c.scale)))
	v.Add(v, big.NewInt(int64(c.offset)))
	return new(big.Float).SetInt(v)
}

// writableInts returns the writable int values nearest target (one below,
// one above where they exist): the raw values around it, clamped to the
// register, kept when they convert back exactly.
func (c *conv) writableInts(target *big.Float) []any {
	lo, hi := c.rawRange()
	t := new(big.Float).SetPrec(200).Set(target)
	t.Sub(t, new(big.Float).SetFloat64(c.offset))
	t.Quo(t, new(big.Float).SetFloat64(c.scale))
	k, _ := t.Int(nil) // toward zero
	var cands []*big.Int
	for _, d := range []int64{-1, 0, 1} {
		cands = append(cands, new(big.Int).Add(k, big.NewInt(d)))
	}
	cands = append(cands, lo, hi)
	var out []int64
	for _, k := range cands {
		if k.Cmp(lo) < 0 || k.Cmp(hi) > 0 {
			continue
		}
		v := c.valueOfRaw(k)
		if !v.IsInt() {
			continue
		}
		vi, acc := v.Int64()
		if acc != big.Exact {
			continue
		}
		if _, err := c.intValueRaw(vi, false); err == nil {
			out = append(out, vi)
		}
	}
	tv, _ := target.Float64()
	return nearest(out, func(x int64) float64 { return float64(x) }, tv)
}

// writableFloats returns the writable values of a float capability on an
// integer register nearest the raw value x.
func (c *conv) writableFloats(x float64) []any {
	lo, hi := c.rawRange()
	flo, _ := new(big.Float).SetInt(lo).Float64()
	fhi, _ := new(big.Float).SetInt(hi).Float64()
	var out []float64
	for _, k := range []float64{math.Floor(x), math.Ceil(x), flo, fhi} {
		k = math.Max(flo, math.Min(fhi, k))
		if v, ok := c.writableNear(k); ok {
			out = append(out, v)
		}
	}
	return nearest(out, func(v float64) float64 { return (v - c.offset) / c.scale }, x)
}

// writableNear returns the value for raw k, stepped toward zero until it
// writes (float64 cannot hold every 64-bit raw value, and 2^63-1 rounds
// up out of range).
func (c *conv) writableNear(k float64) (float64, bool) {
	for range 64 {
		v := k*c.scale + c.offset
		if _, err := c.floatRaw(v, false); err == nil {
			return v, true
		}
		k = math.Nextafter(k, 0)
	}
	return 0, false
}

// writableFloat32 returns the writable float value nearest raw x on a
// float32 register.
func (c *conv) writableFloat32(x float64) []any {
	v := float64(float32(x))*c.scale + c.offset
	for range 64 {
		if _, err := c.floatRaw(v, false); err == nil {
			return []any{v}
		}
		v = math.Nextafter(v, c.offset)
	}
	return nil
}

// nearest keeps, of the candidates, the closest one at or below target and
// the closest one at or above it (by key), without duplicates.
func nearest[T comparable](cands []T, key func(T) float64, target float64) []any {
	var below, above *T
	for i := range cands {
		k := key(cands[i])
		if k <= target && (below == nil || k > key(*below)) {
			below = &cands[i]
		}
		if k >= target && (above == nil || k < key(*above)) {
			above = &cands[i]
		}
	}
	var out []any
	if below != nil {
		out = append(out, *below)
	}
	if above != nil && (below == nil || *above != *below) {
		out = append(out, *above)
	}
	return out
}
