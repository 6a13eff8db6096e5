package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Capability families (manifest: family on a capability). Where an
// endpoint serves families, the instances of a family with two or more
// members in the site are listed as one tool, <kind>_<family>, with a zone
// argument (and source when the family spans gateways); a call picks one
// instance and runs exactly as a call of that instance's own tool would
// (its range, policy, gate, ledger and audit). Instance tools stay callable
// (a client with an older list keeps working); they are only not listed.
// Families with one member are served as that instance.

// member is one capability of a family.
type member struct {
	owner, tool, zone string // owner: OwnerKey
	site, device      string // the owner's site (fleet) and device id
	local             bool
	cap               *manifest.Capability // typing: this gateway's, or built from the catalog
	subject           manifest.ViewSubject
}

// family is what one family tool serves.
type family struct {
	tool, kind string
	members    []member // sorted by zone, then owner
}

// families lists the families served in the site now: this gateway's
// exposed capabilities and the mesh catalog's that name a family, keyed by
// tool name.
// A member whose type differs from the family's first (this gateway's
// first, else the first owner's) is left out and keeps its own tool; so is
// a family whose tool name is also some capability's tool name.
func (s *Server) families() map[string]*family {
	m := s.n.Manifest()
	out := map[string]*family{}
	taken := map[string]bool{}
	add := func(mem member) {
		taken[mem.tool] = true
		if mem.cap.Family == "" {
			return
		}
		name := mem.cap.Kind + "_" + mem.cap.Family
		f := out[name]
		if f == nil {
			f = &family{tool: name, kind: mem.cap.Kind}
			out[name] = f
		}
		if len(f.members) > 0 {
			first := f.members[0].cap
			if first.DataType != mem.cap.DataType || first.Unit != mem.cap.Unit || !slices.Equal(first.EnumValues, mem.cap.EnumValues) {
				return
			}
			for _, o := range f.members {
				if o.zone == mem.zone && o.owner == mem.owner {
					return // one member per zone and owner: the arguments pick one
				}
			}
		}
		f.members = append(f.members, mem)
	}
	for _, c := range m.ExposedCapabilities() {
		add(member{owner: m.Device.ID, device: m.Device.ID, tool: c.ToolName(), zone: c.Zone, local: true, cap: c, subject: m.Subject(c)})
	}
	if s.opts.Router != nil {
		remote := s.opts.Router.RemoteTools()
		sort.Slice(remote, func(i, j int) bool { return remote[i].key() < remote[j].key() })
		for _, t := range remote {
			c := &manifest.Capability{Name: manifest.CapabilityName(t.Tool), Kind: t.Kind, DataType: t.DataType, Unit: t.Unit, Zone: t.Zone,
				Description: t.Description, EnumValues: t.EnumValues, SideEffects: t.SideEffects, Family: t.Family}
			if t.Min != nil && t.Max != nil {
				c.Range = &manifest.Range{Min: *t.Min, Max: *t.Max}
			}
			add(member{owner: t.key(), site: t.Site, device: t.Owner, tool: t.Tool, zone: t.Zone, cap: c,
				subject: manifest.ViewSubject{Device: t.Owner, Site: t.Site, Area: t.Area, Name: c.Name, Kind: t.Kind, Zone: t.Zone, Tags: t.Tags}})
		}
	}
	for name, f := range out {
		if len(f.members) < 2 || taken[name] {
			delete(out, name)
			continue
		}
		sort.SliceStable(f.members, func(i, j int) bool {
			a, b := f.members[i], f.members[j]
			return a.zone < b.zone || a.zone == b.zone && a.owner < b.owner
		})
	}
	return out
}

// familyOf maps each instance tool served by a family to the family tool.
func familyOf(fams map[string]*family) map[string]string {
	out := map[string]string{}
	for name, f := range fams {
		for _, m := range f.members {
			out[m.tool] = name
		}
	}
	return out
}

// familyTools keeps the family tools registered in step with the site.
type familyTools struct {
	mu   sync.Mutex
	defs map[string][]byte // registered tool -> its definition (JSON)
}

// syncFamilies (re)registers the family tools of the site; the SDK tells
// connected clients when the list changes.
func (s *Server) syncFamilies() {
	fams := s.families()
	s.fams.mu.Lock()
	defer s.fams.mu.Unlock()
	if s.fams.defs == nil {
		s.fams.defs = map[string][]byte{}
	}
	for name := range s.fams.defs {
		if fams[name] == nil {
			s.mcp.RemoveTools(name)
			delete(s.fams.defs, name)
		}
	}
	for name, f := range fams {
		def := familyToolDef(f, s.opts.Router != nil, s.opts.Fleet)
		b, _ := json.Marshal(def)
		if bytes.Equal(b, s.fams.defs[name]) {
			continue
		}
		s.fams.defs[name] = b
		s.mcp.AddTool(def, s.handleFamily(name))
	}
}

