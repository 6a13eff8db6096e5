package i2c

import (
	"errors"
	"fmt"
	"math"
)

// Format says how a register's bytes map to an engineering value:
// value = raw*Scale + Offset, raw being Width bits in the given byte order,
// two's complement when Signed. It is pure so that it can be table-tested
// and fuzzed apart from any bus.
type Format struct {
	Width  int // bits: 8, 16, 24 or 32
	Signed bool
	Little bool // byte order; big-endian (false) is the I²C norm
	Scale  float64
	Offset float64
}

// validWidth reports whether w is a register width this driver supports.
func validWidth(w int) bool { return w == 8 || w == 16 || w == 24 || w == 32 }

// check reports a Format that cannot be used (the binding decoder catches
// these first, with positions; this guards the pure API).
func (f Format) check() error {
	switch {
	case !validWidth(f.Width):
		return fmt.Errorf("width %d is not 8, 16, 24 or 32", f.Width)
	case f.Scale == 0 || math.IsNaN(f.Scale) || math.IsInf(f.Scale, 0):
		return fmt.Errorf("scale %v must be a finite, non-zero number", f.Scale)
	case math.IsNaN(f.Offset) || math.IsInf(f.Offset, 0):
		return fmt.Errorf("offset %v must be finite", f.Offset)
	}
	return nil
}

// Bytes is the register's length in bytes.
func (f Format) Bytes() int { return f.Width / 8 }

// Raw decodes b, exactly Bytes() long, into the register's integer.
func (f Format) Raw(b []byte) (int64, error) {
	if !validWidth(f.Width) {
		return 0, fmt.Errorf("width %d is not 8, 16, 24 or 32", f.Width)
	}
	n := f.Bytes()
	if len(b) != n {
		return 0, fmt.Errorf("got %d bytes, want %d for a %d-bit register", len(b), n, f.Width)
	}
	var u uint64
	for i := range n {
		j := i
		if f.Little {
			j = n - 1 - i
		}
		u = u<<8 | uint64(b[j])
	}
	if f.Signed {
		shift := 64 - f.Width
		return int64(u<<shift) >> shift, nil // sign-extend from bit Width-1
	}
	return int64(u), nil
}

// Value decodes b and applies scale and offset.
func (f Format) Value(b []byte) (float64, error) {
	if err := f.check(); err != nil {
		return 0, err
	}
	raw, err := f.Raw(b)
	if err != nil {
		return 0, err
	}
	return float64(raw)*f.Scale + f.Offset, nil
}

// rawRange is the smallest and largest raw integer the register holds.
func (f Format) rawRange() (lo, hi int64) {
	if f.Signed {
		return -(1 << (f.Width - 1)), 1<<(f.Width-1) - 1
	}
	return 0, 1<<f.Width - 1
}

// ValueRange is the engineering range the register can represent.
func (f Format) ValueRange() (lo, hi float64) {
	rl, rh := f.rawRange()
	lo, hi = float64(rl)*f.Scale+f.Offset, float64(rh)*f.Scale+f.Offset
	if lo > hi {
		lo, hi = hi, lo
	}
	return lo, hi
}

// errNotRepresentable is returned (wrapped) by RawFor for a value outside the
// register's range; the point turns it into drivers.ErrBadValue.
var errNotRepresentable = errors.New("not representable in the register")

// RawFor inverts scale and offset: it returns the raw integer whose value is
// nearest v, and that value. A value outside the register's range is an
// error wrapping errNotRepresentable; judging the rounding error against the
// capability's tolerance is the caller's job.
func (f Format) RawFor(v float64) (raw int64, got float64, err error) {
	if err := f.check(); err != nil {
		return 0, 0, err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, 0, fmt.Errorf("%v: %w", v, errNotRepresentable)
	}
	x := math.Round((v - f.Offset) / f.Scale)
	rl, rh := f.rawRange()
	if math.IsNaN(x) || x < float64(rl) || x > float64(rh) {
		lo, hi := f.ValueRange()
		return 0, 0, fmt.Errorf("%v is outside the register's range [%v, %v] (%s): %w", v, lo, hi, f.describe(), errNotRepresentable)
	}
	raw = int64(x)
	return raw, float64(raw)*f.Scale + f.Offset, nil
}

// Encode writes raw into Bytes() bytes in the register's byte order; raw
// must be within the register's range (RawFor guarantees it).
func (f Format) Encode(raw int64) ([]byte, error) {
	if !validWidth(f.Width) {
		return nil, fmt.Errorf("width %d is not 8, 16, 24 or 32", f.Width)
	}
	if rl, rh := f.rawRange(); raw < rl || raw > rh {
		return nil, fmt.Errorf("raw %d outside %d..%d (%s): %w", raw, rl, rh, f.describe(), errNotRepresentable)
	}
	n := f.Bytes()
	u := uint64(raw) // two's complement; the high bits are dropped below
	b := make([]byte, n)
	for i := range n {
		j := n - 1 - i
		if f.Little {
			j = i
		}
		b[j] = byte(u >> (8 * i))
	}
	return b, nil
}

func (f Format) describe() string {
	s := "unsigned"
	if f.Signed {
		s = "signed"
	}
	return fmt.Sprintf("%s %d-bit", s, f.Width)
}
