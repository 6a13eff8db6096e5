package manifest

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// Version is the only physmcp_version this parser accepts.
const Version = "0.1"

// Defaults applied to absent keys.
const (
	DefaultMaxPeers            = 10
	DefaultHeartbeatIntervalMS = 1000
	DefaultQuorumSize          = 3
	DefaultTimeoutMS           = 5000
	MaxTimeoutMS               = 600_000
	DefaultCacheTTLMS          = 1000
	DefaultRetentionDays       = 7
	DefaultTolerance           = 1e-9
	MaxNameLen                 = 60
)

// Enumerations accepted by the parser.
var (
	Kinds          = []string{KindRead, KindDo}
	ReadDataTypes  = []string{TypeFloat, TypeInt, TypeBool, TypeString, TypeEnum}
	DoDataTypes    = []string{TypeFloat, TypeInt, TypeBool, TypeEnum}
	BindingTypes   = []string{"i2c", "spi", "gpio", "adc", "pwm", "uart", "modbus", "opcua", "bacnet", "mqtt", "virtual", "sim", "onewire"}
	ProtocolTypes  = []string{"ip", "serial", "lora", "ble"}
	ProtocolRoles  = []string{"native", "proxy", "lite"}
	RemoteSinkKind = []string{"mqtt", "http", "syslog"}
)

// Keys accepted in each block, in the order they are listed in fixes.
var (
	topKeys        = []string{"physmcp_version", "device", "network", "buses", "defaults", "capabilities", "audit", "views"}
	deviceKeys     = []string{"id", "type", "vendor", "model", "firmware_version", "hardware_revision", "location", "certification"}
	locationKeys   = []string{"zone", "area", "description", "coordinates"}
	coordKeys      = []string{"x", "y", "z"}
	certKeys       = []string{"physmcp_certified", "cert_id", "cert_expiry"}
	networkKeys    = []string{"protocols", "mesh", "fleet"}
	protocolKeys   = []string{"type", "address", "mcp_port", "role"}
	busKeys        = []string{"type"}
	bindingKeys    = []string{"type", "address", "bus"}
	rangeKeys      = []string{"min", "max"}
	adoptedKeys    = []string{"source_address", "source_protocol"}
	auditKeys      = []string{"enabled", "retention_days", "remote_sink"}
	remoteSinkKeys = []string{"type", "address"}
	capKeys        = []string{
		"name", "kind", "description", "binding", "data_type", "unit", "range",
		"enum_values", "precision", "sample_rate_hz", "semantic_tags", "side_effects",
		"rate_limit", "requires_permission", "requires_quorum", "quorum_size",
		"cooldown_ms", "timeout_ms", "cacheable", "cache_ttl_ms", "zone",
		"compensable", "settle_ms", "tolerance", "adopted_from", "family",
		"poll_ms", "deadband", "alarms", "safe", "lease", "expose",
	}
)

var (
	reID      = regexp.MustCompile(`^[a-z0-9_]+$`)
	reCapName = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	reRate    = regexp.MustCompile(`^\s*(\d+)\s*/\s*([a-z]+)\s*$`)
)

var rateUnits = map[string]time.Duration{
	"sec": time.Second, "second": time.Second, "s": time.Second,
	"min": time.Minute, "minute": time.Minute, "m": time.Minute,
	"hour": time.Hour, "h": time.Hour,
	"day": 24 * time.Hour, "d": 24 * time.Hour,
}

