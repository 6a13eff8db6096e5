package mcpserver

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/manifest"
)

// MeshURI is the resource holding the mesh status.
const MeshURI = "physmcp://mesh"

func (s *Server) addMeshResource() {
	if s.opts.Mesh == nil {
		return
	}
	s.mcp.AddResource(&mcp.Resource{
		URI: MeshURI, Name: "mesh", Title: "Site mesh status",
		Description: "The gateways of this site: members and their states, partition_state, mesh_size_estimate, expected size and majority.",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		doc := s.opts.Mesh()
		if v := s.scopeOf(req.Extra).view; v != nil {
			var err error
			if doc, err = meshInView(doc, v); err != nil {
				return nil, err
			}
		}
		return jsonResource(MeshURI, doc)
	})
}

// meshInView cuts the members' catalogs of a mesh status to the
// capabilities v selects (by owner, area, name, kind, zone and tags, as
// tools/list does); each catalog's hash, of the whole catalog, is left out.
func meshInView(doc any, v *manifest.View) (any, error) {
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	members, _ := m["members"].([]any)
	var inSites []any // the fleet endpoint's: only the gateways of the view's sites
	for _, mem := range members {
		mm, _ := mem.(map[string]any)
		cat, _ := mm["catalog"].(map[string]any)
		if cat == nil {
			continue
		}
		delete(cat, "hash")
		owner, _ := mm["name"].(string)
		site, _ := mm["site"].(string) // the fleet endpoint's gateways
		area, _ := cat["area"].(string)
		entries, _ := cat["capabilities"].([]any)
		kept := []any{}
		for _, e := range entries {
			em, _ := e.(map[string]any)
			tool, _ := em["tool"].(string)
			kind, _ := em["kind"].(string)
			zone, _ := em["zone"].(string)
			var tags []string
			if ts, ok := em["tags"].([]any); ok {
				for _, t := range ts {
					if t, ok := t.(string); ok {
						tags = append(tags, t)
					}
				}
			}
			if v.Match(manifest.ViewSubject{Device: owner, Site: site, Area: area, Name: manifest.CapabilityName(tool), Kind: kind, Zone: zone, Tags: tags}) {
				kept = append(kept, e)
			}
		}
		cat["capabilities"] = kept
		if site == "" || len(v.Sites) == 0 || slices.Contains(v.Sites, site) {
			inSites = append(inSites, mem)
		}
	}
	if _, fleet := m["sites"]; fleet {
		// A view of some sites names no other site, not even by its
		// gateways' count.
		sites := []string{}
		for _, mem := range inSites {
			if s, _ := mem.(map[string]any)["site"].(string); !slices.Contains(sites, s) {
				sites = append(sites, s)
			}
		}
		m["members"], m["sites"], m["gateways"] = inSites, sites, len(inSites)
	}
	m["view"] = v.Name
	return m, nil
}
