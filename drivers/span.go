package drivers

import (
	"errors"
	"fmt"
	"sort"

	"github.com/physd/physd/manifest"
)

// Spanner is implemented by points that can say where on their device a
// write lands: a space (a simulated plant, one Modbus unit's table) and a
// range of addresses in it. Two do_ capabilities whose writes overlap
// would be one actuator behind two names, each with its own rate limit,
// cooldown and one-step-at-a-time rule: physd refuses that manifest.
type Spanner interface {
	WriteSpan() (space string, start, count uint64, where string)
}

// SharedActuators returns an error naming every pair of do_ capabilities
// on one bus whose points write overlapping addresses (points that do not
// implement Spanner are not compared).
func SharedActuators(bus string, caps []*manifest.Capability, points []Point) error {
	spanners := make([]Spanner, len(points))
	for i, p := range points {
		spanners[i], _ = p.(Spanner)
	}
	return SharedSpans(bus, caps, spanners)
}

// SharedSpans is SharedActuators for write spans known without an open
// bus (validate checks hardware bindings offline); a nil Spanner is not
// compared.
func SharedSpans(bus string, caps []*manifest.Capability, spanners []Spanner) error {
	type span struct {
		c            *manifest.Capability
		space        string
		start, count uint64
		where        string
	}
	var spans []span
	for i, c := range caps {
		if c.Kind != manifest.KindDo {
			continue
		}
		if sp := spanners[i]; sp != nil {
			space, start, count, where := sp.WriteSpan()
			spans = append(spans, span{c, space, start, max(count, 1), where})
		}
	}
	sort.Slice(spans, func(i, j int) bool {
		a, b := spans[i], spans[j]
		return a.space < b.space || a.space == b.space && a.start < b.start
	})
	var errs []error
	for i := 1; i < len(spans); i++ {
		a, b := spans[i-1], spans[i]
		if a.space == b.space && b.start < a.start+a.count {
			errs = append(errs, fmt.Errorf("%s: capabilities %s and %s both write %s on bus %s; fix: keep one do_ capability per actuator "+
				"(rate limits, cooldowns and one device step at a time are per capability, so two names would let each pass its own limit)",
				b.c.Binding.Pos, a.c.Name, b.c.Name, b.where, bus))
		}
	}
	return errors.Join(errs...)
}