// Load reads and parses a manifest file. I/O failures are returned as the
// os error; problems in the content as Errors.
func Load(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses and validates a manifest. file names the source in error
// positions. On any problem it returns a nil Manifest and an Errors holding
// every problem found, sorted by position.
func Parse(file string, data []byte) (*Manifest, error) {
	p := &parser{Problems: strictyaml.Problems{File: file}}
	root := strictyaml.Document(&p.Problems, data)
	var m *Manifest
	if root != nil {
		m = p.manifest(root)
	}
	if len(p.Errs) > 0 {
		return nil, p.Errs.Sorted()
	}
	if m == nil { // cannot happen: no manifest without an error
		return nil, Errors{{Pos: Pos{File: file}, Msg: "the manifest could not be read"}}
	}
	m.compact()
	m.index()
	return m, nil
}

func (p *parser) manifest(root *yaml.Node) *Manifest {
	top := p.object(root, "", topKeys, false)
	if top == nil {
		return nil
	}
	m := &Manifest{Path: p.File}
	p.version(top, m)
	m.Device = p.device(top.sub("device", deviceKeys, true))
	m.Network = p.network(top.sub("network", networkKeys, true), m.Device.ID)
	m.Buses = p.buses(top.get("buses"))
	m.Defaults = p.defaults(top.sub("defaults", defaultsKeys, false))
	p.capabilities(top.need("capabilities", ""), m)
	m.Audit = p.audit(top.sub("audit", auditKeys, false))
	m.Views = p.views(top.get("views"))
	return m
}

func (p *parser) version(top *obj, m *Manifest) {
	fix := `quote the version: physmcp_version: "0.1"`
	n := top.need("physmcp_version", "add physmcp_version: \"0.1\" at the top of the file")
	if n == nil {
		return
	}
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!float" || n.ShortTag() == "!!int") {
		p.add(n, "physmcp_version", fix, "the version must be a string, got %s", describe(n))
		return
	}
	s, ok := p.Text(n, "physmcp_version")
	if !ok {
		return
	}
	if s != Version {
		p.add(n, "physmcp_version", `set physmcp_version: "0.1" (physd implements PhysMCP v0.1 only)`, "unsupported version %s", quoteShort(s))
		return
	}
	m.PhysMCPVersion = s
}

func (p *parser) device(o *obj) Device {
	var d Device
	d.ID, _ = o.pattern("id", true, reID.MatchString, "lowercase letters, digits and _", "node_temp_zone3_001")
	d.Type, _ = o.str("type", true)
	d.Vendor, _ = o.str("vendor", false)
	d.Model, _ = o.str("model", false)
	d.FirmwareVersion, _ = o.str("firmware_version", false)
	d.HardwareRevision, _ = o.str("hardware_revision", false)
	if loc := o.sub("location", locationKeys, true); loc != nil {
		d.Location.Zone, _ = loc.str("zone", true)
		d.Location.Area, _ = loc.str("area", false)
		d.Location.Description, _ = loc.str("description", false)
		if c := loc.sub("coordinates", coordKeys, false); c != nil {
			co := &Coordinates{}
			if c.need("x", "") != nil {
				co.X, _ = p.FiniteFloat(c.get("x"), c.field("x"))
			}
			if c.need("y", "") != nil {
				co.Y, _ = p.FiniteFloat(c.get("y"), c.field("y"))
			}
			if c.get("z") != nil {
				co.Z, _ = p.FiniteFloat(c.get("z"), c.field("z"))
			}
			d.Location.Coordinates = co
		}
	}
	if c := o.sub("certification", certKeys, false); c != nil {
		cert := &Certification{}
		cert.PhysMCPCertified, _ = c.boolean("physmcp_certified")
		cert.CertID, _ = c.str("cert_id", false)
		if s, ok := c.str("cert_expiry", false); ok {
			if !isISODate(s) {
				p.add(c.get("cert_expiry"), c.field("cert_expiry"), "write an ISO date, e.g. 2027-01-31", "invalid date %s", quoteShort(s))
			}
			cert.CertExpiry = s
		}
		d.Certification = cert
	}
	return d
}

func isISODate(s string) bool {
	for _, layout := range []string{"2006-01-02", time.RFC3339, time.RFC3339Nano} {
		if _, err := time.Parse(layout, s); err == nil {
			return true
		}
	}
	return false
}

func (p *parser) network(o *obj, deviceID string) Network {
	var nw Network
	if n := o.need("protocols", ""); n != nil {
		f := o.field("protocols")
		switch {
		case n.Kind != yaml.SequenceNode:
			p.add(n, f, fixList, "expected a list of protocols, got %s", describe(n))
		case len(n.Content) == 0:
			p.add(n, f, "add at least one protocol, e.g. - {type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}", "protocols must not be empty")
		}
		if n.Kind == yaml.SequenceNode {
			for i, e := range n.Content {
				po := p.object(e, index(f, i), protocolKeys, false)
				if po == nil {
					continue
				}
				var pr Protocol
				pr.Type, _ = po.enum("type", true, ProtocolTypes)
				pr.Address, _ = po.str("address", false)
				pr.MCPPort, _ = po.intIn("mcp_port", 1, 65535)
				if po.get("mcp_port") != nil && pr.Type != "" && pr.Type != "ip" {
					p.add(po.key("mcp_port"), po.field("mcp_port"), "remove mcp_port, or set type: ip", "mcp_port applies only to type ip")
				}
				pr.Role, _ = po.enum("role", false, ProtocolRoles)
				nw.Protocols = append(nw.Protocols, pr)
			}
		}
	}
	nw.Mesh = p.mesh(o.sub("mesh", meshKeys, true), deviceID)
	nw.Fleet = p.fleet(o.sub("fleet", fleetKeys, false))
	return nw
}

