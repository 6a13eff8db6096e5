package web

import (
	"container/list"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
)

// Console sessions: a browser signs in once (a token, or its client
// certificate) and then carries an opaque cookie instead of a bearer
// header, because a browser cannot add an Authorization header to a
// navigation or a form. The cookie is a random 256-bit id; the server
// keeps, under the id's SHA-256, the caller the sign-in authenticated (its
// role and credentials, never the token), what proves it is still valid
// under the policy in force (proof), its expiry and a CSRF secret.

// The cookie names use a hyphen: "physd_" names physd's metrics (the docs
// test reads every such string as one).
const (
	sessionCookie = "physd-session"
	// preCSRFCookie carries the CSRF token of a browser without a session
	// (the sign-in form; the console when no credential is configured):
	// the form must echo it (double submit), which a page of another
	// origin cannot read.
	preCSRFCookie = "physd-csrf"
	csrfField     = "csrf"
	csrfHeader    = "X-CSRF-Token"

	// SessionLifetime bounds a session from its sign-in; SessionIdle ends
	// one nobody used for that long (an open console polls every second,
	// so only a closed or sleeping one idles).
	SessionLifetime = 8 * time.Hour
	SessionIdle     = time.Hour
	// maxSessions bounds the store; maxSessionsPerPerson makes a new
	// sign-in of one person replace their oldest session rather than grow
	// the store.
	maxSessions          = 512
	maxSessionsPerPerson = 8
)

// proof is what re-checks a session against the policy in force on every
// request: a session lives only while the credential it was opened with
// still gives the same role.
type proof struct {
	tokenSum  [32]byte // SHA-256 of the bearer token (policy or transport); zero: none
	transport bool     // the token was the transport token
	tokenID   string   // the policy token's id
	jwt       bool     // opened with a JWT: jwtProvider must stay trusted
	// jwtProvider is the fingerprint of the JWT provider (issuer, audience,
	// role claim and key) that verified the JWT: checking only that the
	// issuer stays trusted let a session outlive a reload that rotated the
	// key (after a leak) or changed the role claim, so that the JWT it was
	// opened with no longer proved the session's role, or anything.
	jwtProvider string
	certFP      string // the client certificate's certfp: credential; every request must present it
	// oauthIssuer and oauthScopes are an OAuth access token's issuer and
	// scopes (space-separated): the session lives while that issuer is an
	// authorization server of the policy and the scopes give its role.
	oauthIssuer, oauthScopes string
}

type session struct {
	caller   node.Caller
	proof    proof
	csrf     string
	created  time.Time
	expires  time.Time // absolute: created+SessionLifetime, or a JWT's exp when sooner
	lastSeen time.Time
	flash    string // a one-shot notice for the next page (a decision taken)
}

// sessions is the server-side store. Every method takes mu; the store is
// small (maxSessions) so a linear sweep on insert is cheap.
type sessions struct {
	mu    sync.Mutex
	byID  map[[32]byte]*session
	fails map[string]*failures // sign-in failures by client address
	// failOrder holds the fails entries least recently tried first, so
	// expiry and eviction take the front: O(1) per sign-in however many
	// addresses are tracked (at most maxFailAddrs).
	failOrder *list.List
}

func newSessions() *sessions {
	return &sessions{byID: map[[32]byte]*session{}, fails: map[string]*failures{}, failOrder: list.New()}
}

// randomToken is 32 random bytes, base64url: a session id or CSRF secret.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b)
}

func idKey(id string) [32]byte { return sha256.Sum256([]byte(id)) }

// errSessionsFull refuses a sign-in when the store is full of live
// sessions of other people: evicting someone else's would let any
// signed-in person sign the others out.
var errSessionsFull = errors.New("too many console sessions are open; sign out elsewhere or wait for one to expire")

