package manifest

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// network.mesh defaults (physd memberlist keys).
const (
	DefaultMeshBind              = "127.0.0.1"
	DefaultMeshPort              = 7946
	DefaultMeshLabel             = "physd"
	DefaultMeshRequestTimeoutMS  = 500
	DefaultMeshReconnectInterval = 10_000
	MaxMeshLabelLen              = 255 // memberlist's label limit
)

// network.mesh.mdns defaults (physd extension; PhysMCP §7.1 bootstrap).
// mDNS is off unless the manifest has an mdns: block (or physd run gets
// --mdns-interface); the interface defaults to loopback, so nothing is
// advertised or browsed on a network unless an interface is named.
const (
	DefaultMDNSInterface        = "lo"
	DefaultMDNSBrowseIntervalMS = 15_000
	MinMDNSBrowseIntervalMS     = 1_000
	MaxMDNSBrowseIntervalMS     = 300_000
	// MaxMDNSInstanceLen is a DNS label's limit: the device id is the
	// mDNS instance name.
	MaxMDNSInstanceLen = 63
)

// meshKeys are the keys of network.mesh, in the order listed in fixes.
var meshKeys = []string{
	"enabled", "seed_peers", "max_peers", "heartbeat_interval_ms",
	"bind", "port", "advertise", "label", "key_file", "key_env",
	"expected_size", "request_timeout_ms", "reconnect_interval_ms", "mdns",
}

// mdnsKeys are the keys of network.mesh.mdns.
var mdnsKeys = []string{"enabled", "interface", "advertise", "discover", "browse_interval_ms"}

