package opcua

import (
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/physd/physd/manifest"
)

// update rewrites testdata/scan_skeleton.yml: go test ./drivers/opcua -run TestSkeletonGolden -update
var update = flag.Bool("update", false, "rewrite the golden skeleton from the current output")

const testNSU = "nsu=urn:plant;"

// goldenReport is a scan report with every kind of variable the
// skeleton writer tells apart.
func goldenReport(dir string) *ScanReport {
	cel := &EngineeringUnits{NamespaceURI: uneceNamespace, UnitID: 'C'<<16 | 'E'<<8 | 'L', DisplayName: "°C", Description: "degree Celsius"}
	v := func(path, id string, edit func(*ScannedVariable)) *ScannedVariable {
		sv := &ScannedVariable{ScannedNode: ScannedNode{NodeID: testNSU + id, Path: strings.Split(path, "/")},
			DataType: "Double", TypeClass: "builtin", ValueRank: -1, AccessLevel: 1, UserAccessLevel: 1, MinSamplingMS: -1}
		edit(sv)
		if sv.ValueType == "" && sv.Value != nil {
			sv.ValueType = sv.DataType
		}
		return sv
	}
	return &ScanReport{
		Bus: ScanBus{Endpoint: "opc.tcp://plc.local:4840/line1", SecurityPolicy: PolicyBasic256Sha256, ServerCertificate: filepath.Join(dir, "plc.server.pem"),
			Username: "commissioning", PasswordEnv: "PLC_PASSWORD", TimeoutMS: 3000},
		BusName: "plc", Identity: "user commissioning", ServerSHA256: strings.Repeat("ab", 32),
		Root: "i=85", RootPath: "Objects", Nodes: 31, Requests: 17, Elapsed: 1200 * time.Millisecond,
		Options:    ScanOptions{Depth: 6, MaxNodes: 5000, Timeout: 30 * time.Second},
		NotBrowsed: []*ScannedNode{{NodeID: "i=2253", Path: []string{"Server"}}},
		Limits:     []string{"stopped at depth 6: 2 object(s) there not browsed; browse one with --root and its node id, or give a larger --depth"},
		Notes:      []string{"browsing Line1/Broken (nsu=urn:plant;s=Broken): BadNodeIdUnknown"},
		Methods:    []*ScannedNode{{NodeID: testNSU + "s=Line1.Reset", Path: []string{"Line1", "Reset"}}},
		Variables: []*ScannedVariable{
			v("Line1/Boiler/FlowTemperature", "s=Boiler.FlowTemp", func(s *ScannedVariable) {
				s.Description, s.DisplayName, s.Value, s.MinSamplingMS = "Flow temperature after the burner", "FlowTemperature", 61.5, 500
				s.EURange, s.Units = &EURange{0, 120}, cel
			}),
			v("Line1/Boiler/Setpoint", "s=Boiler.Setpoint", func(s *ScannedVariable) {
				s.DisplayName, s.Value, s.AccessLevel, s.UserAccessLevel = "Setpoint", 55.0, 3, 3
				s.EURange, s.Units = &EURange{20, 80}, cel
			}),
			v("Line1/Boiler/Setpoint2", "s=Boiler.Setpoint2", func(s *ScannedVariable) {
				s.Value, s.AccessLevel, s.UserAccessLevel = 55.0, 3, 1
			}),
			v("Line1/Pump/Running", "i=3001", func(s *ScannedVariable) {
				s.DataType, s.Value, s.AccessLevel, s.UserAccessLevel = "Boolean", true, 3, 3
			}),
			v("Line1/Pump/Mode", "i=3002", func(s *ScannedVariable) {
				s.DataType, s.Value, s.AccessLevel, s.UserAccessLevel = "String", "auto", 3, 3
			}),
			v("Line1/Pump/Speed", "g=72962B91-FA75-4AE6-8D28-B404DC7DAF63", func(s *ScannedVariable) {
				s.DataType, s.Value, s.EURange = "Int16", int16(1450), &EURange{0.5, 3000.5}
				s.Units = &EngineeringUnits{NamespaceURI: uneceNamespace, UnitID: 'R'<<16 | 'P'<<8 | 'M', DisplayName: "r/min"}
			}),
			v("Line1/Pump/Flow", "s=Pump.Flow", func(s *ScannedVariable) {
				s.DataType, s.Value = "Float", float32(3.25)
				s.Units = &EngineeringUnits{NamespaceURI: uneceNamespace, UnitID: 'M'<<16 | 'Q'<<8 | 'H', DisplayName: "m³/h"}
			}),
			v("Line1/Pump/Energy", "s=Pump.Energy", func(s *ScannedVariable) {
				s.DataType, s.Value = "UInt64", uint64(123456)
				s.Units = &EngineeringUnits{NamespaceURI: "urn:vendor:units", UnitID: 7, DisplayName: "Wh"}
			}),
			v("Line1/Valve", "s=Valve", func(s *ScannedVariable) {
				s.DataType, s.TypeClass, s.TypeName, s.ValueType, s.Value, s.ValueRank = "Number", "abstract", "", "UInt32", uint32(1), -2
				s.EnumStrings, s.AccessLevel, s.UserAccessLevel = []string{"Closed", "Open", "Fault"}, 3, 3
			}),
			v("Line1/Curve", "s=Curve", func(s *ScannedVariable) {
				s.ValueRank, s.ArrayDims, s.Value = 1, []uint32{3}, []float64{1, 2, 3}
				s.EURange = &EURange{10, 5}
			}),
			v("Line1/Samples", "s=Samples", func(s *ScannedVariable) {
				s.ValueRank, s.ArrayDims, s.Value = 1, []uint32{100}, make([]float64, 100)
			}),
			v("Line1/Matrix", "s=Matrix", func(s *ScannedVariable) { s.ValueRank, s.ArrayDims = 2, []uint32{3, 3} }),
			v("Line1/Started", "s=Started", func(s *ScannedVariable) {
				s.DataType, s.ValueType, s.Value = "DateTime", "DateTime", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			}),
			v("Line1/State", "s=State", func(s *ScannedVariable) {
				s.DataType, s.TypeName, s.TypeClass, s.ValueType, s.Value = "Enumeration", "MachineState", "enumeration", "Int32", int32(2)
			}),
			v("Line1/Recipe", "s=Recipe", func(s *ScannedVariable) {
				s.DataType, s.TypeName, s.TypeClass, s.ValueType, s.Value = "Structure", "RecipeType", "structure", "", nil
			}),
			v("Line1/Mystery", "s=Mystery", func(s *ScannedVariable) {
				s.DataType, s.TypeName, s.TypeClass, s.ValueType, s.Value = "", "ns=3;i=77", "unknown", "", nil
			}),
			v("Line1/WriteOnly", "s=WriteOnly", func(s *ScannedVariable) { s.AccessLevel, s.UserAccessLevel = 2, 2 }),
			v("Line1/Secret", "s=Secret", func(s *ScannedVariable) { s.AccessLevel, s.UserAccessLevel = 1, 0 }),
			v("Line1/Odd", "s=Odd;Id", func(s *ScannedVariable) {
				s.NodeID, s.NodeNote = "ns=2;s=Odd;Id", "written with the namespace index (urn:plant): a ';' in it cannot be written in the nsu= form; the index changes if the server reorders its namespace table"
				s.Value = 2.0
			}),
			v("Line1/Padded", "s= Padded", func(s *ScannedVariable) {
				s.NodeNote = "cannot be bound: its string identifier begins or ends with white space, which a binding's node id trims"
			}),
			v("Line1/Late", "s=Late", func(s *ScannedVariable) { s.Unread = "the scan's time ran out before its attributes were read" }),
			v("Line1/NoUserLevel", "s=NoUserLevel", func(s *ScannedVariable) {
				s.Value, s.Status, s.AccessNote = 4.0, "UncertainLastUsableValue", "the server publishes no UserAccessLevel: its AccessLevel is taken for this identity's"
			}),
			v("Line1/Température", "s=Temp2", func(s *ScannedVariable) { s.Value = 18.25 }),
			v("Line1/Temperature", "s=Temp3", func(s *ScannedVariable) { s.Status = "BadSensorFailure" }),
			v("Line1/42", "s=42", func(s *ScannedVariable) { s.Value = 42.0 }),
			v("7Segment", "s=7Segment", func(s *ScannedVariable) { s.DataType, s.Value = "Byte", uint8(7) }),
			v("Line1/Counter", "s=Counter", func(s *ScannedVariable) { s.DataType, s.ValueType, s.Value = "Int32", "Int64", int64(42) }),
			v("Area/A_very_long_folder_name_for_a_process_cell/And_an_even_longer_equipment_module_name/Temperature", "s=Long",
				func(s *ScannedVariable) { s.Value = 1.0 }),
		},
	}
}