// open stores a session for c and returns its id.
func (st *sessions) open(c node.Caller, p proof, now, expires time.Time) (string, *session, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweep(now)
	var own []([32]byte)
	for k, s := range st.byID {
		if slices.ContainsFunc(s.caller.Credentials, func(x string) bool { return slices.Contains(c.Credentials, x) }) {
			own = append(own, k)
		}
	}
	if len(own) >= maxSessionsPerPerson {
		oldest := own[0]
		for _, k := range own {
			if st.byID[k].created.Before(st.byID[oldest].created) {
				oldest = k
			}
		}
		delete(st.byID, oldest)
	}
	if len(st.byID) >= maxSessions {
		return "", nil, errSessionsFull
	}
	id := randomToken()
	c.Credential = "" // never the token
	s := &session{caller: c, proof: p, csrf: randomToken(), created: now, expires: expires, lastSeen: now}
	st.byID[idKey(id)] = s
	return id, s, nil
}

// sweep drops expired sessions (mu held).
func (st *sessions) sweep(now time.Time) {
	for k, s := range st.byID {
		if !s.live(now) {
			delete(st.byID, k)
		}
	}
	st.sweepFails(now)
}

// sweepFails drops the failure records not tried for failWindow, from the
// front of failOrder (mu held). It stops at the first live one: the cost
// is the number dropped, never the size of the table.
func (st *sessions) sweepFails(now time.Time) {
	for e := st.failOrder.Front(); e != nil; e = st.failOrder.Front() {
		f := e.Value.(*failures)
		if now.Sub(f.touched) <= failWindow {
			return
		}
		st.dropFail(f)
	}
}

func (st *sessions) dropFail(f *failures) {
	st.failOrder.Remove(f.elem)
	if st.fails[f.addr] == f {
		delete(st.fails, f.addr)
	}
}

func (s *session) live(now time.Time) bool {
	return now.Before(s.expires) && now.Sub(s.lastSeen) < SessionIdle
}

// lookup returns a copy of the live session of id and marks it used, or
// false. check, run under the lock, re-validates it against the policy in
// force; a session that fails it is deleted.
func (st *sessions) lookup(id string, now time.Time, check func(*session) bool) (session, bool) {
	if id == "" {
		return session{}, false
	}
	k := idKey(id)
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.byID[k]
	if !ok {
		return session{}, false
	}
	if !s.live(now) || !check(s) {
		delete(st.byID, k)
		return session{}, false
	}
	s.lastSeen = now
	return *s, true
}

// close deletes the session of id (sign-out).
func (st *sessions) close(id string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.byID, idKey(id))
}

// setFlash leaves a notice for the session's next page; takeFlash reads
// and clears it.
func (st *sessions) setFlash(id, msg string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if s, ok := st.byID[idKey(id)]; ok {
		s.flash = msg
	}
}

func (st *sessions) takeFlash(id string) string {
	st.mu.Lock()
	defer st.mu.Unlock()
	s, ok := st.byID[idKey(id)]
	if !ok {
		return ""
	}
	msg := s.flash
	s.flash = ""
	return msg
}

// ---- sign-in throttle ---------------------------------------------------

// Failed sign-ins from one client address: after freeFailures, each
// further attempt must wait a delay that doubles up to maxFailDelay, so a
// token cannot be guessed through the form at any useful rate.
const (
	freeFailures = 5
	maxFailDelay = time.Minute
	failWindow   = 15 * time.Minute
	// maxFailAddrs caps the addresses tracked: a flood from many source
	// addresses evicts the least recently tried record rather than grow the
	// table (an address evicted gets its free tries again, as one not yet
	// seen would: per-address counting never held against many addresses).
	maxFailAddrs = 4096
)

type failures struct {
	addr    string
	n       int
	last    time.Time
	until   time.Time
	touched time.Time // the latest try, refused ones too (last may be restored by an undo); failOrder and expiry are by it
	elem    *list.Element
}

// throttled is how long the address must still wait before a sign-in is
// tried, or 0.
func (st *sessions) throttled(addr string, now time.Time) time.Duration {
	st.mu.Lock()
	defer st.mu.Unlock()
	f := st.fails[addr]
	if f == nil || !now.Before(f.until) {
		return 0
	}
	return f.until.Sub(now)
}

