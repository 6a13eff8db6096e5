package modbus

import (
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
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
// It decodes the keys strictly, then runs one step per group of keys; the
// steps report every problem they find, and the parse stops where a later
// step could only repeat an earlier problem.
func parseBinding(c *manifest.Capability, busKind string) (*pointSpec, error) {
	b := newBinder(c, busKind)
	if c.Binding.Type != "modbus" {
		b.p.Add(fmt.Sprintf("a %s bus takes bindings of type modbus, not %q", busKind, c.Binding.Type), "write binding: {type: modbus, bus: ..., ...}")
		return nil, b.p.Err()
	}
	if errs := strictyaml.Decode(b.p.File, b.p.Top, b.p.Root, &b.k); len(errs) > 0 {
		return nil, errs
	}
	if !b.address() {
		return nil, b.p.Err()
	}
	b.s = &pointSpec{name: c.Name, do: c.Kind == manifest.KindDo}
	b.unit()
	b.table()
	b.register()
	if !b.dataType() {
		return nil, b.p.Err()
	}
	b.byteOrder()
	b.scaling()
	b.capType()
	b.span()
	b.writing()
	if err := b.p.Err(); err != nil {
		return nil, err
	}
	if b.k.Verify != nil {
		b.s.verify = parseVerify(b.p, c, b.s, &b.k, busKind)
		if err := b.p.Err(); err != nil {
			return nil, err
		}
	}
	return b.s, nil
}

// binder is one binding being parsed: the decoded keys, what the address
// string says, and the spec the steps fill in.
type binder struct {
	p       *strictyaml.Problems
	c       *manifest.Capability
	busKind string
	k       bindingKeys
	a       addrSpec
	s       *pointSpec
}

func newBinder(c *manifest.Capability, busKind string) *binder {
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
	return &binder{p: &strictyaml.Problems{File: file, Root: root, Top: c.Binding.ParamsNode(), At: at}, c: c, busKind: busKind}
}

// capErr reports a problem with a key of the capability itself.
func (b *binder) capErr(key, msg, fix string) {
	if strings.HasSuffix(b.p.Root, ".verify") {
		fix = "verify a " + b.c.DataType + " capability with a point that can show its value: a register with data_type: for numbers, a coil, discrete input, bit or integer register for bool and enum"
	}
	b.p.Append(&strictyaml.Error{Pos: strictyaml.Pos{File: b.p.File, Line: b.c.Pos.Line, Col: b.c.Pos.Col},
		Field: strings.TrimSuffix(b.p.Root, ".binding") + "." + key, Msg: msg, Fix: fix})
}

// addrErr reports a problem with the address string (the parser keeps no
// position for it, so it points at the binding).
func (b *binder) addrErr(msg, fix string) {
	b.p.Append(&strictyaml.Error{Pos: strictyaml.Pos{File: b.p.File, Line: b.p.At.Line, Col: b.p.At.Col},
		Field: b.p.Root + ".address", Msg: msg, Fix: fix})
}

// address reads the address string and applies a device profile, which
// sets the register instead. It reports false after a problem that stops
// the parse.
func (b *binder) address() bool {
	a, err := parseAddress(b.c.Binding.Address)
	if err != nil {
		b.addrErr(err.Error(), `write the 0-based protocol address (address: 17, with table:) or "slave=1:reg=40001:type=holding" (reg= is 1-based Modicon notation)`)
		return false
	}
	prof, ok := applyProfile(b.p, &b.k, b.c.Kind == manifest.KindDo)
	if !ok {
		return false
	}
	if prof != nil {
		if a.addr != nil || a.table != nil {
			b.addrErr(fmt.Sprintf("the register is set by profile %s point %s (%s %d)", *b.k.Profile, prof.Name, prof.Table, prof.Address),
				"remove the address (keep the unit as unit: N)")
			return false
		}
		a.addr = &prof.Address
	}
	b.a = a
	return true
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

// oneOf is the fix for a value outside a fixed list. (strictyaml.OneOf
// takes the value too, for a "did you mean"; these messages have always
// listed the options alone.)
func oneOf(options []string) string { return "use one of " + strings.Join(options, ", ") }