func (p *parser) nonEmpty(n *yaml.Node, field, s string) bool {
	if strings.TrimSpace(s) == "" {
		p.add(n, field, "remove the empty entry or give it a value", "empty entry")
		return false
	}
	return true
}

func (p *parser) buses(n *yaml.Node) map[string]*Bus {
	if n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.add(n, "buses", "write one entry per bus: buses: {plant: {type: sim}}", "expected a mapping of bus names, got %s", describe(n))
		return nil
	}
	out := map[string]*Bus{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || isNull(k) || strings.TrimSpace(k.Value) == "" {
			p.add(k, "buses", "name the bus with a plain word, e.g. plant", "a bus name must be a non-empty string, got %s", describe(k))
			continue
		}
		field := join("buses", k.Value)
		b := &Bus{Name: k.Value, Pos: p.pos(k), Field: field}
		o := p.object(v, field, busKeys, true)
		if o == nil {
			continue
		}
		b.Type, _ = o.pattern("type", true, reID.MatchString, "a driver type in lowercase letters, digits and _", "sim, i2c, modbus_tcp")
		b.TypePos = b.Pos
		if tn := o.get("type"); tn != nil {
			b.TypePos = p.pos(tn)
		}
		b.Config = rest(v, o.extra)
		out[b.Name] = b
	}
	return out
}

// rest builds a mapping node at n's position from the given key/value pairs.
func rest(n *yaml.Node, pairs []*yaml.Node) *yaml.Node {
	return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: n.Line, Column: n.Column, Content: pairs}
}

func (p *parser) capabilities(n *yaml.Node, m *Manifest) {
	if n == nil {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.add(n, "capabilities", fixList+" of capabilities", "expected a list of capabilities, got %s", describe(n))
		return
	}
	if len(n.Content) == 0 {
		p.add(n, "capabilities", "add at least one capability (- name: ..., kind: read, ...)", "capabilities must not be empty")
		return
	}
	first := map[string]*yaml.Node{}
	for i, e := range n.Content {
		if c := p.capability(e, index("capabilities", i), m, first); c != nil {
			m.Capabilities = append(m.Capabilities, c)
		}
	}
	p.families(n, m)
}

func (p *parser) capability(n *yaml.Node, path string, m *Manifest, first map[string]*yaml.Node) *Capability {
	o := p.object(n, path, capKeys, false)
	if o == nil {
		return nil
	}
	c := &Capability{Pos: p.pos(n)}
	p.capName(o, c, first)
	c.Kind, _ = o.enum("kind", true, Kinds)
	isDo, isRead := c.Kind == KindDo, c.Kind == KindRead
	c.Description, _ = o.str("description", true)

	// Binding.
	if bn := o.need("binding", "add binding: {type: ..., address: ...} (or bus: and driver keys)"); bn != nil {
		c.Binding = p.binding(bn, o.field("binding"), m.Buses)
	}

	p.capValueShape(o, c, isDo)
	p.capTags(o, c)
	p.capGuards(o, c, isRead)
	p.capExtensions(o, c, m, isDo, isRead)
	p.expose(o, c, m)
	p.observe(o, c)
	p.failSafe(o, c, isDo)
	return c
}

// capName checks the capability's name: its form, length and uniqueness
// (first holds the names seen so far).
func (p *parser) capName(o *obj, c *Capability, first map[string]*yaml.Node) {
	if name, ok := o.str("name", true); ok {
		vn := o.get("name")
		switch {
		case !reCapName.MatchString(name):
			p.add(vn, o.field("name"), "start with a lowercase letter and use only a-z, 0-9 and _, e.g. temperature_zone_a", "invalid name %s", quoteShort(name))
		case len(name) > MaxNameLen:
			p.add(vn, o.field("name"), fmt.Sprintf("shorten it to at most %d characters", MaxNameLen), "name is %d characters long", len(name))
		}
		if f, dup := first[name]; dup {
			p.add(vn, o.field("name"), "give each capability its own name", "duplicate capability name %q (first defined at %d:%d)", name, f.Line, f.Column)
		} else {
			first[name] = vn
		}
		c.Name = name
	}
}

