package web

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
)

// The HTTP boundary: one layer in front of every route physd serves. For
// each request, in order:
//
//  1. Host must be a name of this server (DNS rebinding): localhost, a
//     loopback IP, the IP the connection arrived on, or a configured name
//     (Options.AllowedHosts). 403 otherwise, on every route.
//  2. Origin, when sent, must be this server's own origin; a cross-site
//     unsafe request without Origin (Sec-Fetch-Site) is refused too. 403.
//  3. The caller is identified once: bearer token (transport token, policy
//     token or JWT) and/or a verified client certificate. Each route names
//     the least role it needs (routeRule); a missing or bad credential is
//     401, a valid one with too low a role is 403. /healthz and /readyz are
//     the only routes without this step.
//  4. A POST body must be application/json: a browser cannot send that
//     cross-site without a CORS preflight, which physd never grants. 415.
//     The console's own routes (routeRule.form) also take HTML forms
//     (application/x-www-form-urlencoded), and only with a CSRF token.
//  5. CSRF: a state-changing request authenticated by a console session
//     cookie (session.go), and every form post, must carry its CSRF token
//     (the session's, or the physd-csrf cookie's without a session). 403.
//
// The caller found in step 3 travels to the MCP tool handlers and to this
// package's own routes in an internal header (mcpserver.Server.StampCaller),
// so a request is authenticated exactly once and mTLS identities reach the
// tools.

// routeRule is who may call a route.
type routeRule struct {
	// public routes skip the identity step: they tell no secrets.
	public bool
	// read and write are the least roles for GET/HEAD and for every other
	// method, enforced when credentials are required (credentialsRequired).
	read, write string
	// writeAlways, when set, is the least role for non-GET methods even when
	// no credentials are configured: only a policy identity can hold it.
	writeAlways func() string
	// form routes (the console's) accept HTML form posts besides JSON.
	form bool
}

// unknownRoute guards what no pattern matches (404, 405): an anonymous
// caller learns nothing about which routes exist when credentials are
// required.
var unknownRoute = routeRule{read: "viewer", write: "viewer"}

// need is the least role r needs, or "" for anyone.
func (rr routeRule) need(method string, credentialsRequired bool) string {
	safe := method == http.MethodGet || method == http.MethodHead
	if !safe && rr.writeAlways != nil {
		return rr.writeAlways()
	}
	if !credentialsRequired {
		return ""
	}
	if safe {
		return rr.read
	}
	return rr.write
}

// boundary is the outer handler: Host, Origin, identity and media type,
// then the route.
type boundary struct {
	s     *Server
	mux   *http.ServeMux
	rules map[string]routeRule // by mux pattern
	hosts map[string]bool      // allowed Host names besides loopback
	cop   *http.CrossOriginProtection
}

func newBoundary(s *Server) *boundary {
	b := &boundary{s: s, mux: http.NewServeMux(), rules: map[string]routeRule{}, hosts: map[string]bool{},
		cop: http.NewCrossOriginProtection()}
	for _, h := range s.opts.AllowedHosts {
		if n, ok := hostName(h); ok {
			b.hosts[n] = true
		}
	}
	return b
}

// handle mounts h at pattern behind rule.
func (b *boundary) handle(pattern string, rule routeRule, h http.Handler) {
	b.rules[pattern] = rule
	b.mux.Handle(pattern, h)
}

