package fleetd

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/strictyaml"
)

// Config is the fleet endpoint's configuration file (physd fleet
// --config): who it is, the NATS it uses (a cluster it connects to, or
// the hub it embeds), the views it serves and its deadlines. Paths in it
// are relative to the file's directory.
type Config struct {
	Path string
	// ID names the endpoint: its MCP server's device id, and the gateway
	// the sites' audit records the calls came through (via).
	ID                         string
	Prefix                     string
	AuditStream, CatalogStream string
	HistoryStream, AlarmStream string
	Replicas                   int
	CallTimeout                time.Duration // can_do's budget; a gateway's acknowledgement of a read or do_
	ReadTimeout, DoTimeout     time.Duration // a live read's and an acknowledged do_'s answer
	NATS                       *NATS         // nil: embedded
	Embed                      *Embed        // nil: an external cluster
	Views                      []*manifest.View
	ConnectTimeout             time.Duration
}

// NATS is an external NATS cluster (the fleet endpoint's user).
type NATS struct {
	URLs []string
	// Domain is the hub's JetStream domain, when the endpoint addresses
	// it by its domain ($JS.<domain>.API: through a leaf node that runs
	// JetStream itself, or because its user's permissions name it).
	Domain string
	// Fleet holds the credentials and TLS the way a gateway's
	// network.fleet does (fleet.Options reads them).
	Fleet manifest.Fleet
}

// Embed is the hub the endpoint embeds (one machine).
type Embed struct {
	Listen, StoreDir string
	MaxStoreMB       int64
	TLSCert, TLSKey  string
	TLSClientCA      string
	Sites            []EmbedSite
}

// EmbedSite is one site's user on the embedded hub.
type EmbedSite struct {
	Name, PasswordFile, NKey string
}

// Defaults.
const (
	DefaultID          = "fleet"
	DefaultCallTimeout = 2 * time.Second
	DefaultReadTimeout = 5 * time.Second
	DefaultDoTimeout   = 15 * time.Second
)

type rawConfig struct {
	ID            string             `yaml:"id"`
	SubjectPrefix string             `yaml:"subject_prefix"`
	AuditStream   string             `yaml:"audit_stream"`
	CatalogStream string             `yaml:"catalog_stream"`
	HistoryStream string             `yaml:"history_stream"`
	AlarmStream   string             `yaml:"alarm_stream"`
	Replicas      *int               `yaml:"replicas"`
	CallTimeoutMS *int               `yaml:"call_timeout_ms"`
	ReadTimeoutMS *int               `yaml:"read_timeout_ms"`
	DoTimeoutMS   *int               `yaml:"do_timeout_ms"`
	NATS          *rawNATS           `yaml:"nats"`
	Embed         *rawEmbed          `yaml:"embed"`
	Views         map[string]rawView `yaml:"views"`
}

type rawNATS struct {
	URLs             []string `yaml:"urls"`
	Domain           string   `yaml:"domain"`
	CredentialsFile  string   `yaml:"credentials_file"`
	NKeySeedFile     string   `yaml:"nkey_seed_file"`
	User             string   `yaml:"user"`
	PasswordFile     string   `yaml:"password_file"`
	TLS              *rawTLS  `yaml:"tls"`
	ConnectTimeoutMS *int     `yaml:"connect_timeout_ms"`
}

type rawTLS struct {
	CA   string `yaml:"ca"`
	Cert string `yaml:"cert"`
	Key  string `yaml:"key"`
}

type rawEmbed struct {
	Listen     string             `yaml:"listen"`
	StoreDir   string             `yaml:"store_dir"`
	MaxStoreMB int64              `yaml:"max_store_mb"`
	TLS        *rawEmbedTLS       `yaml:"tls"`
	Sites      map[string]rawSite `yaml:"sites"`
}

type rawEmbedTLS struct {
	Cert     string `yaml:"cert"`
	Key      string `yaml:"key"`
	ClientCA string `yaml:"client_ca"`
}

type rawSite struct {
	PasswordFile string `yaml:"password_file"`
	NKey         string `yaml:"nkey"`
}

