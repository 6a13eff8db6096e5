// Package rpi_test checks the Raspberry Pi example manifest: it parses, and
// every binding passes its driver's key checks (physd validate opens only
// simulated buses, so it cannot check these without touching hardware).
package rpi_test

import (
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/gpio"
	"github.com/physd/physd/drivers/i2c"
	"github.com/physd/physd/manifest"
)

func TestExampleManifest(t *testing.T) {
	m, err := manifest.Load("physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	check := map[string]func(*manifest.Capability) error{"i2c": i2c.CheckBinding, "gpio": gpio.CheckBinding}
	for name, b := range m.Buses {
		if _, ok := drivers.Lookup(b.Type); !ok {
			t.Errorf("bus %s: no driver for type %q", name, b.Type)
		}
	}
	for _, c := range m.Capabilities {
		b := m.Buses[c.Binding.Bus]
		if b == nil {
			t.Errorf("%s: bus %q is not declared", c.Name, c.Binding.Bus)
			continue
		}
		if err := check[b.Type](c); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
	}
	if len(m.Capabilities) != 6 {
		t.Errorf("%d capabilities, want 6", len(m.Capabilities))
	}
}
