package manifest

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

const greenhouse = "../examples/greenhouse/physmcp.manifest.yml"

func TestGreenhouse(t *testing.T) {
	m, err := Load(greenhouse)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if m.Path != greenhouse || m.PhysMCPVersion != "0.1" {
		t.Errorf("path/version = %q/%q", m.Path, m.PhysMCPVersion)
	}
	if m.Device.ID != "gw_greenhouse_001" || m.Device.Location.Zone != "greenhouse" || m.Device.FirmwareVersion != "0.1.0" {
		t.Errorf("device = %+v", m.Device)
	}
	wantNet := Network{
		Protocols: []Protocol{{Type: "ip", Address: "127.0.0.1", MCPPort: 8080, Role: "native"}},
		Mesh:      defaultMesh(false),
	}
	if !reflect.DeepEqual(m.Network, wantNet) {
		t.Errorf("network = %+v, want %+v", m.Network, wantNet)
	}
	if want := (Audit{Enabled: true, RetentionDays: 30}); !reflect.DeepEqual(m.Audit, want) {
		t.Errorf("audit = %+v", m.Audit)
	}
	if len(m.Capabilities) != 13 {
		t.Fatalf("%d capabilities, want 13", len(m.Capabilities))
	}

	bus := m.Buses["plant"]
	if bus == nil || bus.Name != "plant" || bus.Type != "sim" || bus.Field != "buses.plant" {
		t.Fatalf("bus = %+v", bus)
	}
	if bus.Pos != (Pos{File: greenhouse, Line: 28, Col: 3}) {
		t.Errorf("bus pos = %v", bus.Pos)
	}
	var keys []string
	for i := 0; i < len(bus.Config.Content); i += 2 {
		keys = append(keys, bus.Config.Content[i].Value)
	}
	if want := []string{"seed", "zones", "tanks", "valves"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("bus config keys = %v, want %v", keys, want)
	}

	temp := m.Capability("temperature_zone_a")
	wantTemp := &Capability{
		Name: "temperature_zone_a", Kind: "read",
		Description:        "Air temperature in growing zone A, measured at canopy height.",
		DataType:           "float",
		Unit:               "celsius",
		Range:              &Range{Min: -10, Max: 50},
		Precision:          0.1,
		SemanticTags:       []string{"temperature", "air", "climate", "zone_a"},
		Zone:               "zone_a",
		RequiresPermission: "none",
		TimeoutMS:          5000,
		Cacheable:          true,
		CacheTTLMS:         2000,
		Compensable:        false,
		Tolerance:          0.1,
		Family:             "temperature",
		Expose:             new(true),
		Pos:                Pos{File: greenhouse, Line: 42, Col: 5},
	}
	temp.Binding = Binding{}
	if !reflect.DeepEqual(temp, wantTemp) {
		t.Errorf("temperature_zone_a =\n %+v\nwant\n %+v", temp, wantTemp)
	}

	heater := m.Capability("heater_zone_a")
	if heater.ToolName() != "do_heater_zone_a" || heater.Cacheable || !heater.Compensable ||
		heater.TimeoutMS != 2000 || heater.CooldownMS != 10000 || heater.RequiresPermission != "operator" ||
		heater.Tolerance != 1 || heater.QuorumSize != 0 || heater.RequiresQuorum || heater.CacheTTL() != 0 {
		t.Errorf("heater_zone_a = %+v", heater)
	}
	if want := (&RateLimit{Count: 30, Per: time.Hour, Source: "30/hour"}); !reflect.DeepEqual(heater.RateLimit, want) {
		t.Errorf("rate limit = %+v", heater.RateLimit)
	}
	b := heater.Binding
	if b.Type != "sim" || b.Bus != "plant" || b.Address != "" || b.Field != "capabilities[8].binding" ||
		b.Pos != (Pos{File: greenhouse, Line: 151, Col: 14}) {
		t.Errorf("binding = %+v", b)
	}
	var params struct {
		Point string `yaml:"point"`
	}
	if errs := b.DecodeParams(&params); errs != nil || params.Point != "zone_a.heater" {
		t.Errorf("params = %+v, %v", params, errs)
	}
	if fan := m.Capability("fan_zone_b"); fan.Tolerance != DefaultTolerance || fan.DataType != "int" {
		t.Errorf("fan_zone_b = %+v", fan)
	}
}

