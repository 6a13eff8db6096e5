package modbus

import (
	"context"
	"fmt"

	"github.com/physd/physd/drivers"
)

// point is one capability's binding on a bus. It holds no value: every
// Read goes to the device (merged with neighbours queued at the same time,
// never served from a cache), so the node's read-back after a write sees
// the device, not us.
type point struct {
	b *Bus
	s *pointSpec
}

var (
	_ drivers.Point       = (*point)(nil)
	_ drivers.PointHealth = (*point)(nil)
)

func (p *point) fail(format string, args ...any) error {
	return fmt.Errorf("%s: %s (%s): %w", p.b.name, p.s.name, p.s.what(), fmt.Errorf(format, args...))
}

// Read reads the point's registers and converts them.
func (p *point) Read(ctx context.Context) (drivers.Reading, error) {
	s := p.s
	res, err := p.b.w.call(ctx, &request{op: opRead, unit: s.unit, table: s.table, addr: s.addr, qty: s.qty()})
	if err != nil {
		return drivers.Reading{}, err
	}
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
	req := &request{op: opWrite, unit: s.unit, table: s.table, addr: s.addr, fc: s.writeFC}
	switch {
	case s.table == tableCoil:
		req.bits = []bool{r.b}
	case s.codec.dt == dtBit:
		req.op, req.bit, req.set, req.swap = opWriteBit, s.codec.bit, r.b, s.codec.order.swapBytes()
	default:
		regs, err := s.codec.encode(r)
		if err != nil {
			return p.fail("%v: %w", err, drivers.ErrBadValue)
		}
		req.regs = regs
	}
	_, err = p.b.w.call(ctx, req)
	return err
}

// Health is nil unless the point's unit (or the whole endpoint) is marked
// down; the node then serves the last value as degraded.
func (p *point) Health() error { return p.b.w.unitHealth(p.s.unit) }
