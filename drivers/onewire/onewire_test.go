package onewire

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// w1dir is a fake /sys/bus/w1/devices: one directory per sensor with its
// w1_slave file, as the kernel's w1-therm driver lays them out.
func w1dir(t *testing.T, sensors map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for id, content := range sensors {
		if err := os.MkdirAll(filepath.Join(dir, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, id, "w1_slave"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func parse(t *testing.T, busCfg, caps string) *manifest.Manifest {
	t.Helper()
	src := `physmcp_version: "0.1"
device: {id: gw_1, type: gateway, location: {zone: z1}}
network: {protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}], mesh: {}}
buses:
  w1: ` + busCfg + `
capabilities:
` + caps
	m, err := manifest.Parse("w1.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readCap(name, dataType, binding string) string {
	return "  - name: " + name + "\n    kind: read\n    description: d\n    data_type: " + dataType + "\n    semantic_tags: [t]\n    binding: " + binding + "\n"
}

func TestRead(t *testing.T) {
	dir := w1dir(t, map[string]string{
		"28-0316a2794bff": "72 01 4b 46 7f ff 0e 10 57 : crc=57 YES\n72 01 4b 46 7f ff 0e 10 57 t=23125\n",
		"28-0316a2794c0a": "5e ff 4b 46 7f ff 02 10 a8 : crc=a8 YES\n5e ff 4b 46 7f ff 02 10 a8 t=-10125\n",
		"28-00000a0b0c0d": "72 01 4b 46 7f ff 0e 10 57 : crc=00 NO\n72 01 4b 46 7f ff 0e 10 57 t=23125\n",
		"28-00000a0b0c0e": "50 05 4b 46 7f ff 0c 10 1c : crc=1c YES\n50 05 4b 46 7f ff 0c 10 1c t=85000\n",
	})
	m := parse(t, "{type: onewire, path: "+dir+"}",
		readCap("tank", "float", `{type: onewire, bus: w1, address: "28-0316a2794bff"}`)+
			readCap("outside_f", "float", `{type: onewire, bus: w1, address: "28-0316a2794c0a", scale: 1.8, offset: 32}`)+
			readCap("noisy", "float", `{type: onewire, bus: w1, address: "28-00000a0b0c0d"}`)+
			readCap("reset", "float", `{type: onewire, bus: w1, address: "28-00000a0b0c0e"}`)+
			readCap("gone", "int", `{type: onewire, bus: w1, address: "28-00000a0b0c0f"}`))
	b, err := drivers.Open(context.Background(), m.Buses["w1"])
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	read := func(i int) (any, error) {
		p, err := b.Point(m.Capabilities[i])
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := p.Read(ctx)
		return r.Value, err
	}
	if v, err := read(0); err != nil || v != 23.125 {
		t.Errorf("tank: %v %v", v, err)
	}
	if v, err := read(1); err != nil || math.Abs(v.(float64)-13.775) > 1e-9 {
		t.Errorf("outside_f: %v %v", v, err)
	}
	if _, err := read(2); err == nil || !strings.Contains(err.Error(), "scratchpad CRC error") {
		t.Errorf("crc NO: %v", err)
	}
	if _, err := read(3); err == nil || !strings.Contains(err.Error(), "power-on value 85 °C") {
		t.Errorf("85 °C: %v", err)
	}
	if _, err := read(4); !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "not on the bus") {
		t.Errorf("missing sensor: %v", err)
	}
	p, _ := b.Point(m.Capabilities[0])
	if err := p.Write(context.Background(), 1.0); !errors.Is(err, drivers.ErrReadOnly) {
		t.Errorf("write: %v", err)
	}
}

func TestMissingBus(t *testing.T) {
	m := parse(t, "{type: onewire, path: /nonexistent/w1}", readCap("tank", "float", `{type: onewire, bus: w1, address: "28-0316a2794bff"}`))
	_, err := drivers.Open(context.Background(), m.Buses["w1"])
	if !errors.Is(err, drivers.ErrOffline) || !strings.Contains(err.Error(), "dtoverlay=w1-gpio") {
		t.Fatalf("%v", err)
	}
}

func TestBindingErrors(t *testing.T) {
	for _, c := range []struct{ cap, want string }{
		{readCap("x", "float", `{type: onewire, bus: w1, address: "28-0316A2794BFF"}`), `w1.yml:12:14: capabilities[0].binding.address: "28-0316A2794BFF" is not a 1-Wire device id`},
		{readCap("x", "float", `{type: onewire, bus: w1, address: "29-0316a2794bff"}`), "family 29"},
		{readCap("x", "float", `{type: onewire, bus: w1, address: "28-0316a2794bff", scale: 0}`), "binding.scale: scale must be a finite non-zero number"},
		{readCap("x", "float", `{type: onewire, bus: w1, address: "28-0316a2794bff", resolution: 12}`), `unknown key "resolution"`},
		{readCap("x", "bool", `{type: onewire, bus: w1, address: "28-0316a2794bff"}`), "capabilities[0].data_type: data_type \"bool\""},
		{"  - name: x\n    kind: do\n    description: d\n    data_type: float\n    semantic_tags: [t]\n    binding: {type: onewire, bus: w1, address: \"28-0316a2794bff\"}\n", "capabilities[0].kind: a 1-Wire temperature sensor is read-only"},
	} {
		m := parse(t, "{type: onewire}", c.cap)
		if err := CheckBinding(m.Capabilities[0]); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s:\n  err  %v\n  want %q", c.cap, err, c.want)
		}
	}
}
