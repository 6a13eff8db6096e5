package mesh

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultBindAddr          = "127.0.0.1"
	DefaultPort              = 7946
	DefaultLabel             = "physd"
	DefaultRequestTimeout    = 500 * time.Millisecond
	DefaultReconnectInterval = 10 * time.Second
	DefaultReconnectTimeout  = 24 * time.Hour
	DefaultJoinTimeout       = 5 * time.Second
	// DefaultPartitionHold is how long a new partition_state must hold
	// before it is reported (hysteresis: a lossy link must not make it
	// flap). A failed probe is also re-checked at once over TCP.
	DefaultPartitionHold = 3 * time.Second

	// MaxPayload bounds a request or reply payload (and an encoded catalog).
	MaxPayload = 256 << 10
	// MaxConcurrentHandlers bounds the requests served at once; more are
	// answered with a "busy" error.
	MaxConcurrentHandlers = 256
)

// Profiles select memberlist's timing preset.
const (
	ProfileLAN   = "lan"   // memberlist.DefaultLANConfig (production)
	ProfileLocal = "local" // memberlist.DefaultLocalConfig (fast; loopback tests)
)

// Config configures a Mesh. Zero fields take the defaults above.
type Config struct {
	// NodeName is the memberlist node name: the manifest's device.id. It
	// must be unique in the mesh; a duplicate is refused.
	NodeName string
	// BindAddr is an IP literal (default 127.0.0.1). A wildcard (0.0.0.0,
	// ::) requires AdvertiseAddr; a non-loopback address requires
	// SecretKey (unless Transport is injected).
	BindAddr string
	BindPort int // default 7946; 0 picks a free port (tests)
	// AdvertiseAddr/AdvertisePort are what peers dial (default: the bind
	// address and port).
	AdvertiseAddr string
	AdvertisePort int
	// Seeds are "host:port" or "name/host:port"; the node's own address is
	// skipped.
	Seeds []string
	// Label separates meshes that share a network (memberlist label,
	// bound into the AES-GCM data when encrypted). Default "physd".
	Label string
	// SecretKey is the AES-128/192/256 key (16, 24 or 32 bytes) of every
	// packet and stream. Nil disables encryption (loopback only).
	SecretKey []byte
	// ExpectedSize is the number of nodes the mesh should have (self
	// included); quorum majority and partition_state use it. Default
	// 1 + the number of seeds that are not this node.
	ExpectedSize int
	// RequestTimeout bounds a Request whose ctx has no deadline, and every
	// Quorum round. Default 500 ms.
	RequestTimeout time.Duration
	// ReconnectInterval is how often seeds and last-known peers that are
	// not alive are joined again (default 10 s). Negative disables the
	// loop (tests that show why it exists).
	ReconnectInterval time.Duration
	// ReconnectTimeout is how long a dead peer is remembered (retried, and
	// counted in SizeEstimate) before it is forgotten. Default 24 h.
	ReconnectTimeout time.Duration
	// JoinTimeout bounds how long New waits for the first join (default
	// 5 s); a join still running continues in the background.
	JoinTimeout time.Duration
	// ProbeInterval overrides the profile's failure-detector period
	// (manifest heartbeat_interval_ms). 0 keeps the profile's value.
	ProbeInterval time.Duration
	Logger        *slog.Logger
	// Transport replaces memberlist's TCP/UDP transport (meshtest in
	// tests); nil uses the real one on BindAddr:BindPort.
	Transport memberlist.NodeAwareTransport
	// Profile is "lan" (default) or "local".
	Profile string
	// PartitionHold is how long a partition_state must persist before
	// PartitionState reports it (default DefaultPartitionHold; negative:
	// report every change at once).
	PartitionHold time.Duration
}

