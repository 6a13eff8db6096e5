package modbus

import (
	"fmt"
	"math"
	"sort"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// What the capability asks of its point: a data_type the registers can
// carry, an enum's codes, and a way to write a do capability.

// capType checks the capability's data_type against the register type,
// and builds an enum's code maps.
func (b *binder) capType() {
	dt, k, c, p := b.s.codec.dt, b.k, b.c, b.p
	switch c.DataType {
	case manifest.TypeFloat:
		if dt == dtBool || dt == dtBit {
			b.capErr("data_type", fmt.Sprintf("a %s point cannot be a float capability", dt), "use data_type: bool for the capability")
		}
	case manifest.TypeInt:
		if !dt.isInt() {
			b.capErr("data_type", fmt.Sprintf("a %s point cannot be an int capability", dt), "use data_type: float for float registers, bool for bits")
		}
		if b.scaled() && (!integral(b.s.conv.scale) || !integral(b.s.conv.offset)) {
			p.Add("an int capability needs a whole-number scale and offset", "use data_type: float for the capability, or whole-number scale/offset", "scale")
		}
	case manifest.TypeBool:
		if dt.isFloat() {
			b.capErr("data_type", fmt.Sprintf("a %s point cannot be a bool capability", dt), "bind bool capabilities to a coil, a discrete input, a bit or an integer register")
		}
		if b.scaled() {
			p.Add("scale and offset do not apply to a bool capability", "remove them", "scale")
		}
	case manifest.TypeEnum:
		if !dt.isInt() {
			b.capErr("data_type", fmt.Sprintf("a %s point cannot be an enum capability", dt), "bind enum capabilities to an integer register")
		}
		if b.scaled() {
			p.Add("scale and offset do not apply to an enum capability", "remove them", "scale")
		}
		enumMaps(p, c, k.EnumMap, &b.s.conv)
	default:
		b.capErr("data_type", fmt.Sprintf("data_type %s is not supported on modbus", c.DataType), "use float, int, bool or enum")
	}
	if c.DataType != manifest.TypeEnum && k.EnumMap != nil {
		p.Add("enum_map applies to enum capabilities only", "remove it", "enum_map")
	}
}

// writing sets the write function of a do capability: 5 or 15 for a coil,
// 6 or 16 for holding registers (16 when the value spans several).
func (b *binder) writing() {
	s, k, p := b.s, b.k, b.p
	if !s.do {
		if k.WriteFunction != nil {
			p.Add("write_function applies to do capabilities only", "remove it, or make the capability kind: do", "write_function")
		}
		return
	}
	switch tbl := s.table; {
	case tbl != 0 && !tbl.writable():
		p.Add(fmt.Sprintf("a %s is read-only: a do capability cannot write it", tbl), "bind do capabilities to a coil or a holding register, or make this a read capability", "table")
	case tbl == tableCoil:
		s.writeFC = 5
		if k.WriteFunction != nil && *k.WriteFunction != 5 && *k.WriteFunction != 15 {
			p.Add(fmt.Sprintf("write_function %d cannot write a coil", *k.WriteFunction), "use 5 (single coil, default) or 15 (multiple coils)", "write_function")
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
				p.Add(fmt.Sprintf("write_function 6 writes one register; %s needs %d", s.codec.dt, s.qty()), "use write_function: 16 (the default for multi-register types)", "write_function")
			default:
				p.Add(fmt.Sprintf("write_function %d cannot write a holding register", wf), "use 6 (single register) or 16 (multiple registers)", "write_function")
			}
		}
	}
}

func integral(f float64) bool { return f == math.Trunc(f) && math.Abs(f) < 1<<53 }

// enumMaps builds the code<->name maps of an enum capability: enum_map when
// given (it must name every enum value, with distinct codes), otherwise the
// index in enum_values.
func enumMaps(p *strictyaml.Problems, c *manifest.Capability, m map[string]int64, cv *conv) {
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
			p.Add(fmt.Sprintf("enum_map has no code for enum value %q", v), "map every value of enum_values to its register code", "enum_map")
			continue
		}
		if other, dup := cv.enumByCode[code]; dup {
			p.Add(fmt.Sprintf("enum_map gives %q and %q the same code %d", other, v, code), "give each value its own code", "enum_map", v)
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
		p.Add(fmt.Sprintf("enum_map names %q, which is not in the capability's enum_values", name), oneOf(c.EnumValues), "enum_map", name)
	}
}
