package modbus

import (
	"strings"

	"github.com/physd/physd/manifest"
	"gopkg.in/yaml.v3"
)

// problems collects configuration errors positioned at the offending YAML,
// the way manifest.DecodeNode reports its own: file:line:col, the dotted
// field and a fix.
type problems struct {
	file string
	root string     // "buses.plc1" or "capabilities[3].binding"
	top  *yaml.Node // the mapping the paths start from (may be nil)
	at   manifest.Pos
	errs manifest.Errors
}

// add reports msg at the value of path (or the nearest written ancestor).
func (p *problems) add(msg, fix string, path ...string) {
	field := p.root
	for _, k := range path {
		field += "." + k
	}
	pos := manifest.Pos{File: p.file, Line: p.at.Line, Col: p.at.Col}
	if n := find(p.top, path); n != nil && n.Line > 0 {
		pos.Line, pos.Col = n.Line, n.Column
	}
	p.errs = append(p.errs, &manifest.Error{Pos: pos, Field: field, Msg: msg, Fix: fix})
}

func (p *problems) err() error { return p.errs.Err() }

// find returns the value node at path, or the deepest key node on the way
// when the path is not fully written (a default), or nil.
func find(n *yaml.Node, path []string) *yaml.Node {
	cur, best := manifest.Resolve(n), (*yaml.Node)(nil)
	for _, k := range path {
		if cur == nil || cur.Kind != yaml.MappingNode {
			return best
		}
		var next *yaml.Node
		for i := 0; i+1 < len(cur.Content); i += 2 {
			if cur.Content[i].Value == k {
				best, next = cur.Content[i], manifest.Resolve(cur.Content[i+1])
				break
			}
		}
		if next == nil {
			return best
		}
		cur, best = next, next
	}
	return best
}

func oneOf(options []string) string { return "use one of " + strings.Join(options, ", ") }
