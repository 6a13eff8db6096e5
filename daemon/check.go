package daemon

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/physd/physd/drivers"
	_ "github.com/physd/physd/drivers/all" // every bus driver (the one list)
	"github.com/physd/physd/manifest"
)

// ParseManifest parses the manifest file's content data, read once (what
// is checked is what is used), and checks every binding offline: the one
// check `physd validate`, `physd run` and a reload apply.
func ParseManifest(path string, data []byte) (*manifest.Manifest, error) {
	m, err := manifest.Parse(path, data)
	if err != nil {
		return nil, err
	}
	if err := CheckBindings(m); err != nil {
		return nil, err
	}
	return m, nil
}

// CheckBindings opens each simulated bus and binds its capabilities, and
// checks hardware bindings without opening the hardware, so validate
// catches driver configuration errors too and never touches a device.
func CheckBindings(m *manifest.Manifest) error {
	var errs []error
	for _, c := range m.Capabilities {
		if c.Binding.Bus == "" {
			errs = append(errs, fmt.Errorf("%s: %s.bus: required; fix: name the bus this capability is wired to (one of buses:)", c.Binding.Pos, c.Binding.Field))
		}
	}
	// Bus by bus in name order: the same manifest prints the same errors
	// in the same order every time.
	for _, name := range slices.Sorted(maps.Keys(m.Buses)) {
		b := m.Buses[name]
		if b.Type != "sim" {
			d, ok := drivers.LookupDriver(b.Type)
			if !ok {
				errs = append(errs, fmt.Errorf("%s: buses.%s.type: no driver for %q; fix: %s", b.TypePos, name, b.Type, manifest.OneOf(b.Type, drivers.Types())))
				continue
			}
			if d.CheckBus != nil {
				if err := d.CheckBus(b); err != nil {
					errs = append(errs, err)
				}
			}
			if span := d.Span; span != nil {
				// The write spans too: two do_ capabilities on one register
				// are refused here, before any bus opens.
				var caps []*manifest.Capability
				var spans []drivers.Spanner
				for _, c := range m.Capabilities {
					if c.Binding.Bus == name {
						sp, err := span(c)
						if err != nil {
							errs = append(errs, err)
							continue
						}
						caps, spans = append(caps, c), append(spans, sp)
					}
				}
				if err := drivers.SharedSpans(name, caps, spans); err != nil {
					errs = append(errs, err)
				}
			} else if check := d.Check; check != nil {
				for _, c := range m.Capabilities {
					if c.Binding.Bus == name {
						if err := check(c); err != nil {
							errs = append(errs, err)
						}
					}
				}
			}
			continue
		}
		bus, err := drivers.Open(context.Background(), b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var caps []*manifest.Capability
		var points []drivers.Point
		for _, c := range m.Capabilities {
			if c.Binding.Bus == name {
				p, err := bus.Point(c)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				caps, points = append(caps, c), append(points, p)
			}
		}
		if err := drivers.SharedActuators(name, caps, points); err != nil {
			errs = append(errs, err)
		}
		bus.Close()
	}
	return errors.Join(errs...)
}
