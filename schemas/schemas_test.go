package schemas

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"gopkg.in/yaml.v3"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

// TestCommittedSchemasAreCurrent is the drift test: the files editors read
// must be what the parsers' models give today.
func TestCommittedSchemasAreCurrent(t *testing.T) {
	for file, build := range map[string]func() ([]byte, error){ManifestFile: Manifest, PolicyFile: Policy} {
		want, err := build()
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("schemas/%s differs from the parser's model (a key, an enumeration or a bound changed): run go generate ./schemas and commit the result", file)
		}
	}
}

func resolved(t *testing.T, file string) *jsonschema.Resolved {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	r, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return r
}

// instance turns YAML into the JSON value an editor's YAML language server
// checks against the schema.
func instance(t *testing.T, src []byte) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal(src, &v); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func examples(t *testing.T, pattern string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "examples", pattern))
	if err != nil || len(files) == 0 {
		t.Fatalf("no examples match %s: %v", pattern, err)
	}
	return files
}

// TestExamplesMatchSchemas: every shipped manifest and policy is valid
// for the schema (an editor shows no false error on them) and for the
// parser, and names its schema for the editor.
func TestExamplesMatchSchemas(t *testing.T) {
	ms, ps := resolved(t, ManifestFile), resolved(t, PolicyFile)
	manifests := append(examples(t, "*/physmcp.manifest.yml"), examples(t, "mesh-3node/node_*.yml")...)
	for _, f := range manifests {
		src, _ := os.ReadFile(f)
		if err := ms.Validate(instance(t, src)); err != nil {
			t.Errorf("%s: not valid for %s: %v", f, ManifestFile, err)
		}
		if _, err := manifest.Parse(f, src); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if !bytes.Contains(src, []byte("# yaml-language-server: $schema=")) {
			t.Errorf("%s does not name its schema for editors", f)
		}
	}
	for _, f := range examples(t, "*/physmcp.policy.yml") {
		src, _ := os.ReadFile(f)
		if err := ps.Validate(instance(t, src)); err != nil {
			t.Errorf("%s: not valid for %s: %v", f, PolicyFile, err)
		}
		m, err := manifest.Load(filepath.Join(filepath.Dir(f), "physmcp.manifest.yml"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := policy.Parse(f, src, m); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if !bytes.Contains(src, []byte("# yaml-language-server: $schema=../../schemas/"+PolicyFile)) {
			t.Errorf("%s does not name its schema for editors", f)
		}
	}
}

// TestSchemasRefuseWhatParsersRefuse: mistakes an editor should underline
// while typing, each also refused by the parser.
func TestSchemasRefuseWhatParsersRefuse(t *testing.T) {
	gm, err := os.ReadFile("../examples/greenhouse/physmcp.manifest.yml")
	if err != nil {
		t.Fatal(err)
	}
	gp, err := os.ReadFile("../examples/greenhouse/physmcp.policy.yml")
	if err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Parse("m.yml", gm)
	if err != nil {
		t.Fatal(err)
	}
	ms, ps := resolved(t, ManifestFile), resolved(t, PolicyFile)
	edit := func(src []byte, old, new string) []byte {
		if !bytes.Contains(src, []byte(old)) {
			t.Fatalf("the example no longer contains %q", old)
		}
		return bytes.Replace(src, []byte(old), []byte(new), 1)
	}
	manifestCases := map[string][]byte{
		"misspelt capability key":  edit(gm, "    cache_ttl_ms:", "    cache_tll_ms:"),
		"unquoted version":         edit(gm, `physmcp_version: "0.1"`, "physmcp_version: 0.1"),
		"string data_type on a do": edit(gm, "point: zone_a.heater}\n    data_type: float", "point: zone_a.heater}\n    data_type: string"),
		"bad rate_limit unit":      edit(gm, "rate_limit: 30/hour", "rate_limit: 30/fortnight"),
		"string timeout":           edit(gm, "timeout_ms: 2000", "timeout_ms: fast"),
		"unknown device key":       edit(gm, "  vendor: physd", "  vendr: physd"),
	}
	for name, src := range manifestCases {
		if ms.Validate(instance(t, src)) == nil {
			t.Errorf("manifest schema accepts: %s", name)
		}
		if _, err := manifest.Parse("m.yml", src); err == nil {
			t.Errorf("manifest parser accepts: %s", name)
		}
	}
	policyCases := map[string][]byte{
		"unquoted version":           edit(gp, `physmcp_policy_version: "0.1"`, "physmcp_policy_version: 0.1"),
		"key of another rule type":   edit(gp, "{type: cooldown, ms: 15000}", "{type: cooldown, ms: 15000, on_violation: deny}"),
		"unknown day":                edit(gp, "days: [sun]", "days: [sunday]"),
		"clock without a colon":      edit(gp, `start: "07:00"`, `start: "0700"`),
		"unknown role":               edit(gp, "require: [operator]}", "require: [operater]}"),
		"rate without a unit":        edit(gp, `{type: rate, max: "30/min"}`, `{type: rate, max: "30"}`),
		"policy for a read_ tool":    edit(gp, "  do_fan_zone_b:", "  read_fan_zone_b:"),
		"string in an integer field": edit(gp, "override_token_ttl_seconds: 900", `override_token_ttl_seconds: "15m"`),
	}
	for name, src := range policyCases {
		if ps.Validate(instance(t, src)) == nil {
			t.Errorf("policy schema accepts: %s", name)
		}
		if _, err := policy.Parse("p.yml", src, m); err == nil {
			t.Errorf("policy parser accepts: %s", name)
		}
	}
}

// TestEveryDriverIsInTheSchema: every package under drivers/ that
// registers a bus type is linked by drivers/all (the one list of drivers,
// which this package and physd import), so the schema names its types.
func TestEveryDriverIsInTheSchema(t *testing.T) {
	files, err := filepath.Glob("../drivers/*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	all, err := os.ReadFile("../drivers/all/all.go")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`drivers\.Register(Driver)?\(`)
	registering := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if re.Match(src) {
			registering[filepath.Base(filepath.Dir(f))] = true
		}
	}
	for pkg := range registering {
		if !strings.Contains(string(all), `"github.com/physd/physd/drivers/`+pkg+`"`) {
			t.Errorf("drivers/%s registers a bus type but drivers/all does not import it: add it there and run go generate ./schemas", pkg)
		}
	}
	if len(registering) < 7 || len(drivers.Types()) < 8 {
		t.Fatalf("found %d registering packages and %d bus types; the pattern no longer matches them", len(registering), len(drivers.Types()))
	}
}