func (b *boundary) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Only the boundary may say who the caller is.
	r.Header.Del(mcpserver.CallerHeader)
	hdr := w.Header()
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("Cache-Control", "no-store")

	if !b.hostAllowed(r) {
		b.refuse(w, r, http.StatusForbidden, "host", "Forbidden: Host "+quote(r.Host)+" is not a name of this server (DNS rebinding protection); "+
			"connect by localhost or IP, or add the name with --allowed-host")
		return
	}
	if msg := b.crossOrigin(r); msg != "" {
		b.refuse(w, r, http.StatusForbidden, "origin", "Forbidden: "+msg)
		return
	}
	if b.queryToken(w, r) {
		return
	}
	_, pattern := b.mux.Handler(r)
	rule, ok := b.rules[pattern]
	if !ok {
		rule = unknownRoute
	}
	var ss *session
	if rule.public {
		// Public routes answer everyone; an authenticated caller may see
		// more (see Server.detailed).
		if c, sess, _, err := b.s.identifyWith(r); err == nil && c.ID != anonymous {
			defer b.s.mcp.StampCaller(r, c)()
			ss = sess
		}
	} else {
		caller, sess, status, err := b.s.identifyWith(r)
		ss = sess
		need := rule.need(r.Method, b.s.credentialsRequired())
		if err == nil {
			if tn := b.s.toolNeed(r, caller); policy.RoleLevel(tn) > policy.RoleLevel(need) {
				need = tn
			}
			if need != "" && policy.RoleLevel(caller.Role) < policy.RoleLevel(need) {
				if caller.ID == anonymous {
					status, err = http.StatusUnauthorized, errors.New("this route needs the "+need+" role: send Authorization: Bearer <token> or a client certificate")
				} else {
					status, err = http.StatusForbidden, errors.New("this route needs the "+need+" role or higher; "+caller.ID+" has "+caller.Role)
				}
			}
		}
		if err != nil {
			if status == http.StatusUnauthorized && r.Method == http.MethodGet && wantsHTML(r) && !hasBearer(r) {
				// A person's browser: the way in is the sign-in page, not a
				// 401 line it cannot act on.
				b.count(r, "unauthenticated")
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			if status == http.StatusUnauthorized {
				b.s.noteRefusal(r.Context(), r, err)
				w.Header().Set("WWW-Authenticate", b.s.challenge(r, need))
				b.refuse(w, r, status, "unauthenticated", "Unauthorized: "+err.Error())
			} else {
				b.s.insufficientScope(w, r, caller, need)
				b.refuse(w, r, status, "forbidden", "Forbidden: "+err.Error())
			}
			return
		}
		defer b.s.mcp.StampCaller(r, caller)()
	}
	if !safeMethod(r.Method) {
		form := isForm(r)
		if r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch {
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" && !(form && rule.form) {
				b.refuse(w, r, http.StatusUnsupportedMediaType, "media_type", "Unsupported Media Type: send the body as Content-Type: application/json")
				return
			}
		}
		// A session cookie and a form are what a browser sends by itself:
		// either needs the token only this origin's pages hold.
		if (ss != nil || form) && !csrfOK(w, r, ss) {
			b.refuse(w, r, http.StatusForbidden, "csrf", "Forbidden: missing or wrong CSRF token: post the form from this server's own page (reload it), "+
				"or send the session's token in the "+csrfHeader+" header")
			return
		}
	}
	b.mux.ServeHTTP(w, r)
}

func safeMethod(m string) bool { return m == http.MethodGet || m == http.MethodHead }

// hostAllowed is the DNS-rebinding check. A rebinding page reaches physd
// under the attacker's name, so only names physd knows as its own pass; an
// IP literal cannot be rebound, but is accepted only for loopback and the
// address the connection arrived on.
func (b *boundary) hostAllowed(r *http.Request) bool {
	host, ok := hostName(r.Host)
	if !ok {
		return false
	}
	if host == "localhost" || b.hosts[host] {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	local, _ := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	return local != nil && local.IP.Equal(ip)
}

// hostName is the lower-case host of a Host header without port, brackets
// or a trailing dot; ok is false when there is none or the port is not a
// number.
func hostName(hostport string) (string, bool) {
	host := hostport
	if h, port, err := net.SplitHostPort(hostport); err == nil {
		for _, c := range port {
			if c < '0' || c > '9' {
				return "", false
			}
		}
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")), ".")
	return host, host != "" && !strings.ContainsAny(host, "/@ ")
}

// crossOrigin says why a request comes from another origin, or "". The MCP
// transport requires a 403 for any Origin that is not the server's own,
// whatever the method; Go's CrossOriginProtection adds Sec-Fetch-Site for
// unsafe requests that carry no Origin.
func (b *boundary) crossOrigin(r *http.Request) string {
	origins := r.Header.Values("Origin")
	switch {
	case len(origins) > 1:
		return "more than one Origin header"
	case len(origins) == 1:
		o := origins[0]
		u, err := url.Parse(o)
		if o == "null" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return "Origin " + quote(o) + " is not this server's origin"
		}
	}
	if err := b.cop.Check(r); err != nil {
		return "cross-origin request (" + err.Error() + ")"
	}
	return ""
}

func (b *boundary) refuse(w http.ResponseWriter, r *http.Request, status int, reason, msg string) {
	b.count(r, reason)
	b.s.log.Info("http request refused", "status", status, "reason", reason, "method", r.Method, "path", r.URL.Path,
		"host", r.Host, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
	http.Error(w, msg, status)
}

// count counts a refusal in physd_http_refusals_total.
func (b *boundary) count(_ *http.Request, reason string) {
	if b.s.refusals != nil {
		b.s.refusals.WithLabelValues(reason).Inc()
	}
}

func newRefusalCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "physd_http_refusals_total",
		Help: "HTTP requests refused by the boundary, by reason (host, origin, unauthenticated, forbidden, media_type, csrf)."}, []string{"reason"})
	reg.MustRegister(c)
	return c
}

