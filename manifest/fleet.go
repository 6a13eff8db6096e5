package manifest

import (
	"math"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// network.fleet defaults (physd extension: the site uplink to NATS).
const (
	DefaultFleetStream           = "PHYSD_AUDIT"
	DefaultFleetHistoryStream    = "PHYSD_HISTORY"
	DefaultFleetAlarmStream      = "PHYSD_ALARMS"
	DefaultFleetSubjectPrefix    = "physd"
	DefaultFleetConnectTimeoutMS = 5_000
	DefaultFleetPublishTimeoutMS = 5_000
)

// fleetKeys are the keys of network.fleet.
var fleetKeys = []string{
	"enabled", "urls", "site", "credentials_file", "nkey_seed_file", "user", "password_file",
	"tls", "stream", "subject_prefix", "connect_timeout_ms", "publish_timeout_ms",
	"domain", "history", "history_stream", "alarms", "alarm_stream", "serve",
}

// What a gateway may serve to the fleet endpoint over NATS (network.fleet.serve).
const (
	FleetServeRead  = "read"
	FleetServeCanDo = "can_do"
	FleetServeDo    = "do"
)

// FleetServes are the values of network.fleet.serve.
var FleetServes = []string{FleetServeRead, FleetServeCanDo, FleetServeDo}

// DefaultFleetServe is network.fleet.serve without the key: reads and
// can_do, never an actuation unless the site operator adds do.
var DefaultFleetServe = []string{FleetServeRead, FleetServeCanDo}

var fleetTLSKeys = []string{"ca", "cert", "key"}

// reSubjectToken is one NATS subject token physd writes (site, device id):
// no dots, wildcards or spaces.
var reSubjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// reSubjectPrefix is a subject prefix: tokens joined by dots.
var reSubjectPrefix = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$`)

// reStreamName is a JetStream stream name physd accepts.
var reStreamName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Fleet is network.fleet: the site uplink (physd extension). Nil when the
// manifest has no fleet block.
type Fleet struct {
	Enabled bool     `json:"enabled"`
	URLs    []string `json:"urls"`
	// Site is the site's name, the second token of every subject.
	Site string `json:"site"`
	// One of: a .creds file (user JWT + NKey seed), an NKey seed file, or a
	// user with a password file.
	CredentialsFile string `json:"credentials_file,omitempty"`
	NKeySeedFile    string `json:"nkey_seed_file,omitempty"`
	User            string `json:"user,omitempty"`
	PasswordFile    string `json:"password_file,omitempty"`
	// TLS: CA to verify the server, client certificate and key.
	TLSCA   string `json:"tls_ca,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	// Stream is the JetStream stream the audit records go to.
	Stream        string `json:"stream"`
	SubjectPrefix string `json:"subject_prefix"`
	// Domain is the hub's JetStream domain ("" : $JS.API): needed when
	// the gateway connects to a leaf node that runs JetStream itself.
	Domain string `json:"domain,omitempty"`
	// History publishes the closed history buckets to HistoryStream;
	// Alarms the active alarms to AlarmStream.
	History          bool   `json:"history"`
	HistoryStream    string `json:"history_stream"`
	Alarms           bool   `json:"alarms"`
	AlarmStream      string `json:"alarm_stream"`
	ConnectTimeoutMS int    `json:"connect_timeout_ms"`
	PublishTimeoutMS int    `json:"publish_timeout_ms"`
	// Serve is what the gateway answers the fleet endpoint over NATS:
	// read, can_do, do (DefaultFleetServe without the key; [] serves
	// nothing: the uplink only publishes).
	Serve []string `json:"serve"`
}

// Serves reports whether the gateway serves what (FleetServe*) to the
// fleet endpoint.
func (f *Fleet) Serves(what string) bool {
	return f != nil && f.Enabled && slices.Contains(f.Serve, what)
}

// DefaultFleet is a network.fleet block with every default and no URL,
// site or credentials (what the parser and physd run's --fleet-* flags
// start from).
func DefaultFleet() *Fleet {
	return &Fleet{Enabled: true, Stream: DefaultFleetStream, SubjectPrefix: DefaultFleetSubjectPrefix,
		History: true, HistoryStream: DefaultFleetHistoryStream, Alarms: true, AlarmStream: DefaultFleetAlarmStream,
		ConnectTimeoutMS: DefaultFleetConnectTimeoutMS, PublishTimeoutMS: DefaultFleetPublishTimeoutMS, Serve: slices.Clone(DefaultFleetServe)}
}

// IsFleetURL reports whether s is a hub URL physd takes: nats:// or
// tls://, a host, no credentials.
func IsFleetURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "nats" || u.Scheme == "tls") && u.Host != "" && u.User == nil
}

// IsSubjectToken reports whether s is one NATS subject token of the names
// physd writes (a site, a device id, a JetStream domain): letters,
// digits, _ and -; no dot, no wildcard.
func IsSubjectToken(s string) bool { return reSubjectToken.MatchString(s) }

// IsSubjectPrefix reports whether s is a subject prefix physd takes.
func IsSubjectPrefix(s string) bool { return reSubjectPrefix.MatchString(s) }

// IsStreamName reports whether s is a JetStream stream name physd takes.
func IsStreamName(s string) bool { return reStreamName.MatchString(s) }