// capValueShape reads the data type and what constrains the value: range,
// enum_values, precision.
func (p *parser) capValueShape(o *obj, c *Capability, isDo bool) {
	types := ReadDataTypes
	if isDo {
		types = DoDataTypes
	}
	dtOK := false
	if dt, ok := o.str("data_type", true); ok {
		if !contains(types, dt) {
			fix := oneOf(dt, types)
			if isDo && dt == TypeString {
				fix = "a do capability cannot take free text; " + oneOf(dt, types)
			}
			p.add(o.get("data_type"), o.field("data_type"), fix, "invalid data_type %s", quoteShort(dt))
		} else {
			c.DataType, dtOK = dt, true
		}
	}
	numeric := c.DataType == TypeFloat || c.DataType == TypeInt
	c.Unit, _ = o.str("unit", false)
	if rn := o.get("range"); rn != nil {
		c.Range = p.valueRange(rn, o.field("range"))
		if dtOK && !numeric {
			p.add(o.key("range"), o.field("range"), "remove range, or use data_type float or int", "range applies only to data_type float or int, not %s", c.DataType)
		}
		if c.Range != nil && c.DataType == TypeInt && (c.Range.Min != math.Trunc(c.Range.Min) || c.Range.Max != math.Trunc(c.Range.Max)) {
			p.add(rn, o.field("range"), "use whole numbers for an int range", "range of an int capability is not whole numbers")
		}
	}
	if en := o.get("enum_values"); en != nil {
		seen := map[string]bool{}
		vals, _ := o.strList("enum_values", false, func(e *yaml.Node, f, s string) bool {
			if !p.nonEmpty(e, f, s) {
				return false
			}
			if seen[s] {
				p.add(e, f, "list each value once", "duplicate enum value %s", quoteShort(s))
				return false
			}
			seen[s] = true
			return true
		})
		c.EnumValues = vals
		if dtOK && c.DataType != TypeEnum {
			p.add(o.key("enum_values"), o.field("enum_values"), "remove enum_values, or set data_type: enum", "enum_values is only allowed with data_type enum")
		} else if c.DataType == TypeEnum && en.Kind == yaml.SequenceNode && len(en.Content) == 0 {
			p.add(en, o.field("enum_values"), "list the accepted values, e.g. enum_values: [auto, low, high]", "enum_values must not be empty")
		}
	} else if c.DataType == TypeEnum {
		o.need("enum_values", "list the accepted values, e.g. enum_values: [auto, low, high]")
	}
	if v, ok := o.floatMin("precision", 0, true); ok {
		c.Precision = v
		if dtOK && !numeric {
			p.add(o.key("precision"), o.field("precision"), "remove precision, or use data_type float or int", "precision applies only to data_type float or int")
		}
	}
}

// capTags reads sample_rate_hz and semantic_tags.
func (p *parser) capTags(o *obj, c *Capability) {
	c.SampleRateHz, _ = o.floatMin("sample_rate_hz", 0, true)
	seenTag := map[string]bool{}
	c.SemanticTags, _ = o.strList("semantic_tags", true, func(e *yaml.Node, f, s string) bool {
		if !reID.MatchString(s) {
			fix := "use lowercase letters, digits and _, e.g. temperature"
			if low := strings.ToLower(s); reID.MatchString(low) {
				fix = fmt.Sprintf("write it in lowercase: %s", low)
			}
			p.add(e, f, fix, "invalid semantic tag %s", quoteShort(s))
			return false
		}
		if seenTag[s] {
			p.add(e, f, "list each tag once", "duplicate semantic tag %q", s)
			return false
		}
		seenTag[s] = true
		return true
	})
	if tn := o.get("semantic_tags"); tn != nil && tn.Kind == yaml.SequenceNode && len(tn.Content) == 0 {
		p.add(tn, o.field("semantic_tags"), "add at least one tag, e.g. [temperature, air]", "semantic_tags must not be empty")
	}
}

