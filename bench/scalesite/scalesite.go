// Package scalesite generates the manifest of the scale benchmark's site
// (bench/scale10k.sh): Slaves Modbus TCP devices (modbus-sim -points) of
// Points points each, every point polled every PollMS, with history,
// deadbands and a few alarms; only a handful of capabilities are tools
// (defaults: {expose: false}), in families, so the default tools/list
// stays within what MCP clients accept however large the site.
//
// Per device k (m01 … m20), on bus mNN (unit 1):
//
//	mNN_power        input 30101   read, exposed, family power (kW)
//	mNN_p001 …       input 30102 … read, observed only; every fourth point
//	                                moves fast (a power), the others slowly
//	mNN_sp0 … spN    holding 40101 do, polled; sp0 of the first
//	                                ExposedSetpoints devices exposed, family setpoint
//
// The point's value is the simulator's int16 ×0.1 (10.0 … 90.0).
//
// With OPCUA set (an endpoint of examples/opcua/server's server.js started
// with --points Groups×Points), the same zones and names are on one opcua
// bus, plant: every read point is a monitored item (poll_ms with a
// deadband of 0.5 % of the node's EURange), bound to ns=1;s=P00000 … in
// order, and device k < ExposedSetpoints has one setpoint, mNN_sp0, bound
// to ns=1;s=SP<k> (exposed, family setpoint).
package scalesite

import (
	"fmt"
	"strings"
)

// Site describes the generated site.
type Site struct {
	// Addrs are the devices' Modbus TCP addresses (host:port), one bus each.
	Addrs []string
	// Points per device, setpoints included (default 500).
	Points int
	// Setpoints per device: holding registers, do_ capabilities (default 4).
	Setpoints int
	// ExposedSetpoints is how many devices' first setpoint is a tool
	// (default 5).
	ExposedSetpoints int
	// PollMS is every point's poll_ms (default 1000).
	PollMS int
	// CacheTTLMS is every read's cache_ttl_ms (default 2 × PollMS): a read
	// of a point between two polls is served from the cache.
	CacheTTLMS int
	// AlarmEvery puts a high alarm on every AlarmEvery-th fast point of a
	// device (default 20: 25 alarms per 500 points; 0 is the default,
	// negative none).
	AlarmEvery int
	// Mesh turns network.mesh on (families are then served by default).
	Mesh bool

	// OPCUA, when set, is the endpoint of one OPC UA server holding every
	// point (server.js --points): the site is Groups zones of Points read
	// points each on that one bus, and no Modbus device.
	OPCUA string
	// Groups is the OPC UA site's number of zones (default 20).
	Groups int
}

func (s Site) withDefaults() Site {
	if s.Points == 0 {
		s.Points = 500
	}
	if s.Setpoints == 0 {
		s.Setpoints = 4
	}
	if s.ExposedSetpoints == 0 {
		s.ExposedSetpoints = 5
	}
	if s.PollMS == 0 {
		s.PollMS = 1000
	}
	if s.CacheTTLMS == 0 {
		s.CacheTTLMS = 2 * s.PollMS
	}
	if s.AlarmEvery == 0 {
		s.AlarmEvery = 20
	}
	if s.Groups == 0 {
		s.Groups = 20
	}
	return s
}

// Reads is how many read points each device (each zone of the OPC UA
// site) has: the rest of a Modbus device's points are setpoints; every
// point of the OPC UA site is a read, its setpoints come beside.
func (s Site) Reads() int {
	s = s.withDefaults()
	if s.OPCUA != "" {
		return s.Points
	}
	return s.Points - s.Setpoints
}

// Devices is how many devices (zones) the site has.
func (s Site) Devices() int {
	if s.OPCUA != "" {
		return s.withDefaults().Groups
	}
	return len(s.Addrs)
}

// Capabilities is how many capabilities the manifest has: every point of
// the Modbus devices; the OPC UA server's points and their setpoints.
func (s Site) Capabilities() int {
	s = s.withDefaults()
	if s.OPCUA == "" {
		return len(s.Addrs) * s.Points
	}
	return s.ServerPoints() + min(s.ExposedSetpoints, s.Groups)
}

// ServerPoints is how many points the OPC UA site's server must serve
// (server.js --points): Groups × Points.
func (s Site) ServerPoints() int {
	s = s.withDefaults()
	return s.Groups * s.Points
}

// Device is the zone (and bus) name of device i (0-based): m01, m02 …
func Device(i int) string { return fmt.Sprintf("m%02d", i+1) }

// SetpointTool is the do_ tool of device i's first setpoint.
func SetpointTool(i int) string { return "do_" + Device(i) + "_sp0" }

// PointName is the capability name of point j (0-based, reads only) of
// device i.
func PointName(i, j int) string {
	if j == 0 {
		return Device(i) + "_power"
	}
	return fmt.Sprintf("%s_p%03d", Device(i), j)
}

