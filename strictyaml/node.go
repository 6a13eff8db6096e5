package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits that keep hostile input cheap. A greenhouse's manifest is a few
// hundred lines; a plant's of 10 000 points (bench/scalesite) is 3 MB in
// flow style, about 8 MB in block style; these are above that.
const (
	// MaxFileSize is the largest file Document accepts.
	MaxFileSize = 16 << 20
	// minMaxNodes bounds the YAML nodes after anchors/aliases are expanded,
	// for any file: what stops an alias ("billion laughs") bomb. A larger
	// file may have a node for every two of its bytes (no YAML node takes
	// less), and no more: only aliases multiply nodes beyond the text.
	minMaxNodes = 200_000
	// maxDepth bounds nesting (after alias expansion).
	maxDepth = 1000
)

// decoder normalises and decodes nodes, recording problems in pr.
type decoder struct {
	pr       *Problems
	nodes    int  // nodes produced by normalize
	maxNodes int  // the bound for this file (document sets it from its size)
	aborted  bool // a hard limit was hit: stop walking
	active   map[*yaml.Node]bool
}

func newDecoder(pr *Problems) *decoder {
	return &decoder{pr: pr, maxNodes: minMaxNodes, active: map[*yaml.Node]bool{}}
}

// add records a problem at n.
func (p *decoder) add(n *yaml.Node, field, fix, format string, args ...any) {
	p.pr.Addf(n, field, fix, format, args...)
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (?s:(.*))$`)

// syntaxError turns a yaml.v3 parse error into an Error at the line it names.
func (p *decoder) syntaxError(err error) {
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
	p.pr.Errs = append(p.pr.Errs, &Error{
		Pos: Pos{File: p.pr.File, Line: line, Col: 1},
		Msg: "YAML syntax error: " + msg,
		Fix: fmt.Sprintf("correct the YAML near line %d (indentation, a missing space after ':', an unclosed quote or bracket, a tab)", line),
	})
}

// SafeDecode runs a yaml.v3 decode and turns any panic into an error.
func SafeDecode(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("yaml: internal parser failure: %v", r)
		}
	}()
	return f()
}

// Document parses data into a single, alias-free root node with the
// protections every physd file gets (size limit, alias-bomb and depth checks,
// anchors and merge keys expanded, duplicate keys reported, positions kept).
// It records problems in pr. It returns nil when the file cannot be read at
// all; a root it returns may still come with problems (a duplicate key, an
// unknown anchor) so a caller can report the rest of the file's problems
// beside them. (Its empty-file message speaks of "the manifest".)
func Document(pr *Problems, data []byte) *yaml.Node {
	return newDecoder(pr).document(data)
}

func (p *decoder) document(data []byte) *yaml.Node {
	if len(data) > MaxFileSize {
		p.pr.Errs = append(p.pr.Errs, &Error{Pos: Pos{File: p.pr.File}, Msg: fmt.Sprintf("file is %d bytes, larger than the %d-byte limit", len(data), MaxFileSize),
			Fix: "a manifest of 10 000 points is about 8 MB in block style and 3 MB in flow style ({name: …, kind: …} per line); check that this is the right file"})
		return nil
	}
	p.maxNodes = max(minMaxNodes, len(data)/2)
	empty := &Error{Pos: Pos{File: p.pr.File, Line: 1, Col: 1}, Msg: "the manifest is empty",
		Fix: `write at least physmcp_version: "0.1", device:, network: and capabilities: (see examples/greenhouse/physmcp.manifest.yml)`}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	err := SafeDecode(func() error { return dec.Decode(&doc) })
	if errors.Is(err, io.EOF) {
		p.pr.Errs = append(p.pr.Errs, empty)
		return nil
	}
	if err != nil {
		p.syntaxError(err)
		return nil
	}
	var next yaml.Node
	err = SafeDecode(func() error { return dec.Decode(&next) })
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
			p.pr.Errs = append(p.pr.Errs, empty)
			return nil
		}
		root = root.Content[0]
	}
	if root.Kind == yaml.ScalarNode && root.ShortTag() == "!!null" {
		p.pr.Errs = append(p.pr.Errs, empty)
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
func (p *decoder) checkSize(root *yaml.Node) bool {
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
			if total > p.maxNodes {
				p.add(e, "", "remove the aliases (*name) that multiply the document, or split the file",
					"the document expands to more than %d YAML nodes (an alias bomb, or far too large)", p.maxNodes)
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
func (p *decoder) normalize(n *yaml.Node, path string, depth int) *yaml.Node {
	if p.aborted || n == nil {
		return nil
	}
	if depth > maxDepth {
		p.add(n, path, "flatten the structure", "nesting is deeper than %d levels", maxDepth)
		p.aborted = true
		return nil
	}
	p.nodes++
	if p.nodes > p.maxNodes {
		p.add(n, path, "remove the aliases (*name) that multiply the document, or split the file",
			"the document expands to more than %d YAML nodes (an alias bomb, or far too large)", p.maxNodes)
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
			ne := p.normalize(e, Index(path, i), depth+1)
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

func (p *decoder) normalizeMapping(n *yaml.Node, path string, depth int) *yaml.Node {
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
			kp = Join(path, nk.Value)
			if first, dup := seen[nk.Value]; dup {
				p.add(k, kp, fmt.Sprintf("keep one %q key (the first is at line %d) and delete this one", nk.Value, first.Line),
					"duplicate key %s (first defined at %d:%d)", Quote(nk.Value), first.Line, first.Column)
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
		src := p.normalize(mv, Join(path, "<<"), depth+1)
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
			p.add(mv, Join(path, "<<"), "merge a mapping: <<: *anchor, or a list of them: <<: [*a, *b]",
				"a merge key (<<) needs a mapping or a list of mappings, got %s", Describe(src))
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

// Describe names what a node is, for "expected X, got Y" messages.
func Describe(n *yaml.Node) string {
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
			return "the string " + Quote(n.Value)
		case "!!int":
			return "the integer " + n.Value
		case "!!float":
			return "the number " + n.Value
		case "!!bool":
			return "the boolean " + n.Value
		case "!!timestamp":
			return "the timestamp " + n.Value
		default:
			return "a " + n.ShortTag() + " value " + Quote(n.Value)
		}
	}
	return "an unsupported YAML node"
}

// IsNull reports whether n is a null scalar.
func IsNull(n *yaml.Node) bool {
	return n != nil && n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// ParseDocument reads one YAML document with Document's protections and
// returns its root node, or every problem found (sorted) and no node. (Its
// empty-file message speaks of "the manifest"; callers may reword it.)
func ParseDocument(file string, data []byte) (*yaml.Node, Errors) {
	pr := &Problems{File: file}
	root := Document(pr, data)
	if len(pr.Errs) > 0 {
		return nil, pr.Errs.Sorted()
	}
	return root, nil
}
