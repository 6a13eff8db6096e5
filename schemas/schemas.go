// Package schemas holds the JSON Schemas of physmcp.manifest.yml and
// physmcp.policy.yml that editors use for completion and checks while
// typing (see docs/manifest.md#editor-completion-and-checks-vs-code). They are generated from the
// parsers' own models, never written by hand:
//
//	go generate ./schemas
//
// and a test fails while a committed file differs from what the parsers
// accept today.
package schemas

//go:generate go run ./gen

import (
	"bytes"
	"encoding/json"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/physd/physd/drivers"
	_ "github.com/physd/physd/drivers/all" // every driver registers its bus types
	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/policy"
)

// File names, relative to this directory; the examples refer to them.
const (
	ManifestFile = "physmcp.manifest.schema.json"
	PolicyFile   = "physmcp.policy.schema.json"
)

// Manifest is the manifest schema as committed.
func Manifest() ([]byte, error) { return render(manifest.Schema(drivers.Types())) }

// Policy is the policy schema as committed.
func Policy() ([]byte, error) {
	g := manifest.DecodeSchema(reflect.TypeFor[gate.Config]())
	g.Description = "The phocinae gate: L0 deny and allow rules, then L1 (off by default), then fail_closed."
	g.Properties["fail_closed"] = &jsonschema.Schema{Type: "string", Enum: []any{string(gate.Deny), string(gate.Ask)},
		Description: "Decision when L1 is off or unreachable: deny (default) or ask."}
	return render(policy.Schema(g))
}

// render writes the schema with $schema, title and description first,
// where a reader of the file looks for them (the library writes struct
// fields in its own order).
func render(s *jsonschema.Schema) ([]byte, error) {
	c := *s
	c.Schema, c.Title, c.Description = "", "", ""
	body, err := json.MarshalIndent(&c, "", "  ")
	if err != nil {
		return nil, err
	}
	head, err := json.MarshalIndent(struct {
		Schema      string `json:"$schema"`
		Title       string `json:"title"`
		Description string `json:"description"`
	}{s.Schema, s.Title, s.Description}, "", "  ")
	if err != nil {
		return nil, err
	}
	// head ends with "\n}", body starts with "{\n": join the two objects.
	out := append(bytes.TrimSuffix(head, []byte("\n}")), ",\n"...)
	out = append(out, bytes.TrimPrefix(body, []byte("{\n"))...)
	return append(out, '\n'), nil
}