// familyToolDef types a family tool: the value schema of its members, the
// zone (and source) that pick one, and each member's range, in the schema
// (if/then per zone) and in the description.
func familyToolDef(f *family, mesh, fleet bool) *mcp.Tool {
	first := f.members[0].cap
	var zones, owners, ranges []string
	lo, hi := math.Inf(1), math.Inf(-1)
	var perMember []any
	multiOwnerZone := false
	seenZone := map[string]bool{}
	perSiteZone := map[string]int{} // fleet: members per site and zone
	for _, m := range f.members {
		perSiteZone[m.site+"\x00"+m.zone]++
	}
	for _, m := range f.members {
		if seenZone[m.zone] {
			multiOwnerZone = multiOwnerZone || !fleet || perSiteZone[m.site+"\x00"+m.zone] > 1
		} else {
			zones = append(zones, m.zone)
			seenZone[m.zone] = true
		}
		if !slices.Contains(owners, m.owner) {
			owners = append(owners, m.owner)
		}
		where := m.zone
		if mesh {
			where += " on " + m.owner
		}
		if r := m.cap.Range; r != nil {
			lo, hi = math.Min(lo, r.Min), math.Max(hi, r.Max)
			ranges = append(ranges, fmt.Sprintf("%s: %s (%s) %g–%g%s", where, m.tool, m.cap.Name, r.Min, r.Max, unitSuffix(m.cap)))
			cond := promcp.Schema{"zone": promcp.Schema{"const": m.zone}}
			required := []any{"zone"}
			switch {
			case fleet:
				cond["site"] = promcp.Schema{"const": m.site}
				required = append(required, "site")
				if perSiteZone[m.site+"\x00"+m.zone] > 1 {
					cond["source"] = promcp.Schema{"const": m.device}
					required = append(required, "source")
				}
			case mesh:
				cond["source"] = promcp.Schema{"const": m.owner}
				required = append(required, "source")
			}
			perMember = append(perMember, promcp.Schema{
				"if":   promcp.Schema{"properties": cond, "required": required},
				"then": promcp.Schema{"properties": promcp.Schema{"value": promcp.Schema{"minimum": r.Min, "maximum": r.Max}}},
			})
		} else {
			ranges = append(ranges, fmt.Sprintf("%s: %s", where, m.tool))
		}
	}
	template := *first
	template.Name, template.Zone = strings.TrimPrefix(f.tool, f.kind+"_"), strings.Join(zones, ", ")
	template.Range = nil
	if !math.IsInf(lo, 0) {
		template.Range = &manifest.Range{Min: lo, Max: hi}
	}
	var def *mcp.Tool
	if f.kind == manifest.KindRead {
		def = readTool(&template)
		def.Title = "Observe " + strings.ReplaceAll(template.Name, "_", " ") + " (family)"
	} else {
		def = doTool(&template)
		def.Title = "Actuate " + strings.ReplaceAll(template.Name, "_", " ") + " (family)"
	}
	def.Description = fmt.Sprintf("Family %s: one tool for %d capabilities; zone picks one (%s). Each call runs as that capability's own tool, with its own range and policy: %s. ",
		template.Name, len(f.members), strings.Join(zones, ", "), strings.Join(ranges, "; ")) + def.Description
	var schema map[string]any
	raw, _ := def.InputSchema.(json.RawMessage) // readTool and doTool build raw schemas
	if json.Unmarshal(raw, &schema) != nil {
		return def
	}
	props, _ := schema["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
		schema["properties"] = props
	}
	zoneEnum := make([]any, len(zones))
	for i, z := range zones {
		zoneEnum[i] = z
	}
	props["zone"] = map[string]any{"type": "string", "enum": zoneEnum, "description": "The zone whose " + template.Name + " to use."}
	req, _ := schema["required"].([]any)
	req = append(req, "zone")
	if fleet {
		setOwnerEnums(props, owners)
		req = append(req, "site")
		if multiOwnerZone {
			req = append(req, "source")
		}
	} else if mesh {
		ownerEnum := make([]any, len(owners))
		for i, o := range owners {
			ownerEnum[i] = o
		}
		desc := "Device id of the gateway that owns the capability; needed where a zone has this family on several gateways."
		props["source"] = map[string]any{"type": "string", "enum": ownerEnum, "description": desc}
		if multiOwnerZone {
			req = append(req, "source")
		}
	}
	schema["required"] = req
	if len(perMember) > 0 && f.kind == manifest.KindDo {
		schema["allOf"] = perMember
	}
	b, _ := json.Marshal(schema)
	def.InputSchema = json.RawMessage(b)
	return def
}

