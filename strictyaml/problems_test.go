package strictyaml

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const problemsSrc = `type: modbus
tcp:
  host: 10.0.0.2
  port: 70000
zones: &z
  a:
    tau_s: 5
alias: *z
`

func problemsTop(t *testing.T) *yaml.Node {
	t.Helper()
	root, errs := ParseDocument("cfg.yml", []byte(problemsSrc))
	if errs != nil {
		t.Fatal(errs)
	}
	return root
}

func TestProblemsAdd(t *testing.T) {
	top := problemsTop(t)
	p := &Problems{File: "cfg.yml", Root: "buses.plc1", Top: top, At: Pos{File: "other", Line: 40, Col: 3}}
	p.Add("port out of range", "use 1-65535", "tcp", "port") // the value
	p.Add("timeout too long", "use less", "tcp", "timeout")  // unwritten: the tcp mapping's value
	p.Add("missing rtu", "add rtu:", "rtu", "baud")          // nothing written: At
	p.Add("tau", "use more", "alias", "a", "tau_s")          // through an alias
	p.AddKey("bad key", "rename it", "tcp", "host")          // the key
	p.AddAt(top, "buses.plc1", "whole bus", "")              // a node
	p.Addf(nil, "x", "fix it", "%d problems", 7)             // no node: the file
	want := []string{
		"cfg.yml:4:9: buses.plc1.tcp.port: port out of range; fix: use 1-65535",
		"cfg.yml:3:3: buses.plc1.tcp.timeout: timeout too long; fix: use less",
		"cfg.yml:40:3: buses.plc1.rtu.baud: missing rtu; fix: add rtu:",
		"cfg.yml:7:12: buses.plc1.alias.a.tau_s: tau; fix: use more",
		"cfg.yml:3:3: buses.plc1.tcp.host: bad key; fix: rename it",
		"cfg.yml:1:1: buses.plc1: whole bus",
		"cfg.yml: x: 7 problems; fix: fix it",
	}
	if p.Len() != len(want) {
		t.Fatalf("%d problems:\n%v", p.Len(), p.Errs)
	}
	for i, e := range p.Errs {
		if e.Error() != want[i] {
			t.Errorf("problem %d:\n got %s\nwant %s", i, e, want[i])
		}
	}
	if p.Err() == nil || !strings.Contains(p.Err().Error(), "port out of range") {
		t.Errorf("Err = %v", p.Err())
	}
}

func TestProblemsKeyFallback(t *testing.T) {
	top := problemsTop(t)
	p := &Problems{File: "f", Top: top, KeyFallback: true}
	p.Add("unwritten", "", "tcp", "timeout") // deepest key written: tcp
	p.Add("written", "", "tcp", "port")
	p.Add("nothing", "", "rtu") // no key written: Top itself
	p.AddKey("unwritten key", "", "zones", "b")
	want := []string{
		"f:2:1: tcp.timeout: unwritten",
		"f:4:9: tcp.port: written",
		"f:1:1: rtu: nothing",
		"f:5:1: zones.b: unwritten key",
	}
	for i, e := range p.Errs {
		if e.Error() != want[i] {
			t.Errorf("problem %d:\n got %s\nwant %s", i, e, want[i])
		}
	}
	var empty Problems
	if empty.Err() != nil || empty.Field("a", "b") != "a.b" {
		t.Errorf("zero Problems: Err %v, Field %q", empty.Err(), empty.Field("a", "b"))
	}
	empty.Add("no top", "", "a")
	if got := empty.Errs[0].Error(); got != "<input>: a: no top" {
		t.Errorf("no top: %s", got)
	}
}

func TestFindLookup(t *testing.T) {
	top := problemsTop(t)
	if n := Find(top, "tcp", "host"); n == nil || n.Value != "10.0.0.2" {
		t.Errorf("Find tcp.host = %v", n)
	}
	if n := Find(top, "nope"); n != nil {
		t.Errorf("Find nope = %v", n)
	}
	if n := Find(top, "type", "deeper"); n == nil || n.Value != "modbus" {
		t.Errorf("Find type.deeper = %v (want the scalar on the way)", n)
	}
	key, val := Lookup(top, "zones", "a", "tau_s")
	if key.Value != "tau_s" || val.Value != "5" {
		t.Errorf("Lookup = %v, %v", key, val)
	}
	key, val = Lookup(top, "type", "deeper")
	if key.Value != "type" || val != nil {
		t.Errorf("Lookup type.deeper = %v, %v", key, val)
	}
	if k := KeyOf(top, "tcp"); k == nil || k.Line != 2 {
		t.Errorf("KeyOf tcp = %v", k)
	}
	if v := ValueOf(top, "type"); v == nil || v.Value != "modbus" {
		t.Errorf("ValueOf type = %v", v)
	}
	if len(Pairs(top)) != 4 || Pairs(nil) != nil {
		t.Errorf("Pairs = %d", len(Pairs(top)))
	}
	seq := &yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: "a"}}}
	if ElemOf(seq, "a") != seq.Content[0] || ElemOf(seq, "b") != seq {
		t.Error("ElemOf")
	}
	if w := WithoutKey(top, "type"); len(w.Content) != 6 || len(top.Content) != 8 {
		t.Errorf("WithoutKey: %d keys left, top has %d", len(w.Content)/2, len(top.Content)/2)
	}
	if Resolve(&yaml.Node{Kind: yaml.DocumentNode}) != nil {
		t.Error("Resolve of an empty document")
	}
}

