package spi

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/devices/mcp3008"
	"github.com/physd/physd/drivers/devices/mcp3008/mcp3008fake"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
	"periph.io/x/conn/v3/spi"
	"periph.io/x/conn/v3/spi/spireg"
)

func parse(t *testing.T, busCfg, caps string) *manifest.Manifest {
	t.Helper()
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  adc: ` + busCfg + `
capabilities:
` + caps
	m, err := manifest.Parse("spi.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: d\n    data_type: " + dataType + "\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

// TestMCP3008ThroughNode: capabilities bound to an MCP3008 on a fake SPI
// port (registered with periph's spireg, as the host driver registers
// /dev/spidev0.0) read the inputs' voltages through the node.
func TestMCP3008ThroughNode(t *testing.T) {
	chip := mcp3008fake.New(3.3)
	chip.SetInput(0, 1.65)
	chip.SetInput(2, 2.0)
	chip.SetInput(3, 0.5)
	const name = "fake-spidev0.0"
	if err := spireg.Register(name, nil, -1, func() (spi.PortCloser, error) { return chip, nil }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = spireg.Unregister(name) })
	m := parse(t, "{type: spi, port: "+name+"}",
		readCap("ain0", "float", "{type: spi, bus: adc, profile: mcp3008, channel: 0}")+
			readCap("pair23", "float", "{type: spi, bus: adc, profile: mcp3008, channel: 2, input: differential, vref: 3.3}")+
			readCap("moisture", "int", "{type: spi, bus: adc, profile: mcp3008, channel: 3, scale: 100, offset: -10}"))
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(context.Background())
	for tool, want := range map[string]float64{
		"read_ain0":     mcp3008.Volts(512, 3.3),                      // 1.65 V
		"read_pair23":   mcp3008.Volts(465, 3.3),                      // 1.5 V → floor(465.45)
		"read_moisture": math.Round(mcp3008.Volts(155, 3.3)*100 - 10), // 0.5 V → 155
	} {
		o, err := n.Read(context.Background(), tool, 0)
		if err != nil || o.Quality != promcp.QualityGood {
			t.Fatalf("%s: %+v %v", tool, o, err)
		}
		var got float64
		switch v := o.Value.(type) {
		case float64:
			got = v
		case int64:
			got = float64(v)
		}
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", tool, o.Value, want)
		}
	}
	if f, mode := chip.Connected(); f != mcp3008.MaxSpeed || mode != spi.Mode0 {
		t.Errorf("connected at %v %v", f, mode)
	}
	chip.SetAbsent(true)
	o, _ := n.Read(context.Background(), "read_ain0", 0)
	// The node serves the last good value as stale, naming the failure.
	if o.Quality == promcp.QualityGood || !strings.Contains(o.Reason, "null bit reads 1") {
		t.Errorf("no chip: %+v", o)
	}
}

func TestMissingPort(t *testing.T) {
	m := parse(t, "{type: spi, port: /dev/spidev9.9}", readCap("a", "float", "{type: spi, bus: adc, profile: mcp3008, channel: 0}"))
	_, err := drivers.Open(context.Background(), m.Buses["adc"])
	if !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "dtparam=spi=on") {
		t.Fatalf("%v", err)
	}
}

func TestBindingErrors(t *testing.T) {
	for _, c := range []struct{ binding, want string }{
		{"{type: spi, bus: adc, channel: 0}", "binding.profile: required"},
		{"{type: spi, bus: adc, profile: mcp3208, channel: 0}", `no SPI device profile "mcp3208"; fix: use profile: mcp3008 or mcp3004`},
		{"{type: spi, bus: adc, device: mcp3008, channel: 0}", "spi.yml:12:44: capabilities[0].binding.device: the part on a binding is named with profile:, on spi as on i2c and modbus; fix: write profile: mcp3008"},
		{"{type: spi, bus: adc, profile: mcp3008}", "binding.channel: required"},
		{"{type: spi, bus: adc, profile: mcp3008, channel: 8}", "spi.yml:12:63: capabilities[0].binding.channel: channel 8 is outside 0..7"},
		{"{type: spi, bus: adc, profile: mcp3004, channel: 4}", "channel 4 is outside 0..3"},
		{"{type: spi, bus: adc, profile: mcp3008, channel: 0, input: diff}", `input "diff"`},
		{"{type: spi, bus: adc, profile: mcp3008, channel: 0, vref: 12}", "vref 12 V is outside"},
		{"{type: spi, bus: adc, profile: mcp3008, channel: 0, gain: 2}", `unknown key "gain"`},
		{`{type: spi, bus: adc, address: "ch=0", profile: mcp3008, channel: 0}`, "not an address"},
	} {
		m := parse(t, "{type: spi, port: x}", readCap("p", "float", c.binding))
		if err := CheckBinding(m.Capabilities[0]); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err  %v\n  want %q", c.binding, err, c.want)
		}
	}
}
