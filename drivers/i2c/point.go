package i2c

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// point is one capability's binding on an open bus.
type point struct {
	bus    *Bus
	spec   *pointSpec
	what   string // "i2c i2c1 0x48 reg 0x00", the prefix of every error
	health streak
}

var (
	_ drivers.Point       = (*point)(nil)
	_ drivers.PointHealth = (*point)(nil)
)

// Health reports a device that failed down_after transactions in a row.
func (p *point) Health() error { return p.health.err(p.what) }

// Read reads the register (or runs the command and reads the frame) and
// returns the value as the capability's data type.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	if p.spec.profile != nil {
		x, err := p.readProfile(ctx)
		if err != nil {
			return drivers.Reading{}, p.failed("read", err)
		}
		v, err := p.scaled(x)
		if err != nil {
			return drivers.Reading{}, fmt.Errorf("%s: %w", p.what, err)
		}
		p.health.ok()
		return drivers.Reading{Value: v, At: time.Now()}, nil
	}
	var (
		raw []byte
		err error
	)
	if p.spec.isReg {
		raw, err = p.readRegister(ctx)
	} else {
		raw, err = p.readCommand(ctx)
	}
	if err != nil {
		return drivers.Reading{}, p.failed("read", err)
	}
	v, err := p.value(raw)
	if err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w", p.what, err)
	}
	p.health.ok()
	return drivers.Reading{Value: v, At: time.Now()}, nil
}

// failed counts wire and CRC errors towards the point's streak and wraps
// them so the node sees a device that did not answer (drivers.ErrOffline).
// Deadline and closed-bus errors already carry their sentinel.
func (p *point) failed(op string, err error) error {
	var we *wireError
	switch {
	case errors.As(err, &we):
		p.health.fail(err)
		return fmt.Errorf("%s: %s: %w (%w)", p.what, op, drivers.ErrOffline, err)
	case errors.Is(err, ErrCRC):
		p.health.fail(err)
		return fmt.Errorf("%s: %s: %w", p.what, op, err)
	}
	return fmt.Errorf("%s: %s: %w", p.what, op, err)
}

func (p *point) readRegister(ctx context.Context) ([]byte, error) {
	buf := make([]byte, p.spec.format.Bytes())
	err := p.bus.transact(ctx, func(tx txFunc) error {
		// One Tx: write the register pointer, repeated start, read. On
		// Linux this is a single I2C_RDWR ioctl.
		return tx(p.spec.addr, []byte{p.spec.reg}, buf)
	})
	return buf, err
}

// readCommand sends the command, waits for the measurement and reads the
// frame, all under the bus lock: another device's traffic between the
// command and the read would be harmless to most sensors but would break
// the ones that answer "the last command" (and the spec promises atomic
// transactions). It returns the selected 16-bit word, big-endian.
func (p *point) readCommand(ctx context.Context) ([]byte, error) {
	s := p.spec
	if err := p.enoughTime(ctx); err != nil {
		return nil, err
	}
	frame := make([]byte, s.readBytes)
	err := p.bus.transact(ctx, func(tx txFunc) error {
		// Waiting for the lock may have used the time up: do not start
		// a measurement that cannot be collected.
		if err := p.enoughTime(ctx); err != nil {
			return err
		}
		if err := tx(s.addr, s.command, nil); err != nil {
			return err
		}
		if err := sleep(ctx, s.wait); err != nil {
			return fmt.Errorf("waiting %v for the measurement: %w (%w)", s.wait, drivers.ErrTimeout, err)
		}
		return tx(s.addr, nil, frame)
	})
	if err != nil {
		return nil, err
	}
	words, err := decodeWords(frame, s.crc)
	if err != nil {
		return nil, err
	}
	w := words[s.field]
	return []byte{byte(w >> 8), byte(w)}, nil
}

