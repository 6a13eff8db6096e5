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
)

// Permissions are a hub user's: the subjects it may publish to and
// subscribe to.
type Permissions struct {
	Publish, Subscribe []string
}

// APIPrefix is the JetStream API's subject prefix in a domain: $JS.API
// without one, $JS.<domain>.API with one (how a client at a leaf node, or
// any client that names the hub's domain, addresses the hub's JetStream).
func APIPrefix(domain string) string {
	if domain == "" {
		return "$JS.API"
	}
	return "$JS." + domain + ".API"
}

// apiPrefixes are the API prefixes permissions in domain name: $JS.API,
// and with a domain $JS.<domain>.API too. A hub server maps its domain's
// API onto its own ($JS.<domain>.API.> to $JS.API.>) before it checks a
// directly connected client's permissions, so such a client is checked
// against $JS.API even when it names the domain; what a leaf node
// forwards is checked as it came over the link, with the domain.
func apiPrefixes(domain string) []string {
	if domain == "" {
		return []string{"$JS.API"}
	}
	return []string{"$JS.API", APIPrefix(domain)}
}

// SitePermissions are what the gateways of one site may do on the hub
// (or what the hub lets the site's leaf node forward): publish under
// prefix.site only (observations, alarm events, audit records, history
// buckets, alarm states, catalogs, heartbeats); on each of streams (the
// audit, history and alarm streams: the uplink's cursors), in the
// JetStream API (and in domain's, apiPrefixes), the stream's info and the
// last message of a subject by direct get, for the site's own subjects
// only (the subject is part of the request's subject, where these
// permissions see it; the other forms of the message get, STREAM.MSG.GET
// and a direct get without a subject, name the message in their body and
// would read any site's); receive the replies on its own inbox
// (SiteInbox: the gateways connect with it as their inbox prefix; a
// shared _INBOX.> would hear the other sites' replies, their records
// among them); take the fleet endpoint's
// requests to their own site's gateways (prefix.site.*.req.>) and answer
// them on the endpoint's replies for this site (FleetInboxPrefix.site.>:
// the endpoint's reply subjects name the site they asked, fleet.Client).
// So a site's credentials can neither publish nor answer as another site,
// nor read another site's records or requests (which carry the callers'
// credentials). The answers are a publish permission, not
// allow_responses: a leaf node forwards to the hub only what its
// site may publish, so a reply the site may only send as a response would
// never leave the leaf.
func SitePermissions(prefix, site, domain string, streams ...string) Permissions {
	pub := []string{prefix + "." + site + ".>", FleetInboxPrefix + "." + site + ".>"}
	for _, api := range apiPrefixes(domain) {
		pub = append(pub, api+".INFO")
		for _, st := range streams {
			pub = append(pub, api+".STREAM.INFO."+st, api+".DIRECT.GET."+st+"."+prefix+"."+site+".>")
		}
	}
	return Permissions{
		Publish:   pub,
		Subscribe: []string{SiteInbox(site) + ".>", prefix + "." + site + ".*.req.>"},
	}
}

// FleetStreams are the streams the fleet endpoint reads (and creates when
// they are missing).
type FleetStreams struct {
	Audit, Catalog, History, Alarms string
}

// FleetPermissions are what the fleet endpoint's user may do on the hub:
// send the gateways' requests (prefix.*.*.req.>) and receive the replies
// on its own inbox (FleetInboxPrefix); follow the catalogs, heartbeats
// and observations; and, on each of its streams, in the JetStream API
// (and in domain's, apiPrefixes): create the stream when it is missing, read its info and its last
// messages (direct gets), and read it through ordered consumers (the
// catalog directory, the history and alarm readers, the alarm states it
// follows to tell its subscribers). It can neither publish as a site (no
// site subject but the requests) nor delete, purge or reconfigure a
// stream.
func FleetPermissions(prefix, domain string, s FleetStreams) Permissions {
	pub := []string{prefix + ".*.*.req.>"}
	for _, api := range apiPrefixes(domain) {
		pub = append(pub, api+".INFO")
		for _, st := range []string{s.Audit, s.Catalog, s.History, s.Alarms} {
			if st == "" {
				continue
			}
			pub = append(pub, api+".STREAM.CREATE."+st, api+".STREAM.INFO."+st, api+".DIRECT.GET."+st, api+".DIRECT.GET."+st+".>",
				api+".CONSUMER.CREATE."+st+".>", api+".CONSUMER.INFO."+st+".>", api+".CONSUMER.MSG.NEXT."+st+".>", api+".CONSUMER.DELETE."+st+".>")
		}
	}
	return Permissions{
		Publish:   pub,
		Subscribe: []string{FleetInboxPrefix + ".>", prefix + ".*.*.catalog", prefix + ".*.*.hb", prefix + ".*.*.obs.>"},
	}
}

// FleetInboxPrefix is the inbox prefix of the fleet endpoint's
// connection: the sites' _INBOX.> subscribe permission does not reach the
// replies it receives, and each site may publish under its own
// FleetInboxPrefix.<site>. only.
const FleetInboxPrefix = "_PHYSD_FLEET"

// SiteInboxPrefix is the first token of the sites' inbox prefixes.
const SiteInboxPrefix = "_PHYSD_SITE"

// SiteInbox is the inbox prefix of a site's gateways' connections,
// _PHYSD_SITE.<site>: the replies the hub's JetStream sends a gateway
// (its cursors, which carry its own records, and its acknowledgements)
// go there, and only that site may subscribe to it. A shared _INBOX.>
// would let every site hear every other site's replies.
func SiteInbox(site string) string { return SiteInboxPrefix + "." + site }

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
	// Prefix is the subjects' prefix; Streams are the endpoint's streams
	// (the sites' permissions name the audit, history and alarm streams,
	// the endpoint's user all four).
	Prefix  string
	Streams FleetStreams
	// TLS, when set, is the listener's (the sites connect with tls://).
	TLS *tls.Config
	// MaxStore bounds JetStream's disk use in bytes (0: nats-server's
	// default, a share of the disk).
	MaxStore int64
}
