package modbus

import (
	"fmt"
	"math"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
)

// bindingKeys are a modbus binding's structured keys (besides type, bus and
// address, which the manifest parser takes).
type bindingKeys struct {
	Unit          *int             `yaml:"unit"`
	Table         *string          `yaml:"table"`
	DataType      *string          `yaml:"data_type"`
	Bit           *int             `yaml:"bit"`
	ByteOrder     *string          `yaml:"byte_order"`
	WordOrder     *string          `yaml:"word_order"` // not a key: caught to point at byte_order
	Scale         *float64         `yaml:"scale"`
	Offset        *float64         `yaml:"offset"`
	WriteFunction *int             `yaml:"write_function"`
	EnumMap       map[string]int64 `yaml:"enum_map"`
	Verify        *yaml.Node       `yaml:"verify"`  // verify.go
	Profile       *string          `yaml:"profile"` // a device profile (profile.go)
	Point         *string          `yaml:"point"`   // the profile's point
}

// pointSpec is a validated binding.
type pointSpec struct {
	name    string // capability name, for messages
	unit    byte
	table   table
	addr    uint16
	codec   regCodec
	conv    conv
	do      bool
	writeFC byte
	verify  *verifySpec // where a write shows, when not at the point itself
}

// qty is the number of registers (or bits) the point reads.
func (s *pointSpec) qty() uint16 {
	if s.table.isBit() {
		return 1
	}
	return uint16(s.codec.dt.words())
}

func (s *pointSpec) what() string { return fmt.Sprintf("unit %d %s", s.unit, ref(s.table, s.addr)) }

