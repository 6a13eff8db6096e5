package strictyaml

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type decodeBase struct {
	Name string `yaml:"name"`
}

type decodeZone struct {
	TauS   float64 `yaml:"tau_s"`
	Heater *int    `yaml:"heater"`
}

type decodeCfg struct {
	decodeBase `yaml:",inline"`
	Seed       int64                 `yaml:"seed"`
	Small      int8                  `yaml:"small"`
	Port       uint16                `yaml:"port"`
	Ratio      float32               `yaml:"ratio"`
	On         bool                  `yaml:"on"`
	Poll       time.Duration         `yaml:"poll"`
	Host       netip.Addr            `yaml:"host"`
	Zones      map[string]decodeZone `yaml:"zones"`
	Regs       []uint16              `yaml:"regs"`
	Pair       [2]int                `yaml:"pair"`
	Extra      any                   `yaml:"extra"`
	Raw        *yaml.Node            `yaml:"raw"`
	Ptr        *decodeZone           `yaml:"ptr"`
	Skipped    string                `yaml:"-"`
	Untagged   string
	unexported string //nolint:unused // must be ignored
}

func parseNode(t *testing.T, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	return &doc
}

func TestDecodeOK(t *testing.T) {
	n := parseNode(t, `name: plant
seed: 7
small: -3
port: 502
ratio: 0.5
on: true
poll: 250ms
host: 10.0.0.2
zones:
  zone_a: {tau_s: 600, heater: 3}
  zone_b: {tau_s: 5e2}
regs: [0x10, 17]
pair: [1, 2]
extra: {a: [1, b]}
raw: [anything, {goes: here}]
ptr: ~
untagged: yes
`)
	var cfg decodeCfg
	if errs := Decode("cfg.yml", n, "buses.plant", &cfg); errs != nil {
		t.Fatal(errs)
	}
	three := 3
	want := decodeCfg{
		decodeBase: decodeBase{Name: "plant"}, Seed: 7, Small: -3, Port: 502, Ratio: 0.5, On: true,
		Poll: 250 * time.Millisecond, Host: netip.MustParseAddr("10.0.0.2"),
		Zones:    map[string]decodeZone{"zone_a": {TauS: 600, Heater: &three}, "zone_b": {TauS: 500}},
		Regs:     []uint16{16, 17},
		Pair:     [2]int{1, 2},
		Extra:    map[string]any{"a": []any{1, "b"}},
		Untagged: "yes",
	}
	raw := cfg.Raw
	cfg.Raw = nil
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}
	if raw == nil || raw.Kind != yaml.SequenceNode || raw.Line != 15 {
		t.Errorf("raw = %+v", raw)
	}
}

func TestDecodeErrors(t *testing.T) {
	n := parseNode(t, `seed: seven
smal: 1
zones:
  zone_a: {tau: 600}
  zone_b: 5
regs: [1, -2, 70000]
pair: [1]
poll: 5
port: 1.5
small: 300
on: "true"
host: not-an-ip
ratio: [1]
`)
	var cfg decodeCfg
	errs := Decode("cfg.yml", n, "buses.plant", &cfg)
	want := []string{
		`cfg.yml:1:7: buses.plant.seed: expected an integer, got the string "seven"; fix: write a whole number without quotes or units`,
		`cfg.yml:2:1: buses.plant.smal: unknown key "smal"; fix: did you mean "small"? valid keys: extra, host, name, on, pair, poll, port, ptr, ratio, raw, regs, seed, small, untagged, zones`,
		`cfg.yml:4:12: buses.plant.zones.zone_a.tau: unknown key "tau"; fix: did you mean "tau_s"? valid keys: heater, tau_s`,
		`cfg.yml:5:11: buses.plant.zones.zone_b: expected a mapping, got the integer 5; fix: write key: value pairs, indented under the key`,
		`cfg.yml:6:11: buses.plant.regs[1]: "-2" is not a non-negative integer in range; fix: write a whole number without quotes or units`,
		`cfg.yml:6:15: buses.plant.regs[2]: integer 70000 is out of range; fix: use a value that fits in uint16`,
		`cfg.yml:7:7: buses.plant.pair: expected a list of 2 items, got a list of 1; fix: write a list of exactly 2 items`,
		`cfg.yml:8:7: buses.plant.poll: expected a duration, got the integer 5; fix: write a duration with a unit, e.g. "250ms", "5s", "1m30s"`,
		`cfg.yml:9:7: buses.plant.port: expected a non-negative integer, got the number 1.5; fix: write a whole number without quotes or units`,
		`cfg.yml:10:8: buses.plant.small: integer 300 is out of range; fix: use a value that fits in int8`,
		`cfg.yml:11:5: buses.plant.on: expected true or false, got the string "true"; fix: write true or false`,
		`cfg.yml:12:7: buses.plant.host: invalid value "not-an-ip": ParseAddr("not-an-ip"): unable to parse IP`,
		`cfg.yml:13:8: buses.plant.ratio: expected a number, got a list; fix: write a plain number without quotes or units`,
	}
	got := strings.Split(errs.Error(), "\n")
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("line %d:\n got: %s\nwant: %s", i, g, w)
		}
	}
}

func TestDecodeEdgeCases(t *testing.T) {
	var cfg decodeCfg
	if errs := Decode("f", nil, "x", &cfg); errs != nil {
		t.Errorf("nil node: %v", errs)
	}
	if errs := Decode("f", &yaml.Node{Kind: yaml.MappingNode}, "x", &cfg); errs.Err() != nil {
		t.Errorf("empty mapping: %v", errs)
	}
	if errs := Decode("f", parseNode(t, "a: 1"), "x", cfg); len(errs) != 1 || !strings.Contains(errs.Error(), "non-nil pointer") {
		t.Errorf("non-pointer: %v", errs)
	}
	var empty struct{}
	errs := Decode("f", parseNode(t, "a: 1"), "buses.gpio", &empty)
	if errs.Error() != `f:1:1: buses.gpio.a: unknown key "a"; fix: remove it; no keys are accepted here` {
		t.Errorf("empty struct: %v", errs)
	}
	// An alias bomb handed straight to DecodeNode is refused quickly.
	bomb := "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
	prev := "a"
	for _, c := range "bcdefghij" {
		bomb += string(c) + ": &" + string(c) + " [" + strings.TrimSuffix(strings.Repeat("*"+prev+",", 10), ",") + "]\n"
		prev = string(c)
	}
	var anyv any
	start := time.Now()
	errs = Decode("f", parseNode(t, bomb), "x", &anyv)
	if len(errs) != 1 || !strings.Contains(errs.Error(), "alias bomb") || time.Since(start) > time.Second {
		t.Errorf("bomb: %v (%v)", errs, time.Since(start))
	}
	// Duplicate keys are reported even in driver config.
	errs = Decode("f", parseNode(t, "name: a\nname: b\n"), "x", &cfg)
	if errs.Error() != `f:2:1: x.name: duplicate key "name" (first defined at 1:1); fix: keep one "name" key (the first is at line 1) and delete this one` {
		t.Errorf("dup: %v", errs)
	}
}
