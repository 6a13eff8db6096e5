package manifest

import (
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"
)

// Families: capabilities of one type (heaters in several zones) may name a
// family. An endpoint that serves families lists one tool per family and
// kind (do_heater, read_temperature) with a zone argument (and source in a
// mesh) instead of one tool per capability, so a site's tool count is its
// number of capability types. Each call still goes to one capability, with
// its own range, policy and gate.
//
// Within one manifest the members of a family must be served by one typed
// tool: the same kind, data_type, unit and enum_values, and one member per
// zone (the zone argument picks it). A family name must not be the name of
// another capability of the same kind (the tool names would collide).
func (p *parser) families(list *yaml.Node, m *Manifest) {
	first := map[string]*Capability{} // kind/family -> first member
	zones := map[string]*Capability{} // kind/family/zone -> member
	names := map[string]bool{}        // kind/name of every capability
	for _, c := range m.Capabilities {
		names[c.Kind+"/"+c.Name] = true
	}
	for _, c := range m.Capabilities {
		if c.Family == "" || !c.Exposed() {
			continue // an unexposed capability with a family is reported by expose
		}
		// The capability's own node (entries that failed to parse have no
		// Capability, so indexes of the two lists may differ).
		i := slices.IndexFunc(list.Content, func(e *yaml.Node) bool { return p.pos(e) == c.Pos })
		if i < 0 {
			continue
		}
		at := list.Content[i]
		if v := valueOf(at, "family"); v != nil {
			at = v
		}
		field := index("capabilities", i) + ".family"
		key := c.Kind + "/" + c.Family
		if names[key] {
			p.add(at, field, fmt.Sprintf("rename the family (e.g. %s_family) or the capability %s", c.Family, c.Family),
				"family %q is also the name of a %s capability: both would be the tool %s_%s", c.Family, c.Kind, c.Kind, c.Family)
			continue
		}
		f, seen := first[key]
		if !seen {
			first[key] = c
		} else if f.DataType != c.DataType || f.Unit != c.Unit || !slices.Equal(f.EnumValues, c.EnumValues) {
			p.add(at, field, fmt.Sprintf("give it the data_type, unit and enum_values of %s, or another family", f.Name),
				"%s differs from %s (family %s) in data_type, unit or enum_values: one tool cannot type both", c.Name, f.Name, c.Family)
			continue
		}
		zk := key + "/" + c.Zone
		if z, dup := zones[zk]; dup {
			p.add(at, field, fmt.Sprintf("give one of them another family, or another zone: the zone argument must pick one %s", c.Family),
				"%s and %s are both family %s in zone %s", z.Name, c.Name, c.Family, c.Zone)
			continue
		}
		zones[zk] = c
	}
}

// valueOf returns the value node of key in the mapping n, or nil.
func valueOf(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// ToolCount is how many tools of this manifest an endpoint lists (besides
// can_do) to a caller whose role may run every do_: the exposed
// capabilities v selects (every one for nil), a family with two or more of
// them counted once where the endpoint serves families. Other gateways'
// tools in the view come on top in a mesh.
func (m *Manifest) ToolCount(v *View, families bool) int {
	n := 0
	byFamily := map[string]int{} // kind_family -> members selected
	for _, c := range m.Capabilities {
		if !c.Exposed() || v != nil && !v.Match(m.Subject(c)) {
			continue
		}
		n++
		if c.Family != "" {
			byFamily[c.Kind+"_"+c.Family]++
		}
	}
	if families {
		for _, k := range byFamily {
			if k >= 2 {
				n -= k - 1
			}
		}
	}
	return n
}
