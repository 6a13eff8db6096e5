package web

import (
	"context"
	"net/http"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
)

// physd as an OAuth 2.1 resource server on the HTTP side (the MCP
// authorization spec, 2026-07-28): the RFC 9728 metadata routes, the 401
// and 403 challenges, and the refusal of tokens in query strings. The
// tokens themselves are checked by package oauth through the policy.

// wellKnown is the RFC 9728 metadata path prefix.
const wellKnown = "/.well-known/oauth-protected-resource"

// mountOAuth adds the metadata routes: public (a client reads them before
// it has a token), and 404 while the policy in force has no
// identity.oauth (a reload may add or remove it).
func (s *Server) mountOAuth(b *boundary) {
	if s.opts.Guard == nil {
		return
	}
	public := routeRule{public: true}
	b.handle("GET "+wellKnown, public, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveMetadata(w, r, "") }))
	b.handle("GET "+wellKnown+"/mcp", public, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serveMetadata(w, r, "") }))
	b.handle("GET "+wellKnown+"/mcp/{view}", public, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("view")
		if s.n.Manifest().View(name) == nil {
			http.Error(w, "404 no view "+quote(name)+" in the manifest", http.StatusNotFound)
			return
		}
		s.serveMetadata(w, r, name)
	}))
}

// oauthConfig is the identity.oauth of the policy in force, or nil.
func (s *Server) oauthConfig() *policy.OAuth {
	if s.opts.Guard == nil {
		return nil
	}
	return s.opts.Guard.Policy().Identity.OAuth
}

// serveMetadata answers the Protected Resource Metadata of the MCP
// endpoint of view ("" for /mcp), with go-sdk's handler.
func (s *Server) serveMetadata(w http.ResponseWriter, r *http.Request, view string) {
	o := s.oauthConfig()
	if o == nil {
		http.Error(w, "404 this gateway is not an OAuth resource server (no identity.oauth in the policy)", http.StatusNotFound)
		return
	}
	meta := &oauthex.ProtectedResourceMetadata{
		Resource:               o.ResourceFor(view),
		ResourceName:           "physd " + s.n.DeviceID(),
		BearerMethodsSupported: []string{"header"},
		ScopesSupported:        o.ScopeNames(),
	}
	for _, as := range o.Servers {
		meta.AuthorizationServers = append(meta.AuthorizationServers, as.Issuer)
	}
	auth.ProtectedResourceMetadataHandler(meta).ServeHTTP(w, r)
}

// viewOf is the view whose MCP endpoint r is for, or "".
func viewOf(r *http.Request) string {
	v, ok := strings.CutPrefix(r.URL.Path, "/mcp/")
	if !ok || strings.Contains(v, "/") {
		return ""
	}
	return v
}

// challenge is the WWW-Authenticate of a 401 for a route that needs role
// need: with identity.oauth, RFC 9728's resource_metadata and the scope
// that grants the role, so that an MCP client can start authorization.
func (s *Server) challenge(r *http.Request, need string) string {
	o := s.oauthConfig()
	if o == nil {
		c := `Bearer realm="physd"`
		if hasBearer(r) {
			c += `, error="invalid_token"`
		}
		return c
	}
	params := []string{"resource_metadata=" + quoteParam(policy.MetadataURL(o.ResourceFor(viewOf(r))))}
	if sc := o.ScopeFor(need); sc != "" && need != "" {
		params = append(params, "scope="+quoteParam(sc))
	}
	if hasBearer(r) {
		params = append(params, `error="invalid_token"`)
	}
	return "Bearer " + strings.Join(params, ", ")
}

// insufficientScope sets the 403 step-up challenge for an OAuth caller
// whose scopes give less than need, and reports whether it did (other
// callers get a plain 403: no scope would help them).
func (s *Server) insufficientScope(w http.ResponseWriter, r *http.Request, c node.Caller, need string) bool {
	o := s.oauthConfig()
	if o == nil || !strings.HasPrefix(c.ID, policy.OAuthPrincipalPrefix) {
		return false
	}
	params := []string{`error="insufficient_scope"`}
	if sc := o.ScopeFor(need); sc != "" {
		params = append(params, "scope="+quoteParam(sc))
	}
	params = append(params, "resource_metadata="+quoteParam(policy.MetadataURL(o.ResourceFor(viewOf(r)))))
	w.Header().Set("WWW-Authenticate", "Bearer "+strings.Join(params, ", "))
	return true
}

// toolNeed is the least role of the do_ tool a 2026-07-28 MCP request
// names in its Mcp-Name header (the SDK checks the header against the
// body), or "" when the caller may run it or names none: an OAuth caller
// below it is answered 403 insufficient_scope before the call, so that
// its client can ask for the scope (step-up) instead of reading a
// refusal. The policy still checks the role of every call.
func (s *Server) toolNeed(r *http.Request, c node.Caller) string {
	if s.opts.Guard == nil || r.Method != http.MethodPost || !strings.HasPrefix(c.ID, policy.OAuthPrincipalPrefix) {
		return ""
	}
	tool := r.Header.Get("Mcp-Name")
	if tool == "" || !strings.HasPrefix(r.URL.Path, "/mcp") {
		return ""
	}
	if _, min, ok := s.opts.Guard.Policy().MayRun(tool, c.Role); !ok {
		return min
	}
	return ""
}

// queryToken refuses a request that carries an access token in its query
// string (OAuth 2.1 §5.2; the MCP spec forbids it): URLs end up in logs
// and browser history. physd never reads one there, and says so rather
// than ignore it.
func (b *boundary) queryToken(w http.ResponseWriter, r *http.Request) bool {
	if !r.URL.Query().Has("access_token") {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer error="invalid_request", error_description="send the access token in the Authorization header, never in the URL"`)
	b.refuse(w, r, http.StatusBadRequest, "query_token", "Bad Request: send the access token as Authorization: Bearer <token>, never in the query string")
	return true
}

// noteRefusal logs why a token was refused (what the answer does not
// say) and records in the audit a token a trusted AS issued for another
// resource.
func (s *Server) noteRefusal(ctx context.Context, r *http.Request, err error) {
	ref, ok := err.(*policy.OAuthRefusal)
	if !ok {
		return
	}
	s.log.InfoContext(ctx, "access token refused", "reason", ref.Public, "detail", ref.Detail, "path", r.URL.Path, "remote", r.RemoteAddr)
	if !ref.Audit || s.opts.Audit == nil {
		return
	}
	if _, aerr := s.opts.Audit.Append(&audit.Record{Event: "auth_refused", Reason: ref.Detail,
		Data: map[string]any{"path": r.URL.Path, "remote": r.RemoteAddr, "answer": ref.Public}}); aerr != nil {
		s.log.Error("audit write failed", "event", "auth_refused", "err", aerr)
	}
}

// quoteParam is an auth-param quoted-string (RFC 9110 §5.6.4).
func quoteParam(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
