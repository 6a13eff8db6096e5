package manifest

import (
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// SchemaDraft is the JSON Schema dialect of the generated schemas: draft-07
// is what every YAML language server (VS Code's redhat.vscode-yaml,
// JetBrains, Helix) reads.
const SchemaDraft = "http://json-schema.org/draft-07/schema#"

// Schema returns the JSON Schema of physmcp.manifest.yml as Parse reads
// it, for editors (completion, hover, checks while typing). It is built
// from the parser's own model: the key list of every section (topKeys,
// deviceKeys, capKeys, meshKeys …), its enumerations (Kinds, Roles,
// BindingTypes …) and its rate units, so a key added to the parser and
// not described here makes Schema panic, and `go generate ./schemas`
// (whose test fails while the committed file differs) carries every
// change to the editors. busTypes are the driver types `physd validate`
// accepts for buses.<name>.type.
//
// The schema is a guide, not the judge: the parser still checks what a
// schema cannot say well (a bus named by a binding exists, seeds, a range
// of whole numbers for an int), and a driver checks its own bus and
// binding keys, which the schema leaves open.
func Schema(busTypes []string) *jsonschema.Schema {
	s := object("physmcp.manifest.yml", topKeys, []string{"physmcp_version", "device", "network", "capabilities"}, props{
		"physmcp_version": constant(Version, `PhysMCP version, quoted: "0.1"`),
		"device":          deviceSchema(),
		"network":         networkSchema(),
		"buses":           busesSchema(busTypes),
		"defaults":        defaultsSchema(),
		"capabilities":    listOf(capabilitySchema(), 1, "The device's capabilities; each becomes read_<name> or do_<name>."),
		"audit":           auditSchema(),
		"views":           viewsSchema(),
	})
	s.Schema = SchemaDraft
	s.Title = "PhysMCP device manifest (physd)"
	s.Description = "physmcp.manifest.yml: PhysMCP v0.1 §5.1 plus physd's extensions. Check a file with: physd validate FILE"
	return s
}

func deviceSchema() *jsonschema.Schema {
	return object("device", deviceKeys, []string{"id", "type", "location"}, props{
		"id":                pattern(reID.String(), "Device id, the proMCP source: lowercase letters, digits and _.", "gw_greenhouse_001"),
		"type":              text("Device type, e.g. greenhouse_controller.", true),
		"vendor":            text("Vendor.", false),
		"model":             text("Model.", false),
		"firmware_version":  text("Firmware version.", false),
		"hardware_revision": text("Hardware revision.", false),
		"location": object("device.location", locationKeys, []string{"zone"}, props{
			"zone":        text("Zone of the device; capabilities default to it.", true),
			"area":        text("Area.", false),
			"description": text("Free text.", false),
			"coordinates": object("device.location.coordinates", coordKeys, []string{"x", "y"}, props{
				"x": number("x.", nil, nil), "y": number("y.", nil, nil), "z": number("z.", nil, nil),
			}),
		}),
		"certification": object("device.certification", certKeys, nil, props{
			"physmcp_certified": boolean("Whether the device is PhysMCP certified."),
			"cert_id":           text("Certificate id.", false),
			"cert_expiry":       text("Certificate expiry, an ISO date such as 2027-01-31.", false),
		}),
	})
}

func networkSchema() *jsonschema.Schema {
	protocol := object("network.protocols[]", protocolKeys, []string{"type"}, props{
		"type":     enum(ProtocolTypes, "Transport."),
		"address":  text("Transport address.", false),
		"mcp_port": integer("MCP port (type ip only).", 1, 65535),
		"role":     enum(ProtocolRoles, "native, proxy or lite."),
	})
	return object("network", networkKeys, []string{"protocols", "mesh"}, props{
		"protocols": listOf(protocol, 1, "How the device is reached."),
		"mesh":      meshSchema(),
		"fleet":     fleetSchema(),
	})
}

func fleetSchema() *jsonschema.Schema {
	return object("network.fleet", fleetKeys, []string{"urls", "site"}, props{
		"enabled":          boolean("Publish to the fleet hub. Default true when this block is present."),
		"urls":             listOf(pattern(`^(nats|tls)://[^@/]+$`, "A NATS server: nats://host:4222 or tls://host:4222.", "nats://hub.example:4222"), 1, "The hub's NATS servers; tried in turn."),
		"site":             pattern(reSubjectToken.String(), "The site's name: the second token of every subject (physd.<site>.<device>....).", "greenhouse-north"),
		"credentials_file": text("A NATS .creds file (user JWT and NKey seed).", true),
		"nkey_seed_file":   text("A file holding the user's NKey seed (SU...).", true),
		"user":             text("User name; the password is read from password_file.", true),
		"password_file":    text("File holding the user's password (needs user).", true),
		"tls": object("network.fleet.tls", fleetTLSKeys, nil, props{
			"ca":   text("CA certificate (PEM) that issued the server's certificate.", true),
			"cert": text("Client certificate (PEM); with key.", true),
			"key":  text("Client private key (PEM); with cert.", true),
		}),
		"stream":             pattern(reStreamName.String(), "JetStream stream the audit records go to. Default "+DefaultFleetStream+".", DefaultFleetStream),
		"subject_prefix":     pattern(reSubjectPrefix.String(), "First token(s) of every subject. Default "+DefaultFleetSubjectPrefix+".", DefaultFleetSubjectPrefix),
		"connect_timeout_ms": integer(fmt.Sprintf("Deadline of one connection attempt. Default %d.", DefaultFleetConnectTimeoutMS), 100, 300_000),
		"publish_timeout_ms": integer(fmt.Sprintf("Deadline of one JetStream publish acknowledgement. Default %d.", DefaultFleetPublishTimeoutMS), 100, math.MaxInt32),
		"domain":             pattern(reSubjectToken.String(), "The hub's JetStream domain (its jetstream.domain); needed when the gateway connects to a leaf node that runs JetStream itself.", "hub"),
		"history":            boolean("Publish each closed history bucket to history_stream. Default true."),
		"history_stream":     pattern(reStreamName.String(), "JetStream stream the history buckets go to. Default "+DefaultFleetHistoryStream+".", DefaultFleetHistoryStream),
		"alarms":             boolean("Publish the active alarms (a snapshot per device) to alarm_stream. Default true."),
		"alarm_stream":       pattern(reStreamName.String(), "JetStream stream the active alarms go to. Default "+DefaultFleetAlarmStream+".", DefaultFleetAlarmStream),
		"serve":              uniqueList(enum(FleetServes, "read, can_do or do"), "What this gateway answers the fleet endpoint (physd fleet) over NATS. Default [read, can_do]: do only when listed; [] serves nothing."),
	})
}

func meshSchema() *jsonschema.Schema {
	return object("network.mesh", meshKeys, nil, props{
		"enabled":               boolean("Join the site mesh (memberlist). Default true."),
		"seed_peers":            listOf(text("[device_id/]host[:port]", true), 0, "Gateways to join at start; a list including this node is fine."),
		"max_peers":             integer(fmt.Sprintf("Fan-out cap for distributed can_do. Default %d.", DefaultMaxPeers), 1, math.MaxInt32),
		"heartbeat_interval_ms": integer(fmt.Sprintf("memberlist's probe interval. Default %d.", DefaultHeartbeatIntervalMS), 1, math.MaxInt32),
		"bind":                  text("IP address to listen on. Default "+DefaultMeshBind+"; 0.0.0.0 only with advertise; off loopback needs key_file or key_env.", false),
		"port":                  integer(fmt.Sprintf("Mesh port (TCP and UDP). Default %d.", DefaultMeshPort), 1, 65535),
		"advertise":             text("ip or ip:port peers dial.", false),
		"label":                 withLen(text("Site label; only nodes with the same label (and key) mesh. Default "+DefaultMeshLabel+".", true), MaxMeshLabelLen),
		"key_file":              text("File holding the AES-128/192/256 key (hex or base64).", true),
		"key_env":               pattern(reEnvName.String(), "Environment variable holding the AES key.", "PHYSD_MESH_KEY"),
		"expected_size":         integer("Expected number of gateways, self included (quorum majorities). Default 1 + the other seeds.", 1, math.MaxInt32),
		"request_timeout_ms":    integer(fmt.Sprintf("Budget of distributed can_do and quorum checks. Default %d.", DefaultMeshRequestTimeoutMS), 1, 60_000),
		"reconnect_interval_ms": integer(fmt.Sprintf("How often seeds are re-joined after a partition. Default %d.", DefaultMeshReconnectInterval), 100, 86_400_000),
		"mdns": object("network.mesh.mdns", mdnsKeys, nil, props{
			"enabled":            boolean("mDNS (_physmcp._tcp) on the interface below. Default true when this block is present; without the block mDNS is off."),
			"interface":          pattern(reIfName.String(), "The one interface to advertise and browse on. Default "+DefaultMDNSInterface+" (this host only).", "eth0", "wlan0"),
			"advertise":          boolean("Answer mDNS queries for this gateway. Default true."),
			"discover":           boolean("Browse for gateways and join their mesh when seed_peers is empty. Default true."),
			"browse_interval_ms": integer(fmt.Sprintf("How often discovery browses again. Default %d.", DefaultMDNSBrowseIntervalMS), MinMDNSBrowseIntervalMS, MaxMDNSBrowseIntervalMS),
		}),
	})
}

func busesSchema(busTypes []string) *jsonschema.Schema {
	bus := object("buses.<name>", busKeys, []string{"type"}, props{
		"type": pattern(reID.String(), "Driver of the bus: "+strings.Join(busTypes, ", ")+".", busTypes...),
	})
	bus.AdditionalProperties = nil // the driver's own keys; the driver checks them
	bus.Description = "A named bus; its other keys belong to the driver (see docs/manifest.md#hardware-bindings)."
	return &jsonschema.Schema{Type: "object", Description: "physd extension: named buses that capabilities refer to.", AdditionalProperties: bus}
}

func capabilitySchema() *jsonschema.Schema {
	binding := object("capabilities[].binding", bindingKeys, []string{"type"}, props{
		"type":    enum(BindingTypes, "Binding type; drivers exist for sim, i2c, gpio, modbus, opcua (OPC UA client), spi (MCP3008 ADC), pwm (kernel sysfs PWM) and onewire (1-Wire temperature sensors, physd extension)."),
		"address": text("PhysMCP address string, e.g. \"0x48:reg=0x00\".", false),
		"bus":     text("The entry of buses: this capability is wired to.", true),
	})
	binding.AdditionalProperties = nil // the driver's keys (point, register, unit …)
	rangeSchema := &jsonschema.Schema{Description: "Physical range: {min, max} or [min, max]; a hard limit for do_.", OneOf: []*jsonschema.Schema{
		object("capabilities[].range", rangeKeys, rangeKeys, props{"min": number("Minimum.", nil, nil), "max": number("Maximum.", nil, nil)}),
		{Type: "array", Items: number("", nil, nil), MinItems: ptr(2), MaxItems: ptr(2)},
	}}
	cp := props{
		"name":                withLen(pattern(reCapName.String(), "Capability name; the tool is read_<name> or do_<name>.", "temperature_zone_a"), MaxNameLen),
		"kind":                enum(Kinds, "read: an observation tool; do: an actuation tool."),
		"description":         text("What it is; becomes the tool description.", true),
		"binding":             binding,
		"data_type":           enum(ReadDataTypes, "Value type; a do capability takes "+strings.Join(DoDataTypes, ", ")+"."),
		"unit":                text("Unit, e.g. celsius, percent.", false),
		"range":               rangeSchema,
		"enum_values":         uniqueList(text("", true), "Values of an enum capability."),
		"precision":           positive("Read resolution (> 0); float and int only."),
		"sample_rate_hz":      positive("Sample rate (> 0)."),
		"semantic_tags":       withMin(uniqueList(pattern(reID.String(), "", "temperature"), "Tags can_do matches: lowercase letters, digits and _."), 1),
		"side_effects":        listOf(text("", true), 0, "What an actuation also changes (do only)."),
		"rate_limit":          pattern(RatePattern(), "N/unit, e.g. 30/hour; enforced with a policy.", "30/hour"),
		"requires_permission": enum(Roles, "Least role allowed (enforced with a policy)."),
		"requires_quorum":     boolean("Needs a quorum of gateways (enforced with a policy)."),
		"quorum_size":         integer(fmt.Sprintf("Gateways that must agree, self included. Default %d with requires_quorum.", DefaultQuorumSize), 1, math.MaxInt32),
		"cooldown_ms":         integer("Minimum time between actuations (enforced with a policy).", 0, math.MaxInt32),
		"timeout_ms":          integer(fmt.Sprintf("Bound on each device read and on a whole actuation. Default %d.", DefaultTimeoutMS), 1, MaxTimeoutMS),
		"cacheable":           boolean("Serve reads from the cache. Default true for read, false for do."),
		"cache_ttl_ms":        integer(fmt.Sprintf("Cache lifetime. Default %d.", DefaultCacheTTLMS), 0, math.MaxInt32),
		"zone":                text("physd: zone this capability acts on. Default device.location.zone.", true),
		"family":              pattern(reCapName.String(), "physd: the capability's family (type), e.g. heater: where an endpoint serves families, one tool do_heater with a zone argument serves every heater of the site.", "heater", "temperature"),
		"compensable":         boolean("physd: a do_ can be undone by writing the previous value. Default true for do."),
		"settle_ms":           integer("physd: wait between write and verifying read-back (do only).", 0, math.MaxInt32),
		"tolerance":           number("physd: |read-back − written| accepted as verified. Default precision.", ptr(0.0), nil),
		"adopted_from": object("capabilities[].adopted_from", adoptedKeys, []string{"source_address"}, props{
			"source_address":  text("Where the proxied capability comes from.", true),
			"source_protocol": text("Its protocol.", false),
		}),
	}
	maps.Copy(cp, observeSchema())
	maps.Copy(cp, failSafeSchema())
	maps.Copy(cp, exposeSchema())
	c := object("capabilities[]", capKeys, []string{"name", "kind", "description", "binding", "data_type", "semantic_tags"}, cp)
	// What the parser ties to kind and data_type.
	c.AllOf = []*jsonschema.Schema{
		ifThen(props{"kind": {Const: anyPtr(KindDo)}}, props{"data_type": enum(DoDataTypes, "")}),
		ifThen(props{"data_type": {Const: anyPtr(TypeEnum)}}, nil, "enum_values"),
	}
	return c
}

func auditSchema() *jsonschema.Schema {
	return object("audit", auditKeys, nil, props{
		"enabled":        boolean("physd always audits actuations; false only logs a warning."),
		"retention_days": integer(fmt.Sprintf("Days rotated audit files are kept. Default %d.", DefaultRetentionDays), 1, 36500),
		"remote_sink": object("audit.remote_sink", remoteSinkKeys, remoteSinkKeys, props{
			"type":    enum(RemoteSinkKind, "syslog or http (mqtt is not implemented)."),
			"address": text("udp://host:514, tcp://…, empty for local syslog; or the URL receiving POSTed JSON lines.", false),
		}),
	})
}

// RatePattern is the regular expression of what ParseRate accepts:
// count/unit, with the units of the parser's table.
func RatePattern() string {
	units := make([]string, 0, len(rateUnits))
	for u := range rateUnits {
		units = append(units, u)
	}
	sort.Strings(units)
	return `^\s*[0-9]+\s*/\s*(` + strings.Join(units, "|") + `)\s*$`
}

// Schema building blocks, shared with the policy schema.

type props = map[string]*jsonschema.Schema

// object is a mapping with exactly the parser's keys. It panics when props
// and keys differ: the schema must describe every key the parser accepts
// and no other.
func object(where string, keys, required []string, p props) *jsonschema.Schema {
	MustCoverKeys(where, keys, p)
	return &jsonschema.Schema{Type: "object", Properties: p, PropertyOrder: slices.Clone(keys), Required: required,
		AdditionalProperties: &jsonschema.Schema{Not: &jsonschema.Schema{}}}
}

// MustCoverKeys panics unless props describes exactly keys: the check
// that keeps a generated schema and its parser's key lists together.
func MustCoverKeys(where string, keys []string, p props) {
	var missing, extra []string
	for _, k := range keys {
		if p[k] == nil {
			missing = append(missing, k)
		}
	}
	for k := range p {
		if !slices.Contains(keys, k) {
			extra = append(extra, k)
		}
	}
	if len(missing)+len(extra) > 0 {
		sort.Strings(extra)
		panic(fmt.Sprintf("schema of %s out of step with the parser: keys the parser accepts without a schema: %v; schema keys the parser refuses: %v", where, missing, extra))
	}
}

// text is any scalar read as its text (the parser's scalarString keeps
// 0x48 and 1.10 as written); nonEmpty adds the parser's "must not be
// empty" for required strings.
func text(desc string, nonEmpty bool) *jsonschema.Schema {
	s := &jsonschema.Schema{Types: []string{"string", "number", "boolean"}, Description: desc}
	if nonEmpty {
		s.Pattern = `\S`
	}
	return s
}

func pattern(re, desc string, examples ...string) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string", Pattern: re, Description: desc}
	for _, e := range examples {
		s.Examples = append(s.Examples, e)
	}
	return s
}