// Manifest is the site's physmcp.manifest.yml.
func (s Site) Manifest() []byte {
	s = s.withDefaults()
	if s.OPCUA != "" {
		return s.opcuaManifest()
	}
	var b strings.Builder
	s.header(&b, fmt.Sprintf("%d Modbus TCP devices × %d points, every point\n# polled every %d ms", len(s.Addrs), s.Points, s.PollMS),
		fmt.Sprintf("%d meters and drives on Modbus TCP", len(s.Addrs)))
	for i, addr := range s.Addrs {
		// queue_size: every point of the device may be queued at once.
		fmt.Fprintf(&b, "  %s: {type: modbus_tcp, address: %q, timeout_ms: 1000, queue_size: %d}\n", Device(i), addr, s.Points+64)
	}
	b.WriteString("defaults: {expose: false}\ncapabilities:\n")
	reads := s.Reads()
	for i := range s.Addrs {
		dev := Device(i)
		for j := range reads {
			s.readPoint(&b, i, j, fmt.Sprintf("{type: modbus, bus: %s, unit: 1, table: input, address: %d, data_type: int16, scale: 0.1}", dev, 100+j))
		}
		for k := range s.Setpoints {
			extra := ""
			if k == 0 && i < s.ExposedSetpoints {
				extra = ", expose: true, family: setpoint"
			}
			fmt.Fprintf(&b, "  - {name: %s_sp%d, kind: do, description: Setpoint %d of %s (percent of its span)., zone: %s, binding: {type: modbus, bus: %s, unit: 1, table: holding, address: %d, data_type: int16, scale: 0.1}, "+
				"data_type: float, unit: percent, range: [0, 100], precision: 0.1, semantic_tags: [setpoint, %s], timeout_ms: 2000, poll_ms: %d%s}\n",
				dev, k, k, dev, dev, dev, 100+k, dev, s.PollMS, extra)
		}
	}
	b.WriteString(`views:
  observe: {kinds: [read], families: true, description: every device's power reading}
`)
	return []byte(b.String())
}

// header writes the manifest's head, up to buses: (what is the site's
// comment, description its location's).
func (s Site) header(b *strings.Builder, what, description string) {
	fmt.Fprintf(b, `# Generated by bench/scalesite: %s; only the points that say expose: true are tools.
physmcp_version: "0.1"
device:
  id: gw_scale_001
  type: plant_gateway
  location: {zone: plant, area: hall_1, description: %s}
network:
  protocols: [{type: ip, address: 127.0.0.1, role: native}]
  mesh: {enabled: %v}
buses:
`, what, description, s.Mesh)
}

// readPoint writes read point j of device i with its binding: every
// fourth a power (the first exposed, some with a high alarm), the others
// slow quantities; all polled (or monitored) every PollMS with a deadband
// of 0.5 % of the range.
func (s Site) readPoint(b *strings.Builder, i, j int, binding string) {
	dev := Device(i)
	unit, tags := pointKind(j)
	extra := ""
	switch {
	case j == 0:
		extra = ", expose: true, family: power"
	case j%4 == 0 && s.AlarmEvery > 0 && (j/4)%s.AlarmEvery == 0:
		extra = ", alarms: {high: 88, hysteresis: 2, for_ms: 3000}"
	}
	fmt.Fprintf(b, "  - {name: %s, kind: read, description: Point %d of %s., zone: %s, binding: %s, "+
		"data_type: float, unit: %s, range: [0, 100], precision: 0.1, semantic_tags: %s, poll_ms: %d, cache_ttl_ms: %d, deadband: \"0.5%%\"%s}\n",
		PointName(i, j), j, dev, dev, binding, unit, tags, s.PollMS, s.CacheTTLMS, extra)
}

// opcuaManifest is the OPC UA site's manifest (s with defaults): Groups
// zones of Points monitored read points and a setpoint for each of the
// first ExposedSetpoints zones, on one bus.
func (s Site) opcuaManifest() []byte {
	var b strings.Builder
	s.header(&b, fmt.Sprintf("%d points on one OPC UA server (%d zones × %d),\n# each a monitored item sampled every %d ms with a deadband of 0.5 %% of its\n# EURange", s.ServerPoints(), s.Groups, s.Points, s.PollMS),
		fmt.Sprintf("%d points behind one OPC UA server", s.ServerPoints()))
	fmt.Fprintf(&b, "  plant: {type: opcua, endpoint: %q, security_policy: None, timeout_ms: 2000, connect_timeout_ms: 10000}\ndefaults: {expose: false}\ncapabilities:\n", s.OPCUA)
	for i := range s.Groups {
		for j := range s.Points {
			s.readPoint(&b, i, j, fmt.Sprintf("{type: opcua, bus: plant, node: \"ns=1;s=P%05d\"}", i*s.Points+j))
		}
	}
	for i := range min(s.ExposedSetpoints, s.Groups) {
		dev := Device(i)
		fmt.Fprintf(&b, "  - {name: %s_sp0, kind: do, description: Setpoint 0 of %s (percent of its span)., zone: %s, binding: {type: opcua, bus: plant, node: \"ns=1;s=SP%d\", ua_type: Double}, "+
			"data_type: float, unit: percent, range: [0, 100], precision: 0.1, semantic_tags: [setpoint, %s], timeout_ms: 2000, poll_ms: %d, expose: true, family: setpoint}\n",
			dev, dev, dev, i, dev, s.PollMS)
	}
	b.WriteString(`views:
  observe: {kinds: [read], families: true, description: every device's power reading}
`)
	return []byte(b.String())
}

// pointKind is the unit and tags of read point j: every fourth point moves
// fast (a power), the others slowly (voltages, currents, temperatures).
func pointKind(j int) (unit, tags string) {
	switch {
	case j%4 == 0:
		return "kW", "[power, energy]"
	case j%4 == 1:
		return "V", "[voltage]"
	case j%4 == 2:
		return "A", "[current]"
	}
	return "celsius", "[temperature]"
}