// TestGreenhouseBusConfig decodes the sim bus keys the way the sim driver
// will: nested maps of structs.
func TestGreenhouseBusConfig(t *testing.T) {
	m, err := Load(greenhouse)
	if err != nil {
		t.Fatal(err)
	}
	type zone struct {
		AmbientC  float64 `yaml:"ambient_c"`
		InitialC  float64 `yaml:"initial_c"`
		InitialRH float64 `yaml:"initial_rh"`
		TauS      float64 `yaml:"tau_s"`
		HeaterC   float64 `yaml:"heater_gain_c"`
	}
	var cfg struct {
		Seed   int64                         `yaml:"seed"`
		Zones  map[string]zone               `yaml:"zones"`
		Tanks  map[string]map[string]float64 `yaml:"tanks"`
		Valves map[string]struct {
			TravelMS int     `yaml:"travel_ms"`
			FlowLPM  float64 `yaml:"flow_lpm"`
			Drains   string  `yaml:"drains"`
		} `yaml:"valves"`
	}
	if errs := m.Buses["plant"].DecodeConfig(&cfg); errs != nil {
		t.Fatal(errs)
	}
	if cfg.Seed != 7 || len(cfg.Zones) != 3 || cfg.Zones["zone_b"].TauS != 500 ||
		cfg.Tanks["rain_tank"]["capacity_l"] != 2000 || cfg.Valves["irrigation_a"].Drains != "rain_tank" {
		t.Errorf("cfg = %+v", cfg)
	}
}

func TestManyProblems(t *testing.T) {
	_, err := Load("testdata/many_problems.yml")
	f := "testdata/many_problems.yml"
	want := []string{
		f + `:2:18: physmcp_version: the version must be a string, got the number 0.1; fix: quote the version: physmcp_version: "0.1"`,
		f + `:4:3: device.location: missing required key "location"; fix: add location: under device`,
		f + `:4:7: device.id: invalid id "Bad-ID"; fix: use lowercase letters, digits and _, e.g. node_temp_zone3_001`,
		f + `:6:3: device.locaton: unknown key "locaton"; fix: did you mean "location"? valid keys: id, type, vendor, model, firmware_version, hardware_revision, location, certification`,
		f + `:11:17: network.protocols[0].mcp_port: expected an integer, got the string "8080"; fix: write a whole number without quotes or units`,
		f + `:12:13: network.protocols[0].role: invalid role "master"; fix: use one of native, proxy, lite`,
		f + `:14:14: network.mesh.enabled: expected true or false, got the string "yes"; fix: write true or false`,
		f + `:15:5: network.mesh.max_peer: unknown key "max_peer"; fix: did you mean "max_peers"? valid keys: ` + strings.Join(meshKeys, ", "),
		f + `:18:9: buses.i2c0.type: missing required key "type"; fix: add type: under buses.i2c0`,
		f + `:23:31: capabilities[0].binding.bus: unknown bus "plantt"; fix: did you mean "plant"? use one of i2c0, plant, or declare it under buses:`,
		f + `:25:12: capabilities[0].range: min (50) is greater than max (-10); fix: set min ≤ max`,
		f + `:26:21: capabilities[0].semantic_tags[0]: invalid semantic tag "Temperature"; fix: write it in lowercase: temperature`,
		f + `:26:39: capabilities[0].semantic_tags[2]: duplicate semantic tag "air"; fix: list each tag once`,
		f + `:27:5: capabilities[0].side_effects: side_effects is only allowed on kind do; fix: remove side_effects, or set kind: do`,
		f + `:28:5: capabilities[0].descripton: unknown key "descripton"; fix: did you mean "description"? valid keys: ` + strings.Join(capKeys, ", "),
		f + `:29:5: capabilities[1].enum_values: missing required key "enum_values"; fix: list the accepted values, e.g. enum_values: [auto, low, high]`,
		f + `:29:11: capabilities[1].name: duplicate capability name "temp" (first defined at 20:11); fix: give each capability its own name`,
		f + `:31:18: capabilities[1].description: description must not be empty; fix: give description a value`,
		f + `:32:14: capabilities[1].binding: binding has neither an address nor any driver keys; fix: add address: "<transport address>" (e.g. "0x48:reg=0x00") or the driver's own keys (e.g. point: zone_a.temperature)`,
		f + `:34:17: capabilities[1].rate_limit: invalid rate_limit unit "week"; fix: use one of sec, second, s, min, minute, m, hour, h, day, d`,
		f + `:35:26: capabilities[1].requires_permission: invalid requires_permission "root"; fix: use one of none, operator, supervisor, admin`,
		f + `:36:17: capabilities[1].timeout_ms: timeout_ms 0 is out of range; fix: use a value from 1 to 600000`,
		f + `:37:20: capabilities[1].semantic_tags: semantic_tags must not be empty; fix: add at least one tag, e.g. [temperature, air]`,
		f + `:38:5: capabilities[2].description: missing required key "description"; fix: add description: under capabilities[2]`,
		f + `:39:11: capabilities[2].kind: invalid kind "doo"; fix: did you mean "do"? use one of read, do`,
		f + `:40:14: capabilities[2].binding: expected a mapping, got a list; fix: write key: value pairs, indented under the key`,
		f + `:42:5: capabilities[2].enum_values: enum_values is only allowed with data_type enum; fix: remove enum_values, or set data_type: enum`,
		f + `:43:20: capabilities[2].semantic_tags: expected a list, got the string "ok"; fix: write a list: [a, b] or one '- item' per line`,
		f + `:45:19: audit.retention_days: retention_days 0 is out of range; fix: use a value from 1 to 36500`,
		f + `:46:16: audit.remote_sink.address: missing required key "address"; fix: add address: under audit.remote_sink`,
		f + `:46:23: audit.remote_sink.type: invalid type "kafka"; fix: use one of mqtt, http, syslog`,
	}
	if err == nil {
		t.Fatal("no error")
	}
	got := strings.Split(err.Error(), "\n")
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
	var es Errors
	if !errors.As(err, &es) || len(es) != len(want) {
		t.Fatalf("errors.As Errors: %T %d", err, len(es))
	}
	var one *Error
	if !errors.As(err, &one) || one.Field != "physmcp_version" || one.Pos.Line != 2 || one.Pos.Col != 18 {
		t.Errorf("errors.As *Error = %+v", one)
	}
}

