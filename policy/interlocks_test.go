package policy_test

import (
	"strings"
	"testing"

	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

const lockMan = `physmcp_version: "0.1"
device: {id: dev, type: t, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses: {plant: {type: sim}}
capabilities:
  - {name: heater, kind: do, description: heater power, binding: {type: sim, bus: plant, point: zone_a.heater}, data_type: float, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heat], safe: {value: 0, on: [interlock_trip]}}
  - {name: fan, kind: do, description: fan speed, binding: {type: sim, bus: plant, point: zone_b.fan}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [fan]}
  - {name: vent, kind: do, description: vent opening, binding: {type: sim, bus: plant, point: zone_c.vent}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [vent], safe: {value: 30, on: [interlock_trip]}}
  - {name: temp, kind: read, description: temperature, binding: {type: sim, bus: plant, point: zone_a.temperature}, data_type: float, unit: celsius, semantic_tags: [temperature], poll_ms: 500}
  - {name: hum, kind: read, description: humidity, binding: {type: sim, bus: plant, point: zone_b.humidity}, data_type: float, unit: percent, semantic_tags: [humidity]}
`

// TestInterlocksParse: a good section becomes rules with their defaults.
func TestInterlocksParse(t *testing.T) {
	m, err := manifest.Parse("m.yml", []byte(lockMan))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse("p.yml", []byte(`physmcp_policy_version: "0.1"
interlocks:
  - {name: hot, kind: trip, while: {read: read_temp, above: 35}, safe: [do_heater]}
  - {name: warm, kind: interlock, tool: do_heater, while: {read: read_temp, above: 25}, max: 40, max_age_ms: 1500}
  - {name: cold, kind: permissive, tool: do_vent, applies_above: 30, requires: {read: read_temp, above: 5}}
`), m)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Interlocks) != 3 {
		t.Fatalf("%d rules", len(p.Interlocks))
	}
	hot, warm := p.Interlocks[0], p.Interlocks[1]
	if hot.Kind != interlock.Trip || hot.Outputs[0] != "do_heater" || hot.MaxAge.Milliseconds() != 2*500+5000 {
		t.Errorf("trip: %+v (max age: 2 × poll_ms + timeout_ms)", hot)
	}
	if warm.MaxAge.Milliseconds() != 1500 || *warm.Max != 40 {
		t.Errorf("interlock: %+v", warm)
	}
}

// TestInterlocksErrors: every mistake is named at its line with the fix.
func TestInterlocksErrors(t *testing.T) {
	m, err := manifest.Parse("m.yml", []byte(lockMan))
	if err != nil {
		t.Fatal(err)
	}
	bad := `physmcp_policy_version: "0.1"
interlocks:
  - {name: Bad-Name, kind: trip, while: {read: read_temp, above: 35}, safe: [do_heater]}
  - {name: a, kind: sometimes, tool: do_heater}
  - {name: b, kind: interlock, tool: do_fan, while: {read: read_temp, above: 1}, max: 5}
  - {name: c, kind: interlock, tool: do_vent, while: {read: read_temp, above: 1}, max: 20}
  - {name: d, kind: permissive, tool: do_heater, requires: {read: read_hum, above: 1}}
  - {name: e, kind: permissive, tool: do_heater, requires: {read: read_temp, above: 1, below: 3}}
  - {name: f, kind: trip, tool: do_heater, while: {read: read_temp, above: 1}}
  - {name: g, kind: interlock, tool: do_heater, while: {read: read_nothing, above: 1}, max: 9}
  - {name: a, kind: trip, while: {read: read_temp, above: 35}, safe: [do_heater]}
  - {name: h, kind: interlock, tool: do_heater, while: {read: read_temp, above: 1}, colour: red}
  - {name: i, kind: interlock, tool: do_heater, while: {read: read_temp, above: 1}}
  - {name: j, kind: trip, while: {read: read_temp, above: 35}, safe: [do_heater], bypass: {max_minutes: 5}}
  - {name: k, kind: interlock, tool: do_heater, while: {read: read_temp, above: 1}, max: 50, bypass: {role: viewer, max_minutes: 9999}}
`
	_, err = policy.Parse("p.yml", []byte(bad), m)
	if err == nil {
		t.Fatal("bad interlocks accepted")
	}
	msg := err.Error()
	for _, want := range []string{
		`p.yml:3:`, `"Bad-Name" is not a rule name`,
		`p.yml:4:`, `interlocks[1](a).kind`, "one of permissive, interlock, trip",
		`p.yml:5:`, "do_fan has no safe state on interlock_trip", "with interlock_trip in safe.on",
		`p.yml:6:`, "the safe value 30 of do_vent breaks the bound",
		`p.yml:7:`, "read_hum is not polled", "poll_ms",
		`p.yml:8:`, "exactly one of above",
		`p.yml:9:`, "a trip lists its outputs with safe:",
		`p.yml:10:`, `"read_nothing" is not a read_ tool`,
		`p.yml:11:`, `"a" is used twice`,
		`p.yml:12:`, `unknown key "colour"`,
		`p.yml:13:`, "an interlock needs max or min",
		`p.yml:14:`, "a trip has no bypass",
		`p.yml:15:`, `"viewer" cannot lift a safety rule`, "9999 is out of range",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("errors lack %q:\n%s", want, msg)
		}
	}
}
