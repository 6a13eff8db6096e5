package strictyaml

import (
	"encoding"
	"fmt"
	"math"
	"reflect"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

var (
	nodeType        = reflect.TypeFor[yaml.Node]()
	durationType    = reflect.TypeFor[time.Duration]()
	unmarshalerType = reflect.TypeFor[yaml.Unmarshaler]()
	textType        = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// Decode strictly decodes n (a Bus.Config or Binding.Params mapping, a whole
// policy file, or any node from a physd YAML file) into out, which must be a
// non-nil pointer.
//
// Struct fields are matched by their yaml tag name (untagged exported fields
// by their lowercased name; `yaml:"-"` is skipped; `,inline` embeds a struct's
// keys). Keys without a field are errors that list the known keys. Supported
// targets: structs, pointers, slices, arrays, maps (keys decoded like
// scalars), string (any scalar, text as written), bool (true/false), ints and
// uints (range checked), floats, time.Duration (a string such as "250ms"),
// any (generic YAML value), yaml.Node / *yaml.Node (copied raw), and types
// implementing yaml.Unmarshaler or encoding.TextUnmarshaler.
//
// A null value leaves a pointer, slice, map or interface nil; for other
// types it is an error. A nil n decodes nothing. Errors carry file:line:col
// from n and field paths prefixed with field (e.g. "buses.plant").
// Required keys are the caller's to check.
func Decode(file string, n *yaml.Node, field string, out any) Errors {
	pr := &Problems{File: file}
	p := newDecoder(pr)
	rv := reflect.ValueOf(out)
	if !rv.IsValid() || rv.Kind() != reflect.Pointer || rv.IsNil() {
		return Errors{{Pos: pr.pos(n), Field: field, Msg: fmt.Sprintf("Decode needs a non-nil pointer, got %T", out), Fix: "pass &value"}}
	}
	if n == nil {
		return nil
	}
	if n.Kind == yaml.DocumentNode && len(n.Content) == 0 {
		return nil
	}
	if !p.checkSize(n) {
		return pr.Errs.Sorted()
	}
	nn := p.normalize(n, field, 0)
	if !p.aborted && nn != nil {
		p.decode(nn, rv.Elem(), field)
	}
	return pr.Errs.Sorted()
}

func (p *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if !v.CanSet() {
		p.add(n, path, "", "cannot set Go field of type %s (unexported?)", v.Type())
		return
	}
	t := v.Type()
	switch t {
	case nodeType:
		v.Set(reflect.ValueOf(*n))
		return
	case reflect.PointerTo(nodeType):
		v.Set(reflect.ValueOf(n))
		return
	case durationType:
		p.decodeDuration(n, v, path)
		return
	}
	if p.decodeUnmarshaler(n, v, path) {
		return
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		p.decodeIndirect(n, v, path)
	case reflect.Struct:
		p.decodeStruct(n, v, path)
	case reflect.Map:
		p.decodeMap(n, v, path)
	case reflect.Slice, reflect.Array:
		p.decodeList(n, v, path)
	case reflect.String:
		if s, ok := p.pr.Text(n, path); ok {
			v.SetString(s)
		}
	case reflect.Bool:
		if b, ok := p.pr.Bool(n, path); ok {
			v.SetBool(b)
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		p.decodeNumber(n, v, path)
	default:
		p.add(n, path, "", "cannot decode into Go type %s", t)
	}
}

// decodeUnmarshaler decodes n with v's own UnmarshalYAML or UnmarshalText,
// reporting whether v has one.
func (p *decoder) decodeUnmarshaler(n *yaml.Node, v reflect.Value, path string) bool {
	t := v.Type()
	if t.Kind() != reflect.Pointer && t.Kind() != reflect.Interface && v.CanAddr() {
		pv := v.Addr()
		if pv.Type().Implements(unmarshalerType) {
			u := pv.Interface().(yaml.Unmarshaler)
			if err := SafeDecode(func() error { return u.UnmarshalYAML(n) }); err != nil {
				p.add(n, path, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
			}
			return true
		}
		if pv.Type().Implements(textType) && n.Kind == yaml.ScalarNode && !IsNull(n) {
			u := pv.Interface().(encoding.TextUnmarshaler)
			if err := SafeDecode(func() error { return u.UnmarshalText([]byte(n.Value)) }); err != nil {
				p.add(n, path, "", "invalid value %s: %v", Quote(n.Value), err)
			}
			return true
		}
	}

	return false
}

// decodeIndirect decodes into a pointer (set only when its value decodes
// cleanly) or an empty interface (the generic YAML value).
func (p *decoder) decodeIndirect(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	switch t.Kind() {
	case reflect.Pointer:
		if IsNull(n) {
			v.SetZero()
			return
		}
		// Set the pointer only when its value decoded cleanly: a half-decoded
		// zero would look like a value the user wrote (an "abc" in an
		// integer field must not come back as a present 0).
		before := len(p.pr.Errs)
		e := reflect.New(t.Elem())
		p.decode(n, e.Elem(), path)
		if len(p.pr.Errs) == before {
			v.Set(e)
		}
	case reflect.Interface:
		if IsNull(n) {
			v.SetZero()
			return
		}
		if t.NumMethod() != 0 {
			p.add(n, path, "", "cannot decode into Go interface type %s", t)
			return
		}
		var x any
		if err := SafeDecode(func() error { return n.Decode(&x) }); err != nil {
			p.add(n, path, "", "%s", strings.TrimPrefix(err.Error(), "yaml: "))
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	}
}

// decodeList decodes a sequence into a slice or a fixed-size array.
func (p *decoder) decodeList(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	switch t.Kind() {
	case reflect.Slice:
		if IsNull(n) {
			v.SetZero()
			return
		}
		if n.Kind != yaml.SequenceNode {
			p.add(n, path, FixList, "expected a list, got %s", Describe(n))
			return
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, e := range n.Content {
			p.decode(e, s.Index(i), Index(path, i))
		}
		v.Set(s)
	case reflect.Array:
		if n.Kind != yaml.SequenceNode || len(n.Content) != t.Len() {
			p.add(n, path, fmt.Sprintf("write a list of exactly %d items", t.Len()), "expected a list of %d items, got %s", t.Len(), describeLen(n))
			return
		}
		for i, e := range n.Content {
			p.decode(e, v.Index(i), Index(path, i))
		}
	}
}

// decodeNumber decodes an integer or float scalar, range checked for the
// Go type.
func (p *decoder) decodeNumber(n *yaml.Node, v reflect.Value, path string) {
	t := v.Type()
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		if i, ok := p.pr.Int(n, path); ok {
			if v.OverflowInt(i) {
				p.add(n, path, fmt.Sprintf("use a value that fits in %s", t), "integer %d is out of range", i)
				return
			}
			v.SetInt(i)
		}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		if u, ok := p.pr.Uint(n, path); ok {
			if v.OverflowUint(u) {
				p.add(n, path, fmt.Sprintf("use a value that fits in %s", t), "integer %d is out of range", u)
				return
			}
			v.SetUint(u)
		}
	case reflect.Float32, reflect.Float64:
		if f, ok := p.pr.Float(n, path); ok {
			if t.Kind() == reflect.Float32 && !math.IsInf(f, 0) && v.OverflowFloat(f) {
				p.add(n, path, "use a smaller number", "number %s is out of range", n.Value)
				return
			}
			v.SetFloat(f)
		}
	}
}

func describeLen(n *yaml.Node) string {
	if n.Kind == yaml.SequenceNode {
		return fmt.Sprintf("a list of %d", len(n.Content))
	}
	return Describe(n)
}

func (p *decoder) decodeDuration(n *yaml.Node, v reflect.Value, path string) {
	fix := `write a duration with a unit, e.g. "250ms", "5s", "1m30s"`
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		p.add(n, path, fix, "expected a duration, got %s", Describe(n))
		return
	}
	d, err := time.ParseDuration(n.Value)
	if err != nil {
		p.add(n, path, fix, "invalid duration %s", Quote(n.Value))
		return
	}
	v.SetInt(int64(d))
}

func (p *decoder) decodeMap(n *yaml.Node, v reflect.Value, path string) {
	if IsNull(n) {
		v.SetZero()
		return
	}
	if n.Kind != yaml.MappingNode {
		p.add(n, path, FixMapping, "expected a mapping, got %s", Describe(n))
		return
	}
	t := v.Type()
	if v.IsNil() {
		v.Set(reflect.MakeMapWithSize(t, len(n.Content)/2))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.add(k, path, "use a plain word as the key", "a key must be a scalar, got %s", Describe(k))
			continue
		}
		kp := Join(path, k.Value)
		kv := reflect.New(t.Key()).Elem()
		before := len(p.pr.Errs)
		p.decode(k, kv, kp)
		if len(p.pr.Errs) > before {
			continue
		}
		ev := reflect.New(t.Elem()).Elem()
		p.decode(val, ev, kp)
		v.SetMapIndex(kv, ev)
	}
}

// structField is one yaml key of a struct: the field's index path.
type structField struct {
	index []int
}

// structFields maps yaml keys to fields, following `,inline` structs.
func structFields(t reflect.Type) (map[string]structField, []string) {
	fields := map[string]structField{}
	var names []string
	var walk func(t reflect.Type, prefix []int)
	walk = func(t reflect.Type, prefix []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("yaml")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			idx := append(append([]int(nil), prefix...), i)
			if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct && (f.IsExported() || f.Anonymous) {
				walk(f.Type, idx)
				continue
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			if _, dup := fields[name]; dup {
				continue // outer field wins, like encoding/json
			}
			fields[name] = structField{index: idx}
			names = append(names, name)
		}
	}
	walk(t, nil)
	sort.Strings(names)
	return fields, names
}

func (p *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		p.add(n, path, FixMapping, "expected a mapping, got %s", Describe(n))
		return
	}
	fields, names := structFields(v.Type())
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || IsNull(k) {
			p.add(k, path, "use a plain word as the key", "a key must be a string, got %s", Describe(k))
			continue
		}
		f, ok := fields[k.Value]
		if !ok {
			p.pr.UnknownKey(k, Join(path, k.Value), names)
			continue
		}
		p.decode(val, v.FieldByIndex(f.index), Join(path, k.Value))
	}
}

// StructKeys returns the yaml keys Decode accepts for the struct type t,
// sorted, and each key's field index path (for t.FieldByIndex).
func StructKeys(t reflect.Type) ([]string, map[string][]int) {
	fields, names := structFields(t)
	index := make(map[string][]int, len(fields))
	for k, f := range fields {
		index[k] = f.index
	}
	return names, index
}

// Normalize returns a copy of n as Decode sees it: aliases expanded, merge
// keys applied, with the same size and depth limits and duplicate-key
// errors, positions kept. A nil n or empty document gives nil.
func Normalize(file string, n *yaml.Node) (*yaml.Node, Errors) {
	if n == nil || n.Kind == yaml.DocumentNode && len(n.Content) == 0 {
		return nil, nil
	}
	pr := &Problems{File: file}
	p := newDecoder(pr)
	if !p.checkSize(n) {
		return nil, pr.Errs.Sorted()
	}
	nn := p.normalize(n, "", 0)
	if p.aborted {
		nn = nil
	}
	return nn, pr.Errs.Sorted()
}
