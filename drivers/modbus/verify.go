package modbus

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// A verify point is another point of the device that shows whether a
// write applied: the status input of a coil command, the "active
// setpoint" register of a setpoint. It is written in the do capability's
// binding:
//
//	binding:
//	  {type: modbus, bus: plc, table: coil, address: 10,
//	   verify: {table: discrete, address: 20}}        # same value
//	   verify: {table: discrete, address: 20, expect: {true: false, false: true}}
//	   verify: {table: holding, address: 101, data_type: float32, tolerance: 0.1}
//
// It takes the binding keys of a read point (unit, table, address,
// data_type, bit, byte_order, scale, offset, enum_map), where unit defaults
// to the binding's, and a register point without data_type takes the
// binding's data_type, byte_order, scale and offset. expect (bool and enum
// capabilities) maps each commanded value to what the verify point shows
// (true/false or an integer); without it the point shows the commanded
// value through its own encoding. tolerance (float and int capabilities)
// is the accepted |shown − expected|, default the capability's tolerance;
// the verify point's encoding is added to it (a float32 register holds
// 0.1 as 0.100000001…; an integer register with scale 0.5 holds the
// nearest half).

// verifySpec is a validated verify point.
type verifySpec struct {
	pt     *pointSpec
	expect map[any]any // commanded value (bool or enum name) → shown value (bool or int64); nil: the value itself
	tol    float64
}

// verifyOnly are the keys of verify that are not binding keys.
var verifyOnly = []string{"address", "expect", "tolerance"}

// parseVerify validates binding.verify of do capability c whose written
// point is s; problems go to p.
func parseVerify(p *strictyaml.Problems, c *manifest.Capability, s *pointSpec, k *bindingKeys, busKind string) *verifySpec {
	n := strictyaml.Resolve(k.Verify)
	if n == nil || n.Kind != yaml.MappingNode {
		p.Add("verify must be a mapping naming the point that shows the command", "write verify: {table: discrete, address: N} (the input or register the device updates)", "verify")
		return nil
	}
	if !s.do {
		p.Add("verify applies to do capabilities only (a read capability writes nothing to verify)", "remove verify, or make the capability kind: do", "verify")
		return nil
	}
	addr, expect, tol, rest, ok := splitVerify(p, n)
	if !ok {
		return nil
	}
	if strings.TrimSpace(addr) == "" {
		p.Add("verify has no address", "add address: N (0-based protocol address, with table:) or an address string such as \"slave=1:reg=10021\"", "verify")
		return nil
	}
	verifyDefaults(rest, addr, s)

	v := &verifySpec{tol: c.Tolerance}
	vc := manifest.Capability{Name: c.Name + " (verify)", Kind: manifest.KindRead, DataType: c.DataType, EnumValues: c.EnumValues,
		Pos:     manifest.Pos{File: p.File, Line: n.Line, Col: n.Column},
		Binding: manifest.Binding{Type: "modbus", Bus: c.Binding.Bus, Address: addr, Params: rest, Pos: manifest.Pos{File: p.File, Line: n.Line, Col: n.Column}, Field: p.Root + ".verify"}}
	if expect != nil {
		v.expect, vc.DataType = parseExpect(p, c, expect)
		if v.expect == nil {
			return nil
		}
		vc.EnumValues = nil
	}
	if tol != nil {
		verifyTolerance(p, c, tol, v)
	}
	vs, err := parseBinding(&vc, busKind)
	if err != nil {
		if errs, ok := err.(strictyaml.Errors); ok {
			p.Append(errs...)
		} else {
			p.Add(err.Error(), "fix the verify point", "verify")
		}
		return nil
	}
	if vs.unit == s.unit && vs.table == s.table && vs.addr == s.addr && vs.codec.bit == s.codec.bit {
		p.Add(fmt.Sprintf("verify names the written point itself (%s)", s.what()), "name the input or register that shows the command at another address, or remove verify (the written point is read back without it)", "verify")
		return nil
	}
	v.pt = vs
	return v
}

