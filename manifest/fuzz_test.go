package manifest

import (
	"os"
	"strings"
	"testing"
)

// FuzzParse checks that no input makes Parse panic or hang, that it returns
// a manifest or errors but never both, and that errors are sorted and
// carry the file name. Seeds: testdata/fuzz/FuzzParse plus the files below.
func FuzzParse(f *testing.F) {
	for _, path := range []string{greenhouse, "testdata/many_problems.yml"} {
		if data, err := os.ReadFile(path); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(header + okCap))
	f.Add([]byte("a: &a [1,2]\nb: &b [*a,*a]\nc: {<<: {x: 1}, y: *b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse("f.yml", data)
		if (m == nil) == (err == nil) {
			t.Fatalf("m = %v, err = %v", m, err)
		}
		if err != nil {
			es, ok := err.(Errors)
			if !ok || len(es) == 0 {
				t.Fatalf("err is %T (%d)", err, len(es))
			}
			for i, e := range es {
				if !strings.HasPrefix(e.Error(), "f.yml") || e.Msg == "" {
					t.Fatalf("bad error %q", e.Error())
				}
				if i > 0 && (es[i-1].Pos.Line > e.Pos.Line || (es[i-1].Pos.Line == e.Pos.Line && es[i-1].Pos.Col > e.Pos.Col)) {
					t.Fatalf("errors not sorted:\n%v", err)
				}
			}
			return
		}
		if len(m.Capabilities) == 0 || m.Device.ID == "" || m.PhysMCPVersion != Version {
			t.Fatalf("incomplete manifest %+v", m)
		}
		for _, c := range m.Capabilities {
			if c.Name == "" || c.Binding.ParamsNode() == nil || c.TimeoutMS <= 0 || len(c.SemanticTags) == 0 {
				t.Fatalf("incomplete capability %+v", c)
			}
			// Drivers decode Params; that must not panic either.
			var anyv map[string]any
			_ = c.Binding.DecodeParams(&anyv)
		}
		for _, b := range m.Buses {
			var anyv map[string]any
			_ = b.DecodeConfig(&anyv)
		}
	})
}
