package mcpserver

import (
	"context"
	"encoding/json"
	"maps"
	"path"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/approval"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/node"
)

// Policy resource URIs.
const (
	PolicyURI       = "physmcp://policy"
	GateApprovalURI = "phocinae://policy/gate-approval"
)

func (s *Server) addPolicyResources() {
	s.mcp.AddResource(&mcp.Resource{
		URI: PolicyURI, Name: "policy", Title: "Effective physmcp policy",
		Description: "What guards every do_ tool: roles, time windows, range guards, rates, cooldowns, quorum and approval rules, manifest and policy merged (the stricter wins).",
		MIMEType:    "application/json",
	}, func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		var doc any = map[string]any{"configured": false, "note": node.NoPolicyNote}
		if s.opts.Guard != nil {
			doc = s.opts.Guard.Policy()
			// The rules of the tools this endpoint serves: through a view,
			// the view's; never those of a capability that is not exposed
			// (no call can reach it, so no rule of it is an agent's to know).
			sc := s.scopeOf(req.Extra)
			if hidden := s.policyHides(); len(hidden) > 0 || sc.view != nil {
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
					c := s.capOfTool(tool)
					if hidden[tool] || sc.view != nil && (c == nil || !sc.view.Match(s.n.Manifest().Subject(c))) {
						delete(tools, tool)
					}
				}
				if sc.view != nil {
					m["view"] = sc.view.Name
				}
				doc = m
			}
		}
		return jsonResource(PolicyURI, doc)
	})
	if s.opts.Guard == nil {
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
		doc := s.opts.Guard.Gate().PolicyDoc(terms)
		if sc := s.scopeOf(req.Extra); sc.view != nil {
			doc = s.gateDocInView(doc, sc)
		}
		return jsonResource(GateApprovalURI, doc)
	})
}

// policyHides names the tools of this gateway's unexposed capabilities.
func (s *Server) policyHides() map[string]bool {
	hidden := map[string]bool{}
	for _, c := range s.n.Manifest().Capabilities {
		if !c.Exposed() {
			hidden[c.ToolName()] = true
		}
	}
	return hidden
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
