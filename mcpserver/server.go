package mcpserver

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Options configure the MCP surface.
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
	TLS *tls.Config
	// StdioRole is the role of the local stdio caller.
	StdioRole string
	// MaxBodyBytes bounds a request body on /mcp (default 1 MiB).
	MaxBodyBytes int64
	Logger       *slog.Logger
	// SimControls are the simulator's development controls by bus name,
	// mounted at /sim/<bus>/ behind the same boundary (--sim-control).
	SimControls map[string]http.Handler
	// Safety is the policy and gate in force (nil: no policy). With it come
	// approval rounds, bearer identities and the emergency override route.
	// Approvals come from the node (node.Config.Approvals).
	Guard *guard.Guard
	// Audit records emergency overrides.
	Audit *audit.Log
	// Metrics, when set, is served at /metrics and fed by every tool call.
	Metrics *metrics.Metrics
	// PolicyPath names the policy file in /status.
	PolicyPath string
	// Mesh, when set, reports the mesh for /status.
	Mesh func() any
	// MeshReady, when set, is a /readyz check: the mesh is joined.
	MeshReady func() error
	// View, when set, is the stdio caller's view (--view): a manifest views: entry.
	View string
	// Families makes the default endpoint and stdio list one tool per
	// capability family instead of every instance (a view may decide
	// otherwise for its endpoint); see families.go.
	Families bool
	// Router, when set, lists and routes the tools of the site's other
	// nodes (a source argument picks the owner).
	Router Router
	// History, when set, is served as the physmcp://history/ resource
	// template (history.go).
	History *history.History
	// Alarms, when set, is served as physmcp://alarms and adds the active
	// alarms of matched capabilities to can_do's context.
	Alarms *alarms.Engine
	// ObsMinInterval is the least time between two updates of one
	// physmcp://obs/ resource (DefaultObsMinInterval when zero).
	ObsMinInterval time.Duration
}

// Server is the MCP face of one node.
type Server struct {
	start     time.Time
	n         *node.Node
	mcp       *mcp.Server
	opts      Options
	log       *slog.Logger
	callerKey []byte // MACs the boundary's caller stamp
	ts        *toolSet
	requests  sync.Map // Physd-Request id -> the HTTP request's context
	fams      familyTools
	refusals  *prometheus.CounterVec // nil without metrics

	obsMin    time.Duration // least time between two updates of one obs resource
	obsMu     sync.Mutex
	obsListed map[string]string // physmcp://obs/ resources by URI: the capability they were listed for, as JSON
}

// ManifestURI is the resource holding the served manifest.
const ManifestURI = "physmcp://manifest"

// New builds the MCP server for n.
func New(n *node.Node, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = 1 << 20
	}
	if opts.StdioRole == "" {
		opts.StdioRole = "none"
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	sdkOpts := &mcp.ServerOptions{
		Instructions: Instructions,
		// Explicit capabilities: no deprecated logging capability, and
		// the lists are fixed for a node's lifetime. The SDK answers
		// prompts/list (empty) regardless, so prompts is declared too.
		Capabilities: &mcp.ServerCapabilities{
			// The mesh changes the list; a policy reload changes what
			// each role is shown; a manifest reload changes the tools and
			// the observation resources.
			Tools:     &mcp.ToolCapabilities{ListChanged: true},
			Resources: &mcp.ResourceCapabilities{ListChanged: true, Subscribe: true},
			Prompts:   &mcp.PromptCapabilities{ListChanged: false},
		},
		SetCacheable: func(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
			// The tool list depends on the caller's role (scopeMiddleware):
			// never shared between callers by a cache on the way.
			c.TTLMs, c.CacheScope = 60_000, "private"
			if liveResource(req) {
				c.TTLMs = 0 // an observation or its history is stale at once
			}
		},
	}
	srv := &Server{start: time.Now(), n: n, opts: opts, log: opts.Logger, callerKey: newCallerKey()}
	sdkOpts.SubscribeHandler = srv.subscribable
	sdkOpts.UnsubscribeHandler = func(context.Context, *mcp.UnsubscribeRequest) error { return nil }
	s := mcp.NewServer(&mcp.Implementation{Name: "physd", Title: "physd — PhysMCP edge node " + n.DeviceID(), Version: Version}, sdkOpts)
	srv.mcp = s
	if opts.Metrics != nil {
		srv.refusals = newRefusalCounter(opts.Metrics.Registry)
	}
	ts := &toolSet{n: n, stdioRole: opts.StdioRole, authn: srv.authenticate, metrics: opts.Metrics, sourceArg: opts.Router != nil}
	ts.scopeReport = func(extra *mcp.RequestExtra, in promcp.CanDoRequest, rep *promcp.CapabilityReport) {
		srv.scopeReport(srv.scopeOf(extra), in, rep)
		if opts.Alarms != nil {
			alarmContext(opts.Alarms, rep)
		}
	}
	ts.register(s)
	srv.ts = ts
	s.AddReceivingMiddleware(srv.scopeMiddleware)
	srv.scopeNotifications()
	if opts.Router != nil {
		ts.enableRouting(s, opts.Router)
	}
	srv.syncFamilies()
	if opts.Router != nil {
		opts.Router.OnChange(srv.syncFamilies)
	}
	srv.addPolicyResources()
	srv.addMeshResource()
	srv.addViewsResource()
	s.AddResource(&mcp.Resource{
		URI: ManifestURI, Name: "manifest", Title: "PhysMCP device manifest",
		Description: "The physmcp.manifest.yml this node serves, as JSON, with promcp_base and physmcp_version.",
		MIMEType:    "application/json",
	}, srv.readManifest)
	srv.addObservationResources(opts.ObsMinInterval)
	if opts.History != nil {
		srv.addHistoryResource(opts.History)
	}
	if opts.Alarms != nil {
		srv.addAlarmsResource(opts.Alarms)
	}
	return srv
}

