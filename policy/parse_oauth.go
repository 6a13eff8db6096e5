package policy

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/physd/physd/strictyaml"
)

// identity.oauth: physd as an OAuth 2.1 resource server.

type rawOAuth struct {
	Resource             string      `yaml:"resource"`
	SiteResource         string      `yaml:"site_resource"`
	FleetResource        string      `yaml:"fleet_resource"`
	AuthorizationServers []yaml.Node `yaml:"authorization_servers"`
	Algorithms           []string    `yaml:"algorithms"`
	ClockSkewSeconds     *int        `yaml:"clock_skew_seconds"`
	Scopes               *yaml.Node  `yaml:"scopes"`
}

type rawAuthServer struct {
	Issuer        string            `yaml:"issuer"`
	MetadataURL   string            `yaml:"metadata_url"`
	Introspection *rawIntrospection `yaml:"introspection"`
}

type rawIntrospection struct {
	ClientID         string `yaml:"client_id"`
	ClientSecretEnv  string `yaml:"client_secret_env"`
	ClientSecretFile string `yaml:"client_secret_file"`
}

// oauthAlgorithms are the JWS algorithms identity.oauth.algorithms may
// name: asymmetric only (an HS* key would be a secret shared with the AS,
// and none is no signature).
var oauthAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// defaultOAuthAlgorithms are what every OAuth AS signs with by default.
var defaultOAuthAlgorithms = []string{"RS256", "ES256"}

// defaultClockSkew tolerates the AS's and this gateway's clocks differing.
const defaultClockSkew = 30 * time.Second

const oauthExample = `oauth: {resource: https://gw1.plant.example/mcp, authorization_servers: [{issuer: https://login.plant.example}], scopes: {"physd:read": viewer, "physd:operate": operator}}`

func (p *parser) oauth(n *yaml.Node, pol *Policy) {
	if n == nil || strictyaml.IsNull(n) {
		return
	}
	const field = "identity.oauth"
	var r rawOAuth
	// An unknown key is reported and the rest still checked: every problem
	// at once.
	if !p.Decode(n, field, &r) && n.Kind != yaml.MappingNode {
		return
	}
	o := &OAuth{Resource: r.Resource, SiteResource: r.SiteResource, FleetResource: r.FleetResource, ClockSkew: defaultClockSkew}
	at := func(key string) *yaml.Node {
		if v := strictyaml.ValueOf(n, key); v != nil {
			return v
		}
		return n
	}
	if r.Resource == "" {
		p.Addf(n, field+".resource", "the URL clients connect to for /mcp, e.g. resource: https://gw1.plant.example/mcp (tokens must be issued for it)", "required")
	} else {
		p.resourceURL(at("resource"), field+".resource", r.Resource)
	}
	if r.SiteResource != "" {
		p.resourceURL(at("site_resource"), field+".site_resource", r.SiteResource)
		if r.SiteResource == r.Resource {
			p.Addf(at("site_resource"), field+".site_resource", "name the site (e.g. https://plant.example/mcp), or remove site_resource", "the same as resource")
		}
	}
	if r.FleetResource != "" {
		p.resourceURL(at("fleet_resource"), field+".fleet_resource", r.FleetResource)
		if r.FleetResource == r.Resource || r.FleetResource == r.SiteResource {
			p.Addf(at("fleet_resource"), field+".fleet_resource", "name the fleet endpoint's resource (e.g. https://fleet.example/mcp), or remove fleet_resource", "the same as resource or site_resource")
		}
	}
	p.authServers(n, r.AuthorizationServers, field+".authorization_servers", o)
	o.Algorithms = p.oauthAlgorithms(at("algorithms"), field+".algorithms", r.Algorithms)
	if s := r.ClockSkewSeconds; s != nil {
		if *s < 0 || *s > 300 {
			p.Addf(at("clock_skew_seconds"), field+".clock_skew_seconds", "0 to 300 seconds (30 by default); keep the gateway's clock in sync (NTP) instead", "%d is out of range", *s)
		}
		o.ClockSkew = time.Duration(*s) * time.Second
	}
	o.Scopes = p.oauthScopes(r.Scopes, n, field+".scopes")
	pol.Identity.OAuth = o
}

// resourceURL checks a resource identifier (RFC 8707 §2): an absolute
// URL without fragment or query, https unless the host is loopback.
func (p *parser) resourceURL(n *yaml.Node, field, s string) {
	if msg := checkOAuthURL(s); msg != "" {
		p.Addf(n, field, "write the absolute URL clients use, e.g. https://gw1.plant.example/mcp", "%q %s", s, msg)
	}
}

// checkOAuthURL says what is wrong with s as an issuer or resource URL.
func checkOAuthURL(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "is not a URL: " + err.Error()
	case u.Host == "" || (u.Scheme != "https" && u.Scheme != "http"):
		return "is not an absolute http(s) URL"
	case u.Scheme == "http" && !loopbackHost(u.Hostname()):
		return "uses http off loopback: OAuth needs https (tokens and keys travel over it)"
	case u.Fragment != "" || strings.Contains(s, "#"):
		return "has a fragment"
	case u.RawQuery != "":
		return "has a query"
	case u.User != nil:
		return "has user info"
	}
	return ""
}