func constant(v, desc string) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "string", Const: anyPtr(v), Description: desc}
}

func enum(options []string, desc string) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string", Description: desc}
	for _, o := range options {
		s.Enum = append(s.Enum, o)
	}
	return s
}

func integer(desc string, lo, hi int64) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "integer", Description: desc, Minimum: ptr(float64(lo))}
	if hi != math.MaxInt32 {
		s.Maximum = ptr(float64(hi))
	}
	return s
}

// number is a number ≥ lo and ≤ hi (either nil: unbounded).
func number(desc string, lo, hi *float64) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "number", Description: desc, Minimum: lo, Maximum: hi}
}

// positive is a number > 0.
func positive(desc string) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "number", Description: desc, ExclusiveMinimum: ptr(0.0)}
}

func boolean(desc string) *jsonschema.Schema {
	return &jsonschema.Schema{Type: "boolean", Description: desc}
}

func listOf(item *jsonschema.Schema, minItems int, desc string) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "array", Items: item, Description: desc}
	if minItems > 0 {
		s.MinItems = ptr(minItems)
	}
	return s
}

func uniqueList(item *jsonschema.Schema, desc string) *jsonschema.Schema {
	s := listOf(item, 0, desc)
	s.UniqueItems = true
	return s
}

func withMin(s *jsonschema.Schema, n int) *jsonschema.Schema { s.MinItems = ptr(n); return s }
func withLen(s *jsonschema.Schema, n int) *jsonschema.Schema { s.MaxLength = ptr(n); return s }

