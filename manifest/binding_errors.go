package manifest

import (
	"fmt"
	"math"
	"strings"

	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// BindingErrors collects a driver's problems with one capability's binding,
// each positioned at the binding key at fault (or the binding, or the
// capability), so every driver reports file:line:col the same way.
type BindingErrors struct {
	c      *Capability
	params *yaml.Node // c's structured keys, unpacked once
	file   string
	root   string // capabilities[i].binding
	Errs   Errors
}

// NewBindingErrors starts collecting for c.
func NewBindingErrors(c *Capability) *BindingErrors {
	b := &BindingErrors{c: c, params: c.Binding.ParamsNode(), file: c.Binding.Pos.File, root: c.Binding.Field}
	if b.file == "" {
		b.file = c.Pos.File
	}
	if b.root == "" {
		b.root = "capabilities." + c.Name + ".binding"
	}
	return b
}

// Add reports a problem with a binding key (a dotted path for nested keys,
// or "" for the binding itself), positioned at the key's value when it is a
// structured key.
func (b *BindingErrors) Add(key, msg, fix string) {
	e := &Error{Pos: Pos{File: b.file, Line: b.c.Binding.Pos.Line, Col: b.c.Binding.Pos.Col}, Field: b.root, Msg: msg, Fix: fix}
	if e.Pos.Line == 0 {
		e.Pos.Line, e.Pos.Col = b.c.Pos.Line, b.c.Pos.Col
	}
	if key != "" {
		e.Field += "." + key
		if v := ParamNode(b.params, strings.Split(key, ".")...); v != nil {
			e.Pos.Line, e.Pos.Col = v.Line, v.Column
		}
	}
	b.Errs = append(b.Errs, e)
}

// AddCap reports a problem with one of the capability's own keys
// (data_type, kind …) that the binding cannot serve.
func (b *BindingErrors) AddCap(key, msg, fix string) {
	b.Errs = append(b.Errs, &Error{
		Pos:   Pos{File: b.file, Line: b.c.Pos.Line, Col: b.c.Pos.Col},
		Field: strings.TrimSuffix(b.root, ".binding") + "." + key, Msg: msg, Fix: fix,
	})
}

// Scale returns a binding's scale key (def when absent), reporting a scale
// that is 0 or not finite with fix.
func (b *BindingErrors) Scale(v *float64, def float64, fix string) float64 {
	switch {
	case v == nil:
		return def
	case *v == 0 || math.IsNaN(*v) || math.IsInf(*v, 0):
		b.Add("scale", fmt.Sprintf("scale must be a finite non-zero number, got %v", *v), fix)
		return def
	}
	return *v
}

// ReadOnlyNumber reports what a read-only numeric sensor cannot serve: kind
// do (readOnly says why) and a data_type other than float or int (dataType
// says why, fix what to write).
func (b *BindingErrors) ReadOnlyNumber(readOnly, dataType, fix string) {
	if b.c.Kind == KindDo {
		b.AddCap("kind", readOnly, "make the capability kind: read")
	}
	if b.c.DataType != TypeFloat && b.c.DataType != TypeInt {
		b.AddCap("data_type", fmt.Sprintf("data_type %q: %s", b.c.DataType, dataType), fix)
	}
}

// ParamNode returns the value node at path in a binding's Params mapping.
func ParamNode(n *yaml.Node, path ...string) *yaml.Node {
	for _, key := range path {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == key {
				next = n.Content[i+1]
				break
			}
		}
		n = next
	}
	return n
}

// File is the manifest file the binding is in.
func (b *BindingErrors) File() string { return b.file }

// Root is the binding's field path, e.g. capabilities[3].binding.
func (b *BindingErrors) Root() string { return b.root }

// Capability is the capability whose binding is checked.
func (b *BindingErrors) Capability() *Capability { return b.c }

// Resolve follows document and alias nodes to the node they stand for.
func Resolve(n *yaml.Node) *yaml.Node { return strictyaml.Resolve(n) }

// WithoutKey returns the mapping n, or a shallow copy of it without key
// (drivers drop a "type:" key a caller other than the parser left in a
// bus's Config).
func WithoutKey(n *yaml.Node, key string) *yaml.Node { return strictyaml.WithoutKey(n, key) }

// DecodeBinding decodes a binding's keys into out: first those parsed from
// the PhysMCP address string (addrKeys, a mapping node), then the
// structured keys beside it. A key given both ways is an error. It returns
// the problems found so far plus any decoding errors.
func (b *BindingErrors) DecodeBinding(addrKeys *yaml.Node, out any) Errors {
	for i := 0; addrKeys != nil && i+1 < len(addrKeys.Content); i += 2 {
		if k := addrKeys.Content[i].Value; ParamNode(b.params, k) != nil {
			b.Add(k, fmt.Sprintf("%s is set both in the address string %q and as a binding key", k, b.c.Binding.Address), "keep one of them")
		}
	}
	if len(b.Errs) > 0 {
		return b.Errs
	}
	if errs := DecodeNode(b.file, addrKeys, b.root+".address", out); len(errs) > 0 {
		return errs
	}
	return DecodeNode(b.file, b.params, b.root, out)
}