func loopbackHost(h string) bool {
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// authServers reads authorization_servers: the issuers physd trusts.
func (p *parser) authServers(parent *yaml.Node, nodes []yaml.Node, field string, o *OAuth) {
	if len(nodes) == 0 {
		p.Addf(parent, field, "list the issuer of each authorization server, e.g. authorization_servers: [{issuer: https://login.plant.example}]", "required")
		return
	}
	seen := map[string]bool{}
	for i := range nodes {
		n := &nodes[i]
		f := fmt.Sprintf("%s[%d]", field, i)
		var r rawAuthServer
		if !p.Decode(n, f, &r) && n.Kind != yaml.MappingNode {
			continue
		}
		at := func(key string) *yaml.Node {
			if v := strictyaml.ValueOf(n, key); v != nil {
				return v
			}
			return n
		}
		if r.Issuer == "" {
			p.Addf(n, f+".issuer", "the AS's issuer identifier, exactly as its tokens' iss claim, e.g. issuer: https://login.plant.example", "required")
			continue
		}
		if msg := checkOAuthURL(r.Issuer); msg != "" {
			p.Addf(at("issuer"), f+".issuer", "the AS's issuer identifier, exactly as its tokens' iss claim (its metadata's issuer)", "%q %s", r.Issuer, msg)
		}
		if seen[r.Issuer] {
			p.Addf(at("issuer"), f+".issuer", "list each authorization server once", "duplicate issuer %q", r.Issuer)
		}
		seen[r.Issuer] = true
		if r.MetadataURL != "" {
			if msg := checkOAuthURL(r.MetadataURL); msg != "" {
				p.Addf(at("metadata_url"), f+".metadata_url", "the AS's metadata document, or remove the key to discover it (RFC 8414, then OpenID Connect discovery)", "%q %s", r.MetadataURL, msg)
			}
		}
		as := AuthServer{Issuer: r.Issuer, MetadataURL: r.MetadataURL}
		if r.Introspection != nil {
			as.Introspection = p.introspection(at("introspection"), f+".introspection", r.Introspection)
		}
		o.Servers = append(o.Servers, as)
	}
}

// introspection reads the client physd introspects opaque tokens as.
func (p *parser) introspection(n *yaml.Node, field string, r *rawIntrospection) *Introspection {
	in := &Introspection{ClientID: r.ClientID}
	if r.ClientID == "" {
		p.Addf(n, field+".client_id", "the client id this gateway has at the AS for token introspection", "required")
	}
	switch {
	case (r.ClientSecretEnv == "") == (r.ClientSecretFile == ""):
		p.Addf(n, field, "set exactly one of client_secret_env or client_secret_file", "one client secret source is required")
	case r.ClientSecretEnv != "":
		in.ClientSecret = os.Getenv(r.ClientSecretEnv)
		if in.ClientSecret == "" {
			p.Addf(strictyaml.ValueOf(n, "client_secret_env"), field+".client_secret_env", "export the introspection client's secret in "+r.ClientSecretEnv, "%s is not set", r.ClientSecretEnv)
		}
	default:
		b, err := os.ReadFile(r.ClientSecretFile)
		in.ClientSecret = strings.TrimSpace(string(b))
		if err != nil || in.ClientSecret == "" {
			p.Addf(strictyaml.ValueOf(n, "client_secret_file"), field+".client_secret_file", "a file holding the introspection client's secret", "cannot use %s: %v", r.ClientSecretFile, errOr(err, "empty"))
		}
	}
	return in
}

// oauthAlgorithms checks algorithms against the asymmetric JWS set.
func (p *parser) oauthAlgorithms(n *yaml.Node, field string, algs []string) []string {
	if len(algs) == 0 {
		return slices.Clone(defaultOAuthAlgorithms)
	}
	for _, a := range algs {
		if !slices.Contains(oauthAlgorithms, a) {
			fix := strictyaml.OneOf(a, oauthAlgorithms)
			if strings.HasPrefix(strings.ToUpper(a), "HS") || strings.EqualFold(a, "none") {
				fix = "use an asymmetric algorithm (" + strings.Join(oauthAlgorithms, ", ") + "): a resource server verifies with the AS's public keys"
			}
			p.Addf(strictyaml.ElemOf(n, a), field, fix, "algorithm %q is not accepted", a)
		}
	}
	return algs
}

// oauthScopes reads scopes: {scope: role}, lowest role first.
func (p *parser) oauthScopes(n, parent *yaml.Node, field string) []ScopeRole {
	if n == nil || len(strictyaml.Pairs(n)) == 0 {
		p.Addf(parent, field, `map each scope to the role it grants, e.g. scopes: {"physd:read": viewer, "physd:operate": operator, "physd:approve": supervisor}`, "required")
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.Addf(n, field, `a mapping of scope to role, e.g. {"physd:read": viewer}`, "is %s", strictyaml.Describe(n))
		return nil
	}
	var out []ScopeRole
	for _, kv := range strictyaml.Pairs(n) {
		scope, role := kv[0].Value, kv[1].Value
		f := field + "." + scope
		if !scopeToken(scope) {
			p.Addf(kv[0], f, "a scope is printable ASCII without spaces, quotes or backslashes (RFC 6749 §3.3), e.g. physd:read", "%q is not a scope", scope)
			continue
		}
		if role == "none" {
			p.Addf(kv[1], f, "map the scope to viewer, operator, supervisor or admin, or remove it", "grants no role")
			continue
		}
		if !p.role(kv[1], f, role) {
			continue
		}
		out = append(out, ScopeRole{Scope: scope, Role: role})
	}
	slices.SortStableFunc(out, func(a, b ScopeRole) int { return RoleLevel(a.Role) - RoleLevel(b.Role) })
	return out
}

// scopeToken is RFC 6749's scope-token: 1*( %x21 / %x23-5B / %x5D-7E ).
func scopeToken(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
