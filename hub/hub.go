// Package hub is the NATS side of a physd fleet: the permissions a hub
// gives each site's gateways and the fleet endpoint, and the nats-server
// (github.com/nats-io/nats-server/v2) that `physd fleet` embeds, with
// JetStream on local disk, for a fleet on one machine. A larger fleet runs
// its own NATS cluster (three servers, JetStream replicas 3) with the same
// permissions; physd then only connects to it. A build with -tags nohub
// leaves the embedded server out (8.7 MB of a stripped arm64 binary):
// Start then says so.
package hub

import (
	"crypto/tls"
	"time"
)

// Permissions are a hub user's: the subjects it may publish to and
// subscribe to, and how many replies (allow_responses) it may send to a
// request it received, within how long.
type Permissions struct {
	Publish, Subscribe []string
	Replies            int
	RepliesFor         time.Duration
}

// SitePermissions are what the gateways of one site may do on the hub:
// publish under prefix.site only (observations, alarm events, audit
// records, catalogs, heartbeats), ask the audit stream for its info and
// messages (the uplink's cursor), receive replies, take the fleet
// endpoint's requests to their own site's gateways (prefix.site.*.req.>)
// and answer only those (allow_responses: one reply per request received,
// within two minutes). So a site's credentials can neither publish nor
// answer as another site, nor read another site's requests (which carry
// the callers' credentials).
func SitePermissions(prefix, site, auditStream string) Permissions {
	return Permissions{
		Publish: []string{
			prefix + "." + site + ".>",
			"$JS.API.INFO",
			"$JS.API.STREAM.INFO." + auditStream,
			"$JS.API.STREAM.MSG.GET." + auditStream,
			"$JS.API.DIRECT.GET." + auditStream,
			"$JS.API.DIRECT.GET." + auditStream + ".>",
		},
		Subscribe:  []string{"_INBOX.>", prefix + "." + site + ".*.req.>"},
		Replies:    1,
		RepliesFor: 2 * time.Minute,
	}
}

// FleetInboxPrefix is the inbox prefix of the fleet endpoint's
// connection: the sites' _INBOX.> subscribe permission does not reach the
// replies it receives.
const FleetInboxPrefix = "_PHYSD_FLEET"

// Site is one site's user on the embedded hub: a password, or an NKey
// (its public key, U…).
type Site struct {
	Name     string
	Password string
	NKey     string
}

// Config configures the embedded hub.
type Config struct {
	// Listen is host:port for the sites' gateways.
	Listen string
	// StoreDir holds JetStream's files (the audit and catalog streams).
	StoreDir string
	// Sites are the users the sites' gateways connect as.
	Sites []Site
	// Prefix and AuditStream are the subjects' prefix and the audit
	// stream the site permissions name.
	Prefix, AuditStream string
	// TLS, when set, is the listener's (the sites connect with tls://).
	TLS *tls.Config
	// MaxStore bounds JetStream's disk use in bytes (0: nats-server's
	// default, a share of the disk).
	MaxStore int64
}
