package modbus

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/physd/physd/drivers"
)

// point is one capability's binding on a bus. It holds no value: every
// Read goes to the device (merged with neighbours queued at the same time,
// never served from a cache), so the node's read-back after a write sees
// the device, not us.
type point struct {
	b *Bus
	s *pointSpec
	// spare is the point's last batch read, answered and free again: the
	// next poll round reuses it rather than allocating (10 000 points read
	// every second are 10 000 requests a second).
	spare atomic.Pointer[request]
}

var (
	_ drivers.Spanner     = (*point)(nil)
	_ drivers.Point       = (*point)(nil)
	_ drivers.PointHealth = (*point)(nil)
	_ drivers.Quantizer   = (*point)(nil)
)

// Quantize returns the value the device holds (and a read returns) after v
// is written: the float32-rounded value on a float32 register, the
// representable value on a scaled integer register, v itself where the
// encoding is exact. A value the point cannot hold is refused with an
// error wrapping drivers.ErrBadValue that names writable values.
func (p *point) Quantize(v any) (any, error) {
	q, err := p.s.conv.quantize(v)
	if err != nil {
		return nil, p.fail("%w", err)
	}
	return q, nil
}

func (p *point) fail(format string, args ...any) error {
	return fmt.Errorf("%s: %s (%s): %w", p.b.name, p.s.name, p.s.what(), fmt.Errorf(format, args...))
}

// Read reads the point's registers and converts them.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	res, err := p.call(ctx, p.readRequest)
	if err != nil {
		return drivers.Reading{}, err
	}
	return p.decode(res)
}

// readRequest is the read of the point's registers (or bits).
func (p *point) readRequest() *request {
	s := p.s
	return &request{op: opRead, unit: s.unit, table: s.table, addr: s.addr, qty: s.qty()}
}

// batchRequest is the point's read as a member of a batch: its spare one,
// reset, when it has one.
func (p *point) batchRequest() *request {
	m := p.spare.Swap(nil)
	if m == nil {
		return p.readRequest()
	}
	s := p.s
	*m = request{op: opRead, unit: s.unit, table: s.table, addr: s.addr, qty: s.qty()}
	return m
}

// decode converts what a read of the point answered.
func (p *point) decode(res result) (drivers.Reading, error) {
	s := p.s
	var err error
	var r raw
	if s.table.isBit() {
		r = raw{kind: rawBool, b: res.bits[0]}
	} else if r, err = s.codec.decode(res.regs); err != nil {
		return drivers.Reading{}, p.fail("%v", err)
	}
	v, err := s.conv.toValue(r)
	if err != nil {
		return drivers.Reading{}, p.fail("%v", err)
	}
	return drivers.Reading{Value: v, At: res.at}, nil
}

// Write converts v and writes it. Values the register cannot hold exactly
// are refused before anything is sent (drivers.ErrBadValue).
func (p *point) Write(ctx context.Context, v any) error {
	s := p.s
	if !s.do {
		return p.fail("opened for a read capability: %w", drivers.ErrReadOnly)
	}
	r, err := s.conv.toRaw(v)
	if err != nil {
		return p.fail("%w", err)
	}
	tmpl := request{op: opWrite, unit: s.unit, table: s.table, addr: s.addr, fc: s.writeFC}
	switch {
	case s.table == tableCoil:
		tmpl.bits = []bool{r.b}
	case s.codec.dt == dtBit:
		tmpl.op, tmpl.bit, tmpl.set, tmpl.swap = opWriteBit, s.codec.bit, r.b, s.codec.order.swapBytes()
	default:
		regs, err := s.codec.encode(r)
		if err != nil {
			return p.fail("%v: %w", err, drivers.ErrBadValue)
		}
		tmpl.regs = regs
	}
	_, err = p.call(ctx, func() *request {
		return &request{op: tmpl.op, unit: tmpl.unit, table: tmpl.table, addr: tmpl.addr, fc: tmpl.fc,
			regs: tmpl.regs, bits: tmpl.bits, bit: tmpl.bit, set: tmpl.set, swap: tmpl.swap}
	})
	return err
}

// call queues a request made by mk and resends it while the device
// answers busy (exception 6: it did not act on it), busy_retries times at
// most with a doubling wait, as long as ctx leaves time for the wait. The
// bus is free for others between the attempts.
func (p *point) call(ctx context.Context, mk func() *request) (result, error) {
	wait := p.b.spec.BusyBackoff
	for try := 0; ; try++ {
		res, err := p.b.w.call(ctx, mk())
		var ex *ExceptionError
		if err == nil || !errors.As(err, &ex) || ex.Exception != 6 {
			return res, err
		}
		ex.busy = try
		// The message was written before the resends were counted:
		// write it again so that its fix says how many were made.
		gaveUp := fmt.Errorf("%s: %w", p.b.name, ex)
		if try >= p.b.spec.BusyRetries {
			return res, gaveUp
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return res, gaveUp
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return res, gaveUp
		}
		wait *= 2
	}
}

// Health is nil unless the point's unit (or the whole endpoint) is marked
// down; the node then serves the last value as degraded.
func (p *point) Health() error { return p.b.w.unitHealth(p.s.unit) }

// WriteSpan is the unit's table and the registers (or bits) this point
// writes.
func (p *point) WriteSpan() (string, uint64, uint64, string) { return p.s.WriteSpan() }

// WriteSpan is the unit's table and the registers (or bits) a binding
// writes (drivers.Spanner).
func (s *pointSpec) WriteSpan() (string, uint64, uint64, string) {
	space := fmt.Sprintf("unit %d %s", s.unit, s.table)
	return space, uint64(s.addr), uint64(s.qty()), fmt.Sprintf("%s %d (%d long)", space, s.addr, s.qty())
}