// reIfName is a network interface name as Linux accepts it (IFNAMSIZ-1).
var reIfName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,14}$`)

var reEnvName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

const fixMeshKey = "add key_file: /etc/physd/mesh.key or key_env: PHYSD_MESH_KEY (an AES key of 16, 24 or 32 bytes, written as hex or base64; e.g. openssl rand -base64 32)"

// mesh parses network.mesh. Rules: bind is an IP literal (default
// 127.0.0.1); a wildcard bind needs advertise; a non-loopback bind of an
// enabled mesh needs key_file or key_env (not both); seeds are
// [device_id/]host[:port]; expected_size defaults to 1 + the distinct seeds
// that are not this node.
func (p *parser) mesh(mo *obj, deviceID string) Mesh {
	ms := Mesh{
		Enabled: true, MaxPeers: DefaultMaxPeers, HeartbeatIntervalMS: DefaultHeartbeatIntervalMS,
		Bind: DefaultMeshBind, Port: DefaultMeshPort, Label: DefaultMeshLabel,
		RequestTimeoutMS: DefaultMeshRequestTimeoutMS, ReconnectIntervalMS: DefaultMeshReconnectInterval,
	}
	if mo == nil {
		return ms
	}
	if v, ok := mo.boolean("enabled"); ok {
		ms.Enabled = v
	}
	if v, ok := mo.intIn("max_peers", 1, math.MaxInt32); ok {
		ms.MaxPeers = v
	}
	if v, ok := mo.intIn("heartbeat_interval_ms", 1, math.MaxInt32); ok {
		ms.HeartbeatIntervalMS = v
	}
	if v, ok := mo.intIn("port", 1, 65535); ok {
		ms.Port = v
	}

	bindOK, bindIP := p.meshAddress(mo, &ms)
	p.meshLabel(mo, &ms)
	p.meshKey(mo, &ms, bindOK, bindIP)
	others := p.meshSeeds(mo, &ms, deviceID)
	if v, ok := mo.intIn("expected_size", 1, math.MaxInt32); ok {
		ms.ExpectedSize = v
	} else {
		ms.ExpectedSize = 1 + others
	}
	if v, ok := mo.intIn("request_timeout_ms", 1, 60_000); ok {
		ms.RequestTimeoutMS = v
	}
	if v, ok := mo.intIn("reconnect_interval_ms", 100, 86_400_000); ok {
		ms.ReconnectIntervalMS = v
	}
	ms.MDNS = p.mdns(mo, deviceID)
	return ms
}

// meshAddress reads bind and advertise; it returns whether bind was valid
// and the address bound.
func (p *parser) meshAddress(mo *obj, ms *Mesh) (bool, net.IP) {
	bindOK := true
	if s, ok := mo.str("bind", false); ok {
		if ip := net.ParseIP(strings.TrimSpace(s)); ip == nil {
			p.add(mo.get("bind"), mo.field("bind"), "write an IP address of this host, e.g. 192.168.1.20 or 127.0.0.1 (host names are not accepted)", "bind %s is not an IP address", quoteShort(s))
			bindOK = false
		} else {
			ms.Bind = ip.String()
		}
	}
	bindIP := net.ParseIP(ms.Bind)

	if s, ok := mo.str("advertise", false); ok {
		host, port, err := splitHostMaybePort(strings.TrimSpace(s), ms.Port)
		ip := net.ParseIP(host)
		switch {
		case err != nil:
			p.add(mo.get("advertise"), mo.field("advertise"), "write ip or ip:port, e.g. 192.168.1.20 or 192.168.1.20:7946", "invalid advertise %s: %v", quoteShort(s), err)
		case ip == nil:
			p.add(mo.get("advertise"), mo.field("advertise"), "write the IP address peers dial, e.g. 192.168.1.20 (host names are not accepted)", "advertise %s is not an IP address", quoteShort(s))
		case ip.IsUnspecified():
			p.add(mo.get("advertise"), mo.field("advertise"), "write the specific address peers dial, e.g. 192.168.1.20", "advertise %s is a wildcard address", quoteShort(s))
		default:
			ms.AdvertiseAddr, ms.AdvertisePort = ip.String(), port
		}
	}
	if bindOK && bindIP != nil && bindIP.IsUnspecified() && mo.get("advertise") == nil {
		p.add(mo.get("bind"), mo.field("bind"), "bind one address of this host, or add advertise: <the address peers dial>",
			"bind %s listens on every interface and needs advertise", ms.Bind)
	}
	return bindOK, bindIP
}

func (p *parser) meshLabel(mo *obj, ms *Mesh) {
	if s, ok := mo.str("label", false); ok {
		switch {
		case strings.TrimSpace(s) == "":
			p.add(mo.get("label"), mo.field("label"), "remove label to use \"physd\", or name the site, e.g. site_north", "label must not be empty")
		case len(s) > MaxMeshLabelLen:
			p.add(mo.get("label"), mo.field("label"), fmt.Sprintf("shorten it to at most %d bytes", MaxMeshLabelLen), "label is %d bytes long", len(s))
		default:
			ms.Label = s
		}
	}
}

// meshKey reads key_file / key_env, required when an enabled mesh binds a
// non-loopback address.
func (p *parser) meshKey(mo *obj, ms *Mesh, bindOK bool, bindIP net.IP) {
	if s, ok := mo.str("key_file", false); ok {
		if strings.TrimSpace(s) == "" {
			p.add(mo.get("key_file"), mo.field("key_file"), "give the path of the key file", "key_file must not be empty")
		}
		ms.KeyFile, ms.KeyPos, ms.KeyField = s, p.pos(mo.get("key_file")), mo.field("key_file")
	}
	if s, ok := mo.str("key_env", false); ok {
		if !reEnvName.MatchString(s) {
			p.add(mo.get("key_env"), mo.field("key_env"), "name an environment variable, e.g. PHYSD_MESH_KEY", "invalid key_env %s", quoteShort(s))
		}
		if mo.get("key_file") != nil {
			p.add(mo.key("key_env"), mo.field("key_env"), "keep either key_file or key_env", "key_file and key_env are both set")
		} else {
			ms.KeyEnv, ms.KeyPos, ms.KeyField = s, p.pos(mo.get("key_env")), mo.field("key_env")
		}
	}
	if ms.Enabled && bindOK && bindIP != nil && !bindIP.IsLoopback() && ms.KeyFile == "" && ms.KeyEnv == "" &&
		mo.get("key_file") == nil && mo.get("key_env") == nil {
		n, field := mo.get("bind"), mo.field("bind")
		p.add(n, field, fixMeshKey, "bind %s is reachable from the network, so the mesh must be encrypted: no key_file or key_env", ms.Bind)
	}
}

// meshSeeds reads seed_peers and returns how many distinct seeds are not
// this node.
func (p *parser) meshSeeds(mo *obj, ms *Mesh, deviceID string) int {
	self := ms.AdvertiseAddr
	if self == "" {
		self = ms.Bind
	}
	selfPort := ms.Port
	if ms.AdvertisePort != 0 {
		selfPort = ms.AdvertisePort
	}
	others := map[string]bool{}
	ms.SeedPeers, _ = mo.strList("seed_peers", false, func(n *yaml.Node, f, s string) bool {
		if !p.nonEmpty(n, f, s) {
			return false
		}
		name, host, port, err := SplitSeed(strings.TrimSpace(s), ms.Port)
		if err != nil {
			p.add(n, f, "write host:port, host, or device_id/host:port, e.g. gw_boiler_001/192.168.1.21:7946", "invalid seed %s: %v", quoteShort(s), err)
			return false
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		if name == deviceID || addr == net.JoinHostPort(self, strconv.Itoa(selfPort)) {
			return true // this node itself: fine in a site-wide list
		}
		others[addr] = true
		return true
	})
	return len(others)
}

// DefaultMDNS is network.mesh.mdns with every default: what a present
// mdns: {} block (or physd run --mdns-interface) starts from. Without the
// block the model's MDNS is the zero value: off.
func DefaultMDNS() MDNS {
	return MDNS{Enabled: true, Interface: DefaultMDNSInterface, Advertise: true, Discover: true,
		BrowseIntervalMS: DefaultMDNSBrowseIntervalMS, Field: "network.mesh.mdns.interface"}
}

// mdns parses network.mesh.mdns. A present block is on unless it says
// enabled: false; interface defaults to lo (loopback only).
func (p *parser) mdns(mo *obj, deviceID string) MDNS {
	if mo == nil || mo.get("mdns") == nil {
		return MDNS{}
	}
	o := p.object(mo.get("mdns"), mo.field("mdns"), mdnsKeys, false)
	if o == nil {
		return MDNS{}
	}
	md := DefaultMDNS()
	md.Pos = p.pos(o.node)
	if v, ok := o.boolean("enabled"); ok {
		md.Enabled = v
	}
	if s, ok := o.str("interface", false); ok {
		if !reIfName.MatchString(s) {
			p.add(o.get("interface"), o.field("interface"), "name a network interface of this host, e.g. eth0, end0 or wlan0 (ip -br link lists them); lo keeps mDNS on this host",
				"interface %s is not an interface name", quoteShort(s))
		} else {
			md.Interface, md.Pos = s, p.pos(o.get("interface"))
		}
	}
	if v, ok := o.boolean("advertise"); ok {
		md.Advertise = v
	}
	if v, ok := o.boolean("discover"); ok {
		md.Discover = v
	}
	if v, ok := o.intIn("browse_interval_ms", MinMDNSBrowseIntervalMS, MaxMDNSBrowseIntervalMS); ok {
		md.BrowseIntervalMS = v
	}
	if md.Enabled && len(deviceID) > MaxMDNSInstanceLen {
		p.add(o.node, o.path, fmt.Sprintf("shorten device.id to at most %d characters (a DNS label), or set enabled: false", MaxMDNSInstanceLen),
			"device.id is %d characters long, too long for an mDNS instance name", len(deviceID))
	}
	return md
}

// MDNSDiscovery reports whether physd browses for gateways to join: the
// mesh and mDNS are on, discovery is not turned off, and no seed_peers
// are given (seeds are the operator's explicit choice; mDNS never adds
// to them).
func (ms *Mesh) MDNSDiscovery() bool {
	return ms.Enabled && ms.MDNS.Enabled && ms.MDNS.Discover && len(ms.SeedPeers) == 0
}

// SplitSeed splits a seed peer "device_id/host:port", "host:port" or
// "host" (port = defaultPort).
func SplitSeed(s string, defaultPort int) (name, host string, port int, err error) {
	rest := s
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		name, rest = rest[:i], rest[i+1:]
		if name == "" {
			return "", "", 0, errors.New("empty device id before /")
		}
	}
	host, port, err = splitHostMaybePort(rest, defaultPort)
	return name, host, port, err
}

// splitHostMaybePort splits "host:port", "[v6]:port", "host" or a bare IPv6
// address.
func splitHostMaybePort(s string, defaultPort int) (string, int, error) {
	if s == "" {
		return "", 0, errors.New("empty address")
	}
	if !strings.Contains(s, ":") || (strings.Count(s, ":") > 1 && !strings.HasPrefix(s, "[")) {
		return strings.Trim(s, "[]"), defaultPort, nil
	}
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, errors.New("expected host:port")
	}
	if host == "" {
		return "", 0, errors.New("empty host")
	}
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("invalid port %q", ps)
	}
	return host, port, nil
}

// DecodeKey decodes a mesh key: hex when the text (surrounding whitespace
// ignored) is 32, 48 or 64 hex digits, base64 (standard or URL, padded or
// not) otherwise. The key must be 16, 24 or 32 bytes (AES-128/192/256).
func DecodeKey(text string) ([]byte, error) {
	s := strings.TrimSpace(text)
	if s == "" {
		return nil, errors.New("the key is empty")
	}
	var key []byte
	if l := len(s); l == 32 || l == 48 || l == 64 {
		if b, err := hex.DecodeString(s); err == nil {
			key = b
		}
	}
	if key == nil {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if b, err := enc.DecodeString(s); err == nil {
				key = b
				break
			}
		}
	}
	if key == nil {
		return nil, errors.New("the key is neither hex nor base64")
	}
	switch len(key) {
	case 16, 24, 32:
		return key, nil
	}
	return nil, fmt.Errorf("the key is %d bytes; want 16, 24 or 32 (AES-128/192/256)", len(key))
}

// LoadKey reads and decodes the mesh key named by key_file or key_env;
// (nil, nil) when neither is set. Errors point at the manifest key. A key
// file readable or writable by everyone is refused.
func (ms *Mesh) LoadKey() ([]byte, error) {
	var text, what string
	switch {
	case ms.KeyFile != "":
		st, err := os.Stat(ms.KeyFile)
		if err != nil {
			return nil, ms.keyError("cannot read the key file: "+err.Error(), "create it with: openssl rand -base64 32 > "+ms.KeyFile+"; chmod 600 "+ms.KeyFile)
		}
		if st.Mode().Perm()&0o006 != 0 {
			return nil, ms.keyError(fmt.Sprintf("the key file %s is accessible to every user (mode %v)", ms.KeyFile, st.Mode().Perm()), "chmod 600 "+ms.KeyFile)
		}
		b, err := os.ReadFile(ms.KeyFile)
		if err != nil {
			return nil, ms.keyError("cannot read the key file: "+err.Error(), "make it readable by the physd user")
		}
		text, what = string(b), "key file "+ms.KeyFile
	case ms.KeyEnv != "":
		v, ok := os.LookupEnv(ms.KeyEnv)
		if !ok {
			return nil, ms.keyError("environment variable "+ms.KeyEnv+" is not set", "export "+ms.KeyEnv+"=$(openssl rand -base64 32) in the service environment")
		}
		text, what = v, "environment variable "+ms.KeyEnv
	default:
		return nil, nil
	}
	key, err := DecodeKey(text)
	if err != nil {
		return nil, ms.keyError(what+": "+err.Error(), "write 16, 24 or 32 random bytes as hex or base64, e.g. openssl rand -base64 32")
	}
	return key, nil
}

func (ms *Mesh) keyError(msg, fix string) error {
	return &Error{Pos: ms.KeyPos, Field: ms.KeyField, Msg: msg, Fix: fix}
}
