package scanskel

import (
	"strings"
	"testing"

	"github.com/physd/physd/manifest"
)

// TestOpening: the opening and one capability make a manifest that parses,
// with the device as given.
func TestOpening(t *testing.T) {
	var b strings.Builder
	Opening(&b, "gw_test_001", "test_gateway", "where the tests are")
	b.WriteString("buses:\n  sim1: {type: sim}\ncapabilities:\n  - {name: t, kind: read, description: d, data_type: float, semantic_tags: [t], binding: {type: sim, bus: sim1, address: t}}\n")
	m, err := manifest.Parse("skeleton.yml", []byte(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if m.Device.ID != "gw_test_001" || m.Device.Type != "test_gateway" || m.Device.Location.Zone != "unassigned" || !strings.Contains(b.String(), "# DECIDE: where the tests are") {
		t.Errorf("device %+v\n%s", m.Device, b.String())
	}
}

func TestOneLine(t *testing.T) {
	if got := OneLine("a\nb\tc\x7fd é"); got != "a b c d é" {
		t.Errorf("OneLine: %q", got)
	}
}