func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// ---- identity ----------------------------------------------------------

// anonymous is the ID of a caller that presented no credential.
const anonymous = "anonymous"

// credentialsRequired reports whether every route but /healthz and
// /readyz needs an authenticated caller: physd listens off loopback or
// takes client certificates (Options.RequireCredentials), or a transport
// token or policy identities are configured.
func (s *Server) credentialsRequired() bool {
	return s.opts.RequireCredentials || s.opts.AuthToken != "" ||
		(s.opts.Guard != nil && s.opts.Guard.Policy().Identity.Configured())
}

// identify establishes the caller of an HTTP request from its bearer token
// and its verified client certificate. With both, the two must give the
// same role: a token cannot raise, nor silently lower, what the
// certificate grants. status is 401 for a missing or bad credential and
// 403 for credentials that disagree.
func (s *Server) identify(r *http.Request) (node.Caller, int, error) {
	c, _, status, err := s.identifyWith(r)
	return c, status, err
}

// identifyWith is identify with the console session the caller came with
// (nil: none). A session cookie counts only when no Authorization header
// is sent: a header is the caller's explicit choice, and a cookie the
// browser added by itself must not raise or lower it.
func (s *Server) identifyWith(r *http.Request) (node.Caller, *session, int, error) {
	var ss *session
	c, err := s.authenticateBearerAt(r.Context(), r.Header, viewOf(r))
	if err == nil && len(r.Header.Values("Authorization")) == 0 {
		if got, ok := s.sessionCaller(r); ok {
			ss, c = &got, got.caller
		}
	}
	c.Transport = "http"
	if r.TLS != nil {
		c.Transport = "https"
	}
	if err != nil {
		return c, nil, http.StatusUnauthorized, err
	}
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return c, ss, 0, nil
	}
	chain := r.TLS.VerifiedChains[0]
	if ss != nil && slices.Contains(c.Credentials, policy.CertFingerprint(chain[0])) {
		return c, ss, 0, nil // the session was opened with this certificate (re-checked in stillValid)
	}
	c, status, err := s.withCert(c, chain)
	return c, ss, status, err
}

// withCert joins a verified client certificate to the caller c found from
// the bearer token or session.
func (s *Server) withCert(c node.Caller, chain []*x509.Certificate) (node.Caller, int, error) {
	var id policy.Identity
	if s.opts.Guard != nil {
		id = s.opts.Guard.Policy().Identity
	}
	p, err := id.AuthenticateCert(chain)
	switch {
	case err != nil && c.ID != anonymous:
		// An unmapped certificate only opened the TLS session; the token
		// decides the role, and the certificate is still one of the
		// credentials this person proved.
		c.Credentials = append(slices.Clone(c.Credentials), policy.CertFingerprint(chain[0]))
		return c, 0, nil
	case err != nil:
		return c, http.StatusUnauthorized, err
	case c.ID != anonymous && c.Role != p.Role:
		return c, http.StatusForbidden, errors.New("the client certificate (" + p.ID + ", role " + p.Role + ") and the bearer token (" +
			c.ID + ", role " + c.Role + ") disagree; send one credential, or make them name the same role")
	case c.ID != anonymous:
		// One caller, two credentials: the person is both (the two-person
		// rule compares every credential presented).
		c.ID += " via " + p.ID
		c.Credentials = append(slices.Clone(c.Credentials), p.Credentials...)
		return c, 0, nil
	}
	return node.Caller{ID: p.ID, Role: p.Role, Transport: c.Transport, Credentials: p.Credentials}, 0, nil
}