func TestScalars(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("[abc, 7, -1, 1.5, .nan, true, ~]"), &doc); err != nil {
		t.Fatal(err)
	}
	e := doc.Content[0].Content
	p := &Problems{File: "f"}
	if s, ok := p.Text(e[1], "x"); !ok || s != "7" {
		t.Errorf("Text = %q %v", s, ok)
	}
	if _, ok := p.Text(e[6], "x"); ok {
		t.Error("Text of null")
	}
	if i, ok := p.Int(e[2], "x"); !ok || i != -1 {
		t.Errorf("Int = %d %v", i, ok)
	}
	if _, ok := p.Uint(e[2], "x"); ok {
		t.Error("Uint of -1")
	}
	if f, ok := p.Float(e[3], "x"); !ok || f != 1.5 {
		t.Errorf("Float = %v %v", f, ok)
	}
	if _, ok := p.FiniteFloat(e[4], "x"); ok {
		t.Error("FiniteFloat of NaN")
	}
	if b, ok := p.Bool(e[5], "x"); !ok || !b {
		t.Errorf("Bool = %v %v", b, ok)
	}
	if _, ok := p.Int(e[0], "x"); ok {
		t.Error("Int of abc")
	}
	if p.Len() != 4 {
		t.Errorf("%d problems: %v", p.Len(), p.Errs)
	}
	want := `f:1:2: x: expected an integer, got the string "abc"; fix: ` + FixInt
	if got := p.Errs[3].Error(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestHints(t *testing.T) {
	if got := OneOf("modbsu", []string{"modbus", "sim"}); got != `did you mean "modbus"? use one of modbus, sim` {
		t.Errorf("OneOf = %s", got)
	}
	if got := UnknownKeyFix("zzz", []string{"a", "b"}); got != "remove it; valid keys: a, b" {
		t.Errorf("UnknownKeyFix = %s", got)
	}
	if got := UnknownKeyFix("prot", []string{"port"}); got != `did you mean "port"? valid keys: port` {
		t.Errorf("UnknownKeyFix = %s", got)
	}
	if got := UnknownKeyFix("x", nil); got != "remove it; no keys are accepted here" {
		t.Errorf("UnknownKeyFix = %s", got)
	}
	if Closest("timeout", []string{"timeout_ms"}) != "timeout_ms" {
		t.Error("Closest prefix")
	}
	if q := Quote(strings.Repeat("a", 50)); !strings.HasSuffix(q, `"…`) {
		t.Errorf("Quote = %s", q)
	}
}

func TestErrorsOrder(t *testing.T) {
	a := &Error{Pos: Pos{File: "f", Line: 2, Col: 1}, Msg: "b"}
	b := &Error{Pos: Pos{File: "f", Line: 1, Col: 5}, Msg: "a"}
	c := &Error{Pos: Pos{File: "f", Line: 2, Col: 1}, Msg: "a"}
	if got := (Errors{a, b, c}).SortByLine(); got[0] != b || got[1] != a || got[2] != c {
		t.Errorf("SortByLine = %v", got)
	}
	dup := *c
	if got := (Errors{a, b, c, &dup}).Sorted(); len(got) != 3 || got[0] != b || got[1] != c || got[2] != a {
		t.Errorf("Sorted = %v", got)
	}
	if (Errors{}).Sorted() != nil || (Errors{}).Err() != nil {
		t.Error("empty Errors")
	}
}

func TestDocument(t *testing.T) {
	p := &Problems{File: "f"}
	root := Document(p, []byte("a: 1\na: 2\nb: 3\n"))
	if root == nil || p.Len() != 1 || !strings.Contains(p.Errs[0].Error(), "f:2:1: a: duplicate key") {
		t.Fatalf("root %v, problems %v", root, p.Errs)
	}
	if _, errs := ParseDocument("f", []byte("a: 1\na: 2\n")); len(errs) != 1 {
		t.Errorf("ParseDocument: %v", errs)
	}
	if _, errs := ParseDocument("f", nil); len(errs) != 1 || !strings.Contains(errs.Error(), "is empty") {
		t.Errorf("ParseDocument of nothing: %v", errs)
	}
	if _, errs := ParseDocument("f", []byte("a: [\n")); len(errs) != 1 || !strings.Contains(errs.Error(), "YAML syntax error") {
		t.Errorf("ParseDocument of bad YAML: %v", errs)
	}
}

func TestNormalize(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("a: &x {b: 1}\nc: *x\n"), &doc); err != nil {
		t.Fatal(err)
	}
	n, errs := Normalize("f", &doc)
	if errs != nil || n.Kind != yaml.MappingNode || n.Content[3].Kind != yaml.MappingNode || n.Content[3].Line != 1 {
		t.Fatalf("%v %v", n, errs)
	}
	if n, errs := Normalize("f", nil); n != nil || errs != nil {
		t.Fatal("nil")
	}
	if err := yaml.Unmarshal([]byte("a: 1\na: 2\n"), &doc); err != nil {
		t.Fatal(err)
	}
	if _, errs := Normalize("f", &doc); len(errs) != 1 {
		t.Fatalf("duplicate: %v", errs)
	}
}