type rawView struct {
	Description  string   `yaml:"description"`
	Sites        []string `yaml:"sites"`
	Kinds        []string `yaml:"kinds"`
	Zones        []string `yaml:"zones"`
	Areas        []string `yaml:"areas"`
	Tags         []string `yaml:"tags"`
	Devices      []string `yaml:"devices"`
	Capabilities []string `yaml:"capabilities"`
	Families     *bool    `yaml:"families"`
}

var (
	reToken  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	reID     = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
	reView   = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	rePrefix = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}$`)
	reStream = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// LoadConfig reads and checks the configuration file at path: every
// problem is reported at once, positioned (file:line:col: field: what;
// fix: how).
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseConfig(path, data)
}

// ParseConfig is LoadConfig for a file's content.
func ParseConfig(path string, data []byte) (*Config, error) {
	root, errs := strictyaml.ParseDocument(path, data)
	if len(errs) > 0 {
		return nil, errs
	}
	top := strictyaml.Resolve(root)
	pr := &strictyaml.Problems{File: path, Top: top}
	var r rawConfig
	pr.Decode(top, "", &r)
	dir := filepath.Dir(path)
	rel := func(p string) string {
		if p == "" || filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(dir, p)
	}
	c := &Config{Path: path, ID: or(r.ID, DefaultID), Prefix: or(r.SubjectPrefix, manifest.DefaultFleetSubjectPrefix),
		AuditStream: or(r.AuditStream, manifest.DefaultFleetStream), CatalogStream: or(r.CatalogStream, fleet.DefaultCatalogStream),
		HistoryStream: or(r.HistoryStream, manifest.DefaultFleetHistoryStream), AlarmStream: or(r.AlarmStream, manifest.DefaultFleetAlarmStream), Replicas: 1,
		CallTimeout: DefaultCallTimeout, ReadTimeout: DefaultReadTimeout, DoTimeout: DefaultDoTimeout,
		ConnectTimeout: time.Duration(manifest.DefaultFleetConnectTimeoutMS) * time.Millisecond}
	if !reID.MatchString(c.ID) {
		pr.Add(fmt.Sprintf("invalid id %s", strictyaml.Quote(c.ID)), "lowercase letters, digits and _, starting with a letter, e.g. fleet_hq (the sites' audit names it as via)", "id")
	}
	if !rePrefix.MatchString(c.Prefix) {
		pr.Add(fmt.Sprintf("invalid subject_prefix %s", strictyaml.Quote(c.Prefix)), "dot-separated tokens of letters, digits, _ and -, e.g. physd (the sites' network.fleet.subject_prefix)", "subject_prefix")
	}
	for key, v := range map[string]string{"audit_stream": c.AuditStream, "catalog_stream": c.CatalogStream, "history_stream": c.HistoryStream, "alarm_stream": c.AlarmStream} {
		if !reStream.MatchString(v) {
			pr.Add(fmt.Sprintf("invalid stream name %s", strictyaml.Quote(v)), "letters, digits, _ and -", key)
		}
	}
	if r.Replicas != nil {
		if *r.Replicas < 1 || *r.Replicas > 5 {
			pr.Add(fmt.Sprintf("%d is out of range", *r.Replicas), "1 (one server, the embedded hub) to 5; 3 on a three-server cluster", "replicas")
		}
		c.Replicas = *r.Replicas
	}
	for key, ms := range map[string]struct {
		v   *int
		out *time.Duration
	}{"call_timeout_ms": {r.CallTimeoutMS, &c.CallTimeout}, "read_timeout_ms": {r.ReadTimeoutMS, &c.ReadTimeout}, "do_timeout_ms": {r.DoTimeoutMS, &c.DoTimeout}} {
		if ms.v == nil {
			continue
		}
		if *ms.v < 50 || *ms.v > 600_000 {
			pr.Add(fmt.Sprintf("%d is out of range", *ms.v), "50 to 600000 ms", key)
			continue
		}
		*ms.out = time.Duration(*ms.v) * time.Millisecond
	}
	if c.DoTimeout <= c.CallTimeout {
		pr.Add("do_timeout_ms must be longer than call_timeout_ms", "the acknowledgement comes within call_timeout_ms, the answer within do_timeout_ms", "do_timeout_ms")
	}
	switch {
	case r.NATS != nil && r.Embed != nil:
		pr.AddKey("nats and embed are two hubs", "keep nats: (an external cluster) or embed: (a hub in this process), not both", "embed")
	case r.NATS != nil:
		c.NATS = parseNATS(pr, r.NATS, rel)
		if ms := r.NATS.ConnectTimeoutMS; ms != nil {
			if *ms < 100 || *ms > 300_000 {
				pr.Add(fmt.Sprintf("%d is out of range", *ms), "100 to 300000 ms", "nats", "connect_timeout_ms")
			}
			c.ConnectTimeout = time.Duration(*ms) * time.Millisecond
		}
	case r.Embed != nil:
		c.Embed = parseEmbed(pr, r.Embed, rel)
	}
	c.Views = parseViews(pr, r.Views)
	if pr.Len() > 0 {
		return nil, pr.Errs.Sorted()
	}
	return c, nil
}

// fillStreams gives the streams and the prefix a Config built in code
// left empty their defaults (ParseConfig fills them from the file).
func (c *Config) fillStreams() {
	c.Prefix = or(c.Prefix, manifest.DefaultFleetSubjectPrefix)
	c.AuditStream = or(c.AuditStream, manifest.DefaultFleetStream)
	c.CatalogStream = or(c.CatalogStream, fleet.DefaultCatalogStream)
	c.HistoryStream = or(c.HistoryStream, manifest.DefaultFleetHistoryStream)
	c.AlarmStream = or(c.AlarmStream, manifest.DefaultFleetAlarmStream)
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func parseNATS(pr *strictyaml.Problems, r *rawNATS, rel func(string) string) *NATS {
	n := &NATS{URLs: r.URLs, Domain: r.Domain, Fleet: manifest.Fleet{Enabled: true, URLs: r.URLs, CredentialsFile: rel(r.CredentialsFile), NKeySeedFile: rel(r.NKeySeedFile),
		User: r.User, PasswordFile: rel(r.PasswordFile)}}
	if len(r.URLs) == 0 {
		pr.Add("urls must not be empty", "the NATS servers, e.g. urls: [tls://nats1.example:4222, tls://nats2.example:4222, tls://nats3.example:4222]", "nats", "urls")
	}
	for i, s := range r.URLs {
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "nats" && u.Scheme != "tls") || u.Host == "" || u.User != nil {
			pr.Add(fmt.Sprintf("invalid NATS URL %s", strictyaml.Quote(s)), "nats://host:4222 or tls://host:4222 (credentials go in credentials_file, nkey_seed_file or user/password_file)", "nats", "urls", fmt.Sprint(i))
		}
	}
	if r.Domain != "" && !reToken.MatchString(r.Domain) {
		pr.Add(fmt.Sprintf("invalid domain %s", strictyaml.Quote(r.Domain)), "the hub's jetstream.domain: letters, digits, _ and -, e.g. hub", "nats", "domain")
	}
	ways := 0
	for _, s := range []string{r.CredentialsFile, r.NKeySeedFile, r.User} {
		if s != "" {
			ways++
		}
	}
	if ways > 1 {
		pr.Add("two ways to authenticate", "keep one of credentials_file, nkey_seed_file or user (with password_file)", "nats")
	}
	if r.PasswordFile != "" && r.User == "" {
		pr.Add("password_file without user", "add user: beside password_file", "nats", "password_file")
	}
	if t := r.TLS; t != nil {
		n.Fleet.TLSCA, n.Fleet.TLSCert, n.Fleet.TLSKey = rel(t.CA), rel(t.Cert), rel(t.Key)
		if (t.Cert == "") != (t.Key == "") {
			pr.Add("tls.cert and tls.key go together", "give both the client certificate and its key, or neither", "nats", "tls")
		}
	}
	return n
}

func parseEmbed(pr *strictyaml.Problems, r *rawEmbed, rel func(string) string) *Embed {
	e := &Embed{Listen: or(r.Listen, "127.0.0.1:4222"), StoreDir: rel(r.StoreDir), MaxStoreMB: r.MaxStoreMB}
	host, _, err := net.SplitHostPort(e.Listen)
	if err != nil {
		pr.Add(fmt.Sprintf("invalid listen %s", strictyaml.Quote(e.Listen)), "host:port, e.g. 127.0.0.1:4222", "embed", "listen")
	}
	if t := r.TLS; t != nil {
		e.TLSCert, e.TLSKey, e.TLSClientCA = rel(t.Cert), rel(t.Key), rel(t.ClientCA)
		if t.Cert == "" || t.Key == "" {
			pr.Add("tls needs cert and key", "the hub's certificate and its private key (PEM)", "embed", "tls")
		}
	}
	if ip := net.ParseIP(host); err == nil && (ip == nil || !ip.IsLoopback()) && host != "localhost" && e.TLSCert == "" {
		pr.Add(fmt.Sprintf("listen %s is off loopback without TLS", strictyaml.Quote(e.Listen)),
			"add embed.tls {cert, key} (the sites' passwords and the callers' credentials cross the network), or listen on 127.0.0.1", "embed", "listen")
	}
	if r.MaxStoreMB < 0 {
		pr.Add("max_store_mb must not be negative", "0 (nats-server's default) or a bound in MiB", "embed", "max_store_mb")
	}
	names := make([]string, 0, len(r.Sites))
	for name := range r.Sites {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		s := r.Sites[name]
		if !reToken.MatchString(name) {
			pr.AddKey(fmt.Sprintf("invalid site name %s", strictyaml.Quote(name)), "letters, digits, _ and - (the site's network.fleet.site)", "embed", "sites", name)
			continue
		}
		if (s.PasswordFile == "") == (s.NKey == "") {
			pr.Add("one of password_file or nkey", "password_file: a file holding the site's password, or nkey: its user's public NKey (U…)", "embed", "sites", name)
			continue
		}
		if s.NKey != "" && (!strings.HasPrefix(s.NKey, "U") || len(s.NKey) != 56) {
			pr.Add(fmt.Sprintf("%s is not a user's public NKey", strictyaml.Quote(s.NKey)), "the U… key `nk -inkey seed.nk -pubout` prints", "embed", "sites", name, "nkey")
		}
		e.Sites = append(e.Sites, EmbedSite{Name: name, PasswordFile: rel(s.PasswordFile), NKey: s.NKey})
	}
	if len(e.Sites) == 0 {
		pr.AddKey("no sites", "name each site's user: sites: {north: {password_file: north.pw}}", "embed", "sites")
	}
	return e
}

func parseViews(pr *strictyaml.Problems, raw map[string]rawView) []*manifest.View {
	names := make([]string, 0, len(raw))
	for name := range raw {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []*manifest.View
	for _, name := range names {
		r := raw[name]
		if !reView.MatchString(name) || strings.Contains(name, "__") {
			pr.AddKey(fmt.Sprintf("invalid view name %s", strictyaml.Quote(name)), "lowercase letters, digits and _, starting with a letter, e.g. north or observe", "views", name)
			continue
		}
		for i, k := range r.Kinds {
			if !slices.Contains(manifest.Kinds, k) {
				pr.Add(fmt.Sprintf("unknown kind %s", strictyaml.Quote(k)), strictyaml.OneOf(k, manifest.Kinds), "views", name, "kinds", fmt.Sprint(i))
			}
		}
		for i, s := range r.Sites {
			if !reToken.MatchString(s) {
				pr.Add(fmt.Sprintf("invalid site %s", strictyaml.Quote(s)), "a site's network.fleet.site: letters, digits, _ and -", "views", name, "sites", fmt.Sprint(i))
			}
		}
		for i, c := range r.Capabilities {
			if strings.HasPrefix(c, "read_") || strings.HasPrefix(c, "do_") {
				pr.Add(fmt.Sprintf("%s is a tool name, not a capability name", strictyaml.Quote(c)), "write the capability name without read_ or do_ (kinds: selects the kind)", "views", name, "capabilities", fmt.Sprint(i))
			}
		}
		out = append(out, &manifest.View{Name: name, Description: r.Description, Sites: r.Sites, Kinds: r.Kinds, Zones: r.Zones, Areas: r.Areas,
			Tags: r.Tags, Devices: r.Devices, Capability: r.Capabilities, Families: r.Families})
	}
	return out
}
