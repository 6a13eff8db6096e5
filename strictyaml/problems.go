package strictyaml

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// Problems collects positioned problems for one file: every problem is an
// Error with file:line:col, the dotted field and a fix.
//
// Problems are reported either at a node (AddAt, Addf, UnknownKey, the
// scalar checks) or by a path of mapping keys below Top (Add, AddKey), for
// checks made on a value decoded from Top: the position is then that of the
// text the path names, or of the nearest part of it that is written (a value
// left to its default is reported where it would go).
//
// The zero value is ready to use (with no file name).
type Problems struct {
	File string     // the file name in every position
	Root string     // the field path of Top, e.g. "buses.plc1" (may be "")
	Top  *yaml.Node // the node the paths of Add and AddKey start from (may be nil)
	// At is the position Add uses when no part of its path is written
	// (and AddKey when Top is nil). Its File is ignored.
	At Pos
	// KeyFallback makes Add point, when its path is not fully written, at
	// the deepest key that is written (Top itself when none) instead of the
	// deepest value that is.
	KeyFallback bool
	// Errs is every problem, in the order added.
	Errs Errors
}

// Field returns Root joined with path by dots.
func (p *Problems) Field(path ...string) string {
	field := p.Root
	for _, k := range path {
		field = Join(field, k)
	}
	return field
}

// pos is the position of n, or of the file alone when n is nil.
func (p *Problems) pos(n *yaml.Node) Pos {
	if n == nil {
		return Pos{File: p.File}
	}
	return Pos{File: p.File, Line: n.Line, Col: n.Column}
}

// AddAt records a problem at n (the file alone when n is nil).
func (p *Problems) AddAt(n *yaml.Node, field, msg, fix string) {
	p.Errs = append(p.Errs, &Error{Pos: p.pos(n), Field: field, Msg: msg, Fix: fix})
}

// Addf records a problem at n with a formatted message.
func (p *Problems) Addf(n *yaml.Node, field, fix, format string, args ...any) {
	p.AddAt(n, field, fmt.Sprintf(format, args...), fix)
}

// Add records a problem with the value at path below Top (field Root.path).
// When the path is not fully written it points at the deepest value on the
// way (the deepest key with KeyFallback), and at At when nothing is.
func (p *Problems) Add(msg, fix string, path ...string) {
	var n *yaml.Node
	if p.KeyFallback {
		key, val := Lookup(p.Top, path...)
		if val == nil {
			val = key
		}
		n = val
	} else {
		n = Find(p.Top, path...)
	}
	p.addPath(n, msg, fix, path)
}

// AddKey records a problem with the key at path below Top (the deepest key
// written on the way, Top when none, At when Top is nil).
func (p *Problems) AddKey(msg, fix string, path ...string) {
	key, _ := Lookup(p.Top, path...)
	p.addPath(key, msg, fix, path)
}

func (p *Problems) addPath(n *yaml.Node, msg, fix string, path []string) {
	pos := Pos{File: p.File, Line: p.At.Line, Col: p.At.Col}
	if n != nil && n.Line > 0 {
		pos.Line, pos.Col = n.Line, n.Column
	}
	p.Errs = append(p.Errs, &Error{Pos: pos, Field: p.Field(path...), Msg: msg, Fix: fix})
}

// Append records errors found elsewhere (e.g. by Decode).
func (p *Problems) Append(errs ...*Error) { p.Errs = append(p.Errs, errs...) }

// Decode is strictyaml.Decode with p.File, recording its errors in p; it
// reports whether n decoded without error.
func (p *Problems) Decode(n *yaml.Node, field string, out any) bool {
	errs := Decode(p.File, n, field, out)
	p.Errs = append(p.Errs, errs...)
	return len(errs) == 0
}

// UnknownKey records that the key k (at field) is not one of known, with a
// "did you mean" when it looks like a typo of one.
func (p *Problems) UnknownKey(k *yaml.Node, field string, known []string) {
	p.Addf(k, field, UnknownKeyFix(k.Value, known), "unknown key %s", Quote(k.Value))
}

// Len is the number of problems recorded.
func (p *Problems) Len() int { return len(p.Errs) }

// Err returns the problems as an error (Errors, in the order added), or nil
// when there are none.
func (p *Problems) Err() error { return p.Errs.Err() }

// Resolve follows document nodes and aliases to the node they stand for
// (nil for an empty document or a dangling alias).
func Resolve(n *yaml.Node) *yaml.Node {
	for n != nil {
		switch n.Kind {
		case yaml.DocumentNode:
			if len(n.Content) == 0 {
				return nil
			}
			n = n.Content[0]
		case yaml.AliasNode:
			n = n.Alias
		default:
			return n
		}
	}
	return nil
}

// Find follows path through mapping nodes (resolving aliases) and returns
// the value node at path; when the path is not fully written, the deepest
// value found on the way (or the key, when its value resolves to nothing);
// nil when not even the first key is written.
func Find(n *yaml.Node, path ...string) *yaml.Node {
	cur, best := Resolve(n), (*yaml.Node)(nil)
	for _, k := range path {
		if cur == nil || cur.Kind != yaml.MappingNode {
			return best
		}
		var next *yaml.Node
		for i := 0; i+1 < len(cur.Content); i += 2 {
			if cur.Content[i].Value == k {
				best, next = cur.Content[i], Resolve(cur.Content[i+1])
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

// Lookup follows path through mapping nodes (resolving aliases). It returns
// the deepest key node found (n itself when none) and the value node of the
// full path (nil when the path is not written out).
func Lookup(n *yaml.Node, path ...string) (key, val *yaml.Node) {
	key, cur := n, Resolve(n)
	for _, k := range path {
		if cur == nil || cur.Kind != yaml.MappingNode {
			return key, nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(cur.Content); i += 2 {
			if cur.Content[i].Value == k {
				key, next = cur.Content[i], Resolve(cur.Content[i+1])
				break
			}
		}
		if next == nil {
			return key, nil
		}
		cur = next
	}
	return key, cur
}

// Pairs returns a mapping node's key/value pairs in file order (nil when n
// is not a mapping). It does not resolve aliases.
func Pairs(n *yaml.Node) [][2]*yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	var out [][2]*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		out = append(out, [2]*yaml.Node{n.Content[i], n.Content[i+1]})
	}
	return out
}

// ValueOf returns the value node of key in the mapping n, or nil. It does
// not resolve aliases.
func ValueOf(n *yaml.Node, key string) *yaml.Node {
	for _, kv := range Pairs(n) {
		if kv[0].Value == key {
			return kv[1]
		}
	}
	return nil
}

// KeyOf returns the key node of key in the mapping n, or nil.
func KeyOf(n *yaml.Node, key string) *yaml.Node {
	for _, kv := range Pairs(n) {
		if kv[0].Value == key {
			return kv[0]
		}
	}
	return nil
}

// ElemOf returns the element of the sequence n whose text is s, or n.
func ElemOf(n *yaml.Node, s string) *yaml.Node {
	if n != nil && n.Kind == yaml.SequenceNode {
		for _, e := range n.Content {
			if e.Value == s {
				return e
			}
		}
	}
	return n
}

// WithoutKey returns the mapping n (resolved), or a shallow copy of it
// without key.
func WithoutKey(n *yaml.Node, key string) *yaml.Node {
	n = Resolve(n)
	if n == nil || n.Kind != yaml.MappingNode {
		return n
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			c := *n
			c.Content = append(append([]*yaml.Node(nil), n.Content[:i]...), n.Content[i+2:]...)
			return &c
		}
	}
	return n
}
