package manifest

import (
	"fmt"
	"math"
	"strings"

	"gopkg.in/yaml.v3"
)

// obj is a YAML mapping checked against a fixed set of keys. All its methods
// are safe on a nil *obj (a mapping that was missing or had the wrong type):
// they report nothing more and return zero values.
type obj struct {
	p     *parser
	node  *yaml.Node
	path  string
	keys  map[string]*yaml.Node // key node by name
	vals  map[string]*yaml.Node // value node by name
	extra []*yaml.Node          // key, value pairs of keys not in known (collect mode)
}

// object checks that n is a mapping whose keys are all in known. With
// collect, other keys are kept in extra instead of being reported.
func (p *parser) object(n *yaml.Node, path string, known []string, collect bool) *obj {
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.add(n, path, fixMapping, "expected a mapping, got %s", describe(n))
		return nil
	}
	o := &obj{p: p, node: n, path: path, keys: map[string]*yaml.Node{}, vals: map[string]*yaml.Node{}}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) {
			p.add(k, path, "use a plain word as the key", "a key must be a string, got %s", describe(k))
			continue
		}
		if contains(known, k.Value) {
			o.keys[k.Value], o.vals[k.Value] = k, v
			continue
		}
		if collect {
			o.extra = append(o.extra, k, v)
			continue
		}
		p.unknownKey(k, join(path, k.Value), known)
	}
	return o
}

func (p *parser) unknownKey(k *yaml.Node, field string, known []string) {
	valid := "valid keys: " + strings.Join(known, ", ")
	if len(known) == 0 {
		valid = "no keys are accepted here"
	}
	fix := "remove it; " + valid
	if s := closest(k.Value, known); s != "" {
		fix = fmt.Sprintf("did you mean %q? %s", s, valid)
	}
	p.add(k, field, fix, "unknown key %s", quoteShort(k.Value))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (o *obj) field(key string) string { return join(o.path, key) }

// get returns the value of key, or nil.
func (o *obj) get(key string) *yaml.Node {
	if o == nil {
		return nil
	}
	return o.vals[key]
}

// key returns the key node of key (for "this key is not allowed here"), or nil.
func (o *obj) key(key string) *yaml.Node {
	if o == nil {
		return nil
	}
	return o.keys[key]
}

// need returns the value of a required key, reporting it at the mapping when
// it is missing.
func (o *obj) need(key, fix string) *yaml.Node {
	if o == nil {
		return nil
	}
	v := o.vals[key]
	if v == nil {
		if fix == "" {
			fix = "add " + key + ": under " + o.where()
		}
		o.p.add(o.node, o.field(key), fix, "missing required key %q", key)
	}
	return v
}

func (o *obj) where() string {
	if o.path == "" {
		return "the top level"
	}
	return o.path
}

// str reads a string key. Required strings must also be non-blank.
func (o *obj) str(key string, required bool) (string, bool) {
	var n *yaml.Node
	if required {
		n = o.need(key, "")
	} else {
		n = o.get(key)
	}
	if n == nil {
		return "", false
	}
	s, ok := o.p.Text(n, o.field(key))
	if ok && required && strings.TrimSpace(s) == "" {
		o.p.add(n, o.field(key), "give "+key+" a value", "%s must not be empty", key)
		return "", false
	}
	return s, ok
}

// enum reads a string key that must be one of options.
func (o *obj) enum(key string, required bool, options []string) (string, bool) {
	s, ok := o.str(key, required)
	if !ok {
		return "", false
	}
	if !contains(options, s) {
		o.p.add(o.get(key), o.field(key), oneOf(s, options), "invalid %s %s", key, quoteShort(s))
		return "", false
	}
	return s, true
}

// pattern reads a string key that must match re (described by what).
func (o *obj) pattern(key string, required bool, ok func(string) bool, what, example string) (string, bool) {
	s, present := o.str(key, required)
	if !present {
		return "", false
	}
	if !ok(s) {
		o.p.add(o.get(key), o.field(key), fmt.Sprintf("use %s, e.g. %s", what, example), "invalid %s %s", key, quoteShort(s))
		return "", false
	}
	return s, true
}

// intIn reads an integer key within [lo, hi].
func (o *obj) intIn(key string, lo, hi int64) (int, bool) {
	n := o.get(key)
	if n == nil {
		return 0, false
	}
	v, ok := o.p.Int(n, o.field(key))
	if !ok {
		return 0, false
	}
	if v < lo || v > hi {
		fix := fmt.Sprintf("use a value from %d to %d", lo, hi)
		if hi == math.MaxInt32 {
			fix = fmt.Sprintf("use a value of at least %d", lo)
		}
		o.p.add(n, o.field(key), fix, "%s %d is out of range", key, v)
		return 0, false
	}
	return int(v), true
}

// floatMin reads a finite number key that must be ≥ lo (or > lo when strict).
func (o *obj) floatMin(key string, lo float64, strict bool) (float64, bool) {
	n := o.get(key)
	if n == nil {
		return 0, false
	}
	v, ok := o.p.FiniteFloat(n, o.field(key))
	if !ok {
		return 0, false
	}
	if v < lo || (strict && v == lo) {
		rel := "at least"
		if strict {
			rel = "greater than"
		}
		o.p.add(n, o.field(key), fmt.Sprintf("use a number %s %g", rel, lo), "%s must be %s %g, got %s", key, rel, lo, n.Value)
		return 0, false
	}
	return v, true
}

func (o *obj) boolean(key string) (bool, bool) {
	n := o.get(key)
	if n == nil {
		return false, false
	}
	return o.p.Bool(n, o.field(key))
}

// strList reads a list of strings; each must pass check (when given).
func (o *obj) strList(key string, required bool, check func(n *yaml.Node, field, s string) bool) ([]string, bool) {
	var n *yaml.Node
	if required {
		n = o.need(key, "")
	} else {
		n = o.get(key)
	}
	if n == nil {
		return nil, false
	}
	if n.Kind != yaml.SequenceNode {
		o.p.add(n, o.field(key), fixList, "expected a list, got %s", describe(n))
		return nil, false
	}
	out := make([]string, 0, len(n.Content))
	ok := true
	for i, e := range n.Content {
		f := index(o.field(key), i)
		s, good := o.p.Text(e, f)
		if good && check != nil {
			good = check(e, f, s)
		}
		if !good {
			ok = false
			continue
		}
		out = append(out, s)
	}
	return out, ok
}

// sub reads a nested mapping.
func (o *obj) sub(key string, known []string, required bool) *obj {
	var n *yaml.Node
	if required {
		n = o.need(key, "")
	} else {
		n = o.get(key)
	}
	if n == nil {
		return nil
	}
	return o.p.object(n, o.field(key), known, false)
}