// enoughTime fails fast when ctx's deadline is closer than wait_ms.
func (p *point) enoughTime(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w (%w)", drivers.ErrTimeout, err)
	}
	if dl, ok := ctx.Deadline(); ok && p.spec.wait > 0 {
		if left := time.Until(dl); left < p.spec.wait {
			return fmt.Errorf("%w: %v left before the deadline, the measurement takes wait_ms %d; raise timeout_ms",
				drivers.ErrTimeout, left.Round(time.Millisecond), p.spec.wait.Milliseconds())
		}
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// scaled applies scale and offset to a device driver's reading and
// converts it to the capability's data type.
func (p *point) scaled(x float64) (any, error) {
	v := x*p.spec.format.Scale + p.spec.format.Offset
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("value %v is not finite (check scale and offset)", v)
	}
	if p.spec.dataType == manifest.TypeInt {
		return int64(math.Round(v)), nil
	}
	return v, nil
}

// value converts the register bytes to the capability's data type.
func (p *point) value(raw []byte) (any, error) {
	f := p.spec.format
	if p.spec.dataType == manifest.TypeBool {
		r, err := f.Raw(raw)
		return r != 0, err
	}
	v, err := f.Value(raw)
	if err != nil {
		return nil, err
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil, fmt.Errorf("value %v is not finite (check scale and offset)", v)
	}
	if p.spec.dataType == manifest.TypeInt {
		r := math.Round(v)
		if r < math.MinInt64 || r >= math.MaxInt64 {
			return nil, fmt.Errorf("value %v does not fit an int", v)
		}
		return int64(r), nil
	}
	return v, nil
}

// Write encodes v (inverse scale and offset), checks that the register can
// hold it, and writes register+data in one Tx. A value refused before the
// bus is touched wraps drivers.ErrBadValue; a failed Tx has an unknown
// outcome (the device may have latched the data before a late NACK), so it
// does not claim drivers.ErrOffline and the node reads back to find out.
func (p *point) Write(ctx context.Context, v any) error {
	if !p.spec.writable {
		return fmt.Errorf("%s: opened for a read capability: %w", p.what, drivers.ErrReadOnly)
	}
	data, err := p.encode(v)
	if err != nil {
		return fmt.Errorf("%s: %w: %w", p.what, drivers.ErrBadValue, err)
	}
	payload := append([]byte{p.spec.reg}, data...)
	err = p.bus.transact(ctx, func(tx txFunc) error { return tx(p.spec.addr, payload, nil) })
	var we *wireError
	switch {
	case errors.As(err, &we):
		p.health.fail(err)
		return fmt.Errorf("%s: write % X: %w", p.what, payload, err)
	case err != nil:
		return fmt.Errorf("%s: write: %w", p.what, err)
	}
	p.health.ok()
	return nil
}

// encode turns a value of the capability's data type into register bytes.
func (p *point) encode(v any) ([]byte, error) {
	f := p.spec.format
	if p.spec.dataType == manifest.TypeBool {
		b, ok := v.(bool)
		if !ok {
			return nil, fmt.Errorf("want a bool, got %T", v)
		}
		var raw int64
		if b {
			raw = 1
		}
		return f.Encode(raw)
	}
	x, ok := manifest.Number(v)
	if !ok {
		return nil, fmt.Errorf("want a number, got %T", v)
	}
	if p.spec.dataType == manifest.TypeInt && x != math.Trunc(x) {
		return nil, fmt.Errorf("want an integer, got %v", x)
	}
	raw, got, err := f.RawFor(x)
	if err != nil {
		return nil, err
	}
	// The node verifies the read-back within tolerance; a value the
	// register cannot hold that closely would be written and then
	// reported as not applied. Refuse it up front instead.
	if d := math.Abs(got - x); d > p.spec.tol+1e-9*max(1, math.Abs(x)) {
		return nil, fmt.Errorf("%v is not representable: the nearest register value is %v (step %v); send a multiple of the step or raise the capability's tolerance",
			x, got, math.Abs(f.Scale))
	}
	return f.Encode(raw)
}
