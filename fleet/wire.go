package fleet

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mesh"
)

// What the fleet endpoint (physd fleet) and a serving gateway say to each
// other over NATS. Every subject is under the gateway's own
// <prefix>.<site>.<device>, so the per-site permissions that confine its
// uplink confine its serving too (docs/fleet.md):
//
//	<base>.catalog         the gateway's catalog (JetStream, last per subject): what it serves, as tools
//	<base>.hb              a heartbeat every HeartbeatInterval (core NATS): its instance and catalog hash
//	<base>.obs.<tool>      observations (core NATS; the uplink, and Server's refreshes)
//	<base>.req.<kind>      requests from the fleet endpoint, answered on their reply subject:
//	                       read, can_do, catalog, do (then go: the two-phase go-ahead)
//
// A request carries HeaderCallID, HeaderFrom and HeaderBudget (the time
// the requester still waits, so no clock is compared across the WAN); a
// reply carries HeaderReply and, on a do_ acknowledgement, HeaderInstance.

// Subject suffixes under <prefix>.<site>.<device>.
const (
	SuffixCatalog   = "catalog"
	SuffixHeartbeat = "hb"
	SuffixObs       = "obs"
	SuffixRequest   = "req"
)

// Request kinds (the token after req.).
const (
	KindRead    = "read"
	KindCanDo   = "can_do"
	KindCatalog = "catalog"
	KindDo      = "do"
	KindGo      = "go"
)

// Headers of requests and replies.
const (
	HeaderCallID = "Physd-Call-Id"
	HeaderFrom   = "Physd-From"
	HeaderBudget = "Physd-Budget-Ms"
	// HeaderReply is ack (a do_ held for its go-ahead), answer or error
	// (the body is the error's text).
	HeaderReply = "Physd-Reply"
	// HeaderInstance names the gateway process that acknowledged a do_;
	// the go-ahead carries it back, so that another process (a restart,
	// a second gateway under the same name) never runs a request it did
	// not hold.
	HeaderInstance = "Physd-Instance"
)

// Reply kinds (HeaderReply).
const (
	ReplyAck    = "ack"
	ReplyAnswer = "answer"
	ReplyError  = "error"
)

// DefaultCatalogStream is the JetStream stream of the gateways' catalogs
// (the fleet endpoint creates it; the last catalog of each gateway is
// kept).
const DefaultCatalogStream = "PHYSD_CATALOG"

// DefaultHeartbeat is how often a serving gateway says it is there.
const DefaultHeartbeat = 5 * time.Second

// DefaultHold is how long a gateway holds an acknowledged do_ for its
// go-ahead, on its own monotonic clock from receipt: a request or a
// go-ahead that waited longer (in a stopped process's buffers, on a link
// that stalled) is never run.
const DefaultHold = 3 * time.Second

// Gateway states in a catalog.
const (
	StateServing = "serving"
	StateStopped = "stopped" // the gateway stopped gracefully (SIGTERM)
)

// Base is <prefix>.<site>.<device>, the root of a gateway's subjects.
func Base(prefix, site, device string) string { return prefix + "." + site + "." + device }

// CatalogSubjects are the subjects of the catalog stream.
func CatalogSubjects(prefix string) []string { return []string{prefix + ".*.*." + SuffixCatalog} }

// SplitSubject reads site, device and the rest from a subject under
// prefix (ok false when it is not one).
func SplitSubject(prefix, subject string) (site, device, rest string, ok bool) {
	s, found := strings.CutPrefix(subject, prefix+".")
	if !found {
		return "", "", "", false
	}
	parts := strings.SplitN(s, ".", 3)
	if len(parts) < 3 || parts[0] == "" || parts[1] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// Catalog is what a serving gateway tells the fleet endpoint about itself:
// the capabilities it serves as tools and what it answers over NATS.
type Catalog struct {
	Site     string `json:"site"`
	DeviceID string `json:"device_id"`
	Zone     string `json:"zone,omitempty"`
	Area     string `json:"area,omitempty"`
	// Serves is network.fleet.serve: read, can_do, do.
	Serves []string `json:"serves"`
	// State is StateServing, or StateStopped once it stopped gracefully.
	State string `json:"state"`
	// Instance is random per gateway process start.
	Instance string `json:"instance"`
	// HeartbeatMS is how often the gateway sends its heartbeat.
	HeartbeatMS  int64   `json:"heartbeat_ms"`
	Capabilities []Entry `json:"capabilities"`
	// Hash is the hex sha256 of the catalog without it (CatalogHash); the
	// heartbeats carry it, so that a change the endpoint missed is seen.
	Hash string `json:"hash"`
}

// Entry is one tool of a gateway: the mesh catalog's description (kind,
// type, unit, zone, family, range, lease terms, description) and how long
// an observation of it stays fresh away from the device.
type Entry struct {
	mesh.CatalogEntry
	// StaleAfterMS is manifest.Capability.StaleAfter: an observation older
	// than this is stale at the fleet endpoint.
	StaleAfterMS int64 `json:"stale_after_ms"`
}

// CatalogOf is the catalog of the manifest m in force on a gateway of site
// that serves what.
func CatalogOf(m *manifest.Manifest, site string, serves []string, instance, state string, heartbeat time.Duration) Catalog {
	mc := mesh.CatalogFromManifest(m)
	c := Catalog{Site: site, DeviceID: m.Device.ID, Zone: mc.Zone, Area: mc.Area, Serves: append([]string{}, serves...),
		State: state, Instance: instance, HeartbeatMS: heartbeat.Milliseconds(), Capabilities: []Entry{}}
	// mc lists the exposed capabilities only (a point that is no tool is
	// not served to the fleet either): each entry finds its capability by
	// name, not by position.
	for _, e := range mc.Capabilities {
		stale := m.Capability(manifest.CapabilityName(e.Tool)).StaleAfter()
		c.Capabilities = append(c.Capabilities, Entry{CatalogEntry: e, StaleAfterMS: stale.Milliseconds()})
	}
	c.Hash = c.hash()
	return c
}

func (c Catalog) hash() string {
	c.Hash = ""
	b, _ := json.Marshal(c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Valid reports whether the catalog's hash is its own (a message that
// was cut or altered on the way is not taken).
func (c Catalog) Valid() bool { return c.Hash != "" && c.Hash == c.hash() }

// Serving reports whether the gateway serves what (manifest.FleetServe*).
func (c Catalog) Serving(what string) bool {
	for _, s := range c.Serves {
		if s == what {
			return true
		}
	}
	return false
}

// Heartbeat is a serving gateway's periodic sign of life.
type Heartbeat struct {
	Instance   string `json:"instance"`
	IntervalMS int64  `json:"interval_ms"`
	// Catalog is the hash of the catalog in force.
	Catalog string `json:"catalog"`
	State   string `json:"state"`
}