// attempt reserves one sign-in try for addr at now. It answers the wait
// still due (> 0: refused, nothing counted), or counts the try as a
// failure before the credential is checked and answers the undo for a try
// that turns out not to be a wrong credential (a success, or a refusal
// that is not the caller's guess). The check and the count are one step
// under mu: a separate check, then a count after authenticating, let every
// concurrent try of a flood pass the check before any of them counted.
// A success undoes only its own try, never the address's earlier
// failures: forgiving them let a holder of one valid token (a viewer's)
// guess another (the admin's) without limit by signing in with their own
// every fifth guess.
func (st *sessions) attempt(addr string, now time.Time) (time.Duration, func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.sweepFails(now)
	f := st.fails[addr]
	if f == nil {
		if len(st.fails) >= maxFailAddrs {
			st.dropFail(st.failOrder.Front().Value.(*failures))
		}
		f = &failures{addr: addr}
		f.elem = st.failOrder.PushBack(f)
		st.fails[addr] = f
	}
	// a try, refused or counted, makes the address the most recently
	// tried: a throttled address under attack is the last one evicted
	if now.After(f.touched) {
		f.touched = now
	}
	st.failOrder.MoveToBack(f.elem)
	if now.Before(f.until) {
		return f.until.Sub(now), nil
	}
	prevLast, prevUntil := f.last, f.until
	f.n++
	f.last = now
	if f.n > freeFailures {
		f.until = now.Add(min(time.Second<<min(f.n-freeFailures-1, 6), maxFailDelay))
	}
	set := f.until
	return 0, func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		if g := st.fails[addr]; g == f {
			f.n--
			if f.last == now {
				f.last = prevLast
			}
			if f.until == set {
				f.until = prevUntil
			}
			if f.n <= 0 {
				st.dropFail(f)
			}
		}
	}
}

// ---- the session as a credential -----------------------------------------

// sessionID is the request's session cookie value ("" without one).
func sessionID(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	return c.Value
}

// sessionCaller is the caller of r's live session, re-checked against the
// policy in force and the request's client certificate.
func (s *Server) sessionCaller(r *http.Request) (session, bool) {
	return s.sessions.lookup(sessionID(r), time.Now(), func(ss *session) bool { return s.stillValid(ss, r) })
}

// stillValid reports whether the credential a session was opened with
// gives the same role under the policy in force now: a reload that removes
// or changes a token (its hash, not only its name), demotes it, or stops
// trusting a JWT issuer ends the session; a certificate session needs the
// same certificate on every request.
func (s *Server) stillValid(ss *session, r *http.Request) bool {
	p, role := ss.proof, ss.caller.Role
	var id *policy.Identity
	if s.opts.Guard != nil {
		id = &s.opts.Guard.Policy().Identity
	}
	switch {
	case p.transport:
		if s.opts.AuthToken == "" || subtle.ConstantTimeCompare(p.tokenSum[:], sha(s.opts.AuthToken)) != 1 {
			return false
		}
	case p.tokenID != "":
		if id == nil || !slices.ContainsFunc(id.Tokens, func(t policy.Token) bool {
			return t.ID == p.tokenID && t.Role == role && subtle.ConstantTimeCompare(t.SHA256[:], p.tokenSum[:]) == 1
		}) {
			return false
		}
	case p.oauthIssuer != "":
		if id == nil || id.OAuth == nil || id.OAuth.SessionRole(p.oauthIssuer, strings.Fields(p.oauthScopes)) != role {
			return false
		}
	case p.jwt:
		if id == nil || !id.TrustsJWTProvider(p.jwtProvider) {
			return false
		}
	}
	if p.certFP != "" {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || policy.CertFingerprint(r.TLS.VerifiedChains[0][0]) != p.certFP || id == nil {
			return false
		}
		cp, err := id.AuthenticateCert(r.TLS.VerifiedChains[0])
		if err != nil || cp.Role != role {
			return false
		}
	}
	return p != (proof{})
}

