package manifest

import (
	"github.com/google/jsonschema-go/jsonschema"
)

// Exposure: a capability with expose: false is bound, polled and observed
// (history, alarms, MQTT, the fleet uplink, interlocks, its safe state)
// like any other, but it is no tool: it is not listed, a call of its tool
// is refused, can_do never offers it and the mesh catalog does not route
// it. Its observations stay plant data, served by the observation, history
// and alarm resources within views. A site of 10 000 points would
// otherwise be 10 000 tools, far past what MCP clients accept (≈ 40).
//
// defaults: {expose: false} flips the default for the whole manifest, so a
// large skeleton lists the few tools it means to offer (expose: true)
// rather than writing expose: false on every point. The default is a
// manifest key, not a bus key: what an agent is offered is not a property
// of the wiring (a meter's bus carries the one point to offer and the
// hundred not to), a bus's keys other than type belong to its driver, and
// moving a point to another bus must not change whether it is a tool.

// Defaults is the defaults: block: values a capability takes when it does
// not set the key itself.
type Defaults struct {
	// Expose is capabilities[].expose's default (true when absent).
	Expose bool `json:"expose"`
}

// defaultsKeys are the keys of defaults:.
var defaultsKeys = []string{"expose"}

// defaults reads the defaults: block (absent: every capability exposed).
func (p *parser) defaults(o *obj) Defaults {
	d := Defaults{Expose: true}
	if v, ok := o.boolean("expose"); ok {
		d.Expose = v
	}
	return d
}

// expose reads capabilities[].expose (default: defaults.expose). An
// unexposed capability is in no family tool, so family: on one is refused
// rather than ignored.
func (p *parser) expose(o *obj, c *Capability, m *Manifest) {
	expose := m.Defaults.Expose
	if v, ok := o.boolean("expose"); ok {
		expose = v
	}
	c.Expose = &expose
	if !expose && c.Family != "" {
		at, why := o.key("family"), "expose: false"
		if o.get("expose") == nil {
			why = "defaults: {expose: false}"
		}
		p.add(at, o.field("family"), "remove family, or add expose: true to make it a tool",
			"family %q on a capability that is not exposed (%s): a family is a tool, and this capability is no tool", c.Family, why)
	}
}

// Exposed reports whether the capability is a tool. The parser always sets
// Expose; a Capability built without it (a test's, or one describing
// another gateway's tool from the mesh catalog) is exposed.
func (c *Capability) Exposed() bool { return c.Expose == nil || *c.Expose }

// ExposedCapabilities lists the capabilities of m that are tools.
func (m *Manifest) ExposedCapabilities() []*Capability {
	out := make([]*Capability, 0, len(m.Capabilities))
	for _, c := range m.Capabilities {
		if c.Exposed() {
			out = append(out, c)
		}
	}
	return out
}

func exposeSchema() props {
	return props{
		"expose": boolean("physd: false keeps the capability off the tool surface (not listed, not callable, not offered by can_do, not routed): it is still polled and observed (resources, history, alarms, MQTT, interlocks). Default: defaults.expose, else true."),
	}
}

func defaultsSchema() *jsonschema.Schema {
	return object("defaults", defaultsKeys, nil, props{
		"expose": boolean("physd: the default of capabilities[].expose (default true); false lists only the capabilities that say expose: true."),
	})
}
