package daemon

import (
	"context"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/physd/physd/drivers/modbus"
	"github.com/physd/physd/drivers/modbus/modbustest"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

const busManifest = `physmcp_version: "0.1"
device: {id: gw_bus, type: plc, location: {zone: plant}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plc: {type: modbus_tcp, address: "ADDR", timeout_ms: TIMEOUT}
EXTRABUS
capabilities:
  - name: level
    kind: read
    description: A level.
    binding: {type: modbus, bus: plc, table: holding, address: 3, data_type: uint16}
    data_type: int
    semantic_tags: [level]
EXTRACAP`

// openTestNode opens a node of m on a fresh state directory, closed
// when the test ends.
func openTestNode(t *testing.T, m *manifest.Manifest) *node.Node {
	t.Helper()
	return testrig.OpenManifest(t, m, "", nil).Node
}

// gauges are the values of a gauge family by its label's value.
func gauges(t *testing.T, mx *metrics.Metrics, name, label string) map[string]float64 {
	t.Helper()
	fams, err := mx.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			out[labelOf(m, label)] = m.GetGauge().GetValue()
		}
	}
	return out
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestBusMetricsFollowReload: after a reload, a reopened Modbus bus's
// counters are the new engine's (not the closed one's), a bus the reload
// adds has physd_bus_up, and one it removes has no series.
func TestBusMetricsFollowReload(t *testing.T) {
	srv, err := modbustest.StartTCP("127.0.0.1:0", modbustest.NewBank(16))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	parse := func(timeout string, extra bool) *manifest.Manifest {
		t.Helper()
		r := strings.NewReplacer("ADDR", srv.Addr, "TIMEOUT", timeout, "EXTRABUS\n", "", "EXTRACAP", "")
		if extra {
			r = strings.NewReplacer("ADDR", srv.Addr, "TIMEOUT", timeout,
				"EXTRABUS\n", "  plant: {type: sim, zones: {zone_a: {ambient_c: 12, initial_c: 18}}}\n",
				"EXTRACAP", `  - name: temperature_zone_a
    kind: read
    description: Air temperature.
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: celsius
    semantic_tags: [temperature]
`)
		}
		m, err := manifest.Parse("m.yml", []byte(r.Replace(busManifest)))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ctx := context.Background()
	n := openTestNode(t, parse("500", false))
	mx := metrics.New()
	registerBusMetrics(mx, n)
	for range 3 {
		if _, err := n.Read(ctx, "read_level", 0); err != nil {
			t.Fatal(err)
		}
	}
	old := n.Buses()["plc"].(*modbus.Bus)
	if got := gauges(t, mx, "physd_bus_requests", "bus")["plc"]; got != float64(old.Stats().Requests) || got < 3 {
		t.Fatalf("before the reload: physd_bus_requests{bus=plc} = %v, want the engine's %d (3 reads at least)", got, old.Stats().Requests)
	}

	// timeout_ms changed: the bus is reopened (a new engine); a sim bus
	// is added.
	if _, err := n.Reload(ctx, parse("700", true)); err != nil {
		t.Fatal(err)
	}
	reopened := n.Buses()["plc"].(*modbus.Bus)
	if reopened == old {
		t.Fatal("the reload did not reopen the bus")
	}
	if _, err := n.Read(ctx, "read_level", 0); err != nil {
		t.Fatal(err)
	}
	if got, want := gauges(t, mx, "physd_bus_requests", "bus")["plc"], float64(reopened.Stats().Requests); got != want || got == float64(old.Stats().Requests) {
		t.Errorf("after the reopen: physd_bus_requests{bus=plc} = %v, want the new engine's %v (the closed one's is %d)", got, want, old.Stats().Requests)
	}
	up := gauges(t, mx, "physd_bus_up", "bus")
	if up["plc"] != 1 || up["plant"] != 1 {
		t.Errorf("after the reload: physd_bus_up = %v, want plc and the added plant up", up)
	}

	if _, err := n.Reload(ctx, parse("700", false)); err != nil {
		t.Fatal(err)
	}
	if up = gauges(t, mx, "physd_bus_up", "bus"); len(up) != 1 || up["plc"] != 1 {
		t.Errorf("after the reload that removed plant: physd_bus_up = %v, want plc only", up)
	}
}