// handleFamily serves a family tool: the zone (and source) pick the
// member the caller's view may see; the call then runs as that member's
// own tool, here or on its owner.
func (s *Server) handleFamily(tool string) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		f := s.families()[tool]
		if f == nil {
			return toolError(fmt.Errorf("%s is no longer served (the site's capabilities changed): list the tools again", tool)), nil
		}
		var args map[string]json.RawMessage
		if err := json.Unmarshal(req.Params.Arguments, &args); err != nil || args == nil {
			return toolError(&node.InputError{Field: "arguments", Msg: "expected an object with zone"}), nil
		}
		var zone, source, site string
		if raw, ok := args["zone"]; !ok || json.Unmarshal(raw, &zone) != nil || zone == "" {
			return toolError(&node.InputError{Field: "zone", Msg: "required: the zone whose " + manifest.CapabilityName(tool) + " to use"}), nil
		}
		if raw, ok := args["source"]; ok && json.Unmarshal(raw, &source) != nil {
			return toolError(&node.InputError{Field: "source", Msg: "must be a device id"}), nil
		}
		if raw, ok := args["site"]; ok && (!s.opts.Fleet || json.Unmarshal(raw, &site) != nil) {
			return toolError(&node.InputError{Field: "site", Msg: "must be one of the tool's sites (the fleet endpoint's tools only)"}), nil
		}
		if s.opts.Fleet && site == "" {
			var owners []string
			for _, m := range f.members {
				owners = append(owners, m.owner)
			}
			return toolError(&node.InputError{Field: "site", Msg: "required: the site whose " + manifest.CapabilityName(tool) + " to use, one of " + strings.Join(sitesOf(owners), ", ")}), nil
		}
		sc := s.scopeOf(req.Extra)
		var picks []member
		var zones []string
		for _, m := range f.members {
			if sc.view != nil && !sc.view.Match(m.subject) {
				continue
			}
			if !slices.Contains(zones, m.zone) {
				zones = append(zones, m.zone)
			}
			if m.zone == zone && m.site == site && (source == "" || m.device == source) {
				picks = append(picks, m)
			}
		}
		switch {
		case len(picks) == 0 && source != "":
			return toolError(&node.InputError{Field: "source", Msg: fmt.Sprintf("%q has no %s in zone %q here; zones: %s", truncateArg(source), manifest.CapabilityName(tool), zone, strings.Join(zones, ", "))}), nil
		case len(picks) == 0 && site != "":
			return toolError(&node.InputError{Field: "site", Msg: fmt.Sprintf("site %q has no %s in zone %q here; zones: %s", truncateArg(site), manifest.CapabilityName(tool), zone, strings.Join(zones, ", "))}), nil
		case len(picks) == 0:
			return toolError(&node.InputError{Field: "zone", Msg: fmt.Sprintf("no %s in zone %q here; zones: %s", manifest.CapabilityName(tool), zone, strings.Join(zones, ", "))}), nil
		case len(picks) > 1:
			var on []string
			for _, m := range picks {
				on = append(on, m.device)
			}
			return toolError(&node.InputError{Field: "source", Msg: fmt.Sprintf("zone %q has a %s on %s: name one as source", zone, manifest.CapabilityName(tool), strings.Join(on, ", "))}), nil
		}
		m := picks[0]
		delete(args, "zone")
		switch {
		case m.local:
			delete(args, "source")
		case s.opts.Fleet:
			args["site"], _ = json.Marshal(m.site)
			args["source"], _ = json.Marshal(m.device)
		default:
			args["source"], _ = json.Marshal(m.owner)
		}
		b, _ := json.Marshal(args)
		params := *req.Params
		params.Name, params.Arguments = m.tool, b
		inner := &mcp.CallToolRequest{Session: req.Session, Params: &params, Extra: req.Extra}
		if m.local {
			h := s.ts.handleRead(m.tool)
			if f.kind == manifest.KindDo {
				h = s.ts.handleDo(m.tool)
			}
			return h(ctx, inner)
		}
		if s.ts.routing == nil {
			return toolError(fmt.Errorf("%s on %s: this gateway has no mesh", m.tool, m.owner)), nil
		}
		return s.ts.routing.route(ctx, inner, f.kind, m.tool, m.owner)
	}
}
