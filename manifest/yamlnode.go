package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/physd/physd/strictyaml"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits that keep hostile input cheap. A real manifest is a few hundred
// lines; these are far above that.
const (
	// MaxFileSize is the largest manifest Parse accepts.
	MaxFileSize = 1 << 20
	// maxNodes bounds the YAML nodes after anchors/aliases are expanded; it is
	// what stops an alias ("billion laughs") bomb.
	maxNodes = 200_000
	// maxDepth bounds nesting (after alias expansion).
	maxDepth = 1000
)

// parser collects errors for one file.
type parser struct {
	file    string
	errs    Errors
	nodes   int  // nodes produced by normalize
	aborted bool // a hard limit was hit: stop walking
	active  map[*yaml.Node]bool
}

func (p *parser) pos(n *yaml.Node) Pos {
	if n == nil {
		return Pos{File: p.file}
	}
	return Pos{File: p.file, Line: n.Line, Col: n.Column}
}

// add records a problem at n.
func (p *parser) add(n *yaml.Node, field, fix, format string, args ...any) {
	p.errs = append(p.errs, &Error{Pos: p.pos(n), Field: field, Msg: fmt.Sprintf(format, args...), Fix: fix})
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func index(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (?s:(.*))$`)

// syntaxError turns a yaml.v3 parse error into an Error at the line it names.
func (p *parser) syntaxError(err error) {
	msg := err.Error()
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if l, e := strconv.Atoi(m[1]); e == nil && l > 0 {
			line = l
		}
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	p.errs = append(p.errs, &Error{
		Pos: Pos{File: p.file, Line: line, Col: 1},
		Msg: "YAML syntax error: " + msg,
		Fix: fmt.Sprintf("correct the YAML near line %d (indentation, a missing space after ':', an unclosed quote or bracket, a tab)", line),
	})
}

// safeDecode runs a yaml.v3 decode and turns any panic into an error.
func safeDecode(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: internal parser failure: %v", r)
		}
	}()
	return f()
}

// document parses data into a single, alias-free root node, or records why it
// cannot and returns nil.
func (p *parser) document(data []byte) *yaml.Node {
	if len(data) > MaxFileSize {
		p.errs = append(p.errs, &Error{Pos: Pos{File: p.file}, Msg: fmt.Sprintf("file is %d bytes, larger than the %d-byte limit", len(data), MaxFileSize),
			Fix: "a manifest is a few hundred lines; check that this is the right file"})
		return nil
	}
	empty := &Error{Pos: Pos{File: p.file, Line: 1, Col: 1}, Msg: "the manifest is empty",
		Fix: `write at least physmcp_version: "0.1", device:, network: and capabilities: (see examples/greenhouse/physmcp.manifest.yml)`}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	err := safeDecode(func() error { return dec.Decode(&doc) })
	if errors.Is(err, io.EOF) {
		p.errs = append(p.errs, empty)
		return nil
	}
	if err != nil {
		p.syntaxError(err)
		return nil
	}
	var next yaml.Node
	err = safeDecode(func() error { return dec.Decode(&next) })
	switch {
	case err == nil:
		n := &next
		if n.Line == 0 && len(n.Content) > 0 {
			n = n.Content[0]
		}
		p.add(n, "", "keep one manifest per file: remove the '---' separator and everything after it",
			"the file holds more than one YAML document")
		return nil
	case !errors.Is(err, io.EOF):
		p.syntaxError(err)
		return nil
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			p.errs = append(p.errs, empty)
			return nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		p.errs = append(p.errs, empty)
		return nil
	}
	if !p.checkSize(root) {
		return nil
	}
	p.active = map[*yaml.Node]bool{}
	root = p.normalize(root, "", 0)
	if p.aborted || root == nil {
		return nil
	}
	return root
}

// checkSize counts the nodes the document has once aliases are expanded,
// without expanding them (each anchor is counted once and memoised), so an
// alias bomb is rejected in time proportional to the file's size. It also
// rejects aliases that contain themselves and excessive nesting.
func (p *parser) checkSize(root *yaml.Node) bool {
	memo := map[*yaml.Node]int{}
	active := map[*yaml.Node]bool{}
	var count func(n *yaml.Node, depth int) int
	count = func(n *yaml.Node, depth int) int {
		if p.aborted || n == nil {
			return 0
		}
		if depth > maxDepth {
			p.add(n, "", "flatten the structure", "nesting is deeper than %d levels", maxDepth)
			p.aborted = true
			return 0
		}
		if n.Kind == yaml.AliasNode {
			t := n.Alias
			if t == nil {
				return 1
			}
			if active[t] {
				p.add(n, "", "an alias cannot point inside its own anchor; copy the value instead",
					"alias *%s refers to a value that contains it", n.Value)
				p.aborted = true
				return 0
			}
			if c, ok := memo[t]; ok {
				return c
			}
			c := count(t, depth+1)
			memo[t] = c
			return c
		}
		if n.Anchor != "" {
			active[n] = true
			defer delete(active, n)
		}
		total := 1
		for _, e := range n.Content {
			total += count(e, depth+1)
			if p.aborted {
				return 0
			}
			if total > maxNodes {
				p.add(e, "", "remove the aliases (*name) that multiply the document, or split the file",
					"the document expands to more than %d YAML nodes (an alias bomb, or far too large)", maxNodes)
				p.aborted = true
				return 0
			}
		}
		return total
	}
	count(root, 0)
	return !p.aborted
}

// normalize returns a copy of n with aliases expanded and merge keys (<<)
// applied, reporting duplicate mapping keys. Positions are kept: an expanded
// alias carries the positions of its anchor's text. It stops (p.aborted) when
// the expansion exceeds maxNodes or maxDepth, or an alias contains itself.
func (p *parser) normalize(n *yaml.Node, path string, depth int) *yaml.Node {
	if p.aborted || n == nil {
		return nil
	}
	if depth > maxDepth {
		p.add(n, path, "flatten the structure", "nesting is deeper than %d levels", maxDepth)
		p.aborted = true
		return nil
	}
	p.nodes++
	if p.nodes > maxNodes {
		p.add(n, path, "remove the aliases (*name) that multiply the document, or split the file",
			"the document expands to more than %d YAML nodes (an alias bomb, or far too large)", maxNodes)
		p.aborted = true
		return nil
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
		}
		return p.normalize(n.Content[0], path, depth+1)
	case yaml.AliasNode:
		t := n.Alias
		if t == nil {
			p.add(n, path, "define the anchor (&"+n.Value+") before using it", "unknown anchor %q", n.Value)
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
		}
		if p.active[t] {
			p.add(n, path, "an alias cannot point inside its own anchor; copy the value instead",
				"alias *%s refers to a value that contains it", n.Value)
			p.aborted = true
			return nil
		}
		p.active[t] = true
		out := p.normalize(t, path, depth+1)
		delete(p.active, t)
		return out
	case yaml.ScalarNode:
		c := *n
		c.Anchor = ""
		c.Content = nil
		return &c
	case yaml.SequenceNode:
		c := *n
		c.Anchor = ""
		c.Content = make([]*yaml.Node, 0, len(n.Content))
		if n.Anchor != "" {
			p.active[n] = true
			defer delete(p.active, n)
		}
		for i, e := range n.Content {
			ne := p.normalize(e, index(path, i), depth+1)
			if p.aborted {
				return nil
			}
			c.Content = append(c.Content, ne)
		}
		return &c
	case yaml.MappingNode:
		if n.Anchor != "" {
			p.active[n] = true
			defer delete(p.active, n)
		}
		return p.normalizeMapping(n, path, depth)
	default:
		p.add(n, path, "", "unsupported YAML node")
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
	}
}

func (p *parser) normalizeMapping(n *yaml.Node, path string, depth int) *yaml.Node {
	c := *n
	c.Anchor = ""
	c.Content = make([]*yaml.Node, 0, len(n.Content))
	seen := map[string]*yaml.Node{}
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		nk := p.normalize(k, path, depth+1)
		if p.aborted {
			return nil
		}
		kp := path
		if nk.Kind == yaml.ScalarNode {
			kp = join(path, nk.Value)
			if first, dup := seen[nk.Value]; dup {
				p.add(k, kp, fmt.Sprintf("keep one %q key (the first is at line %d) and delete this one", nk.Value, first.Line),
					"duplicate key %s (first defined at %d:%d)", quoteShort(nk.Value), first.Line, first.Column)
				continue
			}
			seen[nk.Value] = k
		}
		nv := p.normalize(v, kp, depth+1)
		if p.aborted {
			return nil
		}
		c.Content = append(c.Content, nk, nv)
	}
	// Merge keys: explicit keys win; among merged mappings the earlier wins.
	for _, mv := range merges {
		src := p.normalize(mv, join(path, "<<"), depth+1)
		if p.aborted {
			return nil
		}
		var maps []*yaml.Node
		switch src.Kind {
		case yaml.MappingNode:
			maps = []*yaml.Node{src}
		case yaml.SequenceNode:
			maps = src.Content
		}
		ok := len(maps) > 0 || src.Kind == yaml.SequenceNode
		for _, m := range maps {
			if m.Kind != yaml.MappingNode {
				ok = false
			}
		}
		if !ok {
			p.add(mv, join(path, "<<"), "merge a mapping: <<: *anchor, or a list of them: <<: [*a, *b]",
				"a merge key (<<) needs a mapping or a list of mappings, got %s", describe(src))
			continue
		}
		for _, m := range maps {
			for i := 0; i+1 < len(m.Content); i += 2 {
				k := m.Content[i]
				if k.Kind == yaml.ScalarNode {
					if _, dup := seen[k.Value]; dup {
						continue
					}
					seen[k.Value] = k
				}
				c.Content = append(c.Content, k, m.Content[i+1])
			}
		}
	}
	return &c
}

// describe names what a node is, for "expected X, got Y" messages.
func describe(n *yaml.Node) string {
	if n == nil {
		return "nothing"
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "an empty value (null)"
		case "!!str":
			return "the string " + quoteShort(n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!timestamp":
			return "the timestamp " + n.Value
		default:
			return "a " + n.ShortTag() + " value " + quoteShort(n.Value)
		}
	}
	return "an unsupported YAML node"
}

func isNull(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Fix hints for type errors.
const (
	fixString  = "write a text value (quote it if it contains ': ' or starts with a special character)"
	fixInt     = "write a whole number without quotes or units"
	fixNumber  = "write a plain number without quotes or units"
	fixBool    = "write true or false"
	fixMapping = "write key: value pairs, indented under the key"
	fixList    = "write a list: [a, b] or one '- item' per line"
)

// scalarString accepts any non-null scalar and returns its text as written
// (so 0x48 and 1.10 keep their spelling).
func (p *parser) scalarString(n *yaml.Node, field string) (string, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		p.add(n, field, fixString, "expected a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

func (p *parser) scalarInt(n *yaml.Node, field string) (int64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.add(n, field, fixInt, "expected an integer, got %s", describe(n))
		return 0, false
	}
	var v int64
	if err := safeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.add(n, field, fixInt, "integer %s is out of range", quoteShort(n.Value))
		return 0, false
	}
	return v, true
}

func (p *parser) scalarUint(n *yaml.Node, field string) (uint64, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		p.add(n, field, fixInt, "expected a non-negative integer, got %s", describe(n))
		return 0, false
	}
	var v uint64
	if err := safeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.add(n, field, fixInt, "%s is not a non-negative integer in range", quoteShort(n.Value))
		return 0, false
	}
	return v, true
}

func (p *parser) scalarFloat(n *yaml.Node, field string) (float64, bool) {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		p.add(n, field, fixNumber, "expected a number, got %s", describe(n))
		return 0, false
	}
	var v float64
	if err := safeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.add(n, field, fixNumber, "%s is not a valid number", quoteShort(n.Value))
		return 0, false
	}
	return v, true
}

// finiteFloat is scalarFloat that also rejects NaN and ±Inf.
func (p *parser) finiteFloat(n *yaml.Node, field string) (float64, bool) {
	v, ok := p.scalarFloat(n, field)
	if ok && (math.IsNaN(v) || math.IsInf(v, 0)) {
		p.add(n, field, "write a finite number", "%s is not a finite number", n.Value)
		return 0, false
	}
	return v, ok
}

func (p *parser) scalarBool(n *yaml.Node, field string) (bool, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
		p.add(n, field, fixBool, "expected true or false, got %s", describe(n))
		return false, false
	}
	var v bool
	if err := safeDecode(func() error { return n.Decode(&v) }); err != nil {
		p.add(n, field, fixBool, "%s is not a boolean", quoteShort(n.Value))
		return false, false
	}
	return v, true
}

// ParseDocument reads one YAML document with the same protections as the
// manifest and returns its root node: strictyaml.ParseDocument.
func ParseDocument(file string, data []byte) (*yaml.Node, Errors) {
	return strictyaml.ParseDocument(file, data)
}
