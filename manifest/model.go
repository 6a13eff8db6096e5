// Package manifest turns a physmcp.manifest.yml (PhysMCP v0.1 §5.1, plus the
// physd extensions documented in docs/manifest.md) into a typed, validated model.
//
// Parsing is strict: unknown keys, wrong types, duplicate names, missing
// required keys and inconsistent ranges are all reported at once, each with
// file:line:col and a hint that says how to fix it. A Manifest returned
// without error is safe to build a node from.
package manifest

import (
	"strings"
	"time"

	"github.com/physd/physd/strictyaml"
	"gopkg.in/yaml.v3"
)

// Capability kinds.
const (
	KindRead = "read"
	KindDo   = "do"
)

// Data types accepted in capabilities[].data_type.
const (
	TypeFloat  = "float"
	TypeInt    = "int"
	TypeBool   = "bool"
	TypeString = "string" // read only
	TypeEnum   = "enum"   // do (and read, as a physd extension)
)

// Roles, lowest to highest (PhysMCP requires_permission enum).
var Roles = []string{"none", "operator", "supervisor", "admin"}

// Pos is a position in the source file, 1-based.
type Pos = strictyaml.Pos

// Manifest is a validated physmcp.manifest.yml.
type Manifest struct {
	Path           string  `json:"-"`
	PhysMCPVersion string  `json:"physmcp_version"`
	Device         Device  `json:"device"`
	Network        Network `json:"network"`
	// Buses is the physd extension that names shared hardware (a simulated
	// plant, an I2C bus, a Modbus endpoint) so capabilities can refer to it.
	Buses map[string]*Bus `json:"buses,omitempty"`
	// Defaults are the capabilities' defaults (defaults:, expose.go).
	Defaults     Defaults      `json:"defaults"`
	Capabilities []*Capability `json:"capabilities"`
	Audit        Audit         `json:"audit"`
	// Views are the physd extension views: (views.go).
	Views []*View `json:"views,omitempty"`

	// byName indexes Capabilities by name (Parse builds it): a site of
	// 10 000 points is looked up on every call. Capability checks each
	// hit, so a manifest whose list was changed after Parse (a test's, a
	// copy cut to a view) is still answered right, by a scan.
	byName map[string]int
}

// Device is the device: block.
type Device struct {
	ID               string   `json:"id"`
	Type             string   `json:"type"`
	Vendor           string   `json:"vendor,omitempty"`
	Model            string   `json:"model,omitempty"`
	FirmwareVersion  string   `json:"firmware_version,omitempty"`
	HardwareRevision string   `json:"hardware_revision,omitempty"`
	Location         Location `json:"location"`
	// Certification is device.certification (optional, informational).
	Certification *Certification `json:"certification,omitempty"`
}

// Certification is device.certification.
type Certification struct {
	PhysMCPCertified bool   `json:"physmcp_certified"`
	CertID           string `json:"cert_id,omitempty"`
	CertExpiry       string `json:"cert_expiry,omitempty"` // ISO date as written
}

// Location is device.location.
type Location struct {
	Zone        string       `json:"zone"`
	Area        string       `json:"area,omitempty"`
	Description string       `json:"description,omitempty"`
	Coordinates *Coordinates `json:"coordinates,omitempty"`
}

// Coordinates is device.location.coordinates.
type Coordinates struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
	Z float64 `json:"z"`
}

// Network is the network: block.
type Network struct {
	Protocols []Protocol `json:"protocols"`
	Mesh      Mesh       `json:"mesh"`
	// Fleet is the site uplink (physd extension); nil without a fleet block.
	Fleet *Fleet `json:"fleet,omitempty"`
}

// Protocol is one network.protocols[] entry.
type Protocol struct {
	Type    string `json:"type"`              // ip | serial | lora | ble
	Address string `json:"address,omitempty"` // transport specific
	MCPPort int    `json:"mcp_port,omitempty"`
	Role    string `json:"role,omitempty"` // native | proxy | lite
}