// proofOf is what re-checks a session opened by caller c with the bearer
// token (may be "") and the request r, under the identity id in force (nil:
// no policy).
func proofOf(c node.Caller, bearer string, r *http.Request, id *policy.Identity) proof {
	var p proof
	if bearer != "" {
		p.tokenSum = sha256.Sum256([]byte(bearer))
		switch {
		case c.ID == "transport-token" || strings.HasPrefix(c.ID, "transport-token via "):
			p.transport = true
		case strings.HasPrefix(c.ID, "token:"):
			p.tokenID, _, _ = strings.Cut(strings.TrimPrefix(c.ID, "token:"), " via ")
		case strings.HasPrefix(c.ID, policy.OAuthPrincipalPrefix):
			// Not a JWT provider's token: an authorization server's. Its
			// scopes are read from the JWT the sign-in just verified (an
			// opaque token has none to read: the sign-in refuses it).
			for _, cr := range c.Credentials {
				if iss, ok := policy.IssuerOf(cr); ok {
					p.oauthIssuer, p.oauthScopes = iss, oauthScopes(bearer)
				}
			}
		default:
			for _, cr := range c.Credentials {
				if strings.HasPrefix(cr, "jwt:") {
					p.jwt = true // with no provider found (a reload in between), the session fails its first check
					if id != nil {
						p.jwtProvider = id.JWTProviderOf(bearer)
					}
				}
			}
		}
	}
	if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 {
		fp := policy.CertFingerprint(r.TLS.VerifiedChains[0][0])
		if slices.Contains(c.Credentials, fp) && slices.ContainsFunc(c.Credentials, func(x string) bool { return strings.HasPrefix(x, "cert:") }) {
			p.certFP = fp // a mapped certificate: it must stay presented
		}
	}
	return p
}

// oauthScopes are the scopes of an OAuth JWT access token the policy
// already verified (scope, or scp as a list or a string), space-separated.
func oauthScopes(raw string) string {
	claims := jwt.MapClaims{}
	if _, _, err := jwt.NewParser().ParseUnverified(raw, claims); err != nil {
		return ""
	}
	var out []string
	if s, ok := claims["scope"].(string); ok {
		out = append(out, strings.Fields(s)...)
	}
	switch scp := claims["scp"].(type) {
	case string:
		out = append(out, strings.Fields(scp)...)
	case []any:
		for _, v := range scp {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return strings.Join(out, " ")
}

// jwtExpiry reads the expiry of a JWT the policy already verified.
func jwtExpiry(raw string) (time.Time, bool) {
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(raw, &claims); err != nil || claims.ExpiresAt == nil {
		return time.Time{}, false
	}
	return claims.ExpiresAt.Time, true
}

// setSessionCookie sends the session cookie: HttpOnly (no script reads
// it), SameSite=Strict (no other site's page sends it), Secure over TLS,
// host-only, and no longer than the session lives.
func setSessionCookie(w http.ResponseWriter, r *http.Request, id string, maxAge time.Duration) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", MaxAge: max(int(maxAge.Seconds()), 1),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

func clearCookie(w http.ResponseWriter, r *http.Request, name string) {
	http.SetCookie(w, &http.Cookie{Name: name, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
}

// preCSRF is the browser's sessionless CSRF token, set as a cookie when it
// has none.
func preCSRF(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(preCSRFCookie); err == nil && len(c.Value) == 43 {
		return c.Value
	}
	v := randomToken()
	http.SetCookie(w, &http.Cookie{Name: preCSRFCookie, Value: v, Path: "/", MaxAge: int(SessionLifetime.Seconds()),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode})
	return v
}

// csrfOK reports whether a state-changing request carries the CSRF token
// it needs: the session's secret when it came with a session, else the
// double-submit token of its physd-csrf cookie. The token comes in the
// X-CSRF-Token header or the form's csrf field (the form is parsed here,
// bounded).
func csrfOK(w http.ResponseWriter, r *http.Request, ss *session) bool {
	want := ""
	if ss != nil {
		want = ss.csrf
	} else if c, err := r.Cookie(preCSRFCookie); err == nil {
		want = c.Value
	}
	got := r.Header.Get(csrfHeader)
	if got == "" && isForm(r) {
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if err := r.ParseForm(); err == nil {
			got = r.PostForm.Get(csrfField)
		}
	}
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func isForm(r *http.Request) bool {
	mt := strings.ToLower(strings.TrimSpace(strings.Split(r.Header.Get("Content-Type"), ";")[0]))
	return mt == "application/x-www-form-urlencoded"
}
