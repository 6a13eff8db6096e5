package mcpserver

import (
	"encoding/json"

	"github.com/physd/physd/manifest"
)

// manifestView serialises the manifest for the physmcp://manifest resource.
type manifestView struct{ m *manifest.Manifest }

func (v *manifestView) MarshalJSON() ([]byte, error) { return json.Marshal(v.m) }
