package sim

import (
	"context"
	"math"
	"testing"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"gopkg.in/yaml.v3"
)

const testFile = "plant.yml"

// mapping parses a YAML snippet into its top mapping node.
func mapping(t testing.TB, src string) *yaml.Node {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatalf("bad test YAML: %v\n%s", err, src)
	}
	if len(doc.Content) == 0 {
		return nil
	}
	return doc.Content[0]
}

// busFrom builds a *manifest.Bus named "plant" from the YAML of its config
// keys, the way the parser hands it over (type removed).
func busFrom(t testing.TB, src string) *manifest.Bus {
	t.Helper()
	n := mapping(t, src)
	b := &manifest.Bus{Name: "plant", Type: "sim", Config: n, Pos: manifest.Pos{File: testFile, Line: 1, Col: 1}}
	return b
}

func newPlantT(t testing.TB, src string) *Plant {
	t.Helper()
	p, err := New(busFrom(t, src))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// capFrom builds a *manifest.Capability from a YAML snippet with name, kind,
// data_type and binding keys; the binding's keys other than type, address
// and bus become Params, as the parser does.
func capFrom(t testing.TB, src string) *manifest.Capability {
	t.Helper()
	n := mapping(t, src)
	c := &manifest.Capability{Pos: manifest.Pos{File: testFile, Line: n.Line, Col: n.Column}}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		switch k {
		case "name":
			c.Name = v.Value
		case "kind":
			c.Kind = v.Value
		case "data_type":
			c.DataType = v.Value
		case "binding":
			c.Binding.Pos = manifest.Pos{File: testFile, Line: v.Line, Col: v.Column}
			params := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: v.Line, Column: v.Column}
			for j := 0; j+1 < len(v.Content); j += 2 {
				bk, bv := v.Content[j], v.Content[j+1]
				switch bk.Value {
				case "type":
					c.Binding.Type = bv.Value
				case "address":
					c.Binding.Address = bv.Value
				case "bus":
					c.Binding.Bus = bv.Value
				default:
					params.Content = append(params.Content, bk, bv)
				}
			}
			if len(params.Content) > 0 {
				c.Binding.Params = params
			}
		}
	}
	return c
}

// open binds a point of kind/data_type on p.
func open(t testing.TB, p *Plant, kind, dataType, point string) drivers.Point {
	t.Helper()
	c := capFrom(t, "{name: c, kind: "+kind+", data_type: "+dataType+", binding: {type: sim, bus: plant, point: "+point+"}}")
	pt, err := p.Point(c)
	if err != nil {
		t.Fatalf("Point(%s %s %s): %v", kind, dataType, point, err)
	}
	return pt
}

func readF(t testing.TB, pt drivers.Point) float64 {
	t.Helper()
	r, err := pt.Read(context.Background())
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	f, ok := r.Value.(float64)
	if !ok {
		t.Fatalf("Read value %#v is %T, want float64", r.Value, r.Value)
	}
	return f
}

func write(t testing.TB, pt drivers.Point, v any) {
	t.Helper()
	if err := pt.Write(context.Background(), v); err != nil {
		t.Fatalf("Write(%v): %v", v, err)
	}
}

func near(t testing.TB, what string, got, want, tol float64) {
	t.Helper()
	if math.IsNaN(got) || math.Abs(got-want) > tol {
		t.Errorf("%s = %.6f, want %.6f ± %g", what, got, want, tol)
	}
}
