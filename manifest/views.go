package manifest

import (
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"
	"gopkg.in/yaml.v3"
)

// View is a named subset of the site's capabilities (physd extension,
// `views:` at the top level): an agent connected to /mcp/<name> (or to
// stdio with --view <name>) sees only the capabilities the view selects,
// in tools/list, can_do and routed calls. Every selector that is given
// must match (zones AND kinds …); inside one selector any entry may match.
// A view narrows what an agent sees; what it may do is still the policy's
// (roles, guards, approval).
type View struct {
	Name        string   `json:"name"`
	Description string   `json:"description,omitempty"`
	Kinds       []string `json:"kinds,omitempty"`        // read | do
	Zones       []string `json:"zones,omitempty"`        // capability zone
	Areas       []string `json:"areas,omitempty"`        // device.location.area of the owner
	Tags        []string `json:"tags,omitempty"`         // any of the capability's semantic_tags
	Devices     []string `json:"devices,omitempty"`      // owner device ids
	Capability  []string `json:"capabilities,omitempty"` // capability names (without read_/do_)
	// Sites selects the owners' fleet sites (network.fleet.site). Only the
	// fleet endpoint (physd fleet) sets it, from its own configuration: a
	// gateway's manifest has no sites: selector, and its owners have no site.
	Sites []string `json:"sites,omitempty"`
	// Families, when set, decides whether the view's endpoint lists a
	// family tool per capability family (families.go) or every instance;
	// unset, the endpoint follows physd run --families.
	Families *bool `json:"families,omitempty"`
	Pos      Pos   `json:"-"`
}

// ViewSubject is what a view is matched against: one capability of one
// owner, local or learnt from the mesh catalog.
type ViewSubject struct {
	Device, Area, Name, Kind, Zone string
	Tags                           []string
	// Site is the owner's fleet site (empty in a gateway's site mesh).
	Site string
}

// Match reports whether the view selects s.
func (v *View) Match(s ViewSubject) bool {
	in := func(list []string, x string) bool { return len(list) == 0 || slices.Contains(list, x) }
	if !in(v.Kinds, s.Kind) || !in(v.Zones, s.Zone) || !in(v.Areas, s.Area) || !in(v.Devices, s.Device) || !in(v.Capability, s.Name) || !in(v.Sites, s.Site) {
		return false
	}
	if len(v.Tags) == 0 {
		return true
	}
	for _, t := range s.Tags {
		if slices.Contains(v.Tags, t) {
			return true
		}
	}
	return false
}

// View returns the named view, or nil.
func (m *Manifest) View(name string) *View {
	for _, v := range m.Views {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// ViewNames lists the declared views in file order.
func (m *Manifest) ViewNames() []string {
	out := make([]string, len(m.Views))
	for i, v := range m.Views {
		out[i] = v.Name
	}
	return out
}

// Subject is the view subject of one of this manifest's capabilities.
func (m *Manifest) Subject(c *Capability) ViewSubject {
	return ViewSubject{Device: m.Device.ID, Area: m.Device.Location.Area, Name: c.Name, Kind: c.Kind, Zone: c.Zone, Tags: c.SemanticTags}
}

var viewKeys = []string{"description", "kinds", "zones", "areas", "tags", "devices", "capabilities", "families"}

// views reads views: {name: {selectors}}. Names become URL path segments
// (/mcp/<name>), so they are plain lowercase words. Zones, devices and
// capabilities may name other gateways' (a view is a site-wide cut), so a
// name this manifest does not know is not an error; `physd lint` reports
// a view that selects nothing here.
func (p *parser) views(n *yaml.Node) []*View {
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.add(n, "views", "write one entry per view: views: {observe: {kinds: [read]}}", "expected a mapping of view names, got %s", describe(n))
		return nil
	}
	var out []*View
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || !reCapName.MatchString(k.Value) || strings.Contains(k.Value, "__") {
			p.add(k, "views", "name the view with lowercase letters, digits and _, starting with a letter, e.g. observe or zone_a", "invalid view name %s", quoteShort(k.Value))
			continue
		}
		field := join("views", k.Value)
		o := p.object(v, field, viewKeys, false)
		if o == nil {
			continue
		}
		view := &View{Name: k.Value, Pos: p.pos(k)}
		view.Description, _ = o.str("description", false)
		nonEmpty := func(e *yaml.Node, f, s string) bool { return p.nonEmpty(e, f, s) }
		view.Kinds, _ = o.strList("kinds", false, func(e *yaml.Node, f, s string) bool {
			if !slices.Contains(Kinds, s) {
				p.add(e, f, oneOf(s, Kinds), "unknown kind %s", quoteShort(s))
				return false
			}
			return true
		})
		view.Zones, _ = o.strList("zones", false, nonEmpty)
		view.Areas, _ = o.strList("areas", false, nonEmpty)
		view.Tags, _ = o.strList("tags", false, nonEmpty)
		view.Devices, _ = o.strList("devices", false, func(e *yaml.Node, f, s string) bool {
			if !reID.MatchString(s) {
				p.add(e, f, "write a device id: lowercase letters, digits and _", "invalid device id %s", quoteShort(s))
				return false
			}
			return true
		})
		view.Capability, _ = o.strList("capabilities", false, func(e *yaml.Node, f, s string) bool {
			if strings.HasPrefix(s, "read_") || strings.HasPrefix(s, "do_") {
				p.add(e, f, "write the capability name without read_ or do_ (kinds: selects the kind)", "%s is a tool name, not a capability name", quoteShort(s))
				return false
			}
			if !reCapName.MatchString(s) {
				p.add(e, f, "write a capability name: lowercase letters, digits and _", "invalid capability name %s", quoteShort(s))
				return false
			}
			return true
		})
		if b, ok := o.boolean("families"); ok {
			view.Families = &b
		}
		out = append(out, view)
	}
	return out
}

func viewsSchema() *jsonschema.Schema {
	names := func(desc string) *jsonschema.Schema {
		return uniqueList(&jsonschema.Schema{Type: "string", Pattern: `\S`}, desc)
	}
	view := object("views.<name>", viewKeys, nil, props{
		"description":  text("What the view is for (shown to the agent).", false),
		"kinds":        uniqueList(enum(Kinds, "read or do"), "Kinds of tools in the view (default both)."),
		"zones":        names("Capability zones in the view (any gateway's)."),
		"areas":        names("device.location.area of the owning gateways."),
		"tags":         names("Capabilities with any of these semantic_tags."),
		"devices":      names("Device ids of the owning gateways."),
		"capabilities": names("Capability names (without read_/do_)."),
		"families":     boolean("List one tool per capability family (zone argument) instead of every instance; default: physd run --families."),
	})
	return &jsonschema.Schema{Type: "object", Description: "physd extension: named subsets of the site's capabilities, each served at /mcp/<name> and over stdio with --view <name>. Every selector given must match.",
		PropertyNames: &jsonschema.Schema{Pattern: reCapName.String()}, AdditionalProperties: view}
}
