// Package profiles is physd's library of device profiles: register maps of
// common devices, written from their datasheets, that a manifest binding
// names instead of spelling every address and encoding by hand:
//
//	binding: {type: modbus, bus: meter, unit: 1, profile: eastron_sdm120, point: voltage}
//
// Modbus profiles are YAML files under profiles/modbus/ (one per device
// type, the file name is the profile name), embedded in the binary. Each
// file's header cites the document its register map comes from.
package profiles

import (
	"bytes"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

//go:embed modbus/*.yml
var modbusFiles embed.FS

// ModbusPoint is one value of a Modbus device: where it is and how it is
// encoded, in the modbus binding's own terms.
type ModbusPoint struct {
	Name        string
	Table       string   // coil, discrete, input, holding
	Address     uint16   // 0-based protocol address
	DataType    string   // int16 ... float64, bool, bit
	ByteOrder   string   // ABCD, CDAB, BADC, DCBA; "" for the default
	Bit         *int     // for data_type bit
	Scale       *float64 // value = raw*scale + offset
	Offset      *float64
	Unit        string // engineering unit, for people
	Access      string // read (default) or write: a point a do capability may write
	Description string
}

// identify is how a device names itself in its device identification
// (function 43/14): substrings of VendorName and of ProductCode or
// ModelName, compared without case.
type identify struct {
	Vendor  string `yaml:"vendor"`
	Product string `yaml:"product"`
}

// Modbus is a Modbus device profile.
type Modbus struct {
	Identify    *identify
	Name        string
	Vendor      string
	Model       string
	Description string
	Points      map[string]*ModbusPoint
}

// PointNames lists the profile's points, sorted.
func (m *Modbus) PointNames() []string {
	names := make([]string, 0, len(m.Points))
	for n := range m.Points {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type pointKeys struct {
	Table       *string  `yaml:"table"`
	Address     *uint16  `yaml:"address"`
	DataType    *string  `yaml:"data_type"`
	ByteOrder   *string  `yaml:"byte_order"`
	Bit         *int     `yaml:"bit"`
	Scale       *float64 `yaml:"scale"`
	Offset      *float64 `yaml:"offset"`
	Unit        string   `yaml:"unit"`
	Access      string   `yaml:"access"`
	Description string   `yaml:"description"`
}

type modbusFile struct {
	Identify    *identify            `yaml:"identify"`
	Vendor      string               `yaml:"vendor"`
	Model       string               `yaml:"model"`
	Description string               `yaml:"description"`
	Defaults    pointKeys            `yaml:"defaults"`
	Points      map[string]pointKeys `yaml:"points"`
}

// ModbusNames lists the Modbus profiles in the library, sorted.
func ModbusNames() []string {
	entries, _ := fs.ReadDir(modbusFiles, "modbus")
	var names []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yml") {
			names = append(names, strings.TrimSuffix(e.Name(), ".yml"))
		}
	}
	sort.Strings(names)
	return names
}

// LoadModbus returns the named Modbus profile. An unknown name's error
// lists the profiles there are.
func LoadModbus(name string) (*Modbus, error) {
	if name == "" || strings.ContainsAny(name, "/\\.") {
		return nil, fmt.Errorf("%q is not a profile name; the library has %s", name, strings.Join(ModbusNames(), ", "))
	}
	data, err := modbusFiles.ReadFile(path.Join("modbus", name+".yml"))
	if err != nil {
		return nil, fmt.Errorf("no Modbus profile %q; the library has %s", name, strings.Join(ModbusNames(), ", "))
	}
	return parseModbus(name, data)
}

var (
	tables     = map[string]bool{"coil": true, "discrete": true, "input": true, "holding": true}
	dataTypes  = map[string]int{"int16": 1, "uint16": 1, "int32": 2, "uint32": 2, "float32": 2, "int64": 4, "uint64": 4, "float64": 4, "bool": 1, "bit": 1}
	byteOrders = map[string]bool{"ABCD": true, "CDAB": true, "BADC": true, "DCBA": true}
)

// parseModbus decodes and checks a profile file strictly.
func parseModbus(name string, data []byte) (*Modbus, error) {
	var f modbusFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("profile %s: %v", name, err)
	}
	if len(f.Points) == 0 {
		return nil, fmt.Errorf("profile %s has no points", name)
	}
	m := &Modbus{Identify: f.Identify, Name: name, Vendor: f.Vendor, Model: f.Model, Description: f.Description, Points: map[string]*ModbusPoint{}}
	str := func(v, def *string) string {
		if v != nil {
			return *v
		}
		if def != nil {
			return *def
		}
		return ""
	}
	for pn, k := range f.Points {
		d := f.Defaults
		p := &ModbusPoint{Name: pn, Table: str(k.Table, d.Table), DataType: str(k.DataType, d.DataType), ByteOrder: str(k.ByteOrder, d.ByteOrder),
			Bit: k.Bit, Scale: k.Scale, Offset: k.Offset, Unit: k.Unit, Access: k.Access, Description: k.Description}
		if p.Scale == nil {
			p.Scale = d.Scale
		}
		if p.Offset == nil {
			p.Offset = d.Offset
		}
		if p.Access == "" {
			p.Access = "read"
		}
		switch {
		case k.Address == nil:
			return nil, fmt.Errorf("profile %s point %s has no address", name, pn)
		case !tables[p.Table]:
			return nil, fmt.Errorf("profile %s point %s: table %q is not coil, discrete, input or holding", name, pn, p.Table)
		case dataTypes[p.DataType] == 0:
			return nil, fmt.Errorf("profile %s point %s: unknown data_type %q", name, pn, p.DataType)
		case p.ByteOrder != "" && !byteOrders[p.ByteOrder]:
			return nil, fmt.Errorf("profile %s point %s: unknown byte_order %q", name, pn, p.ByteOrder)
		case p.Access != "read" && p.Access != "write":
			return nil, fmt.Errorf("profile %s point %s: access is read or write, not %q", name, pn, p.Access)
		case p.Access == "write" && (p.Table == "input" || p.Table == "discrete"):
			return nil, fmt.Errorf("profile %s point %s: a %s cannot be written", name, pn, p.Table)
		}
		p.Address = *k.Address
		if int(p.Address)+dataTypes[p.DataType] > 65536 {
			return nil, fmt.Errorf("profile %s point %s runs past address 65535", name, pn)
		}
		m.Points[pn] = p
	}
	return m, nil
}

// MatchModbus returns the profile whose identify: entry fits a device's
// identification (VendorName, and ProductCode or ModelName), or nil.
func MatchModbus(vendor, product, model string) *Modbus {
	has := func(s, sub string) bool {
		return sub != "" && strings.Contains(strings.ToLower(s), strings.ToLower(sub))
	}
	for _, n := range ModbusNames() {
		m, err := LoadModbus(n)
		if err != nil || m.Identify == nil {
			continue
		}
		if has(vendor, m.Identify.Vendor) && (has(product, m.Identify.Product) || has(model, m.Identify.Product)) {
			return m
		}
	}
	return nil
}