// Mesh is network.mesh: PhysMCP's keys (enabled, seed_peers, max_peers,
// heartbeat_interval_ms) plus the physd memberlist keys (see mesh.go for
// defaults and rules).
type Mesh struct {
	Enabled bool `json:"enabled"`
	// SeedPeers are "host:port", "host" (port = Port) or
	// "device_id/host:port"; this node's own entry is allowed and skipped.
	SeedPeers           []string `json:"seed_peers,omitempty"`
	MaxPeers            int      `json:"max_peers"`
	HeartbeatIntervalMS int      `json:"heartbeat_interval_ms"`

	// Bind is the IP address the mesh listens on (TCP and UDP), default
	// 127.0.0.1. A wildcard (0.0.0.0, ::) requires Advertise.
	Bind string `json:"bind"`
	Port int    `json:"port"` // default 7946
	// AdvertiseAddr/AdvertisePort come from advertise ("ip" or "ip:port"):
	// what peers dial. Empty/0 means Bind/Port.
	AdvertiseAddr string `json:"advertise_addr,omitempty"`
	AdvertisePort int    `json:"advertise_port,omitempty"`
	// Label separates meshes sharing a network; default "physd".
	Label string `json:"label"`
	// KeyFile or KeyEnv names where the AES key (16, 24 or 32 bytes, hex or
	// base64) is read at start (LoadKey). Required when Bind is not
	// loopback.
	KeyFile string `json:"key_file,omitempty"`
	KeyEnv  string `json:"key_env,omitempty"`
	// ExpectedSize is the expected number of nodes, self included (quorum
	// majority, partition_state); default 1 + the seeds that are not this
	// node.
	ExpectedSize        int `json:"expected_size"`
	RequestTimeoutMS    int `json:"request_timeout_ms"`    // default 500
	ReconnectIntervalMS int `json:"reconnect_interval_ms"` // default 10000

	// KeyPos and KeyField locate key_file/key_env for LoadKey's errors.
	KeyPos   Pos    `json:"-"`
	KeyField string `json:"-"`

	// MDNS is network.mesh.mdns (physd extension): advertise
	// _physmcp._tcp and find gateways to join (see mesh.go).
	MDNS MDNS `json:"mdns"`
}

// MDNS is network.mesh.mdns. Off unless the block is present.
type MDNS struct {
	Enabled bool `json:"enabled"`
	// Interface is the one interface mDNS advertises and browses on;
	// default "lo" (this host only).
	Interface string `json:"interface"`
	// Advertise answers queries for _physmcp._tcp (default true);
	// Discover browses for gateways to join when seed_peers is empty
	// (default true).
	Advertise bool `json:"advertise"`
	Discover  bool `json:"discover"`
	// BrowseIntervalMS is how often discovery browses again (default
	// 15000, 1000..300000).
	BrowseIntervalMS int `json:"browse_interval_ms"`

	// Pos and Field locate interface (or the mdns block) for errors found
	// at start (an interface this host does not have).
	Pos   Pos    `json:"-"`
	Field string `json:"-"`
}

// Bus is one entry of the buses: extension. Type selects the driver
// (sim, i2c, gpio, modbus_tcp, modbus_rtu); Config holds the remaining keys,
// which the driver decodes strictly itself.
type Bus struct {
	Name   string     `json:"name"`
	Type   string     `json:"type"`
	Config *yaml.Node `json:"-"`
	Pos    Pos        `json:"-"`
	// TypePos is where the bus's type: value is written, for errors about
	// the bus type (Pos is the bus name).
	TypePos Pos `json:"-"`
	// Field is the path used in error messages, "buses.<name>".
	Field string `json:"-"`
}

// DecodeConfig strictly decodes the bus's own keys (Config) into out, a
// pointer to a struct with yaml tags; see DecodeNode.
func (b *Bus) DecodeConfig(out any) Errors {
	return DecodeNode(b.Pos.File, b.Config, b.FieldPath(), out)
}

