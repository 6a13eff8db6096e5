package manifest

import (
	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// DecodeNode strictly decodes n into out: it is strictyaml.Decode (see there
// for the rules), kept for callers that have not moved to strictyaml yet.
func DecodeNode(file string, n *yaml.Node, field string, out any) Errors {
	return strictyaml.Decode(file, n, field, out)
}