// authenticateBearer maps the Authorization header to a caller: the
// transport token (--auth-token-file) is a viewer; a policy identity
// (hashed token or JWT) carries its role; no credential is anonymous
// (role none).
func (s *Server) authenticateBearer(h http.Header) (node.Caller, error) {
	return s.authenticateBearerAt(context.Background(), h, "")
}

// authenticateBearerAt is authenticateBearer at the MCP endpoint of a
// view ("" for every other route): an OAuth token must be for that
// endpoint's resource (policy.Identity.AuthenticateAt).
func (s *Server) authenticateBearerAt(ctx context.Context, h http.Header, view string) (node.Caller, error) {
	return s.authenticateBearerWith(h, func(id *policy.Identity, bearer string) (policy.Principal, error) {
		return id.AuthenticateAt(ctx, bearer, view)
	})
}

// authenticateBearerWith maps the Authorization header to a caller, with
// auth checking a bearer against the policy's identities.
func (s *Server) authenticateBearerWith(h http.Header, auth func(id *policy.Identity, bearer string) (policy.Principal, error)) (node.Caller, error) {
	c := node.Caller{ID: anonymous, Role: "none", Transport: "http", Credentials: []string{anonymous}}
	auths := h.Values("Authorization")
	switch {
	case len(auths) == 0:
		return c, nil
	case len(auths) > 1:
		return c, errors.New("send one Authorization header")
	}
	scheme, bearer, _ := strings.Cut(auths[0], " ")
	if !strings.EqualFold(scheme, "Bearer") || bearer == "" {
		return c, errors.New("the Authorization header must be \"Bearer <token>\"")
	}
	if s.opts.AuthToken != "" && hmac.Equal(sha(bearer), sha(s.opts.AuthToken)) {
		return node.Caller{ID: "transport-token", Role: "viewer", Transport: "http", Credentials: []string{"transport-token"}}, nil
	}
	if s.opts.Guard != nil && s.opts.Guard.Policy().Identity.Configured() {
		p, err := auth(&s.opts.Guard.Policy().Identity, bearer)
		if err != nil {
			return c, err
		}
		return node.Caller{ID: p.ID, Role: p.Role, Transport: "http", Credentials: p.Credentials}, nil
	}
	return c, errors.New("the bearer token is not accepted here")
}

// AuthenticateCredential maps a bearer token or JWT a caller presented to
// another gateway, which forwarded it with a routed call, to a caller of
// this gateway's policy (the transport token, policy tokens, JWT
// providers): the owner of a capability decides who is calling, never the
// gateway that routed the call.
func (s *Server) AuthenticateCredential(credential string) (node.Caller, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+credential)
	c, err := s.authenticateBearer(h)
	c.Credential = ""
	return c, err
}

// AuthenticateFleetCredential is AuthenticateCredential for a call the
// fleet endpoint (physd fleet) forwarded over NATS: an OAuth token may
// also be for the policy's fleet_resource. The fleet never vouches for
// anyone either.
func (s *Server) AuthenticateFleetCredential(credential string) (node.Caller, error) {
	h := http.Header{}
	h.Set("Authorization", "Bearer "+credential)
	c, err := s.authenticateBearerWith(h, func(id *policy.Identity, bearer string) (policy.Principal, error) {
		return id.AuthenticateFleet(context.Background(), bearer)
	})
	c.Credential = ""
	return c, err
}

func hasBearer(r *http.Request) bool { return r.Header.Get("Authorization") != "" }

func sha(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

// detailed reports whether a public route may answer r with details
// (device id, version, readiness errors naming devices and addresses):
// always when credentials are not required, else to an authenticated
// viewer.
func (s *Server) detailed(r *http.Request) bool {
	if !s.credentialsRequired() {
		return true
	}
	c, ok := s.mcp.StampedCaller(r.Header)
	return ok && policy.RoleLevel(c.Role) >= policy.RoleLevel("viewer")
}

// authenticate is the caller of a request to one of this package's routes,
// given its headers: the one the boundary established, else (a handler
// reached without the boundary) the bearer token alone.
func (s *Server) authenticate(h http.Header) (node.Caller, error) {
	if c, ok := s.mcp.StampedCaller(h); ok {
		return c, nil
	}
	if h.Get(mcpserver.CallerHeader) != "" {
		return node.Caller{}, errors.New("the request's caller stamp does not verify")
	}
	return s.authenticateBearer(h)
}