// PolicyReloaded tells connected clients that their tool lists may have
// changed (the role filter reads the policy in force). The SDK sends
// tools/list_changed when a tool is (re)added: can_do is re-added as is.
func (s *Server) PolicyReloaded() {
	s.mcp.AddTool(canDoTool(), s.ts.handleCanDo)
}

// ManifestReloaded lists the tools and observation resources of the
// manifest now in force (node.Reload): added and changed ones are
// (re)added, removed ones removed, and the SDK tells connected clients
// (tools/list_changed, resources/list_changed). A routed tool of another
// gateway that has the name of a removed local one is listed again.
func (s *Server) ManifestReloaded() {
	if s.ts.routing != nil {
		s.ts.routing.relistLocal(func() map[string]bool { s.ts.syncLocal(s.mcp); return s.ts.localNames() })
	} else {
		s.ts.syncLocal(s.mcp)
	}
	s.syncFamilies()
	s.syncObservationResources()
	s.PolicyReloaded() // roles may list other tools now
	for _, rec := range s.ts.voidRedefined() {
		if s.opts.Audit != nil {
			if _, err := s.opts.Audit.Append(rec); err != nil {
				s.log.Error("audit write failed", "event", rec.Event, "err", err)
			}
		}
	}
}

// MCP returns the underlying SDK server.
func (s *Server) MCP() *mcp.Server { return s.mcp }

func (s *Server) readManifest(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	if sc := s.scopeOf(req.Extra); sc.view != nil {
		// Through a view, the manifest shows the view's capabilities only.
		m := *s.n.Manifest()
		m.Capabilities, m.Buses = nil, map[string]*manifest.Bus{}
		// Other views' selectors name capabilities outside this one.
		m.Views = []*manifest.View{s.shownView(sc.view)}
		for _, c := range s.n.Manifest().Capabilities {
			if sc.view.Match(s.n.Manifest().Subject(c)) {
				m.Capabilities = append(m.Capabilities, c)
				if b := s.n.Manifest().Buses[c.Binding.Bus]; b != nil {
					m.Buses[c.Binding.Bus] = b
				}
			}
		}
		return manifestResult(&m)
	}
	return manifestResult(s.n.Manifest())
}

func manifestResult(m *manifest.Manifest) (*mcp.ReadResourceResult, error) {
	body, err := manifestJSON(m)
	if err != nil {
		return nil, err
	}
	return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: ManifestURI, MIMEType: "application/json", Text: string(body)}}}, nil
}

// RunStdio serves MCP on stdin/stdout until the client closes stdin or ctx
// ends.
func (s *Server) RunStdio(ctx context.Context) error {
	return s.mcp.Run(ctx, &mcp.StdioTransport{})
}

// Handler serves /mcp and the operational routes on one listener, every
// one of them behind the boundary (boundary.go). This table is the whole
// HTTP surface; docs/security.md lists it.
func (s *Server) Handler() http.Handler {
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: s.opts.MaxBodyBytes, Logger: s.log,
			// The boundary checks Host against physd's own allow-list (the
			// SDK's check knows only loopback) and Origin for every route.
			DisableLocalhostProtection: true})
	viewer := routeRule{read: "viewer", write: "viewer"}
	b := newBoundary(s)
	b.handle("GET /healthz", routeRule{public: true}, http.HandlerFunc(s.serveHealth))
	b.handle("GET /readyz", routeRule{public: true}, http.HandlerFunc(s.serveReady))
	b.handle("/mcp", viewer, s.withView("", mcpHandler))
	// Views are looked up per request: a manifest reload may add or
	// remove them.
	b.handle("/mcp/{view}", viewer, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("view")
		if s.n.Manifest().View(name) == nil {
			http.Error(w, "404 no view "+quote(name)+" in the manifest (views: "+strings.Join(s.n.Manifest().ViewNames(), ", ")+")", http.StatusNotFound)
			return
		}
		s.withView(name, mcpHandler).ServeHTTP(w, r)
	}))
	b.handle("GET /status", viewer, http.HandlerFunc(s.serveStatus))
	b.handle("GET /{$}", viewer, http.HandlerFunc(s.servePage))
	if s.opts.Metrics != nil {
		b.handle("GET /metrics", viewer, s.opts.Metrics.Handler())
	}
	if s.opts.Guard != nil {
		b.handle("/emergency/override", routeRule{read: "viewer", writeAlways: func() string { return s.opts.Guard.Policy().Emergency.OverrideRole }},
			http.HandlerFunc(s.serveOverride))
	}
	if s.n.Approvals() != nil && s.opts.Guard != nil {
		// Listing shows what will happen (to those who may approve: it
		// names callers and keys); deciding always needs an identity
		// (operator at least; the request's approver_role is checked by
		// the handler), never the anonymous local caller.
		rule := routeRule{read: "operator", writeAlways: func() string { return "operator" }}
		b.handle("/approvals", rule, http.HandlerFunc(s.serveApprovals))
		b.handle("/approvals/{id}", rule, http.HandlerFunc(s.serveApprovals))
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
		body["device_id"], body["version"] = s.n.DeviceID(), Version
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
