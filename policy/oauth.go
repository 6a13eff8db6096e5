package policy

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"time"
)

// OAuth is identity.oauth: physd as an OAuth 2.1 resource server (the MCP
// authorization spec, RFC 9728, RFC 8707). The policy holds what the file
// says; Verifier, set by the daemon (package oauth), fetches metadata and
// keys and checks tokens.
type OAuth struct {
	// Resource is the canonical URL of /mcp as clients write it; a view
	// served at /mcp/<view> is Resource + "/" + view.
	Resource string
	// SiteResource, when set, is a resource identifier every gateway of
	// the site accepts as well: the audience of tokens that follow a call
	// routed across the mesh to the capability's owner.
	SiteResource string
	// FleetResource, when set, is the fleet endpoint's resource (physd
	// fleet): a token for it is accepted on a call the fleet forwarded
	// over NATS (Identity.AuthenticateFleet), and only there.
	FleetResource string
	Servers       []AuthServer
	// Algorithms are the JWS algorithms accepted (never none, never HS*:
	// a resource server holds no shared secret with the AS).
	Algorithms []string
	// ClockSkew is the tolerance on exp and nbf.
	ClockSkew time.Duration
	// Scopes map OAuth scopes to roles, lowest role first; a token's role is
	// the highest any of its scopes maps to.
	Scopes []ScopeRole
	// Verifier checks access tokens; nil refuses every OAuth token (a
	// policy parsed by `physd validate` has none).
	Verifier OAuthVerifier
}

// AuthServer is an authorization server physd trusts.
type AuthServer struct {
	// Issuer is the AS's issuer identifier, exactly as its tokens' iss.
	Issuer string
	// MetadataURL overrides discovery (RFC 8414, then OIDC discovery).
	MetadataURL string
	// Introspection, when set, lets opaque (non-JWT) tokens of this AS be
	// checked by RFC 7662 token introspection with these client
	// credentials.
	Introspection *Introspection
}

// Introspection is the client physd authenticates as at an RFC 7662
// introspection endpoint.
type Introspection struct {
	ClientID     string
	ClientSecret string
}

// ScopeRole is one scopes entry.
type ScopeRole struct {
	Scope string
	Role  string
}

// OAuthVerifier checks an access token for one of audiences and maps it
// to a principal (OAuth.Principal). Its errors are *OAuthRefusal.
type OAuthVerifier interface {
	Verify(ctx context.Context, token string, audiences []string) (Principal, error)
}

// OAuthRefusal is why an access token was refused. Public is what the
// caller is told; Detail (the token's audience, issuer, key id …) goes to
// the log and, when Audit, the audit: a caller that presents a token
// for another resource learns nothing about which resources physd is.
type OAuthRefusal struct {
	Public string
	Detail string
	// Audit is set for a token a trusted AS really issued (its signature
	// verified, or the AS vouched for it) for another resource; a forged
	// or expired one is only logged, so that nobody can make physd fsync
	// at will.
	Audit bool
}

func (e *OAuthRefusal) Error() string { return e.Public }

// OAuthPrincipalPrefix starts the Principal.ID of an OAuth caller.
const OAuthPrincipalPrefix = "oauth:"

// Principal is the principal of a verified token: its person is the
// issuer and subject (the same credential as a JWT provider's, so
// identity.people lists both alike), its role the highest its scopes map
// to (none when no scope maps).
func (o *OAuth) Principal(issuer, subject string, scopes []string) Principal {
	return Principal{ID: OAuthPrincipalPrefix + issuer + "/" + subject, Role: o.RoleOf(scopes), Credentials: []string{JWTCredential(issuer, subject)}}
}

// RoleOf is the highest role scopes map to, or none.
func (o *OAuth) RoleOf(scopes []string) string {
	role := "none"
	for _, s := range o.Scopes {
		if slices.Contains(scopes, s.Scope) && RoleLevel(s.Role) > RoleLevel(role) {
			role = s.Role
		}
	}
	return role
}

// ScopeFor is the scope to ask for to get at least role: the one that
// maps to the lowest role not below it ("" when none does).
func (o *OAuth) ScopeFor(role string) string {
	for _, s := range o.Scopes { // lowest role first
		if RoleLevel(s.Role) >= RoleLevel(role) {
			return s.Scope
		}
	}
	return ""
}

// ScopeNames are the scopes, lowest role first (scopes_supported).
func (o *OAuth) ScopeNames() []string {
	out := make([]string, len(o.Scopes))
	for i, s := range o.Scopes {
		out[i] = s.Scope
	}
	return out
}

// ResourceFor is the resource identifier of the MCP endpoint of a view
// ("" for /mcp).
func (o *OAuth) ResourceFor(view string) string {
	if view == "" {
		return o.Resource
	}
	return strings.TrimSuffix(o.Resource, "/") + "/" + url.PathEscape(view)
}

// Audiences are the token audiences accepted at the endpoint of view ("":
// /mcp and every route that is not a view's): the gateway's resource, the
// view's own, and the site's. A token for one view is accepted at that
// view only; a token for the gateway at all of them.
func (o *OAuth) Audiences(view string) []string {
	out := []string{o.Resource}
	if view != "" {
		out = append(out, o.ResourceFor(view))
	}
	if o.SiteResource != "" {
		out = append(out, o.SiteResource)
	}
	return out
}

// FleetAudiences are the token audiences accepted on a call the fleet
// endpoint forwarded: the gateway's own, the site's and the fleet's.
func (o *OAuth) FleetAudiences() []string {
	out := o.Audiences("")
	if o.FleetResource != "" {
		out = append(out, o.FleetResource)
	}
	return out
}

// MetadataURL is where RFC 9728 puts the metadata of a resource: the
// well-known path inserted before the resource's path.
func MetadataURL(resource string) string {
	u, err := url.Parse(resource)
	if err != nil {
		return ""
	}
	path := strings.TrimSuffix(u.EscapedPath(), "/")
	return u.Scheme + "://" + u.Host + "/.well-known/oauth-protected-resource" + path
}

// issuer reports whether iss is an authorization server of this policy.
func (o *OAuth) issuer(iss string) bool {
	return o != nil && slices.ContainsFunc(o.Servers, func(a AuthServer) bool { return a.Issuer == iss })
}

// SessionRole is the role an access token from issuer with these scopes
// gives under this policy now ("none" when issuer is no longer one of its
// authorization servers): what a console session opened with such a token
// re-checks on every request, so that a reload which drops the AS or remaps
// a scope ends the session.
func (o *OAuth) SessionRole(issuer string, scopes []string) string {
	if !o.issuer(issuer) {
		return "none"
	}
	return o.RoleOf(scopes)
}

// IssuerOf is the issuer of a person's JWT or OAuth credential
// (JWTCredential); ok is false for any other credential.
func IssuerOf(credential string) (issuer string, ok bool) { return jwtIssuerOf(credential) }

// introspects reports whether any authorization server checks opaque
// tokens.
func (o *OAuth) introspects() bool {
	return o != nil && slices.ContainsFunc(o.Servers, func(a AuthServer) bool { return a.Introspection != nil })
}