// UsesTLS reports whether the uplink must use TLS (a tls:// URL or a tls
// block).
func (f *Fleet) UsesTLS() bool {
	if f.TLSCA != "" || f.TLSCert != "" {
		return true
	}
	for _, u := range f.URLs {
		if strings.HasPrefix(u, "tls://") {
			return true
		}
	}
	return false
}

// fleet parses network.fleet. Rules: urls are nats:// or tls:// URLs
// (at least one); site is one subject token; at most one of
// credentials_file, nkey_seed_file and user (password_file needs user);
// tls.cert and tls.key go together (device.id is already a subject token:
// lowercase letters, digits and _).
func (p *parser) fleet(fo *obj) *Fleet {
	if fo == nil {
		return nil
	}
	f := DefaultFleet()
	if v, ok := fo.boolean("enabled"); ok {
		f.Enabled = v
	}
	f.URLs, _ = fo.strList("urls", true, func(n *yaml.Node, field, s string) bool {
		if !IsFleetURL(s) {
			p.add(n, field, "use nats://host:4222 or tls://host:4222 (credentials go in credentials_file, nkey_seed_file or user/password_file, never in the URL)", "invalid NATS URL %s", quoteShort(s))
			return false
		}
		return true
	})
	if n := fo.get("urls"); n != nil && len(f.URLs) == 0 && n.Kind == yaml.SequenceNode {
		p.add(n, fo.field("urls"), "add the hub's URL, e.g. - nats://hub.example:4222", "urls must not be empty")
	}
	f.Site, _ = fo.pattern("site", true, reSubjectToken.MatchString, "letters, digits, _ and - (one NATS subject token)", "greenhouse-north")
	if v, ok := fo.pattern("stream", false, reStreamName.MatchString, "letters, digits, _ and -", DefaultFleetStream); ok {
		f.Stream = v
	}
	if v, ok := fo.pattern("subject_prefix", false, reSubjectPrefix.MatchString, "dot-separated tokens of letters, digits, _ and -", "physd or acme.physd"); ok {
		f.SubjectPrefix = v
	}
	if v, ok := fo.pattern("domain", false, reSubjectToken.MatchString, "letters, digits, _ and - (the hub's jetstream.domain)", "hub"); ok {
		f.Domain = v
	}
	if v, ok := fo.boolean("history"); ok {
		f.History = v
	}
	if v, ok := fo.pattern("history_stream", false, reStreamName.MatchString, "letters, digits, _ and -", DefaultFleetHistoryStream); ok {
		f.HistoryStream = v
	}
	if v, ok := fo.boolean("alarms"); ok {
		f.Alarms = v
	}
	if v, ok := fo.pattern("alarm_stream", false, reStreamName.MatchString, "letters, digits, _ and -", DefaultFleetAlarmStream); ok {
		f.AlarmStream = v
	}
	f.CredentialsFile, _ = fo.str("credentials_file", false)
	f.NKeySeedFile, _ = fo.str("nkey_seed_file", false)
	f.User, _ = fo.str("user", false)
	f.PasswordFile, _ = fo.str("password_file", false)
	var methods []string
	for _, k := range []string{"credentials_file", "nkey_seed_file", "user"} {
		if fo.get(k) != nil {
			methods = append(methods, k)
		}
	}
	if len(methods) > 1 {
		p.add(fo.key(methods[1]), fo.field(methods[1]), "keep one of credentials_file, nkey_seed_file or user (with password_file)", "%s and %s are two ways to authenticate", methods[0], methods[1])
	}
	if f.PasswordFile != "" && f.User == "" {
		p.add(fo.key("password_file"), fo.field("password_file"), "add user: beside password_file", "password_file without user")
	}
	if to := fo.sub("tls", fleetTLSKeys, false); to != nil {
		f.TLSCA, _ = to.str("ca", false)
		f.TLSCert, _ = to.str("cert", false)
		f.TLSKey, _ = to.str("key", false)
		if (f.TLSCert == "") != (f.TLSKey == "") {
			p.add(to.node, to.path, "give both cert and key (the client certificate and its private key), or neither", "tls.cert and tls.key go together")
		}
		for _, u := range f.URLs {
			if strings.HasPrefix(u, "nats://") {
				p.add(to.node, to.path, "use tls://host:4222 in urls, or remove tls:", "a tls block with the plain URL %s", u)
				break
			}
		}
	}
	if v, ok := fo.intIn("connect_timeout_ms", 100, 300_000); ok {
		f.ConnectTimeoutMS = v
	}
	if v, ok := fo.intIn("publish_timeout_ms", 100, math.MaxInt32); ok {
		f.PublishTimeoutMS = v
	}
	seen := map[string]bool{}
	if v, ok := fo.strList("serve", false, func(n *yaml.Node, field, s string) bool {
		switch {
		case !slices.Contains(FleetServes, s):
			p.add(n, field, oneOf(s, FleetServes), "unknown %s", quoteShort(s))
			return false
		case seen[s]:
			p.add(n, field, "name each once", "%s is listed twice", quoteShort(s))
			return false
		}
		seen[s] = true
		return true
	}); ok {
		f.Serve = v
	}
	return f
}