// capGuards reads the actuation guards: side effects, rate limit,
// permission, quorum, cooldown, timeout and caching.
func (p *parser) capGuards(o *obj, c *Capability, isRead bool) {
	if o.get("side_effects") != nil {
		c.SideEffects, _ = o.strList("side_effects", false, p.nonEmpty)
		if isRead {
			p.add(o.key("side_effects"), o.field("side_effects"), "remove side_effects, or set kind: do", "side_effects is only allowed on kind do")
		}
	}
	if s, ok := o.str("rate_limit", false); ok {
		c.RateLimit = p.rateLimit(o.get("rate_limit"), o.field("rate_limit"), s)
	}
	c.RequiresPermission = "none"
	if s, ok := o.enum("requires_permission", false, Roles); ok {
		c.RequiresPermission = s
	}
	c.RequiresQuorum, _ = o.boolean("requires_quorum")
	if v, ok := o.intIn("quorum_size", 1, math.MaxInt32); ok {
		c.QuorumSize = v
	} else if c.RequiresQuorum && o.get("quorum_size") == nil {
		c.QuorumSize = DefaultQuorumSize
	}
	c.CooldownMS, _ = o.intIn("cooldown_ms", 0, math.MaxInt32)
	c.TimeoutMS = DefaultTimeoutMS
	if v, ok := o.intIn("timeout_ms", 1, MaxTimeoutMS); ok {
		c.TimeoutMS = v
	}
	c.Cacheable = isRead
	if v, ok := o.boolean("cacheable"); ok {
		c.Cacheable = v
	}
	c.CacheTTLMS = DefaultCacheTTLMS
	if v, ok := o.intIn("cache_ttl_ms", 0, math.MaxInt32); ok {
		c.CacheTTLMS = v
	}
}

// capExtensions reads the physd extensions: zone, family, compensation,
// settling, tolerance and adopted_from.
func (p *parser) capExtensions(o *obj, c *Capability, m *Manifest, isDo, isRead bool) {
	c.Zone = m.Device.Location.Zone
	if s, ok := o.str("zone", false); ok {
		if strings.TrimSpace(s) == "" {
			p.add(o.get("zone"), o.field("zone"), "remove zone to use device.location.zone, or name the zone", "zone must not be empty")
		}
		c.Zone = s
	}
	if s, ok := o.str("family", false); ok {
		if !reCapName.MatchString(s) {
			p.add(o.get("family"), o.field("family"), "name the family like a capability, e.g. heater", "invalid family %s", quoteShort(s))
		} else {
			c.Family = s
		}
	}
	c.Compensable = isDo
	if v, ok := o.boolean("compensable"); ok {
		c.Compensable = v
		if isRead && v {
			p.add(o.key("compensable"), o.field("compensable"), "remove compensable, or set kind: do", "compensable: true applies only to kind do")
		}
	}
	if v, ok := o.intIn("settle_ms", 0, math.MaxInt32); ok {
		c.SettleMS = v
	}
	if o.get("settle_ms") != nil && isRead {
		p.add(o.key("settle_ms"), o.field("settle_ms"), "remove settle_ms, or set kind: do", "settle_ms is only allowed on kind do")
	}
	c.Tolerance = DefaultTolerance
	if c.Precision > 0 {
		c.Tolerance = c.Precision
	}
	if v, ok := o.floatMin("tolerance", 0, false); ok {
		c.Tolerance = v
	}
	if a := o.sub("adopted_from", adoptedKeys, false); a != nil {
		af := &AdoptedFrom{}
		af.SourceAddress, _ = a.str("source_address", true)
		af.SourceProtocol, _ = a.str("source_protocol", false)
		c.AdoptedFrom = af
	}
}

func (p *parser) binding(n *yaml.Node, path string, buses map[string]*Bus) Binding {
	b := Binding{Pos: p.pos(n), Field: path}
	o := p.object(n, path, bindingKeys, true)
	if o == nil {
		return b
	}
	b.Type, _ = o.enum("type", true, BindingTypes)
	b.Address, _ = o.str("address", false)
	if s, ok := o.str("bus", false); ok {
		b.Bus = s
		if _, known := buses[s]; !known {
			fix := "declare it under buses: at the top level (no buses are declared)"
			if len(buses) > 0 {
				names := make([]string, 0, len(buses))
				for k := range buses {
					names = append(names, k)
				}
				sort.Strings(names)
				fix = oneOf(s, names) + ", or declare it under buses:"
			}
			p.add(o.get("bus"), o.field("bus"), fix, "unknown bus %s", quoteShort(s))
		}
	}
	b.Params = rest(n, o.extra)
	if strings.TrimSpace(b.Address) == "" && len(o.extra) == 0 {
		p.add(n, path, `add address: "<transport address>" (e.g. "0x48:reg=0x00") or the driver's own keys (e.g. point: zone_a.temperature)`,
			"binding has neither an address nor any driver keys")
	}
	return b
}

