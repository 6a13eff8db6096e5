package gpio

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"periph.io/x/conn/v3/gpio"
	"periph.io/x/conn/v3/gpio/gpioreg"
)

const testFile = "rpi.yml"

// parse builds a manifest with the bus "gpio" and the given capabilities
// (YAML list items), parsed by the real manifest parser.
func parse(t testing.TB, caps string) *manifest.Manifest {
	t.Helper()
	return parseBus(t, "{type: gpio}", caps)
}

// parseBus is parse with the bus entry's YAML (a flow mapping).
func parseBus(t testing.TB, bus, caps string) *manifest.Manifest {
	t.Helper()
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  gpio: ` + bus + `
capabilities:
` + caps
	m, err := manifest.Parse(testFile, []byte(src))
	if err != nil {
		var b strings.Builder
		for i, l := range strings.Split(src, "\n") {
			fmt.Fprintf(&b, "%3d| %s\n", i+1, l)
		}
		t.Fatalf("manifest.Parse: %v\n%s", err, b.String())
	}
	return m
}

func readCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: d\n    data_type: " + dataType +
		"\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

func doCap(name, binding string) string {
	return "  - name: " + name + "\n    kind: do\n    description: d\n    data_type: bool\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

// newPin registers a fake pin with gpioreg for the duration of the test.
// Names are global to the process: each test uses its own.
func newPin(t testing.TB, name string) *testPin {
	t.Helper()
	p := &testPin{N: name, EdgesChan: make(chan gpio.Level, 16)}
	register(t, p)
	return p
}

func register(t testing.TB, p gpio.PinIO) {
	t.Helper()
	if err := gpioreg.Register(p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = gpioreg.Unregister(p.Name()) })
}

// open opens m's bus "gpio" through the driver registry, as the node does,
// with fast timings, and binds every capability.
func open(t testing.TB, m *manifest.Manifest) (*Bus, map[string]drivers.Point) {
	t.Helper()
	db, err := drivers.Open(context.Background(), m.Buses["gpio"])
	if err != nil {
		t.Fatalf("drivers.Open: %v", err)
	}
	b := db.(*Bus)
	b.poll, b.retryEvery = 5*time.Millisecond, 0
	t.Cleanup(func() { _ = b.Close() })
	pts := map[string]drivers.Point{}
	for _, c := range m.Capabilities {
		p, err := b.Point(c)
		if err != nil {
			t.Fatalf("Point(%s): %v", c.Name, err)
		}
		pts[c.Name] = p
	}
	return b, pts
}

func read(t testing.TB, p drivers.Point) any {
	t.Helper()
	r, err := p.Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return r.Value
}

func write(t testing.TB, p drivers.Point, v any) {
	t.Helper()
	if err := p.Write(context.Background(), v); err != nil {
		t.Fatalf("Write(%v): %v", v, err)
	}
}

// level and pull read the fake's state under its lock.
func level(p *testPin) gpio.Level {
	p.Lock()
	defer p.Unlock()
	return p.L
}

func pull(p *testPin) gpio.Pull {
	p.Lock()
	defer p.Unlock()
	return p.P
}

func setLevel(p *testPin, l gpio.Level) {
	p.Lock()
	defer p.Unlock()
	p.L = l
}