// header is a valid manifest up to "capabilities:"; capability text starts
// at line 12.
const header = `physmcp_version: "0.1"
device:
  id: node_1
  type: sensor
  location: {zone: z1}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080}]
  mesh: {}
buses:
  plant: {type: sim}
capabilities:
`

// okCap is a valid read capability (lines 12-17 when placed first).
const okCap = `  - name: t
    kind: read
    description: d
    binding: {type: i2c, address: "0x48:reg=0x00"}
    data_type: float
    semantic_tags: [temperature]
`

func TestMinimalDefaults(t *testing.T) {
	m, err := Parse("t.yml", []byte(header+okCap+`  - name: v
    kind: do
    description: valve
    binding: {type: modbus, address: "slave=1:reg=40001:type=holding"}
    data_type: enum
    enum_values: [open, closed]
    semantic_tags: [valve]
    requires_quorum: true
    range: [1, 2]
`))
	if err == nil {
		t.Fatal("range on an enum must fail")
	}
	if !strings.Contains(err.Error(), "t.yml:26:5: capabilities[1].range: range applies only to data_type float or int, not enum") {
		t.Fatalf("err = %v", err)
	}
	m, err = Parse("t.yml", []byte(header+okCap+`  - name: v
    kind: do
    description: valve
    binding: {type: modbus, address: "slave=1:reg=40001:type=holding"}
    data_type: int
    range: [1, 2]
    semantic_tags: [valve]
    requires_quorum: true
    rate_limit: 1/min
`))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(m.Network.Mesh, defaultMesh(true)) {
		t.Errorf("mesh = %+v", m.Network.Mesh)
	}
	if !reflect.DeepEqual(m.Audit, Audit{Enabled: true, RetentionDays: 7}) {
		t.Errorf("audit = %+v", m.Audit)
	}
	r := m.Capabilities[0]
	if r.Zone != "z1" || !r.Cacheable || r.CacheTTLMS != 1000 || r.TimeoutMS != 5000 || r.Compensable ||
		r.Tolerance != 1e-9 || r.RequiresPermission != "none" || r.QuorumSize != 0 || r.CacheTTL() != time.Second {
		t.Errorf("read defaults = %+v", r)
	}
	if r.Binding.ParamsNode() == nil || len(r.Binding.ParamsNode().Content) != 0 || r.Binding.Address != "0x48:reg=0x00" {
		t.Errorf("binding = %+v", r.Binding)
	}
	d := m.Capabilities[1]
	if d.Cacheable || !d.Compensable || d.QuorumSize != 3 || *d.Range != (Range{1, 2}) || d.Timeout() != 5*time.Second ||
		*d.RateLimit != (RateLimit{Count: 1, Per: time.Minute, Source: "1/min"}) {
		t.Errorf("do defaults = %+v", d)
	}
}

