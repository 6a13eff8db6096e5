package mcpserver

import (
	"encoding/json"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/promcp"
)

// manifestJSON is the physmcp://manifest resource: the parsed manifest with
// the proMCP base version declared beside PhysMCP's (proMCP §14.1).
func manifestJSON(m *manifest.Manifest) ([]byte, error) {
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	doc["promcp_base"] = promcp.PromcpBase
	return json.MarshalIndent(doc, "", "  ")
}
