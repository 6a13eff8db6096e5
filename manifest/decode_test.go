package manifest

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The decoder itself is tested in strictyaml; DecodeNode only forwards.
func TestDecodeNodeForwards(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte("port: 502\nprot: 1\n"), &doc); err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Port uint16 `yaml:"port"`
	}
	errs := DecodeNode("f.yml", &doc, "buses.plc1", &cfg)
	want := `f.yml:2:1: buses.plc1.prot: unknown key "prot"; fix: did you mean "port"? valid keys: port`
	if cfg.Port != 502 || len(errs) != 1 || errs.Error() != want {
		t.Fatalf("port %d, errs:\n%v\nwant %s", cfg.Port, errs, want)
	}
	if !strings.Contains(OneOf("raed", []string{"read"}), `"read"`) {
		t.Error("OneOf")
	}
}
