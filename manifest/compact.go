package manifest

import (
	"strings"

	"gopkg.in/yaml.v3"
)

// compact copies what a parsed manifest keeps — each capability, its
// strings, slices and small parts, and the YAML of its binding's driver
// keys (and each bus's) — into a few large blocks of fresh memory, once,
// at the end of Parse; each distinct string is kept once. A binding's
// driver keys are kept packed (packedNode), not as yaml.Nodes: at 10 000
// points they were a third of physd's live heap (13 MB of 40).
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
	nodes, params := newNodeBlock(m), newParamBlock(m, in.all)
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
		nc.Binding.Params, nc.Binding.packed = nil, params.pack(c.Binding.Params, in)
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
// one string.
type interner struct {
	all string
	at  map[string]uint32 // where each string is in all
}

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
	in := interner{at: make(map[string]uint32, len(order))}
	for _, s := range order {
		in.at[s] = uint32(b.Len())
		b.WriteString(s)
	}
	in.all = b.String()
	return in
}

// ref is where v is in all ("" is at 0, of length 0).
func (in interner) ref(v string) strRef {
	return strRef{at: in.at[v], n: uint32(len(v))}
}

func (in interner) s(v string) string {
	if at, ok := in.at[v]; ok {
		return in.all[at : at+uint32(len(v))]
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

// nodeBlock holds the YAML nodes of the buses' configurations compact
// keeps, and their content lists, each in one block.
type nodeBlock struct {
	nodes []yaml.Node
	ptrs  []*yaml.Node
}

func newNodeBlock(m *Manifest) *nodeBlock {
	nodes, ptrs := 0, 0
	for _, b := range m.Buses {
		n, p := treeSize(b.Config)
		nodes, ptrs = nodes+n, ptrs+p
	}
	return &nodeBlock{nodes: make([]yaml.Node, 0, nodes), ptrs: make([]*yaml.Node, 0, ptrs)}
}

// treeSize counts the nodes of the tree n and their content entries.
func treeSize(n *yaml.Node) (nodes, ptrs int) {
	if n == nil {
		return 0, 0
	}
	nodes, ptrs = 1, len(n.Content)
	for _, e := range n.Content {
		k, p := treeSize(e)
		nodes, ptrs = nodes+k, ptrs+p
	}
	return nodes, ptrs
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

// packedNode is one YAML node of a binding's driver keys as compact keeps
// it: 36 bytes where a yaml.Node takes 152 (driver keys have no comments,
// anchors or aliases: strictyaml expanded those), and no pointers, so the
// collector never scans the block. Its strings are parts of the block's
// text; its children are the block's nodes[first : first+n].
type packedNode struct {
	tag, value strRef
	line, col  int32
	first, n   int32
	kind       uint8 // yaml.Kind
	style      uint8 // yaml.Style
}

// strRef is a string of a paramBlock's text.
type strRef struct{ at, n uint32 }

// paramBlock holds the packed driver keys of every binding of a manifest.
type paramBlock struct {
	text  string // the interner's strings
	nodes []packedNode
}

// packedParams is where a compacted binding's driver keys are: the tree
// rooted at nodes[at] of block (none when block is nil).
type packedParams struct {
	block *paramBlock
	at    int32
}

func newParamBlock(m *Manifest, text string) *paramBlock {
	nodes := 0
	for _, c := range m.Capabilities {
		n, _ := treeSize(c.Binding.Params)
		nodes += n
	}
	return &paramBlock{text: text, nodes: make([]packedNode, 0, nodes)}
}

// pack copies the tree n into the block.
func (pb *paramBlock) pack(n *yaml.Node, in interner) packedParams {
	if n == nil {
		return packedParams{}
	}
	at := int32(len(pb.nodes))
	pb.nodes = append(pb.nodes, packedNode{})
	pb.fill(at, n, in)
	return packedParams{block: pb, at: at}
}

// fill packs n at nodes[at], its children side by side after the nodes
// already packed, then theirs.
func (pb *paramBlock) fill(at int32, n *yaml.Node, in interner) {
	p := packedNode{tag: in.ref(n.Tag), value: in.ref(n.Value), line: int32(n.Line), col: int32(n.Column), kind: uint8(n.Kind), style: uint8(n.Style)}
	if len(n.Content) > 0 {
		p.first, p.n = int32(len(pb.nodes)), int32(len(n.Content))
		for range n.Content {
			pb.nodes = append(pb.nodes, packedNode{}) // within the counted capacity
		}
	}
	pb.nodes[at] = p
	for i, e := range n.Content {
		pb.fill(p.first+int32(i), e, in)
	}
}

// node unpacks the tree into fresh yaml.Nodes.
func (pp packedParams) node() *yaml.Node {
	if pp.block == nil {
		return nil
	}
	return pp.block.unpack(pp.at)
}

func (pb *paramBlock) unpack(at int32) *yaml.Node {
	p := &pb.nodes[at]
	n := &yaml.Node{Kind: yaml.Kind(p.kind), Style: yaml.Style(p.style), Tag: pb.str(p.tag), Value: pb.str(p.value), Line: int(p.line), Column: int(p.col)}
	if p.n > 0 {
		n.Content = make([]*yaml.Node, p.n)
		for i := range n.Content {
			n.Content[i] = pb.unpack(p.first + int32(i))
		}
	}
	return n
}

func (pb *paramBlock) str(r strRef) string { return pb.text[r.at : r.at+r.n] }