// TestErrorClasses checks one class of problem per case: the exact position,
// field and message, and that the fix says what to do.
func TestErrorClasses(t *testing.T) {
	type want struct{ at, msg, fix string }
	cases := []struct {
		name string
		doc  string
		want []want
	}{
		{"unknown key with suggestion", header + okCap + "    unti: celsius\n",
			[]want{{"18:5: capabilities[0].unti", `unknown key "unti"`, `did you mean "unit"? valid keys: name, kind,`}}},
		{"unknown key without suggestion", header + okCap + "    colour: red\n",
			[]want{{"18:5: capabilities[0].colour", `unknown key "colour"`, `remove it; valid keys: name,`}}},
		{"unknown top-level key", "capabilites: []\n" + header + okCap,
			[]want{{"1:1: capabilites", `unknown key "capabilites"`, `did you mean "capabilities"?`}}},
		{"wrong scalar type", header + okCap + "    timeout_ms: soon\n",
			[]want{{"18:17: capabilities[0].timeout_ms", `expected an integer, got the string "soon"`, "write a whole number"}}},
		{"float where int", header + okCap + "    cooldown_ms: 1.5\n",
			[]want{{"18:18: capabilities[0].cooldown_ms", `expected an integer, got the number 1.5`, "whole number"}}},
		{"scalar where mapping", header + okCap + "    adopted_from: serial\n",
			[]want{{"18:19: capabilities[0].adopted_from", `expected a mapping, got the string "serial"`, "key: value pairs"}}},
		{"mapping where string", header + okCap + "    unit: {a: 1}\n",
			[]want{{"18:11: capabilities[0].unit", `expected a string, got a mapping`, "text value"}}},
		{"null value", header + okCap + "    unit:\n",
			[]want{{"18:10: capabilities[0].unit", `expected a string, got an empty value (null)`, "text value"}}},
		{"duplicate name", header + okCap + strings.Replace(okCap, "temperature", "air", 1),
			[]want{{"18:11: capabilities[1].name", `duplicate capability name "t" (first defined at 12:11)`, "its own name"}}},
		{"duplicate key", header + okCap + "    kind: do\n",
			[]want{{"18:5: capabilities[0].kind", `duplicate key "kind" (first defined at 13:5)`, "delete this one"}}},
		{"missing required", header + strings.Replace(okCap, "    description: d\n", "", 1),
			[]want{{"12:5: capabilities[0].description", `missing required key "description"`, "add description: under capabilities[0]"}}},
		{"missing device", `physmcp_version: "0.1"` + "\n" + header[strings.Index(header, "network:"):] + okCap,
			[]want{{"1:1: device", `missing required key "device"`, "add device: under the top level"}}},
		{"min > max", header + okCap + "    range: {min: 5, max: 1}\n",
			[]want{{"18:12: capabilities[0].range", "min (5) is greater than max (1)", "set min ≤ max"}}},
		{"min > max shorthand", header + okCap + "    range: [5, 1]\n",
			[]want{{"18:12: capabilities[0].range", "min (5) is greater than max (1)", "set min ≤ max"}}},
		{"range not finite", header + okCap + "    range: [.nan, 1]\n",
			[]want{{"18:13: capabilities[0].range.min", ".nan is not a finite number", "finite number"}}},
		{"range missing max", header + okCap + "    range: {min: 1}\n",
			[]want{{"18:12: capabilities[0].range.max", `missing required key "max"`, "{min: 0, max: 100}"}}},
		{"bad enum kind", header + strings.Replace(okCap, "kind: read", "kind: red", 1),
			[]want{{"13:11: capabilities[0].kind", `invalid kind "red"`, `did you mean "read"? use one of read, do`}}},
		{"string data_type on do", header + strings.Replace(strings.Replace(okCap, "kind: read", "kind: do", 1), "data_type: float", "data_type: string", 1),
			[]want{{"16:16: capabilities[0].data_type", `invalid data_type "string"`, "cannot take free text; use one of float, int, bool, enum"}}},
		{"bad binding type", header + strings.Replace(okCap, "type: i2c", "type: rs485", 1),
			[]want{{"15:21: capabilities[0].binding.type", `invalid type "rs485"`, "use one of i2c, spi, gpio,"}}},
		{"bad rate_limit", header + okCap + "    rate_limit: often\n",
			[]want{{"18:17: capabilities[0].rate_limit", `invalid rate_limit "often"`, `e.g. "6/hour"`}}},
		{"rate_limit zero", header + okCap + "    rate_limit: 0/h\n",
			[]want{{"18:17: capabilities[0].rate_limit", `rate_limit count "0" is out of range`, "at least 1"}}},
		{"bus reference to unknown bus", header + strings.Replace(okCap, "address: \"0x48:reg=0x00\"", "bus: i2c1, reg: 0", 1),
			[]want{{"15:31: capabilities[0].binding.bus", `unknown bus "i2c1"`, "use one of plant, or declare it under buses:"}}},
		{"bus reference with no buses", strings.Replace(header, "buses:\n  plant: {type: sim}\n", "", 1) + strings.Replace(okCap, "address: \"0x48:reg=0x00\"", "bus: plant, reg: 0", 1),
			[]want{{"13:31: capabilities[0].binding.bus", `unknown bus "plant"`, "no buses are declared"}}},
		{"side_effects on read", header + okCap + "    side_effects: [noise]\n",
			[]want{{"18:5: capabilities[0].side_effects", "side_effects is only allowed on kind do", "set kind: do"}}},
		{"settle_ms on read", header + okCap + "    settle_ms: 10\n",
			[]want{{"18:5: capabilities[0].settle_ms", "settle_ms is only allowed on kind do", "set kind: do"}}},
		{"enum without values", header + strings.Replace(okCap, "data_type: float", "data_type: enum", 1),
			[]want{{"12:5: capabilities[0].enum_values", `missing required key "enum_values"`, "enum_values: [auto, low, high]"}}},
		{"enum empty values", header + strings.Replace(okCap, "data_type: float", "data_type: enum", 1) + "    enum_values: []\n",
			[]want{{"18:18: capabilities[0].enum_values", "enum_values must not be empty", "list the accepted values"}}},
		{"enum duplicate values", header + strings.Replace(okCap, "data_type: float", "data_type: enum", 1) + "    enum_values: [a, b, a]\n",
			[]want{{"18:25: capabilities[0].enum_values[2]", `duplicate enum value "a"`, "once"}}},
		{"bad capability name", header + strings.Replace(okCap, "name: t", "name: 1temp", 1),
			[]want{{"12:11: capabilities[0].name", `invalid name "1temp"`, "start with a lowercase letter"}}},
		{"name too long", header + strings.Replace(okCap, "name: t", "name: "+strings.Repeat("a", 61), 1),
			[]want{{"12:11: capabilities[0].name", "name is 61 characters long", "at most 60"}}},
		{"version as float", strings.Replace(header, `"0.1"`, "0.1", 1) + okCap,
			[]want{{"1:18: physmcp_version", "the version must be a string, got the number 0.1", `quote the version: physmcp_version: "0.1"`}}},
		{"no capabilities", header + "  []\n",
			[]want{{"12:3: capabilities", "capabilities must not be empty", "add at least one capability"}}},
		{"precision not positive", header + okCap + "    precision: 0\n",
			[]want{{"18:16: capabilities[0].precision", "precision must be greater than 0, got 0", "greater than 0"}}},
		{"mcp_port out of range", strings.Replace(header, "8080", "70000", 1) + okCap,
			[]want{{"7:56: network.protocols[0].mcp_port", "mcp_port 70000 is out of range", "from 1 to 65535"}}},
		{"bus without type", strings.Replace(header, "{type: sim}", "{tipe: sim}", 1) + okCap,
			[]want{{"10:10: buses.plant.type", `missing required key "type"`, "add type: under buses.plant"}}},
		{"bad certification date", strings.Replace(header, "  type: sensor\n", "  type: sensor\n  certification: {cert_expiry: soon}\n", 1) + okCap,
			[]want{{"5:32: device.certification.cert_expiry", `invalid date "soon"`, "ISO date"}}},
		{"merge key", header + "  - &base\n    " + okCap[4:] + "  - <<: *base\n    name: t2\n    kind: do\n    colour: red\n",
			[]want{{"22:5: capabilities[1].colour", `unknown key "colour"`, ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse("t.yml", []byte(tc.doc))
			if m != nil {
				t.Errorf("got a manifest together with errors")
			}
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("err = %v (%T), want Errors", err, err)
			}
			if len(es) != len(tc.want) {
				t.Errorf("%d errors, want %d:\n%v", len(es), len(tc.want), err)
			}
			for i, w := range tc.want {
				if i >= len(es) {
					break
				}
				e := es[i]
				line := e.Error()
				if !strings.HasPrefix(line, "t.yml:"+w.at+": "+w.msg) {
					t.Errorf("error %d:\n got: %s\nwant prefix: t.yml:%s: %s", i, line, w.at, w.msg)
				}
				if !strings.Contains(e.Fix, w.fix) {
					t.Errorf("fix %q does not contain %q", e.Fix, w.fix)
				}
			}
		})
	}
}

