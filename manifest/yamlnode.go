package manifest

import (
	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// MaxFileSize is the largest manifest Parse accepts (strictyaml's limit:
// hostile input stays cheap, and a plant of 10 000 points fits).
const MaxFileSize = strictyaml.MaxFileSize

// parser collects the problems of one manifest file. Reading the YAML
// (limits, aliases, merge keys, duplicate keys) and the scalar checks are
// strictyaml's; the parser walks the manifest's own structure.
type parser struct {
	strictyaml.Problems
}

func (p *parser) pos(n *yaml.Node) Pos {
	if n == nil {
		return Pos{File: p.File}
	}
	return Pos{File: p.File, Line: n.Line, Col: n.Column}
}

// add records a problem at n.
func (p *parser) add(n *yaml.Node, field, fix, format string, args ...any) {
	p.Addf(n, field, fix, format, args...)
}

// Short names for strictyaml's helpers, used throughout the parser.
func join(path, key string) string    { return strictyaml.Join(path, key) }
func index(path string, i int) string { return strictyaml.Index(path, i) }
func describe(n *yaml.Node) string    { return strictyaml.Describe(n) }
func isNull(n *yaml.Node) bool        { return strictyaml.IsNull(n) }

// Fix hints for type errors.
const (
	fixString  = strictyaml.FixString
	fixInt     = strictyaml.FixInt
	fixNumber  = strictyaml.FixNumber
	fixBool    = strictyaml.FixBool
	fixMapping = strictyaml.FixMapping
	fixList    = strictyaml.FixList
)

// ParseDocument reads one YAML document with the same protections as the
// manifest and returns its root node: strictyaml.ParseDocument.
func ParseDocument(file string, data []byte) (*yaml.Node, Errors) {
	return strictyaml.ParseDocument(file, data)
}