// FieldPath is the bus's path in error messages ("buses.<name>"), also for
// a Bus built by hand without Field.
func (b *Bus) FieldPath() string {
	if b.Field != "" {
		return b.Field
	}
	return "buses." + b.Name
}

// Binding is capabilities[].binding: the PhysMCP address string and/or the
// structured keys (physd extension), the keys other than type, address and
// bus, for the driver to decode strictly (ParamsNode).
type Binding struct {
	Type    string `json:"type"`
	Address string `json:"address,omitempty"`
	Bus     string `json:"bus,omitempty"`
	// Params is the structured keys of a binding built by hand; Parse
	// keeps them packed instead (nil here): read them with ParamsNode.
	Params *yaml.Node `json:"-"`
	packed packedParams
	Pos    Pos `json:"-"`
	// Field is the path used in error messages, "capabilities[i].binding".
	Field string `json:"-"`
}

// ParamsNode is the binding's structured keys, a mapping node (nil when
// there are none). For a parsed manifest each call unpacks a fresh tree;
// the caller must not change the tree of a binding built by hand.
func (b *Binding) ParamsNode() *yaml.Node {
	if b.Params != nil {
		return b.Params
	}
	return b.packed.node()
}

// DecodeParams strictly decodes the binding's structured keys into out, a
// pointer to a struct with yaml tags; see DecodeNode.
func (b *Binding) DecodeParams(out any) Errors {
	return DecodeNode(b.Pos.File, b.ParamsNode(), b.Field, out)
}

// Range is capabilities[].range.
type Range struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// Contains reports whether v is within the closed range.
func (r *Range) Contains(v float64) bool { return r == nil || (v >= r.Min && v <= r.Max) }

// RateLimit is a parsed rate_limit string such as "6/hour".
type RateLimit struct {
	Count  int           `json:"count"`
	Per    time.Duration `json:"-"`
	Source string        `json:"source"` // as written
}

// Capability is one capabilities[] entry with defaults applied.
type Capability struct {
	Name         string   `json:"name"`
	Kind         string   `json:"kind"`
	Description  string   `json:"description"`
	Binding      Binding  `json:"binding"`
	DataType     string   `json:"data_type"`
	Unit         string   `json:"unit,omitempty"`
	Range        *Range   `json:"range,omitempty"`
	EnumValues   []string `json:"enum_values,omitempty"`
	Precision    float64  `json:"precision,omitempty"`
	SampleRateHz float64  `json:"sample_rate_hz,omitempty"`
	SemanticTags []string `json:"semantic_tags"`
	// Zone is a physd extension: the zone this capability acts on or
	// observes; it defaults to device.location.zone. A gateway often serves
	// several zones, and can_do matches intent.location against it.
	Zone               string     `json:"zone"`
	SideEffects        []string   `json:"side_effects,omitempty"`
	RateLimit          *RateLimit `json:"rate_limit,omitempty"`
	RequiresPermission string     `json:"requires_permission"`
	RequiresQuorum     bool       `json:"requires_quorum"`
	QuorumSize         int        `json:"quorum_size,omitempty"`
	CooldownMS         int        `json:"cooldown_ms,omitempty"`
	TimeoutMS          int        `json:"timeout_ms"`
	Cacheable          bool       `json:"cacheable"`
	CacheTTLMS         int        `json:"cache_ttl_ms"`
	// Extensions (physd):
	// Compensable says whether a do_ can be undone by writing the previous
	// value back (default true for float/int/enum/bool setpoints).
	Compensable bool `json:"compensable"`
	// SettleMS waits this long after a write before the verifying read-back.
	SettleMS int `json:"settle_ms,omitempty"`
	// Tolerance is the largest |read-back - written| accepted as verified;
	// defaults to precision, or 1e-9.
	Tolerance float64 `json:"tolerance,omitempty"`
	// Family groups capabilities of one type (families.go): served as one
	// tool with a zone argument where an endpoint serves families.
	Family string `json:"family,omitempty"`
	// Expose is false for a capability that is observed but is no tool
	// (expose.go); use Exposed(). The parser always sets it.
	Expose *bool `json:"expose,omitempty"`
	// AdoptedFrom is PhysMCP's proxy-mode origin of the capability.
	AdoptedFrom *AdoptedFrom `json:"adopted_from,omitempty"`
	// PollMS and Deadband are the observation keys (observe.go).
	PollMS   int       `json:"poll_ms,omitempty"`
	Deadband *Deadband `json:"deadband,omitempty"`
	Alarms   *Alarms   `json:"alarms,omitempty"`
	// Safe and Lease are the fail-safe keys (safe.go).
	Safe  *Safe  `json:"safe,omitempty"`
	Lease *Lease `json:"lease,omitempty"`
	Pos   Pos    `json:"-"`
}