// withDefaults validates cfg and fills its zero fields.
func (cfg Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(cfg.NodeName) == "" {
		bad("NodeName is empty: set it to the device id")
	}
	if cfg.BindAddr == "" {
		cfg.BindAddr = DefaultBindAddr
	}
	bind := net.ParseIP(cfg.BindAddr)
	if bind == nil {
		bad("BindAddr %q is not an IP address", cfg.BindAddr)
	}
	if cfg.BindPort < 0 || cfg.BindPort > 65535 {
		bad("BindPort %d is out of range", cfg.BindPort)
	}
	if cfg.AdvertiseAddr != "" {
		ip := net.ParseIP(cfg.AdvertiseAddr)
		if ip == nil || ip.IsUnspecified() {
			bad("AdvertiseAddr %q must be a specific IP address", cfg.AdvertiseAddr)
		}
	}
	if cfg.AdvertisePort < 0 || cfg.AdvertisePort > 65535 {
		bad("AdvertisePort %d is out of range", cfg.AdvertisePort)
	}
	if cfg.Transport == nil && bind != nil {
		if bind.IsUnspecified() && cfg.AdvertiseAddr == "" {
			bad("BindAddr %s is a wildcard: set AdvertiseAddr to the address peers should dial", cfg.BindAddr)
		}
		if !bind.IsLoopback() && len(cfg.SecretKey) == 0 {
			bad("BindAddr %s is not loopback: a SecretKey (key_file or key_env) is required", cfg.BindAddr)
		}
	}
	switch len(cfg.SecretKey) {
	case 0, 16, 24, 32:
	default:
		bad("SecretKey is %d bytes: want 16, 24 or 32 (AES-128/192/256)", len(cfg.SecretKey))
	}
	if cfg.Label == "" {
		cfg.Label = DefaultLabel
	}
	if len(cfg.Label) > memberlist.LabelMaxSize {
		bad("Label is %d bytes: at most %d", len(cfg.Label), memberlist.LabelMaxSize)
	}
	for _, s := range cfg.Seeds {
		if _, _, _, err := SplitSeed(s, DefaultPort); err != nil {
			bad("seed %q: %v", s, err)
		}
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.RequestTimeout < 0 {
		bad("RequestTimeout must be positive")
	}
	if cfg.ReconnectInterval == 0 {
		cfg.ReconnectInterval = DefaultReconnectInterval
	}
	if cfg.ReconnectTimeout <= 0 {
		cfg.ReconnectTimeout = DefaultReconnectTimeout
	}
	if cfg.PartitionHold == 0 {
		cfg.PartitionHold = DefaultPartitionHold
	}
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = DefaultJoinTimeout
	}
	if cfg.ProbeInterval < 0 {
		bad("ProbeInterval must not be negative")
	}
	if cfg.ExpectedSize < 0 {
		bad("ExpectedSize must not be negative")
	}
	switch cfg.Profile {
	case "":
		cfg.Profile = ProfileLAN
	case ProfileLAN, ProfileLocal:
	default:
		bad("Profile %q: use %q or %q", cfg.Profile, ProfileLAN, ProfileLocal)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg, errors.Join(errs...)
}

// SplitSeed splits "name/host:port", "host:port" or "host" into its parts,
// filling defaultPort when the port is missing.
func SplitSeed(s string, defaultPort int) (name, host string, port int, err error) {
	rest := s
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		name, rest = rest[:i], rest[i+1:]
		if name == "" {
			return "", "", 0, errors.New("empty node name before /")
		}
	}
	if rest == "" {
		return "", "", 0, errors.New("empty address")
	}
	host, ps, err := net.SplitHostPort(rest)
	if err != nil {
		// No port (or a bare IPv6 address).
		if strings.Count(rest, ":") > 1 && !strings.HasPrefix(rest, "[") || !strings.Contains(rest, ":") {
			return name, strings.Trim(rest, "[]"), defaultPort, nil
		}
		return "", "", 0, err
	}
	if host == "" {
		return "", "", 0, errors.New("empty host")
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 1 || p > 65535 {
		return "", "", 0, fmt.Errorf("invalid port %q", ps)
	}
	return name, host, p, nil
}

// memberlistConfig builds memberlist's configuration from cfg.
func (m *Mesh) memberlistConfig() (*memberlist.Config, error) {
	cfg := m.cfg
	var mc *memberlist.Config
	if cfg.Profile == ProfileLocal {
		mc = memberlist.DefaultLocalConfig()
	} else {
		mc = memberlist.DefaultLANConfig()
	}
	mc.Name = cfg.NodeName
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = cfg.BindPort
	}
	if cfg.ProbeInterval > 0 {
		mc.ProbeInterval = cfg.ProbeInterval
		if mc.ProbeTimeout > cfg.ProbeInterval/2 {
			mc.ProbeTimeout = cfg.ProbeInterval / 2
		}
	}
	// LZW on every message costs more CPU (a fresh 4 KiB+ table per
	// message: about 12 % of a 30-node can_do) than it saves on a LAN's
	// small messages; receivers accept either.
	mc.EnableCompression = false
	mc.Label = cfg.Label
	mc.SkipInboundLabelCheck = false
	if len(cfg.SecretKey) > 0 {
		mc.SecretKey = append([]byte(nil), cfg.SecretKey...)
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	d := &delegate{m: m}
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Ping = d
	mc.Logger = memberlistLogger(cfg.Logger, m)
	t := cfg.Transport
	if t == nil {
		nt, err := newNetTransport(cfg, mc)
		if err != nil {
			return nil, err
		}
		t = nt
	}
	m.dial = newDialer(t)
	mc.Transport = m.dial
	return mc, nil
}
