package gpio

import (
	"context"
	"fmt"
	"time"

	"github.com/physd/physd/drivers"
)

// levelPoint reads (and, for outputs bound by a do capability, drives) a
// pin's logical level.
type levelPoint struct {
	st       *pinState
	what     string // "gpio gpio GPIO17", the prefix of errors
	writable bool
}

var (
	_ drivers.Point       = (*levelPoint)(nil)
	_ drivers.PointHealth = (*levelPoint)(nil)
	_ drivers.Point       = (*countPoint)(nil)
	_ drivers.PointHealth = (*countPoint)(nil)
)

// Read returns the logical level as a bool (true = active).
func (p *levelPoint) Read(ctx context.Context) (drivers.Reading, error) {
	if err := ctx.Err(); err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrTimeout, err)
	}
	v, err := p.st.level()
	if err != nil {
		return drivers.Reading{}, err
	}
	return drivers.Reading{Value: v, At: time.Now()}, nil
}

// Write drives the output to the logical level v (a bool).
func (p *levelPoint) Write(ctx context.Context, v any) error {
	if !p.writable {
		return fmt.Errorf("%s: opened for a read capability: %w", p.what, drivers.ErrReadOnly)
	}
	b, ok := v.(bool)
	if !ok {
		return fmt.Errorf("%s: want a bool, got %T: %w", p.what, v, drivers.ErrBadValue)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrTimeout, err)
	}
	return p.st.drive(b)
}

// Health reports a pin that is missing or could not be configured.
func (p *levelPoint) Health() error { return p.st.health() }

// countPoint reads an input's edge count since the daemon configured it.
type countPoint struct {
	st   *pinState
	what string
}

// Read returns the count as an int64.
func (p *countPoint) Read(ctx context.Context) (drivers.Reading, error) {
	if err := ctx.Err(); err != nil {
		return drivers.Reading{}, fmt.Errorf("%s: %w (%w)", p.what, drivers.ErrTimeout, err)
	}
	n, err := p.st.count()
	if err != nil {
		return drivers.Reading{}, err
	}
	return drivers.Reading{Value: n, At: time.Now()}, nil
}

// Write is refused: a counter is an observation.
func (p *countPoint) Write(context.Context, any) error {
	return fmt.Errorf("%s: an edge counter cannot be written: %w", p.what, drivers.ErrReadOnly)
}

// Health reports a pin that is missing or could not be configured.
func (p *countPoint) Health() error { return p.st.health() }