// valueRange reads {min: a, max: b} or the shorthand [a, b].
func (p *parser) valueRange(n *yaml.Node, path string) *Range {
	var minN, maxN *yaml.Node
	switch n.Kind {
	case yaml.MappingNode:
		o := p.object(n, path, rangeKeys, false)
		minN, maxN = o.need("min", "write range: {min: 0, max: 100}"), o.need("max", "write range: {min: 0, max: 100}")
		if minN == nil || maxN == nil {
			return nil
		}
	case yaml.SequenceNode:
		if len(n.Content) != 2 {
			p.add(n, path, "write range: [min, max] with exactly two numbers, or {min: 0, max: 100}", "range list has %d items, want 2", len(n.Content))
			return nil
		}
		minN, maxN = n.Content[0], n.Content[1]
	default:
		p.add(n, path, "write range: {min: 0, max: 100} or [0, 100]", "expected a range, got %s", describe(n))
		return nil
	}
	lo, ok1 := p.FiniteFloat(minN, join(path, "min"))
	hi, ok2 := p.FiniteFloat(maxN, join(path, "max"))
	if !ok1 || !ok2 {
		return nil
	}
	if lo > hi {
		p.add(n, path, "set min ≤ max", "min (%s) is greater than max (%s)", minN.Value, maxN.Value)
		return nil
	}
	return &Range{Min: lo, Max: hi}
}

// rateLimit parses "N/unit" at a node.
func (p *parser) rateLimit(n *yaml.Node, path, s string) *RateLimit {
	r, err := ParseRate(s, "rate_limit")
	if err != nil {
		var re *rateError
		if errors.As(err, &re) {
			p.add(n, path, re.fix, "%s", re.msg)
		}
		return nil
	}
	return r
}

type rateError struct{ msg, fix string }

func (e *rateError) Error() string { return e.msg + "; fix: " + e.fix }

// Problem splits the error into what is wrong and how to fix it, so a
// caller that positions it (the policy parser) does not print "fix:" twice.
func (e *rateError) Problem() (msg, fix string) { return e.msg, e.fix }

// ParseRate parses a PhysMCP rate string "N/unit" (unit sec, second, s,
// min, minute, m, hour, h, day, d), as used by rate_limit in the manifest
// and by rate rules in the policy; what names the field in messages.
func ParseRate(s, what string) (*RateLimit, error) {
	units := "sec, second, s, min, minute, m, hour, h, day, d"
	mm := reRate.FindStringSubmatch(s)
	if mm == nil {
		return nil, &rateError{fmt.Sprintf("invalid %s %s", what, quoteShort(s)), `write count/unit, e.g. "6/hour"; units: ` + units}
	}
	count, err := strconv.Atoi(mm[1])
	if err != nil || count < 1 || count > math.MaxInt32 {
		return nil, &rateError{fmt.Sprintf("%s count %s is out of range", what, quoteShort(mm[1])), `use a count of at least 1, e.g. "1/min"`}
	}
	per, ok := rateUnits[mm[2]]
	if !ok {
		return nil, &rateError{fmt.Sprintf("invalid %s unit %s", what, quoteShort(mm[2])), oneOf(mm[2], strings.Split(units, ", "))}
	}
	return &RateLimit{Count: count, Per: per, Source: s}, nil
}

func (p *parser) audit(o *obj) Audit {
	a := Audit{Enabled: true, RetentionDays: DefaultRetentionDays}
	if v, ok := o.boolean("enabled"); ok {
		a.Enabled = v
	}
	if v, ok := o.intIn("retention_days", 1, 36500); ok {
		a.RetentionDays = v
	}
	if r := o.sub("remote_sink", remoteSinkKeys, false); r != nil {
		rs := &RemoteSink{}
		rs.Type, _ = r.enum("type", true, RemoteSinkKind)
		rs.Address, _ = r.str("address", true)
		a.RemoteSink = rs
	}
	return a
}