// splitVerify takes verify's own keys (address, expect, tolerance) out of
// the mapping n; rest holds the binding keys of the verify point. It
// reports false after a key that cannot apply to a verify point.
func splitVerify(p *strictyaml.Problems, n *yaml.Node) (addr string, expect, tol, rest *yaml.Node, ok bool) {
	rest = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column}
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], strictyaml.Resolve(n.Content[i+1])
		switch key.Value {
		case "address":
			if val == nil || val.Kind != yaml.ScalarNode {
				p.Add("verify.address must be a number or an address string", `write address: 20 (0-based) or address: "slave=1:reg=10021"`, "verify", "address")
				return "", nil, nil, nil, false
			}
			addr = val.Value
		case "expect":
			expect = val
		case "tolerance":
			tol = val
		case "verify", "write_function":
			p.Add(fmt.Sprintf("%s does not apply to a verify point (it is only read)", key.Value), "remove it from verify", "verify", key.Value)
			return "", nil, nil, nil, false
		default:
			rest.Content = append(rest.Content, n.Content[i], n.Content[i+1])
		}
	}
	return addr, expect, tol, rest, true
}

// verifyDefaults adds the keys a verify point takes from the binding: the
// unit, and a register point's encoding when it names none of its own.
func verifyDefaults(rest *yaml.Node, addr string, s *pointSpec) {
	a, _ := parseAddress(addr)
	if a.unit == nil && !hasKey(rest, "unit") {
		addKey(rest, "unit", strconv.Itoa(int(s.unit)))
	}
	vt := a.table
	if tn := keyValue(rest, "table"); tn != "" {
		if t, ok := tableNames[strings.ToLower(strings.TrimSpace(tn))]; ok {
			vt = &t
		}
	}
	if vt != nil && !vt.isBit() && !s.table.isBit() && !hasKey(rest, "data_type") {
		addKey(rest, "data_type", s.codec.dt.String())
		if s.codec.dt == dtBit {
			addKey(rest, "bit", strconv.Itoa(int(s.codec.bit)))
		}
		if !hasKey(rest, "byte_order") && s.codec.order != 0 {
			addKey(rest, "byte_order", orderNames[s.codec.order])
		}
		if !hasKey(rest, "scale") && s.conv.scale != 1 {
			addKey(rest, "scale", strconv.FormatFloat(s.conv.scale, 'g', -1, 64))
		}
		if !hasKey(rest, "offset") && s.conv.offset != 0 {
			addKey(rest, "offset", strconv.FormatFloat(s.conv.offset, 'g', -1, 64))
		}
	}
}

// verifyTolerance reads verify.tolerance into v.
func verifyTolerance(p *strictyaml.Problems, c *manifest.Capability, tol *yaml.Node, v *verifySpec) {
	f, err := strconv.ParseFloat(strings.TrimSpace(tol.Value), 64)
	switch {
	case tol.Kind != yaml.ScalarNode || err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0):
		p.Add(fmt.Sprintf("verify.tolerance must be a number ≥ 0, got %q", tol.Value), "write the accepted |shown − expected| in the capability's unit, e.g. tolerance: 0.5", "verify", "tolerance")
	case c.DataType != manifest.TypeFloat && c.DataType != manifest.TypeInt:
		p.Add(fmt.Sprintf("verify.tolerance applies to float and int capabilities, not %s", c.DataType), "remove it (use expect: to map values)", "verify", "tolerance")
	default:
		v.tol = f
	}
}