// TestSkeletonGolden: the skeleton of a report with every kind of
// variable is byte for byte testdata/scan_skeleton.yml, and it validates
// as written (the manifest parser and the driver's offline checks, the
// pinned certificate read from the skeleton's folder).
func TestSkeletonGolden(t *testing.T) {
	dir := t.TempDir()
	cert, _, err := generateCert("urn:test:server")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plc.server.pem"), cert, 0o600); err != nil {
		t.Fatal(err)
	}
	skel, n := goldenReport(dir).Skeleton(SkeletonOptions{DeviceID: "gw_line1", Dir: dir, At: time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC),
		Command: "physd scan opcua opc.tcp://plc.local:4840/line1 --security-policy Basic256Sha256 --server-sha256 abab… --username commissioning --password-env PLC_PASSWORD"})
	golden := filepath.Join("testdata", "scan_skeleton.yml")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, skel, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (create it with -update)", err)
	}
	if string(skel) != string(want) {
		t.Errorf("the skeleton differs from %s (rewrite with -update if intended):\n%s", golden, skel)
	}

	file := filepath.Join(dir, "skeleton.yml")
	m, err := manifest.Parse(file, skel)
	if err != nil {
		t.Fatalf("the skeleton does not parse: %v", err)
	}
	if err := CheckBus(m.Buses["plc"]); err != nil {
		t.Fatal(err)
	}
	names := map[string]*manifest.Capability{}
	for _, c := range m.Capabilities {
		if err := CheckBinding(c); err != nil {
			t.Errorf("%s: %v", c.Name, err)
		}
		if c.Kind != manifest.KindRead {
			t.Errorf("%s is kind %s: a scan never proposes a write", c.Name, c.Kind)
		}
		names[c.Name] = c
	}
	if n != len(m.Capabilities) || n != 20 {
		t.Errorf("%d capabilities, the manifest has %d", n, len(m.Capabilities))
	}
	for name, want := range map[string]string{
		"line1_boiler_flow_temperature": "celsius", "line1_pump_speed": "rpm", "line1_pump_flow": "m³/h", "line1_pump_energy": "Wh",
	} {
		if c := names[name]; c == nil || c.Unit != want {
			t.Errorf("%s: unit %+v, want %s", name, c, want)
		}
	}
	if c := names["line1_pump_speed"]; c == nil || *c.Range != (manifest.Range{Min: 1, Max: 3000}) {
		t.Errorf("line1_pump_speed: an int range from EURange 0.5..3000.5: %+v", c)
	}
	for _, name := range []string{"line1_curve_0", "line1_curve_2", "line1_temperature", "line1_temperature_2", "line1_42", "n_7_segment"} {
		if names[name] == nil {
			t.Errorf("no capability %s", name)
		}
	}
}

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{
		"FlowTemperature": "flow_temperature", "PT100Value": "pt100_value", "Tank1Level": "tank1_level", "HTTPServer": "http_server",
		"Température": "temperature", "motor speed (rpm)": "motor_speed_rpm", "__x__": "x", "温度": "", "DB1.DBW20": "db1_dbw20",
	} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUNECECode(t *testing.T) {
	for _, c := range []struct {
		ns   string
		id   int32
		want string
	}{
		{uneceNamespace, 'C'<<16 | 'E'<<8 | 'L', "CEL"},
		{uneceNamespace, 'P'<<8 | '1', "P1"},
		{uneceNamespace, '5'<<8 | '9', "59"},
		{"", 'K'<<16 | 'W'<<8 | 'H', "KWH"},
		{"urn:vendor", 'C'<<16 | 'E'<<8 | 'L', ""},
		{uneceNamespace, -1, ""},
		{uneceNamespace, 0x01020304, ""},
		{uneceNamespace, math.MaxInt32, ""},
	} {
		if got := uneceCode(&EngineeringUnits{NamespaceURI: c.ns, UnitID: c.id}); got != c.want {
			t.Errorf("uneceCode(%s, %d) = %q, want %q", c.ns, c.id, got, c.want)
		}
	}
	for code, name := range uneceUnits {
		if name == "" || len(code) > 3 {
			t.Errorf("%s: %q", code, name)
		}
	}
}
