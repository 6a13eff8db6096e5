package manifest

import (
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// compact copies what a parsed manifest keeps — each capability, its
// strings and slices, and the YAML of its binding's driver keys (and each
// bus's) — into fresh memory, once, at the end of Parse; repeated strings
// (zones, units, tags, the drivers' key names and values) are kept once.
//
// Why: parsing a plant's manifest (10 000 points, 3 MB) makes some 250 MB
// of short-lived objects (the YAML decoder's tree, strictyaml's normalized
// copy, the parser's), and the few it keeps are scattered among them.
// Go's heap does not move objects, so every span holding one kept object
// stayed in use: 40 MB of manifest held 110 MB of heap, which the soft
// memory limit then had to collect against without pause. Copied together,
// the kept objects fill a few spans and the rest is freed whole.
func (m *Manifest) compact() {
	in := interner{}
	for i, c := range m.Capabilities {
		nc := new(Capability)
		*nc = *c
		nc.Name, nc.Kind, nc.Description = in.s(c.Name), in.s(c.Kind), in.s(c.Description)
		nc.DataType, nc.Unit, nc.Zone, nc.Family = in.s(c.DataType), in.s(c.Unit), in.s(c.Zone), in.s(c.Family)
		nc.RequiresPermission = in.s(c.RequiresPermission)
		nc.EnumValues, nc.SemanticTags, nc.SideEffects = in.list(c.EnumValues), in.list(c.SemanticTags), in.list(c.SideEffects)
		nc.Binding.Type, nc.Binding.Address, nc.Binding.Bus = in.s(c.Binding.Type), in.s(c.Binding.Address), in.s(c.Binding.Bus)
		nc.Binding.Field, nc.Binding.Pos.File, nc.Pos.File = in.s(c.Binding.Field), in.s(c.Binding.Pos.File), in.s(c.Pos.File)
		nc.Binding.Params = in.node(c.Binding.Params)
		nc.Range = clonePtr(c.Range)
		if c.Deadband != nil {
			d := *c.Deadband
			d.Source = in.s(d.Source)
			nc.Deadband = &d
		}
		if c.Expose != nil {
			nc.Expose = new(*c.Expose)
		}
		if c.Alarms != nil {
			a := *c.Alarms
			a.High, a.Low, a.Quality = clonePtr(a.High), clonePtr(a.Low), in.list(a.Quality)
			nc.Alarms = &a
		}
		nc.RateLimit = clonePtr(c.RateLimit)
		m.Capabilities[i] = nc
	}
	for _, b := range m.Buses {
		b.Config = in.node(b.Config)
	}
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	c := *p
	return &c
}

// interner keeps one copy of each string.
type interner map[string]string

func (in interner) s(v string) string {
	if v == "" {
		return ""
	}
	if c, ok := in[v]; ok {
		return c
	}
	c := strings.Clone(v)
	in[c] = c
	return c
}

func (in interner) list(v []string) []string {
	if v == nil {
		return nil
	}
	out := slices.Clone(v)
	for i, x := range out {
		out[i] = in.s(x)
	}
	return out
}

// node copies a tree of YAML nodes (strictyaml expanded its aliases, and
// bindings carry no comments: only kind, style, tag, value, position and
// content are kept).
func (in interner) node(n *yaml.Node) *yaml.Node {
	if n == nil {
		return nil
	}
	c := &yaml.Node{Kind: n.Kind, Style: n.Style, Tag: in.s(n.Tag), Value: in.s(n.Value), Line: n.Line, Column: n.Column}
	if len(n.Content) > 0 {
		c.Content = make([]*yaml.Node, len(n.Content))
		for i, e := range n.Content {
			c.Content[i] = in.node(e)
		}
	}
	return c
}
