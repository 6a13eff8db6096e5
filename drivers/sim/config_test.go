package sim

import (
	"context"
	"errors"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"gopkg.in/yaml.v3"
)

func TestRegisteredAsSim(t *testing.T) {
	b := busFrom(t, "zones: {zone_a: {}}")
	bus, err := drivers.Open(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	defer bus.Close()
	if _, ok := bus.(*Plant); !ok {
		t.Fatalf("drivers.Open(type sim) = %T, want *Plant", bus)
	}
	if err := bus.Health(); err != nil {
		t.Fatal(err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []string // substrings of the error, in order
	}{
		{"unknown top key", "seed: 1\nlatency: 5\n",
			[]string{"plant.yml:2:1: buses.plant.latency: unknown key \"latency\"", "did you mean \"latency_ms\""}},
		{"unknown zone key", "zones:\n  zone_a:\n    ambient_c: 12\n    tau: 600\n",
			[]string{"plant.yml:4:5: buses.plant.zones.zone_a.tau: unknown key", "did you mean \"tau_s\""}},
		{"drains unknown tank", "tanks: {rain: {capacity_l: 10}}\nvalves:\n  v: {travel_ms: 100, drains: rian}\n",
			[]string{"plant.yml:3:31: buses.plant.valves.v.drains: drains names unknown tank \"rian\"", "fix: name one of the tanks: rain"}},
		{"drains without tanks", "valves: {v: {drains: t}}\n",
			[]string{"buses.plant.valves.v.drains", "declare the tank under tanks:"}},
		{"capacity zero", "tanks: {t: {capacity_l: 0}}\n",
			[]string{"plant.yml:1:25: buses.plant.tanks.t.capacity_l: capacity_l must be > 0, got 0"}},
		{"initial above capacity", "tanks: {t: {capacity_l: 10, initial_l: 11}}\n",
			[]string{"buses.plant.tanks.t.initial_l: initial_l must be between 0 and 10, got 11"}},
		{"travel zero", "valves: {v: {travel_ms: 0}}\n",
			[]string{"buses.plant.valves.v.travel_ms: travel_ms must be > 0"}},
		{"tau negative", "zones: {z: {tau_s: -1}}\n", []string{"buses.plant.zones.z.tau_s: tau_s must be > 0"}},
		{"rh above 100", "zones: {z: {initial_rh: 120}}\n", []string{"buses.plant.zones.z.initial_rh"}},
		{"valve initial", "valves: {v: {initial: 101}}\n", []string{"buses.plant.valves.v.initial"}},
		{"negative latency", "latency_ms: -1\n", []string{"buses.plant.latency_ms: latency_ms must be between 0"}},
		{"wrong type", "seed: seven\n", []string{"plant.yml:1:7: buses.plant.seed: expected an integer", "seven"}},
		{"float for int", "valves: {v: {travel_ms: 1.5}}\n", []string{"plant.yml:1:25: buses.plant.valves.v.travel_ms: expected an integer", "1.5"}},
		{"string for number", "zones: {z: {tau_s: \"600\"}}\n", []string{"plant.yml:1:20: buses.plant.zones.z.tau_s: expected a number", "\"600\""}},
		{"bool for number", "zones: {z: {tau_s: true}}\n", []string{"buses.plant.zones.z.tau_s: expected a number"}},
		{"zones not a map", "zones: [a, b]\n", []string{"plant.yml:1:8: buses.plant.zones: expected a mapping, got a list"}},
		{"zone not a map", "zones: {z: 5}\n", []string{"plant.yml:1:12: buses.plant.zones.z: expected a mapping"}},
		{"dotted name", "zones: {z.a: {}}\n", []string{"buses.plant.zones.z.a: invalid name \"z.a\""}},
		{"name clash", "zones: {x: {}}\ntanks: {x: {}}\n", []string{"buses.plant.tanks.x: name \"x\" is already used in zones"}},
		{"duplicate key", "seed: 1\nseed: 2\n", []string{"plant.yml:2:1: buses.plant.seed: duplicate key"}},
		{"nan", "zones: {z: {ambient_c: .nan}}\n", []string{"buses.plant.zones.z.ambient_c"}},
		{"several errors", "seed: x\nlatency: 1\n", []string{"plant.yml:1:7: buses.plant.seed", "\nplant.yml:2:1: buses.plant.latency"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(busFrom(t, tc.src))
			if err == nil {
				t.Fatalf("config accepted:\n%s", tc.src)
			}
			msg := err.Error()
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error\n  %s\nlacks (in order) %q", msg, w)
				}
				rest = rest[i+len(w):]
			}
			var me *manifest.Error
			if !errors.As(err, &me) || me.Fix == "" {
				t.Fatalf("error %v is not a *manifest.Error with a fix", err)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	// No config at all: the default three-zone greenhouse.
	p, err := New(&manifest.Bus{Name: "plant", Type: "sim"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"irrigation_a.command", "irrigation_a.position", "rain_tank.level",
		"zone_a.fan", "zone_a.heater", "zone_a.humidity", "zone_a.temperature", "zone_a.vent",
		"zone_b.fan", "zone_b.heater", "zone_b.humidity", "zone_b.temperature", "zone_b.vent",
		"zone_c.fan", "zone_c.heater", "zone_c.humidity", "zone_c.temperature", "zone_c.vent",
	}
	if got := p.Points(); !reflect.DeepEqual(got, want) {
		t.Fatalf("default points = %v", got)
	}
	s := p.Snapshot()
	if s["rain_tank.level"] != defaultCapacityL/2 || s["zone_a.temperature"] != defaultAmbientC {
		t.Fatalf("default snapshot = %v", s)
	}

	// The parser may leave type: in Config; it is tolerated. Declaring only
	// zones gives only zones.
	p, err = New(busFrom(t, "type: sim\nzones: {only: {}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Points(); len(got) != 5 || got[0] != "only.fan" {
		t.Fatalf("points = %v", got)
	}
}

// The example greenhouse manifest is the contract: its plant bus opens and
// every capability bound to it gets a point.
func TestExampleGreenhouseManifest(t *testing.T) {
	synctest.Test(t, testExampleGreenhouseManifest)
}

func testExampleGreenhouseManifest(t *testing.T) {
	const path = "../../examples/greenhouse/physmcp.manifest.yml"
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	root := mapping(t, string(src))
	var busNode, capsNode *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		switch root.Content[i].Value {
		case "buses":
			busNode = root.Content[i+1]
		case "capabilities":
			capsNode = root.Content[i+1]
		}
	}
	plantNode := busNode.Content[1]
	if busNode.Content[0].Value != "plant" {
		t.Fatalf("first bus is %q", busNode.Content[0].Value)
	}
	p, err := New(&manifest.Bus{Name: "plant", Type: "sim", Config: plantNode, Pos: manifest.Pos{File: path}})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for _, n := range capsNode.Content {
		out, err := yaml.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		c := capFrom(t, string(out))
		if c.Binding.Bus != "plant" {
			continue
		}
		pt, err := p.Point(c)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if _, err := pt.Read(t.Context()); err != nil {
			t.Errorf("%s: read: %v", c.Name, err)
		}
		bound++
	}
	if bound != 13 {
		t.Fatalf("bound %d capabilities, want the example's 13", bound)
	}
	near(t, "zone_b initial temperature", p.Snapshot()["zone_b.temperature"], 19, 1e-6)
}

func TestPointErrors(t *testing.T) {
	p := newPlantT(t, oneZone+"valves: {v: {}}\n")
	for _, tc := range []struct {
		name, src string
		want      []string
	}{
		{"unknown object", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, point: zone_q.temperature}}",
			[]string{"plant.yml:1:81: capabilities.t.binding.point: unknown point \"zone_q.temperature\"", "fix: use one of v.command, v.position, zone_a.fan"}},
		{"unknown signal", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, point: zone_a.temp}}",
			[]string{"unknown point \"zone_a.temp\"", "fix: use one of zone_a.fan, zone_a.heater, zone_a.humidity, zone_a.temperature, zone_a.vent"}},
		{"do on a measurement", "{name: t, kind: do, data_type: float, binding: {type: sim, bus: plant, point: zone_a.temperature}}",
			[]string{"point \"zone_a.temperature\" is a measurement", "v.command, zone_a.fan, zone_a.heater, zone_a.vent"}},
		{"do on valve position", "{name: t, kind: do, data_type: float, binding: {type: sim, bus: plant, point: v.position}}",
			[]string{"\"v.position\" is a measurement"}},
		{"bool temperature", "{name: t, kind: read, data_type: bool, binding: {type: sim, bus: plant, point: zone_a.temperature}}",
			[]string{"plant.yml:1:1: capabilities.t.data_type: point \"zone_a.temperature\" (celsius) cannot be a bool"}},
		{"enum", "{name: t, kind: do, data_type: enum, binding: {type: sim, bus: plant, point: zone_a.heater}}",
			[]string{"data_type \"enum\" is not supported"}},
		{"string", "{name: t, kind: read, data_type: string, binding: {type: sim, bus: plant, point: zone_a.heater}}",
			[]string{"data_type \"string\" is not supported"}},
		{"bad kind", "{name: t, kind: poke, data_type: float, binding: {type: sim, bus: plant, point: zone_a.heater}}",
			[]string{"capabilities.t.kind: capability kind \"poke\" is not read or do"}},
		{"no point", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant}}",
			[]string{"plant.yml:1:50: capabilities.t.binding: a sim binding needs a point"}},
		{"unknown binding key", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, pin: 3}}",
			[]string{"capabilities.t.binding.pin: unknown key \"pin\"", "point"}},
		{"point and address disagree", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, address: zone_a.humidity, point: zone_a.temperature}}",
			[]string{"capabilities.t.binding.point: point \"zone_a.temperature\" and address \"zone_a.humidity\" disagree"}},
		{"unknown address", "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, address: nope}}",
			[]string{"capabilities.t.binding.address: unknown point \"nope\""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Point(capFrom(t, tc.src))
			if err == nil {
				t.Fatal("binding accepted")
			}
			msg, rest := err.Error(), err.Error()
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("error\n  %s\nlacks (in order) %q", msg, w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
	// The address string alone is enough.
	pt, err := p.Point(capFrom(t, "{name: t, kind: read, data_type: float, binding: {type: sim, bus: plant, address: zone_a.humidity}}"))
	if err != nil {
		t.Fatal(err)
	}
	near(t, "humidity via address", readF(t, pt), 85, 0)
}

func TestDataTypesAndWriteValidation(t *testing.T) {
	p := newPlantT(t, oneZone+"valves: {v: {}}\n")
	fanF := open(t, p, "do", "float", "zone_a.fan")
	fanI := open(t, p, "do", "int", "zone_a.fan")
	fanB := open(t, p, "do", "bool", "zone_a.fan")
	fanR := open(t, p, "read", "float", "zone_a.fan")

	write(t, fanF, 49.6)
	r, _ := fanI.Read(t.Context())
	if r.Value != int64(50) {
		t.Fatalf("int read of 49.6 = %#v, want int64(50)", r.Value)
	}
	r, _ = fanB.Read(t.Context())
	if r.Value != false {
		t.Fatalf("bool read of 49.6 = %#v, want false", r.Value)
	}
	write(t, fanI, int64(50))
	if r, _ = fanB.Read(t.Context()); r.Value != true {
		t.Fatalf("bool read of 50 = %#v, want true", r.Value)
	}
	write(t, fanB, false)
	near(t, "fan after writing false", readF(t, fanR), 0, 0)
	write(t, fanB, true)
	near(t, "fan after writing true", readF(t, fanR), 100, 0)
	write(t, fanI, 30.0) // an integral float64 is fine for an int point
	near(t, "fan after writing 30.0 as int", readF(t, fanR), 30, 0)

	for _, tc := range []struct {
		pt   drivers.Point
		v    any
		want error
	}{
		{fanF, 100.5, drivers.ErrBadValue},
		{fanF, -0.1, drivers.ErrBadValue},
		{fanF, math.NaN(), drivers.ErrBadValue},
		{fanF, math.Inf(1), drivers.ErrBadValue},
		{fanF, "50", drivers.ErrBadValue},
		{fanF, true, drivers.ErrBadValue},
		{fanI, int64(101), drivers.ErrBadValue},
		{fanI, 12.5, drivers.ErrBadValue},
		{fanB, 1.0, drivers.ErrBadValue},
		{fanR, 10.0, drivers.ErrReadOnly},
		{open(t, p, "read", "float", "zone_a.temperature"), 10.0, drivers.ErrReadOnly},
	} {
		if err := tc.pt.Write(t.Context(), tc.v); !errors.Is(err, tc.want) {
			t.Errorf("Write(%#v) = %v, want %v", tc.v, err, tc.want)
		}
	}
	near(t, "fan after rejected writes", readF(t, fanR), 30, 0)

	// A float read of a measurement, an int read rounds it.
	tempI := open(t, p, "read", "int", "zone_a.temperature")
	if r, _ := tempI.Read(t.Context()); r.Value != int64(12) {
		t.Fatalf("int temperature = %#v", r.Value)
	}
	// Reading.At is the plant's clock.
	if r, _ := tempI.Read(t.Context()); r.At.IsZero() {
		t.Fatal("Reading.At not set")
	}
}

func TestReadHonoursCancelledContext(t *testing.T) {
	p := newPlantT(t, oneZone)
	temp := open(t, p, "read", "float", "zone_a.temperature")
	heater := open(t, p, "do", "float", "zone_a.heater")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := temp.Read(ctx); !errors.Is(err, drivers.ErrTimeout) || !errors.Is(err, context.Canceled) {
		t.Fatalf("read with cancelled ctx: %v", err)
	}
	if err := heater.Write(ctx, 50.0); !errors.Is(err, drivers.ErrTimeout) {
		t.Fatalf("write with cancelled ctx: %v", err)
	}
	if p.Snapshot()["zone_a.heater"] != 0 {
		t.Fatal("write with a cancelled context reached the plant")
	}
}

func TestConfigAliasesAndNullEntries(t *testing.T) {
	synctest.Test(t, testConfigAliasesAndNullEntries)
}

func testConfigAliasesAndNullEntries(t *testing.T) {
	p := newPlantT(t, "sensor_noise: 0\nzones: {a: &z {initial_c: 20}, b: *z, c: }\ntanks: {t: }\n")
	s := p.Snapshot()
	if s["a.temperature"] != 20 || s["b.temperature"] != 20 || s["c.temperature"] != defaultAmbientC || s["t.level"] != defaultCapacityL/2 {
		t.Fatalf("snapshot = %v", s)
	}
	// A bad value reached through an alias is reported where it is written.
	_, err := New(busFrom(t, "zones: {a: &z {tau_s: 0}, b: *z}\n"))
	if err == nil || !strings.Contains(err.Error(), "plant.yml:1:23: buses.plant.zones.a.tau_s: tau_s must be > 0") ||
		!strings.Contains(err.Error(), "buses.plant.zones.b.tau_s") {
		t.Fatalf("err = %v", err)
	}
}