// AdoptedFrom is capabilities[].adopted_from (PhysMCP proxy mode).
type AdoptedFrom struct {
	SourceAddress  string `json:"source_address"`
	SourceProtocol string `json:"source_protocol,omitempty"`
}

// ToolName is read_<name> or do_<name>.
func (c *Capability) ToolName() string { return c.Kind + "_" + c.Name }

// CapabilityName is the capability name of a tool name (ToolName undone):
// read_x and do_x both name x.
func CapabilityName(tool string) string {
	return strings.TrimPrefix(strings.TrimPrefix(tool, "read_"), "do_")
}

// Timeout returns timeout_ms as a duration.
func (c *Capability) Timeout() time.Duration { return time.Duration(c.TimeoutMS) * time.Millisecond }

// CacheTTL returns cache_ttl_ms as a duration (0 when not cacheable).
func (c *Capability) CacheTTL() time.Duration {
	if !c.Cacheable {
		return 0
	}
	return time.Duration(c.CacheTTLMS) * time.Millisecond
}

// StaleAfter is the age past which a value of c counts as stale where it
// is shown away from the device (the console, the fleet endpoint): the
// stale_s its alarms declare, else three poll intervals or cache lifetimes,
// and never less than 10 s (a value read every second is seconds old).
func (c *Capability) StaleAfter() time.Duration {
	if c.Alarms != nil && c.Alarms.StaleS > 0 {
		return time.Duration(c.Alarms.StaleS) * time.Second
	}
	return max(3*c.PollInterval(), 3*c.CacheTTL(), MinStaleAfter)
}

// MinStaleAfter is StaleAfter's floor.
const MinStaleAfter = 10 * time.Second

// Audit is the audit: block.
type Audit struct {
	Enabled       bool        `json:"enabled"`
	RetentionDays int         `json:"retention_days"`
	RemoteSink    *RemoteSink `json:"remote_sink,omitempty"`
}

// RemoteSink is audit.remote_sink.
type RemoteSink struct {
	Type    string `json:"type"` // mqtt | http | syslog
	Address string `json:"address"`
}

// Tool returns the capability whose tool (read_x, do_x) is tool, or nil.
func (m *Manifest) Tool(tool string) *Capability {
	if c := m.Capability(CapabilityName(tool)); c != nil && c.ToolName() == tool {
		return c
	}
	return nil
}

// index builds byName (Parse, once the list is complete).
func (m *Manifest) index() {
	m.byName = make(map[string]int, len(m.Capabilities))
	for i, c := range m.Capabilities {
		if _, dup := m.byName[c.Name]; !dup {
			m.byName[c.Name] = i
		}
	}
}

// Capability returns the capability with the given bare name, or nil.
func (m *Manifest) Capability(name string) *Capability {
	if i, ok := m.byName[name]; ok && i < len(m.Capabilities) && m.Capabilities[i].Name == name {
		return m.Capabilities[i]
	}
	for _, c := range m.Capabilities {
		if c.Name == name {
			return c
		}
	}
	return nil
}
