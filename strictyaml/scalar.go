package strictyaml

import (
	"math"

	"gopkg.in/yaml.v3"
)

// Fix hints for type errors (exported for checks made on hand-walked nodes).
const (
	FixString  = "write a text value (quote it if it contains ': ' or starts with a special character)"
	FixInt     = "write a whole number without quotes or units"
	FixNumber  = "write a plain number without quotes or units"
	FixBool    = "write true or false"
	FixMapping = "write key: value pairs, indented under the key"
	FixList    = "write a list: [a, b] or one '- item' per line"
)

// Text accepts any non-null scalar and returns its text as written (so 0x48
// and 1.10 keep their spelling); otherwise it records a problem at n.
func (p *Problems) Text(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || IsNull(n) {
		p.Addf(n, field, FixString, "expected a string, got %s", Describe(n))
		return "", false
	}
	return n.Value, true
}

// Int accepts an integer scalar that fits in an int64.
func (p *Problems) Int(n *yaml.Node, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.Addf(n, field, FixInt, "expected an integer, got %s", Describe(n))
		return 0, false
	}
	var v int64
	if err := SafeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.Addf(n, field, FixInt, "integer %s is out of range", Quote(n.Value))
		return 0, false
	}
	return v, true
}

// Uint accepts a non-negative integer scalar that fits in a uint64.
func (p *Problems) Uint(n *yaml.Node, field string) (uint64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.Addf(n, field, FixInt, "expected a non-negative integer, got %s", Describe(n))
		return 0, false
	}
	var v uint64
	if err := SafeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.Addf(n, field, FixInt, "%s is not a non-negative integer in range", Quote(n.Value))
		return 0, false
	}
	return v, true
}

// Float accepts an integer or float scalar.
func (p *Problems) Float(n *yaml.Node, field string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		p.Addf(n, field, FixNumber, "expected a number, got %s", Describe(n))
		return 0, false
	}
	var v float64
	if err := SafeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.Addf(n, field, FixNumber, "%s is not a valid number", Quote(n.Value))
		return 0, false
	}
	return v, true
}

// FiniteFloat is Float that also rejects NaN and ±Inf.
func (p *Problems) FiniteFloat(n *yaml.Node, field string) (float64, bool) {
	v, ok := p.Float(n, field)
	if ok && (math.IsNaN(v) || math.IsInf(v, 0)) {
		p.Addf(n, field, "write a finite number", "%s is not a finite number", n.Value)
		return 0, false
	}
	return v, ok
}

// Bool accepts true or false.
func (p *Problems) Bool(n *yaml.Node, field string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		p.Addf(n, field, FixBool, "expected true or false, got %s", Describe(n))
		return false, false
	}
	var v bool
	if err := SafeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.Addf(n, field, FixBool, "%s is not a boolean", Quote(n.Value))
		return false, false
	}
	return v, true
}