func ifThen(cond props, then props, required ...string) *jsonschema.Schema {
	var keys []string
	for k := range cond {
		keys = append(keys, k)
	}
	return &jsonschema.Schema{
		If:   &jsonschema.Schema{Properties: cond, Required: keys},
		Then: &jsonschema.Schema{Properties: then, Required: required},
	}
}

func ptr[T any](v T) *T { return &v }

func anyPtr(v any) *any { return &v }

// DecodeSchema is the JSON Schema of what DecodeNode accepts for a value of
// type t: a struct is a mapping with exactly its yaml keys (the same
// structFields DecodeNode matches keys with), a string any scalar, ints
// within their Go type's range, time.Duration a duration string, yaml.Node
// and any anything. Files decoded with DecodeNode (the policy) build their
// schema from their own Go types with it.
func DecodeSchema(t reflect.Type) *jsonschema.Schema {
	switch t {
	case reflect.TypeFor[yaml.Node](), reflect.TypeFor[*yaml.Node]():
		return &jsonschema.Schema{}
	case reflect.TypeFor[time.Duration]():
		return &jsonschema.Schema{Type: "string", Pattern: `^([0-9.]+(ns|us|µs|ms|s|m|h))+$`, Description: `A duration such as "250ms" or "1m30s".`}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return DecodeSchema(t.Elem())
	case reflect.Interface:
		return &jsonschema.Schema{}
	case reflect.Struct:
		names, index := strictyaml.StructKeys(t)
		p := props{}
		for _, name := range names {
			p[name] = DecodeSchema(t.FieldByIndex(index[name]).Type)
		}
		return object(t.String(), names, nil, p)
	case reflect.Map:
		return &jsonschema.Schema{Type: "object", AdditionalProperties: DecodeSchema(t.Elem())}
	case reflect.Slice, reflect.Array:
		return &jsonschema.Schema{Type: "array", Items: DecodeSchema(t.Elem())}
	case reflect.String:
		return text("", false)
	case reflect.Bool:
		return boolean("")
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		s := &jsonschema.Schema{Type: "integer"}
		if t.Bits() < 64 {
			s.Minimum, s.Maximum = ptr(-math.Pow(2, float64(t.Bits()-1))), ptr(math.Pow(2, float64(t.Bits()-1))-1)
		}
		return s
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		s := &jsonschema.Schema{Type: "integer", Minimum: ptr(0.0)}
		if t.Bits() < 64 {
			s.Maximum = ptr(math.Pow(2, float64(t.Bits())) - 1)
		}
		return s
	case reflect.Float32, reflect.Float64:
		return &jsonschema.Schema{Type: "number"}
	}
	return &jsonschema.Schema{}
}

// SchemaObject is the exported form of object for other schema builders
// (the policy's): a mapping with exactly keys, panicking when p differs.
func SchemaObject(where string, keys, required []string, p map[string]*jsonschema.Schema) *jsonschema.Schema {
	return object(where, keys, required, p)
}