func TestDocumentErrors(t *testing.T) {
	bomb := `a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
`
	cases := []struct{ name, doc, want string }{
		{"empty file", "", `t.yml:1:1: the manifest is empty; fix: write at least physmcp_version: "0.1"`},
		{"only comments", "# nothing\n\n", "t.yml:1:1: the manifest is empty"},
		{"null document", "---\n~\n", "t.yml:1:1: the manifest is empty"},
		{"syntax error", "physmcp_version: \"0.1\"\ndevice:\n  id: [a,\n", "t.yml:3:1: YAML syntax error: did not find expected node content; fix: correct the YAML near line 3"},
		{"missing colon", "a: 1\nb: 2\nc 2\nd: 3\n", "t.yml:3:1: YAML syntax error: could not find expected ':'"},
		{"tab indentation", "device:\n\tid: x\n", "t.yml:2:1: YAML syntax error: found character that cannot start any token"},
		{"two documents", header + okCap + "---\nphysmcp_version: \"0.1\"\n", "t.yml:18:1: the file holds more than one YAML document; fix: keep one manifest per file"},
		{"top level list", "- a\n- b\n", "t.yml:1:1: expected a mapping, got a list"},
		{"alias bomb", bomb, "t.yml:6:17: the document expands to more than 200000 YAML nodes (an alias bomb, or far too large)"},
		{"self alias", "a: &a\n  b: *a\n", "t.yml:2:6: alias *a refers to a value that contains it"},
		{"too large", "#" + strings.Repeat("x", MaxFileSize), "t.yml: file is 16777217 bytes, larger than the 16777216-byte limit"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			m, err := Parse("t.yml", []byte(tc.doc))
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("took %v", el)
			}
			if m != nil || err == nil {
				t.Fatalf("m = %v, err = %v", m, err)
			}
			if es := err.(Errors); len(es) != 1 {
				t.Errorf("%d errors, want 1:\n%v", len(es), err)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("got  %s\nwant %s", err, tc.want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("err = %v, want ErrNotExist", err)
	}
}

func TestAnchorsResolve(t *testing.T) {
	doc := header + `  - &t
    name: t
    kind: read
    description: d
    binding: &b {type: sim, bus: plant, point: a.b}
    data_type: float
    semantic_tags: &tags [temperature]
  - name: u
    kind: read
    description: d
    binding: {<<: *b, point: c.d}
    data_type: float
    semantic_tags: *tags
`
	m, err := Parse("t.yml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	u := m.Capability("u")
	var params struct {
		Point string `yaml:"point"`
	}
	if errs := u.Binding.DecodeParams(&params); errs != nil {
		t.Fatal(errs)
	}
	if params.Point != "c.d" || u.Binding.Bus != "plant" || !reflect.DeepEqual(u.SemanticTags, []string{"temperature"}) {
		t.Errorf("u = %+v params %+v", u, params)
	}
}
