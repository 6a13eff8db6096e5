package opcua

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

const testFile = "plant.yml"

// parseManifest builds a manifest with the bus "plc" (the bus entry's keys
// as a YAML flow mapping) and the given capabilities, by the real parser.
func parseManifest(t testing.TB, bus, caps string) (*manifest.Manifest, error) {
	t.Helper()
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  plc: ` + bus + `
capabilities:
` + caps
	return manifest.Parse(testFile, []byte(src))
}

func mustParse(t testing.TB, bus, caps string) *manifest.Manifest {
	t.Helper()
	m, err := parseManifest(t, bus, caps)
	if err != nil {
		t.Fatalf("manifest.Parse: %v", err)
	}
	return m
}

func readCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: d\n    data_type: " + dataType +
		"\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

func doCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: do\n    description: d\n    data_type: " + dataType +
		"\n    range: {min: -1000, max: 1000}\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

// openAll opens m's bus "plc" through the driver registry, as the node
// does, and binds every capability.
func openAll(t testing.TB, m *manifest.Manifest) (*Bus, map[string]drivers.Point) {
	t.Helper()
	db, err := drivers.Open(context.Background(), m.Buses["plc"])
	if err != nil {
		t.Fatalf("drivers.Open: %v", err)
	}
	b := db.(*Bus)
	t.Cleanup(func() { _ = b.Close() })
	pts := map[string]drivers.Point{}
	for i := range m.Capabilities {
		c := m.Capabilities[i]
		p, err := b.Point(c)
		if err != nil {
			t.Fatalf("Point(%s): %v", c.Name, err)
		}
		pts[c.Name] = p
	}
	return b, pts
}

// errText is err's text, with each positioned error on its own line.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "\n", " | ")
}

func wantErr(t testing.TB, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one containing %q", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not contain %q", errText(err), p)
		}
	}
}

var _ = fmt.Sprint

func errorsIs(err, target error) bool { return errors.Is(err, target) }