// parseExpect reads verify.expect: every commanded value of a bool or enum
// capability mapped to what the verify point shows, all true/false or all
// integers. It returns the map and the data type the verify point is read
// as (bool or int), or nil after reporting a problem.
func parseExpect(p *strictyaml.Problems, c *manifest.Capability, n *yaml.Node) (map[any]any, string) {
	var commands []string
	switch c.DataType {
	case manifest.TypeBool:
		commands = []string{"true", "false"}
	case manifest.TypeEnum:
		commands = c.EnumValues
	default:
		p.Add(fmt.Sprintf("verify.expect applies to bool and enum capabilities, not %s", c.DataType),
			"remove expect: a number is verified through the verify point's scale, offset and tolerance", "verify", "expect")
		return nil, ""
	}
	if n.Kind != yaml.MappingNode {
		p.Add("verify.expect must map each commanded value to what the verify point shows", "write e.g. expect: {true: true, false: false}", "verify", "expect")
		return nil, ""
	}
	out := map[any]any{}
	kinds := map[string]bool{}
	ok := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], strictyaml.Resolve(n.Content[i+1])
		name := key.Value
		var cmd any = name
		if c.DataType == manifest.TypeBool {
			b, err := strconv.ParseBool(strings.ToLower(name))
			if err != nil || (name != "true" && name != "false") {
				p.Add(fmt.Sprintf("verify.expect key %q is not a value of a bool capability", name), "use the keys true and false", "verify", "expect", name)
				ok = false
				continue
			}
			cmd = b
		} else if !contains(commands, name) {
			p.Add(fmt.Sprintf("verify.expect names %q, which is not in the capability's enum_values", name), oneOf(commands), "verify", "expect", name)
			ok = false
			continue
		}
		shown, kind := expectValue(val)
		if kind == "" {
			p.Add(fmt.Sprintf("verify.expect.%s must be true, false or an integer (what the verify point shows)", name), "write e.g. "+name+": true, or "+name+": 3 for a status register", "verify", "expect", name)
			ok = false
			continue
		}
		kinds[kind] = true
		out[cmd] = shown
	}
	if len(kinds) > 1 {
		p.Add("verify.expect mixes true/false and integers", "use true/false for a coil or discrete input (or a bit), integers for a register", "verify", "expect")
		ok = false
	}
	var missing []string
	for _, cmd := range commands {
		var key any = cmd
		if c.DataType == manifest.TypeBool {
			key = cmd == "true"
		}
		if _, has := out[key]; !has {
			missing = append(missing, cmd)
		}
	}
	sort.Strings(missing)
	if ok && len(missing) > 0 {
		p.Add(fmt.Sprintf("verify.expect has no entry for %s", strings.Join(missing, ", ")), "map every value the capability can be commanded to", "verify", "expect")
		ok = false
	}
	if !ok {
		return nil, ""
	}
	if kinds["int"] {
		return out, manifest.TypeInt
	}
	return out, manifest.TypeBool
}

// expectValue is an expect entry's value: a bool or an int64, with its kind.
func expectValue(n *yaml.Node) (any, string) {
	if n == nil || n.Kind != yaml.ScalarNode {
		return nil, ""
	}
	switch n.Value {
	case "true":
		return true, "bool"
	case "false":
		return false, "bool"
	}
	if i, err := strconv.ParseInt(strings.TrimSpace(n.Value), 0, 64); err == nil {
		return i, "int"
	}
	return nil, ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func hasKey(m *yaml.Node, key string) bool { return strictyaml.ValueOf(m, key) != nil }

func keyValue(m *yaml.Node, key string) string {
	if n := strictyaml.Resolve(strictyaml.ValueOf(m, key)); n != nil && n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

// addKey adds a default key to a verify mapping (at the mapping's position,
// so an error about it points at verify).
func addKey(m *yaml.Node, key, value string) {
	m.Content = append(m.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key, Line: m.Line, Column: m.Column},
		&yaml.Node{Kind: yaml.ScalarNode, Value: value, Line: m.Line, Column: m.Column})
}

// expected is what the verify point shows when cmd applied, and the
// tolerance to judge it with.
func (v *verifySpec) expected(cmd any) (any, float64) {
	if v.expect != nil {
		return v.expect[cmd], 0
	}
	if q, err := v.pt.conv.quantize(cmd); err == nil {
		return q, v.tol
	}
	// The verify point cannot hold cmd exactly (an integer register with a
	// coarser scale than the command's): it shows the nearest step.
	tol := v.tol
	if v.pt.codec.dt.isInt() {
		tol += math.Abs(v.pt.conv.scale) / 2
	}
	return cmd, tol
}

// judge reports whether shown is want within tol; a relative 1e-9 absorbs
// float noise, never a real step.
func judge(shown, want any, tol float64) bool {
	sf, sok := manifest.Number(shown)
	wf, wok := manifest.Number(want)
	if sok && wok {
		return math.Abs(sf-wf) <= tol+1e-9*max(1, math.Abs(wf))
	}
	return shown == want
}

// verifiedPoint is a point whose writes are verified at its verify point.
type verifiedPoint struct {
	*point
	v *verifySpec
}

var _ drivers.Verifier = (*verifiedPoint)(nil)

// Verify reads the verify point and judges it against a write of cmd.
func (p *verifiedPoint) Verify(ctx context.Context, cmd any) (drivers.Verification, error) {
	vp := &point{b: p.b, s: p.v.pt}
	want, tol := p.v.expected(cmd)
	out := drivers.Verification{Point: vp.s.what(), Expected: want}
	r, err := vp.Read(ctx)
	if err != nil {
		return out, err
	}
	out.Observed, out.At = r.Value, r.At
	out.OK = judge(r.Value, want, tol)
	return out, nil
}
