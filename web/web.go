// Package web is physd's one HTTP surface: the boundary in front of every
// route (boundary.go), the MCP endpoints package mcpserver serves, health
// and readiness, /status, the operator's console (console.go, login.go,
// session.go), the emergency override, the
// approvals routes, /metrics and the simulator controls, and the listener
// (Serve, CheckListen). It imports mcpserver; mcpserver knows nothing of
// HTTP routes.
package web

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/history"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// Options configure the HTTP surface.
type Options struct {
	// AuthToken, when set, is a transport token: "Authorization: Bearer
	// <token>" authenticates its holder as a viewer on every route.
	AuthToken string
	// RequireCredentials makes every route but /healthz and /readyz need an
	// authenticated caller even without a token or policy identities (set
	// when physd listens off loopback or takes client certificates).
	RequireCredentials bool
	// AllowedHosts are Host names, besides localhost, loopback IPs and the
	// IP a connection arrived on, under which physd answers (DNS-rebinding
	// protection), e.g. the gateway's DNS name.
	AllowedHosts []string
	// TLS, when set, makes Serve speak HTTPS with this configuration.
	TLS    *tls.Config
	Logger *slog.Logger
	// SimControls are the simulator's development controls by bus name,
	// mounted at /sim/<bus>/ behind the same boundary (--sim-control).
	SimControls map[string]http.Handler
	// Guard is the policy and gate in force (nil: no policy). With it come
	// bearer identities, the emergency override route and, when the node
	// has an approval authority (node.Config.Approvals), the approvals
	// routes.
	Guard *guard.Guard
	// Audit records emergency overrides and approval decisions.
	Audit *audit.Log
	// Metrics, when set, is served at /metrics and counts the boundary's
	// refusals.
	Metrics *metrics.Metrics
	// PolicyPath names the policy file in /status.
	PolicyPath string
	// Mesh, when set, reports the mesh for /status.
	Mesh func() any
	// Fleet is /status's fleet uplink entry (nil: none).
	Fleet func() any
	// MeshReady, when set, is a /readyz check: the mesh is joined.
	MeshReady func() error
	// History, when set, draws the status page's charts.
	History *history.History
	// Alarms, when set, lists the active alarms in /status and on its page.
	Alarms *alarms.Engine
}

// Server is the HTTP face of one node: its MCP server's endpoints and the
// operational routes, behind one boundary.
type Server struct {
	start    time.Time
	n        *node.Node
	mcp      *mcpserver.Server
	opts     Options
	log      *slog.Logger
	refusals *prometheus.CounterVec // nil without metrics
	sessions *sessions              // the console's sign-ins (session.go)
	live     liveReads              // the console's reads (live.go)
}

// New builds the HTTP surface of ms (and of the node it serves).
func New(ms *mcpserver.Server, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{start: time.Now(), n: ms.Node(), mcp: ms, opts: opts, log: opts.Logger, sessions: newSessions()}
	if opts.Metrics != nil {
		s.refusals = newRefusalCounter(opts.Metrics.Registry)
	}
	return s
}

