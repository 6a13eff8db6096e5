package profiles

import (
	"fmt"
	"strings"
	"testing"
)

// TestLibrary: every profile in the library loads, cites its source in
// its header, and its points do not overlap.
func TestLibrary(t *testing.T) {
	names := ModbusNames()
	for _, want := range []string{"abb_acs550", "eastron_sdm120", "eastron_sdm630"} {
		if !strings.Contains(strings.Join(names, ","), want) {
			t.Fatalf("library %v lacks %s", names, want)
		}
	}
	for _, n := range names {
		m, err := LoadModbus(n)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := modbusFiles.ReadFile("modbus/" + n + ".yml")
		if !strings.Contains(string(data), "# Source:") {
			t.Errorf("%s: the header must cite the register map's source (# Source:)", n)
		}
		used := map[string]string{}
		for _, pn := range m.PointNames() {
			p := m.Points[pn]
			for i := range dataTypes[p.DataType] {
				key := fmt.Sprintf("%s:%d", p.Table, int(p.Address)+i)
				if other, ok := used[key]; ok {
					t.Errorf("%s: points %s and %s overlap at %s %d", n, other, pn, p.Table, int(p.Address)+i)
				}
				used[key] = pn
			}
		}
	}
	m, _ := LoadModbus("eastron_sdm120")
	if p := m.Points["total_active_energy"]; p.Table != "input" || p.Address != 0x156 || p.DataType != "float32" || p.ByteOrder != "ABCD" || p.Access != "read" {
		t.Fatalf("sdm120 total_active_energy: %+v", p)
	}
	a, _ := LoadModbus("abb_acs550")
	if p := a.Points["output_frequency"]; p.Table != "holding" || p.Address != 102 || *p.Scale != 0.1 {
		t.Fatalf("acs550 output_frequency: %+v", p)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"nope", `no Modbus profile "nope"; the library has abb_acs550, eastron_sdm120`},
		{"../x", "is not a profile name"},
	} {
		if _, err := LoadModbus(c.name); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
	for _, c := range []struct{ src, want string }{
		{"points: {a: {table: input, data_type: float32}}", "point a has no address"},
		{"points: {a: {address: 1, table: input, data_type: float32, access: write}}", "a input cannot be written"},
		{"points: {a: {address: 1, table: input, data_type: float31}}", `unknown data_type "float31"`},
		{"points: {a: {address: 1, table: input, data_type: float32, colour: red}}", "field colour not found"},
		{"points: {a: {address: 65535, table: input, data_type: float32}}", "runs past address 65535"},
	} {
		if _, err := parseModbus("t", []byte(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.src, err, c.want)
		}
	}
}

func TestMatchModbus(t *testing.T) {
	if m := MatchModbus("EASTRON", "SDM120-Modbus", ""); m == nil || m.Name != "eastron_sdm120" {
		t.Fatalf("%+v", m)
	}
	if m := MatchModbus("ABB Oy", "", "ACS550-01-012A-4"); m == nil || m.Name != "abb_acs550" {
		t.Fatalf("%+v", m)
	}
	if m := MatchModbus("Eastron", "SDM72", ""); m != nil {
		t.Fatalf("SDM72 matched %s", m.Name)
	}
}
