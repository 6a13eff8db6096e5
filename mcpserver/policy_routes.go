package mcpserver

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"path"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
)

// Policy resource URIs.
const (
	PolicyURI       = "physmcp://policy"
	GateApprovalURI = "phocinae://policy/gate-approval"
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
	for _, mem := range members {
		mm, _ := mem.(map[string]any)
		cat, _ := mm["catalog"].(map[string]any)
		if cat == nil {
			continue
		}
		delete(cat, "hash")
		owner, _ := mm["name"].(string)
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
			if v.Match(manifest.ViewSubject{Device: owner, Area: area, Name: manifest.CapabilityName(tool), Kind: kind, Zone: zone, Tags: tags}) {
				kept = append(kept, e)
			}
		}
		cat["capabilities"] = kept
	}
	m["view"] = v.Name
	return m, nil
}

func (s *Server) addPolicyResources() {
	s.mcp.AddResource(&mcp.Resource{
		URI: PolicyURI, Name: "policy", Title: "Effective physmcp policy",
		Description: "What guards every do_ tool: roles, time windows, range guards, rates, cooldowns, quorum and approval rules, manifest and policy merged (the stricter wins).",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		var doc any = map[string]any{"configured": false, "note": node.NoPolicyNote}
		if s.opts.Safety != nil {
			doc = s.opts.Safety.Policy()
			if sc := s.scopeOf(req.Extra); sc.view != nil {
				// Through a view, the rules of the view's tools only.
				b, err := json.Marshal(doc)
				if err != nil {
					return nil, err
				}
				var m map[string]any
				if err := json.Unmarshal(b, &m); err != nil {
					return nil, err
				}
				tools, _ := m["tools"].(map[string]any)
				for tool := range tools {
					if c := s.capOfTool(tool); c == nil || !sc.view.Match(s.n.Manifest().Subject(c)) {
						delete(tools, tool)
					}
				}
				m["view"] = sc.view.Name
				doc = m
			}
		}
		return jsonResource(PolicyURI, doc)
	})
	if s.opts.Safety == nil {
		return
	}
	s.mcp.AddResource(&mcp.Resource{
		URI: GateApprovalURI, Name: "gate-approval", Title: "Phocinae gate approval policy",
		Description: "The gate's decision chain (L0 table, L1, fail-closed), thresholds, and what a client must do when the gate asks for a human's confirmation.",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		terms := gate.ApprovalTerms{TTL: approval.DefaultTTL, Skew: approval.Skew}
		if a := s.n.Approvals(); a != nil {
			terms.TTL = a.TTL()
		}
		doc := s.opts.Safety.Gate().PolicyDoc(terms)
		if sc := s.scopeOf(req.Extra); sc.view != nil {
			doc = s.gateDocInView(doc, sc)
		}
		return jsonResource(GateApprovalURI, doc)
	})
}

// gateDocInView keeps of the gate's L0 table the rules that apply to a
// tool of this gateway the scope's view selects (an exact name or a glob
// matching one of them): the others name tools outside the view.
func (s *Server) gateDocInView(doc map[string]any, sc scope) map[string]any {
	m := s.n.Manifest()
	var tools []string
	for _, c := range m.Capabilities {
		if sc.view.Match(m.Subject(c)) {
			tools = append(tools, c.ToolName())
		}
	}
	applies := func(rule map[string]any) bool {
		pattern, _ := rule["tool"].(string)
		return slices.ContainsFunc(tools, func(tool string) bool {
			ok, err := path.Match(pattern, tool)
			return pattern == tool || err == nil && ok
		})
	}
	out := maps.Clone(doc)
	chain, _ := doc["decision_chain"].([]map[string]any)
	cut := make([]map[string]any, len(chain))
	for i, step := range chain {
		step = maps.Clone(step)
		for _, key := range []string{"deny_rules", "allow_rules"} {
			if rules, ok := step[key].([]map[string]any); ok {
				step[key] = slices.DeleteFunc(slices.Clone(rules), func(r map[string]any) bool { return !applies(r) })
			}
		}
		cut[i] = step
	}
	out["decision_chain"] = cut
	out["view"] = sc.view.Name
	return out
}

func jsonResource(uri string, doc any) (*mcp.ReadResourceResult, error) {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, MIMEType: "application/json", Text: string(b)}}}, nil
}

// serveOverride starts (POST {"reason": "...", "ttl_s": 300}) or ends
// (DELETE) an emergency override. It needs the policy's override role, and
// every start and end is audited.
func (s *Server) serveOverride(w http.ResponseWriter, r *http.Request) {
	caller, err := s.authenticate(r.Header)
	if err != nil {
		http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
		return
	}
	g := s.opts.Safety
	switch r.Method {
	case http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"override": g.ActiveOverride()})
	case http.MethodPost:
		var in struct {
			Reason string `json:"reason"`
			TTLS   int    `json:"ttl_s"`
		}
		if err := decodeBody(http.MaxBytesReader(w, r.Body, 16<<10), &in); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]any{"error": "body: " + err.Error() + `; send {"reason": "...", "ttl_s": 300}`})
			return
		}
		o, err := g.StartOverride(caller.ID, caller.Role, in.Reason, time.Duration(in.TTLS)*time.Second)
		if err != nil {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": err.Error()})
			return
		}
		s.auditOverride("override_start", caller, in.Reason, o.Until)
		writeJSON(w, http.StatusOK, map[string]any{"override": o, "lifts": []string{"time_window"},
			"never_lifts": []string{"role", "range", "rate", "cooldown", "quorum", "gate deny"}})
	case http.MethodDelete:
		if _, err := g.StartOverride(caller.ID, caller.Role, "end", time.Nanosecond); err != nil {
			writeJSON(w, http.StatusForbidden, map[string]any{"error": err.Error()})
			return
		}
		g.EndOverride()
		s.auditOverride("override_end", caller, "", time.Now())
		writeJSON(w, http.StatusOK, map[string]any{"override": nil})
	default:
		w.Header().Set("Allow", "GET, POST, DELETE")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	}
}

func (s *Server) auditOverride(event string, caller node.Caller, reason string, until time.Time) {
	if s.opts.Audit == nil {
		return
	}
	if _, err := s.opts.Audit.Append(&audit.Record{Event: event, Caller: caller.ID, Reason: reason,
		Data: map[string]any{"role": caller.Role, "until": until.UTC()}}); err != nil {
		s.log.Error("audit write failed", "event", event, "err", err)
	}
}