// parseBinding validates a capability's binding for a bus of kind busKind.
func parseBinding(c *manifest.Capability, busKind string) (*pointSpec, error) {
	file := c.Binding.Pos.File
	if file == "" {
		file = c.Pos.File
	}
	root := c.Binding.Field
	if root == "" {
		root = "capabilities." + c.Name + ".binding"
	}
	at := c.Binding.Pos
	if at.Line == 0 {
		at = c.Pos
	}
	p := &problems{file: file, root: root, top: c.Binding.Params, at: at}
	// capErr reports a problem with a key of the capability itself.
	capErr := func(key, msg, fix string) {
		if strings.HasSuffix(root, ".verify") {
			fix = "verify a " + c.DataType + " capability with a point that can show its value: a register with data_type: for numbers, a coil, discrete input, bit or integer register for bool and enum"
		}
		p.errs = append(p.errs, &manifest.Error{Pos: manifest.Pos{File: file, Line: c.Pos.Line, Col: c.Pos.Col},
			Field: strings.TrimSuffix(root, ".binding") + "." + key, Msg: msg, Fix: fix})
	}
	// addrErr reports a problem with the address string (the parser keeps
	// no position for it, so it points at the binding).
	addrErr := func(msg, fix string) {
		p.errs = append(p.errs, &manifest.Error{Pos: manifest.Pos{File: file, Line: at.Line, Col: at.Col},
			Field: root + ".address", Msg: msg, Fix: fix})
	}

	if c.Binding.Type != "modbus" {
		p.add(fmt.Sprintf("a %s bus takes bindings of type modbus, not %q", busKind, c.Binding.Type), "write binding: {type: modbus, bus: ..., ...}")
		return nil, p.err()
	}
	var k bindingKeys
	if errs := manifest.DecodeNode(file, c.Binding.Params, root, &k); len(errs) > 0 {
		return nil, errs
	}
	a, err := parseAddress(c.Binding.Address)
	if err != nil {
		addrErr(err.Error(), `write the 0-based protocol address (address: 17, with table:) or "slave=1:reg=40001:type=holding" (reg= is 1-based Modicon notation)`)
		return nil, p.err()
	}
	prof, ok := applyProfile(p, &k, c.Kind == manifest.KindDo)
	if !ok {
		return nil, p.err()
	}
	if prof != nil {
		if a.addr != nil || a.table != nil {
			addrErr(fmt.Sprintf("the register is set by profile %s point %s (%s %d)", *k.Profile, prof.Name, prof.Table, prof.Address),
				"remove the address (keep the unit as unit: N)")
			return nil, p.err()
		}
		a.addr = &prof.Address
	}
	s := &pointSpec{name: c.Name, do: c.Kind == manifest.KindDo}

	// Unit.
	unitMin, unitMax := 0, 255
	if busKind == TypeRTU {
		unitMin, unitMax = 1, 247 // 0 is broadcast (no reply); 248..255 are reserved
	}
	unit := -1
	switch {
	case a.unit != nil && k.Unit != nil && *a.unit != *k.Unit:
		p.add(fmt.Sprintf("unit: %d disagrees with slave=%d in the address", *k.Unit, *a.unit), "keep one of them, or make them the same", "unit")
	case k.Unit != nil:
		unit = *k.Unit
	case a.unit != nil:
		unit = *a.unit
	case busKind == TypeTCP:
		unit = 1 // most TCP devices ignore it; gateways route by it
	default:
		p.add("a modbus_rtu binding needs its unit (slave) id", "add unit: N (1..247), or slave=N in the address string")
	}
	if unit >= 0 {
		if unit < unitMin || unit > unitMax {
			p.add(fmt.Sprintf("unit %d is outside %d..%d for %s", unit, unitMin, unitMax, busKind), fmt.Sprintf("use a unit id in %d..%d", unitMin, unitMax), "unit")
		}
		s.unit = byte(unit)
	}

	// Table.
	var tbl table
	if k.Table != nil {
		t, ok := tableNames[strings.ToLower(strings.TrimSpace(*k.Table))]
		switch {
		case !ok:
			p.add(fmt.Sprintf("unknown table %q", *k.Table), "use coil, discrete, input or holding", "table")
		case a.table != nil && *a.table != t:
			p.add(fmt.Sprintf("table: %s disagrees with the address, which names a %s", t, *a.table), "keep one of them, or make them the same", "table")
		default:
			tbl = t
		}
	} else if a.table != nil {
		tbl = *a.table
	} else {
		p.add("the binding does not say which table", "add table: coil|discrete|input|holding, or use reg=4xxxx Modicon notation in the address")
	}
	s.table = tbl

	// Address.
	if a.addr == nil {
		addrErr("the binding has no register address", `add address: N (0-based protocol address) or address: "slave=1:reg=40001"`)
	} else {
		s.addr = *a.addr
	}

	// Data type.
	dt := dtBool
	switch {
	case k.DataType != nil:
		d, ok := parseDataType(strings.ToLower(strings.TrimSpace(*k.DataType)))
		if !ok {
			p.add(fmt.Sprintf("unknown data_type %q", *k.DataType), oneOf(dataTypeNames()), "data_type")
			return nil, p.err()
		}
		dt = d
	case tbl.isBit():
		dt = dtBool
	case k.Bit != nil:
		dt = dtBit
	case c.DataType == manifest.TypeBool || c.DataType == manifest.TypeEnum:
		dt = dtUint16
	case tbl != 0:
		p.add("a register binding needs data_type (how the register(s) encode the value)",
			"add data_type: int16, uint16, int32, uint32, int64, uint64, float32 or float64", "data_type")
		return nil, p.err()
	}
	if tbl.isBit() && dt != dtBool {
		p.add(fmt.Sprintf("a %s holds one bit: data_type %s does not apply", tbl, dt), "use data_type: bool (or leave it out)", "data_type")
	}
	if !tbl.isBit() && tbl != 0 && dt == dtBit && k.Bit == nil {
		p.add("data_type bit needs bit: (0 = least significant .. 15)", "add bit: N", "data_type")
	}
	if k.Bit != nil {
		switch {
		case dt != dtBit:
			p.add(fmt.Sprintf("bit: applies to data_type bit, not %s", dt), "use data_type: bit (or leave data_type out)", "bit")
		case *k.Bit < 0 || *k.Bit > 15:
			p.add(fmt.Sprintf("bit must be 0..15, got %d", *k.Bit), "number bits from 0 (least significant) to 15", "bit")
		default:
			s.codec.bit = uint8(*k.Bit)
		}
	}
	s.codec.dt = dt

	// Byte order: one key. word_order was once a silent alias; it is
	// refused so that a manifest says the order one way only.
	if k.WordOrder != nil {
		p.add(fmt.Sprintf("word_order is not a key: the register order is byte_order (did you mean byte_order: %s?)", strings.TrimSpace(*k.WordOrder)),
			"rename word_order to byte_order; its values are ABCD, CDAB, BADC, DCBA", "word_order")
	}
	if k.ByteOrder != nil {
		o, ok := parseOrder(strings.TrimSpace(*k.ByteOrder))
		switch {
		case !ok:
			p.add(fmt.Sprintf("unknown byte_order %q", *k.ByteOrder), oneOf(orderNames)+" (ABCD is the Modbus standard, high word first)", "byte_order")
		case tbl.isBit():
			p.add(fmt.Sprintf("byte_order does not apply to a %s", tbl), "remove it", "byte_order")
		default:
			s.codec.order = o
		}
	}

	// Scale and offset.
	s.conv = conv{capType: c.DataType, dt: dt, scale: 1}
	if k.Scale != nil {
		if *k.Scale == 0 || math.IsNaN(*k.Scale) || math.IsInf(*k.Scale, 0) {
			p.add(fmt.Sprintf("scale must be a finite non-zero number, got %v", *k.Scale), "use the engineering units per raw count, e.g. 0.1", "scale")
		} else {
			s.conv.scale = *k.Scale
		}
	}
	if k.Offset != nil {
		if math.IsNaN(*k.Offset) || math.IsInf(*k.Offset, 0) {
			p.add(fmt.Sprintf("offset must be finite, got %v", *k.Offset), "use a number, e.g. -40", "offset")
		} else {
			s.conv.offset = *k.Offset
		}
	}
	scaled := k.Scale != nil || k.Offset != nil

	// Capability data_type against the register type.
	switch c.DataType {
	case manifest.TypeFloat:
		if dt == dtBool || dt == dtBit {
			capErr("data_type", fmt.Sprintf("a %s point cannot be a float capability", dt), "use data_type: bool for the capability")
		}
	case manifest.TypeInt:
		if !dt.isInt() {
			capErr("data_type", fmt.Sprintf("a %s point cannot be an int capability", dt), "use data_type: float for float registers, bool for bits")
		}
		if scaled && (!integral(s.conv.scale) || !integral(s.conv.offset)) {
			p.add("an int capability needs a whole-number scale and offset", "use data_type: float for the capability, or whole-number scale/offset", "scale")
		}
	case manifest.TypeBool:
		if dt.isFloat() {
			capErr("data_type", fmt.Sprintf("a %s point cannot be a bool capability", dt), "bind bool capabilities to a coil, a discrete input, a bit or an integer register")
		}
		if scaled {
			p.add("scale and offset do not apply to a bool capability", "remove them", "scale")
		}
	case manifest.TypeEnum:
		if !dt.isInt() {
			capErr("data_type", fmt.Sprintf("a %s point cannot be an enum capability", dt), "bind enum capabilities to an integer register")
		}
		if scaled {
			p.add("scale and offset do not apply to an enum capability", "remove them", "scale")
		}
		enumMaps(p, c, k.EnumMap, &s.conv)
	default:
		capErr("data_type", fmt.Sprintf("data_type %s is not supported on modbus", c.DataType), "use float, int, bool or enum")
	}
	if c.DataType != manifest.TypeEnum && k.EnumMap != nil {
		p.add("enum_map applies to enum capabilities only", "remove it", "enum_map")
	}

	// The register span must fit the 16-bit address space.
	if int(s.addr)+int(s.qty())-1 > 0xFFFF {
		addrErr(fmt.Sprintf("%s at address %d runs past the last address 65535", dt, s.addr), "use a lower address")
	}

	// Writing.
	if s.do {
		switch {
		case tbl != 0 && !tbl.writable():
			p.add(fmt.Sprintf("a %s is read-only: a do capability cannot write it", tbl), "bind do capabilities to a coil or a holding register, or make this a read capability", "table")
		case tbl == tableCoil:
			s.writeFC = 5
			if k.WriteFunction != nil && *k.WriteFunction != 5 && *k.WriteFunction != 15 {
				p.add(fmt.Sprintf("write_function %d cannot write a coil", *k.WriteFunction), "use 5 (single coil, default) or 15 (multiple coils)", "write_function")
			} else if k.WriteFunction != nil {
				s.writeFC = byte(*k.WriteFunction)
			}
		case tbl == tableHolding:
			s.writeFC = 6
			if s.qty() > 1 {
				s.writeFC = 16
			}
			if k.WriteFunction != nil {
				switch wf := *k.WriteFunction; {
				case wf == 16:
					s.writeFC = 16
				case wf == 6 && s.qty() == 1:
					s.writeFC = 6
				case wf == 6:
					p.add(fmt.Sprintf("write_function 6 writes one register; %s needs %d", dt, s.qty()), "use write_function: 16 (the default for multi-register types)", "write_function")
				default:
					p.add(fmt.Sprintf("write_function %d cannot write a holding register", wf), "use 6 (single register) or 16 (multiple registers)", "write_function")
				}
			}
		}
	} else if k.WriteFunction != nil {
		p.add("write_function applies to do capabilities only", "remove it, or make the capability kind: do", "write_function")
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	if k.Verify != nil {
		s.verify = parseVerify(p, c, s, &k, busKind)
		if err := p.err(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func integral(f float64) bool { return f == math.Trunc(f) && math.Abs(f) < 1<<53 }

// enumMaps builds the code<->name maps of an enum capability: enum_map when
// given (it must name every enum value, with distinct codes), otherwise the
// index in enum_values.
func enumMaps(p *problems, c *manifest.Capability, m map[string]int64, cv *conv) {
	cv.enumByName, cv.enumByCode = map[string]int64{}, map[int64]string{}
	if m == nil {
		for i, v := range c.EnumValues {
			cv.enumByName[v], cv.enumByCode[int64(i)] = int64(i), v
		}
		return
	}
	known := map[string]bool{}
	for _, v := range c.EnumValues {
		known[v] = true
		code, ok := m[v]
		if !ok {
			p.add(fmt.Sprintf("enum_map has no code for enum value %q", v), "map every value of enum_values to its register code", "enum_map")
			continue
		}
		if other, dup := cv.enumByCode[code]; dup {
			p.add(fmt.Sprintf("enum_map gives %q and %q the same code %d", other, v, code), "give each value its own code", "enum_map", v)
		}
		cv.enumByName[v], cv.enumByCode[code] = code, v
	}
	var extra []string
	for name := range m {
		if !known[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	for _, name := range extra {
		p.add(fmt.Sprintf("enum_map names %q, which is not in the capability's enum_values", name), oneOf(c.EnumValues), "enum_map", name)
	}
}

// CheckBinding validates a modbus binding for a bus of type busType
// (modbus_tcp or modbus_rtu) without opening the bus, for physd validate.
func CheckBinding(busType string, c *manifest.Capability) error {
	_, err := parseBinding(c, busType)
	return err
}

// BindingSpan checks a binding like CheckBinding and returns where its
// writes land, without an open bus: validate (and a manifest reload)
// refuses two do_ capabilities on one register before anything opens.
func BindingSpan(busType string, c *manifest.Capability) (drivers.Spanner, error) {
	s, err := parseBinding(c, busType)
	if err != nil {
		return nil, err
	}
	return s, nil
}
