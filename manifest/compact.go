package manifest

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// compact copies what a parsed manifest keeps — each capability, its
// strings, slices and small parts, and the YAML of its binding's driver
// keys (and each bus's) — into a few large blocks of fresh memory, once,
// at the end of Parse; each distinct string is kept once.
//
// Why: parsing a plant's manifest (10 000 points, 3 MB) makes some 250 MB
// of short-lived objects (the YAML decoder's tree, strictyaml's normalized
// copy, the parser's), and the few it keeps were scattered among them.
// Go's heap does not move objects, so every span holding one kept object
// stayed in use: 40 MB of manifest held 110 MB of heap, which the soft
// memory limit then collected against without pause (80 % of a core).
// Kept in blocks (one per kind of object), the manifest does not depend on
// where the collector happened to leave holes while it was parsed.
func (m *Manifest) compact() {
	in := newInterner(m)
	caps := make([]Capability, len(m.Capabilities))
	var ranges []Range
	var deadbands []Deadband
	var alarms []Alarms
	for _, c := range m.Capabilities {
		if c.Range != nil {
			ranges = append(ranges, Range{})
		}
		if c.Deadband != nil {
			deadbands = append(deadbands, Deadband{})
		}
		if c.Alarms != nil {
			alarms = append(alarms, Alarms{})
		}
	}
	nodes := newNodeBlock(m)
	exposed, hidden := true, false
	for i, c := range m.Capabilities {
		nc := &caps[i]
		*nc = *c
		nc.Name, nc.Kind, nc.Description = in.s(c.Name), in.s(c.Kind), in.s(c.Description)
		nc.DataType, nc.Unit, nc.Zone, nc.Family = in.s(c.DataType), in.s(c.Unit), in.s(c.Zone), in.s(c.Family)
		nc.RequiresPermission = in.s(c.RequiresPermission)
		nc.EnumValues, nc.SemanticTags, nc.SideEffects = in.list(c.EnumValues), in.list(c.SemanticTags), in.list(c.SideEffects)
		nc.Binding.Type, nc.Binding.Address, nc.Binding.Bus = in.s(c.Binding.Type), in.s(c.Binding.Address), in.s(c.Binding.Bus)
		nc.Binding.Field, nc.Binding.Pos.File, nc.Pos.File = in.s(c.Binding.Field), in.s(c.Binding.Pos.File), in.s(c.Pos.File)
		nc.Binding.Params = nodes.copy(c.Binding.Params, in)
		if c.Range != nil {
			ranges[0] = *c.Range
			nc.Range, ranges = &ranges[0], ranges[1:]
		}
		if c.Deadband != nil {
			deadbands[0] = *c.Deadband
			deadbands[0].Source = in.s(c.Deadband.Source)
			nc.Deadband, deadbands = &deadbands[0], deadbands[1:]
		}
		if c.Alarms != nil {
			a := *c.Alarms
			a.Quality = in.list(a.Quality)
			// High and Low stay where they are: a few alarms' numbers.
			alarms[0] = a
			nc.Alarms, alarms = &alarms[0], alarms[1:]
		}
		if c.Expose != nil {
			// Never written through: every capability may share the two.
			nc.Expose = &hidden
			if *c.Expose {
				nc.Expose = &exposed
			}
		}
		m.Capabilities[i] = nc
	}
	for _, b := range m.Buses {
		b.Config = nodes.copy(b.Config, in)
	}
}

// interner keeps each distinct string of a manifest once, all of them in
// one block.
type interner map[string]string

// newInterner collects the strings compact keeps and copies them into one
// string, of which each kept string is a part.
func newInterner(m *Manifest) interner {
	seen := map[string]bool{}
	var order []string
	add := func(ss ...string) {
		for _, s := range ss {
			if s != "" && !seen[s] {
				seen[s] = true
				order = append(order, s)
			}
		}
	}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n == nil {
			return
		}
		add(n.Tag, n.Value)
		for _, e := range n.Content {
			walk(e)
		}
	}
	for _, c := range m.Capabilities {
		add(c.Name, c.Kind, c.Description, c.DataType, c.Unit, c.Zone, c.Family, c.RequiresPermission,
			c.Binding.Type, c.Binding.Address, c.Binding.Bus, c.Binding.Field, c.Binding.Pos.File, c.Pos.File)
		add(c.EnumValues...)
		add(c.SemanticTags...)
		add(c.SideEffects...)
		if c.Deadband != nil {
			add(c.Deadband.Source)
		}
		if c.Alarms != nil {
			add(c.Alarms.Quality...)
		}
		walk(c.Binding.Params)
	}
	for _, b := range m.Buses {
		walk(b.Config)
	}
	var b strings.Builder
	for _, s := range order {
		b.WriteString(s)
	}
	all, in, at := b.String(), make(interner, len(order)), 0
	for _, s := range order {
		in[s] = all[at : at+len(s)]
		at += len(s)
	}
	return in
}

func (in interner) s(v string) string {
	if c, ok := in[v]; ok {
		return c
	}
	return v // "" (and nothing else: newInterner saw every string compact asks for)
}

func (in interner) list(v []string) []string {
	if v == nil {
		return nil
	}
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = in.s(x)
	}
	return out
}

// nodeBlock holds the YAML nodes compact keeps, and their content lists,
// each in one block.
type nodeBlock struct {
	nodes []yaml.Node
	ptrs  []*yaml.Node
}

func newNodeBlock(m *Manifest) *nodeBlock {
	nodes, ptrs := 0, 0
	var count func(n *yaml.Node)
	count = func(n *yaml.Node) {
		if n == nil {
			return
		}
		nodes++
		ptrs += len(n.Content)
		for _, e := range n.Content {
			count(e)
		}
	}
	for _, c := range m.Capabilities {
		count(c.Binding.Params)
	}
	for _, b := range m.Buses {
		count(b.Config)
	}
	return &nodeBlock{nodes: make([]yaml.Node, 0, nodes), ptrs: make([]*yaml.Node, 0, ptrs)}
}

// copy copies a tree of YAML nodes into the block (strictyaml expanded its
// aliases, and driver keys carry no comments: kind, style, tag, value,
// position and content are kept).
func (nb *nodeBlock) copy(n *yaml.Node, in interner) *yaml.Node {
	if n == nil {
		return nil
	}
	nb.nodes = append(nb.nodes, yaml.Node{Kind: n.Kind, Style: n.Style, Tag: in.s(n.Tag), Value: in.s(n.Value), Line: n.Line, Column: n.Column})
	c := &nb.nodes[len(nb.nodes)-1]
	if len(n.Content) > 0 {
		at := len(nb.ptrs)
		for range n.Content {
			nb.ptrs = append(nb.ptrs, nil) // within the block's capacity: nothing moves
		}
		c.Content = nb.ptrs[at : at+len(n.Content) : at+len(n.Content)]
		for i, e := range n.Content {
			c.Content[i] = nb.copy(e, in)
		}
	}
	return c
}
