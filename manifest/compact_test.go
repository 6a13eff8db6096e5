package manifest

import (
	"os"
	"testing"

	"gopkg.in/yaml.v3"
)

// TestCompactKeepsEverything: after Parse's compaction every capability
// and bus keeps its driver keys whole (every node, value and position), and
// its strings and small parts, as the file has them.
func TestCompactKeepsEverything(t *testing.T) {
	src, err := os.ReadFile("../examples/modbus/physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse("modbus.yml", src)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	// The file's own binding mappings, by capability name.
	want := map[string]*yaml.Node{}
	top := doc.Content[0]
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value != "capabilities" {
			continue
		}
		for _, c := range top.Content[i+1].Content {
			if name, b := valueOf(c, "name"), valueOf(c, "binding"); name != nil && b != nil {
				want[name.Value] = b
			}
		}
	}
	var check func(name string, got, file *yaml.Node)
	check = func(name string, got, file *yaml.Node) {
		if got == nil || got.Value != file.Value || got.Line != file.Line || got.Column != file.Column || got.Kind != file.Kind || got.Style != file.Style || got.ShortTag() != file.ShortTag() {
			t.Fatalf("%s: node %+v, the file has %+v", name, got, file)
		}
	}
	for _, c := range m.Capabilities {
		file := want[c.Name]
		if file == nil {
			t.Fatalf("%s: not in the file", c.Name)
		}
		// Params holds the binding's keys other than type, address and bus,
		// in the file's order.
		j, params := 0, c.Binding.ParamsNode()
		for i := 0; i+1 < len(file.Content); i += 2 {
			switch file.Content[i].Value {
			case "type", "address", "bus":
				continue
			}
			if params == nil || j+1 >= len(params.Content) {
				t.Fatalf("%s: Params lacks %s", c.Name, file.Content[i].Value)
			}
			check(c.Name, params.Content[j], file.Content[i])
			check(c.Name, params.Content[j+1], file.Content[i+1])
			j += 2
		}
		if c.Name == "" || c.Description == "" || len(c.SemanticTags) == 0 || c.Expose == nil || !*c.Expose || m.Capability(c.Name) != c {
			t.Errorf("%s: %+v", c.Name, c)
		}
	}
	if b := m.Buses["boiler"]; b == nil || valueOf(b.Config, "address") == nil || valueOf(b.Config, "address").Value != "127.0.0.1:5020" {
		t.Errorf("bus boiler: %+v", b)
	}
}
