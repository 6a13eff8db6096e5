package web

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/physd/physd/policy"
)

// loginView is what login.html shows.
type loginView struct {
	Device      string
	CSRF        string
	Next        string
	Error       string
	Cert        string // a mapped client certificate's identity: sign in with it, no token
	Required    bool   // credentials are required here
	SignedInAs  string // the caller already has a session
	RetryAfterS int
}

// safeNext keeps a post-sign-in destination on this server: a path, never
// another origin ("//host", "/\host", a scheme).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") || strings.HasPrefix(next, "/login") {
		return "/"
	}
	return next
}

// serveLogin is GET /login (the sign-in form) and POST /login (sign in
// with a token, or with the client certificate when the form sends none).
func (s *Server) serveLogin(w http.ResponseWriter, r *http.Request) {
	v := loginView{Device: s.n.DeviceID(), Next: safeNext(r.FormValue("next")), Required: s.credentialsRequired()}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && s.opts.Guard != nil {
		if p, err := s.opts.Guard.Policy().Identity.AuthenticateCert(r.TLS.VerifiedChains[0]); err == nil {
			v.Cert = p.ID + " (" + p.Role + ")"
		}
	}
	if r.Method == http.MethodGet {
		ss, ok := s.sessionCaller(r)
		if ok {
			v.SignedInAs = ss.caller.ID + " (" + ss.caller.Role + ")"
		}
		v.CSRF = s.loginCSRF(w, r, ss, ok)
		writeHTML(w, http.StatusOK, "login.html", v, s)
		return
	}
	status, err := s.signIn(w, r)
	if err == nil {
		http.Redirect(w, r, v.Next, http.StatusSeeOther)
		return
	}
	ss, ok := s.sessionCaller(r)
	v.CSRF, v.Error = s.loginCSRF(w, r, ss, ok), err.Error()
	if wait := s.sessions.throttled(clientAddr(r), time.Now()); wait > 0 {
		v.RetryAfterS = int(wait.Seconds() + 0.999)
		w.Header().Set("Retry-After", fmt.Sprint(v.RetryAfterS))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="physd"`)
	}
	writeHTML(w, status, "login.html", v, s)
}

// loginCSRF is the CSRF token the sign-in form must carry: the one the
// boundary will check when it is posted (csrfOK). A browser with a live
// session posts it with its session cookie, so the session's token; the
// page offered such a browser the physd-csrf token, and its "sign in as
// someone else" was always refused (403). The cookie counts only without
// an Authorization header, as in identifyWith.
func (s *Server) loginCSRF(w http.ResponseWriter, r *http.Request, ss session, ok bool) string {
	if ok && len(r.Header.Values("Authorization")) == 0 {
		return ss.csrf
	}
	return preCSRF(w, r)
}

// clientAddr is the address failed sign-ins are counted by.
func clientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// signIn authenticates the form's token (and the client certificate, by
// the boundary's own rules: identify) and opens a session; it answers the
// status of a refusal and why.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) (int, error) {
	now, addr := time.Now(), clientAddr(r)
	// The try is counted as a failure before the credential is checked
	// (attempt), so concurrent tries cannot all pass the throttle; undo
	// takes it back for anything but a wrong credential.
	wait, undo := s.sessions.attempt(addr, now)
	if wait > 0 {
		return http.StatusTooManyRequests, fmt.Errorf("too many failed sign-ins from %s: try again in %d s", addr, int(wait.Seconds()+0.999))
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	probe := r.Clone(r.Context())
	probe.Header = r.Header.Clone()
	probe.Header.Del("Authorization")
	probe.Header.Del("Cookie") // the new session is decided by this form alone
	if token != "" {
		probe.Header.Set("Authorization", "Bearer "+token)
	}
	c, status, err := s.identify(probe)
	switch {
	case err == nil && c.ID == anonymous && !s.credentialsRequired():
		err = errors.New("this gateway needs no sign-in (it listens on loopback only and no credential is configured): open the console directly")
		status = http.StatusBadRequest
	case err == nil && c.ID == anonymous:
		err, status = errors.New("enter an access token"), http.StatusUnauthorized
	case err == nil && strings.HasPrefix(c.ID, policy.OAuthPrincipalPrefix) && strings.Count(token, ".") != 2:
		// An opaque token is checked by introspection on each request; a
		// session would outlive a revocation the AS reports.
		err, status = errors.New("sign in with a JWT access token or a policy token: an opaque OAuth token is checked with the authorization server on every request, which a session cannot do"), http.StatusBadRequest
	case err == nil && policy.RoleLevel(c.Role) < policy.RoleLevel("viewer"):
		err, status = errors.New(c.ID+" has the role "+c.Role+", which opens no console (viewer at least)"), http.StatusForbidden
	case err != nil:
		err = errors.New("sign-in refused: " + err.Error())
	}
	if err != nil {
		if status != http.StatusUnauthorized && status != http.StatusForbidden {
			undo()
		}
		s.log.Info("console sign-in refused", "status", status, "remote", r.RemoteAddr, "err", err)
		return status, err
	}
	expires := now.Add(SessionLifetime)
	if exp, ok := jwtExpiry(token); ok && exp.Before(expires) {
		expires = exp // a session never outlives the JWT that opened it
	}
	undo() // a right credential is no failure (but forgives none before it)
	var ident *policy.Identity
	if s.opts.Guard != nil {
		ident = &s.opts.Guard.Policy().Identity
	}
	id, _, err := s.sessions.open(c, proofOf(c, token, r, ident), now, expires)
	if err != nil {
		return http.StatusServiceUnavailable, err
	}
	setSessionCookie(w, r, id, expires.Sub(now))
	s.log.Info("console sign-in", "caller", c.ID, "role", c.Role, "remote", r.RemoteAddr)
	return http.StatusOK, nil
}

// serveLogout is POST /logout: the session ends on the server, and the
// cookie is cleared.
func (s *Server) serveLogout(w http.ResponseWriter, r *http.Request) {
	if id := sessionID(r); id != "" {
		s.sessions.close(id)
	}
	clearCookie(w, r, sessionCookie)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