// Handler serves the MCP endpoints and the operational routes on one
// listener, every one of them behind the boundary (boundary.go). This
// table is the whole HTTP surface; docs/security.md lists it.
func (s *Server) Handler() http.Handler {
	viewer := routeRule{read: "viewer", write: "viewer"}
	b := newBoundary(s)
	b.handle("GET /healthz", routeRule{public: true}, http.HandlerFunc(s.serveHealth))
	b.handle("GET /readyz", routeRule{public: true}, http.HandlerFunc(s.serveReady))
	s.mountOAuth(b)
	b.handle("/mcp", viewer, s.mcp.Endpoint(""))
	// Views are looked up per request: a manifest reload may add or
	// remove them.
	b.handle("/mcp/{view}", viewer, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("view")
		if s.n.Manifest().View(name) == nil {
			http.Error(w, "404 no view "+quote(name)+" in the manifest (views: "+strings.Join(s.n.Manifest().ViewNames(), ", ")+")", http.StatusNotFound)
			return
		}
		s.mcp.Endpoint(name).ServeHTTP(w, r)
	}))
	b.handle("GET /status", viewer, http.HandlerFunc(s.serveStatus))
	// The operator's console (console.go) and its sign-in (login.go). The
	// sign-in page, sign-out and the static assets are public: the way in
	// must open without a credential (sign-in and sign-out still need the
	// CSRF token of the page they were posted from).
	b.handle("GET /{$}", viewer, http.HandlerFunc(s.serveConsole))
	b.handle("GET /console/live", viewer, http.HandlerFunc(s.serveLive))
	b.handle("GET /console/console.js", routeRule{public: true}, serveAsset("console.js", "text/javascript; charset=utf-8"))
	b.handle("GET /console/console.css", routeRule{public: true}, serveAsset("console.css", "text/css; charset=utf-8"))
	b.handle("/login", routeRule{public: true, form: true}, http.HandlerFunc(s.serveLogin))
	b.handle("POST /logout", routeRule{public: true, form: true}, http.HandlerFunc(s.serveLogout))
	if s.opts.Alarms != nil {
		b.handle("POST /console/alarms/ack", routeRule{read: "viewer", write: "operator", form: true}, http.HandlerFunc(s.serveAlarmAck))
	}
	if s.opts.Metrics != nil {
		b.handle("GET /metrics", viewer, s.opts.Metrics.Handler())
	}
	if s.opts.Guard != nil {
		b.handle("/emergency/override", routeRule{read: "viewer", writeAlways: func() string { return s.opts.Guard.Policy().Emergency.OverrideRole }},
			http.HandlerFunc(s.serveOverride))
	}
	if s.opts.Guard != nil {
		// Reading the rules is a viewer's; a bypass step always needs an
		// identity (the node checks the rule's bypass role and the
		// two-person rule), never the anonymous local caller.
		b.handle("GET /interlocks", viewer, http.HandlerFunc(s.serveInterlocks))
		bp := routeRule{read: "operator", writeAlways: func() string { return "operator" }}
		b.handle("/interlocks/{rule}/bypass", bp, http.HandlerFunc(s.serveBypass))
		b.handle("/interlocks/{rule}/bypass/{action}", bp, http.HandlerFunc(s.serveBypass))
	}
	if s.n.Approvals() != nil && s.opts.Guard != nil {
		// Listing shows what will happen (to those who may approve: it
		// names callers and keys); deciding always needs an identity
		// (operator at least; the request's approver_role is checked by
		// the handler), never the anonymous local caller.
		rule := routeRule{read: "operator", writeAlways: func() string { return "operator" }}
		b.handle("/approvals", rule, http.HandlerFunc(s.serveApprovals))
		b.handle("/approvals/{id}", rule, http.HandlerFunc(s.serveApprovals))
		rule.form = true
		b.handle("POST /console/approvals/{id}", rule, http.HandlerFunc(s.serveApprovalForm))
	}
	for bus, h := range s.opts.SimControls {
		prefix := "/sim/" + bus
		// Fault injection changes what every reader sees: an operator's act.
		b.handle(prefix+"/", routeRule{read: "viewer", write: "operator"}, http.StripPrefix(prefix, h))
	}
	return b
}

// serveHealth answers a liveness probe; the device id and version only to
// a caller that may see them (Server.detailed).
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	body := map[string]any{"status": "ok"}
	if s.detailed(r) {
		body["device_id"], body["version"] = s.n.DeviceID(), mcpserver.Version
	}
	writeJSON(w, http.StatusOK, body)
}

// serveReady answers a readiness probe: 200 or 503 with each check's name
// and state; the errors (which may name devices and addresses) only to a
// caller that may see them.
func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	ok, checks := s.n.Ready()
	if s.opts.MeshReady != nil {
		r := node.Readiness{Name: "mesh", OK: true}
		if err := s.opts.MeshReady(); err != nil {
			r.OK, r.Error, ok = false, err.Error(), false
		}
		checks = append(checks, r)
	}
	code := http.StatusOK
	if !ok {
		code = http.StatusServiceUnavailable
	}
	if !s.detailed(r) {
		for i := range checks {
			if checks[i].Error != "" {
				checks[i].Error = "details need the viewer role"
			}
		}
	}
	writeJSON(w, code, map[string]any{"ready": ok, "checks": checks})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve runs the HTTP server on l until ctx ends, then shuts down within
// grace.
func (s *Server) Serve(ctx context.Context, l net.Listener, grace time.Duration) error {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		TLSConfig:         s.opts.TLS,
	}
	errc := make(chan error, 1)
	go func() {
		if s.opts.TLS != nil {
			errc <- hs.ServeTLS(l, "", "") // certificates come from TLSConfig
			return
		}
		errc <- hs.Serve(l)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if e := <-errc; e != nil && !errors.Is(e, http.ErrServerClosed) {
		return e
	}
	return err
}
