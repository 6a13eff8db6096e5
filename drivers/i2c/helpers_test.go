package i2c

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

const testFile = "rpi.yml"

// manifestHeader is a valid manifest up to the bus config; busLine is the
// line "  i2c1: ..." so tests can assert positions.
const manifestHeader = `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
`

// parse builds a manifest with one i2c bus "i2c1" (config as a YAML flow
// mapping, e.g. `{type: i2c, bus: fake-1}`) and the given capabilities
// (YAML list items), parsed by the real manifest parser.
func parse(t testing.TB, busCfg, caps string) *manifest.Manifest {
	t.Helper()
	src := manifestHeader + "  i2c1: " + busCfg + "\ncapabilities:\n" + caps
	m, err := manifest.Parse(testFile, []byte(src))
	if err != nil {
		t.Fatalf("manifest.Parse: %v\n%s", err, numbered(src))
	}
	return m
}

// numbered prefixes each line with its number, to read positions in failures.
func numbered(src string) string {
	var b strings.Builder
	for i, l := range strings.Split(src, "\n") {
		fmt.Fprintf(&b, "%3d| %s\n", i+1, l)
	}
	return b.String()
}

// readCap is a read capability list item with the given data type and
// binding (a YAML flow mapping).
func readCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: d\n    data_type: " + dataType +
		"\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

// doCap is a do capability; extra lines (indented 4) are appended.
func doCap(name, dataType, binding, extra string) string {
	return "  - name: " + name + "\n    kind: do\n    description: d\n    data_type: " + dataType +
		"\n    semantic_tags: [t]\n    binding: " + binding + "\n" + extra
}

// openBus opens m's bus i2c1 through the driver registry, as the node does.
func openBus(t testing.TB, m *manifest.Manifest) drivers.Bus {
	t.Helper()
	b, err := drivers.Open(context.Background(), m.Buses["i2c1"])
	if err != nil {
		t.Fatalf("drivers.Open: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// points opens every capability of m on b, by name.
func points(t testing.TB, m *manifest.Manifest, b drivers.Bus) map[string]drivers.Point {
	t.Helper()
	out := map[string]drivers.Point{}
	for _, c := range m.Capabilities {
		p, err := b.Point(c)
		if err != nil {
			t.Fatalf("Point(%s): %v", c.Name, err)
		}
		out[c.Name] = p
	}
	return out
}

// readCtx reads p the way the node does: under a timeout_ms deadline.
func readCtx(t testing.TB, p drivers.Point) (any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), manifest.DefaultTimeoutMS*1e6)
	defer cancel()
	r, err := p.Read(ctx)
	return r.Value, err
}

func mustRead(t testing.TB, p drivers.Point) any {
	t.Helper()
	v, err := readCtx(t, p)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return v
}

// setup registers a fake bus holding an SHT3x at 0x44 and a register
// device at 0x48, and opens the given capabilities on it.
func setup(t testing.TB, caps string) (*fakeBus, *fakeSHT, *fakeRegs, drivers.Bus, map[string]drivers.Point) {
	t.Helper()
	fb := newFakeBus()
	sht := &fakeSHT{rawT: 0x6666, rawRH: 0x8000}
	regs := &fakeRegs{}
	fb.add(0x44, sht)
	fb.add(0x48, regs)
	name := registerFake(t, fb)
	m := parse(t, "{type: i2c, bus: "+name+"}", caps)
	b := openBus(t, m)
	return fb, sht, regs, b, points(t, m, b)
}
