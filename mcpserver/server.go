package mcpserver

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Options configure the MCP surface. The HTTP surface in front of it
// (the boundary, the operational routes, the listener) is package web's.
type Options struct {
	// StdioRole is the role of the local stdio caller.
	StdioRole string
	// MaxBodyBytes bounds a request body on an MCP endpoint (default 1 MiB).
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Guard is the policy and gate in force (nil: no policy), served as the
	// policy and gate resources. Approval rounds come from the node
	// (node.Config.Approvals).
	Guard *guard.Guard
	// Audit records the approvals a manifest reload voids.
	Audit *audit.Log
	// Metrics, when set, is fed by every tool call.
	Metrics *metrics.Metrics
	// Mesh, when set, reports the mesh as the physmcp://mesh resource.
	Mesh func() any
	// View, when set, is the stdio caller's view (--view): a manifest views: entry.
	View string
	// Families makes the default endpoint and stdio list one tool per
	// capability family instead of every instance (a view may decide
	// otherwise for its endpoint); see families.go.
	Families bool
	// Router, when set, lists and routes the tools of the site's other
	// nodes (a source argument picks the owner).
	Router Router
	// Fleet makes this the fleet endpoint's server (physd fleet): the
	// Router's owners are gateways of many sites, named by a site and a
	// device id, and the tools take a site argument (owners.go).
	Fleet bool
	// History, when set, is served as the physmcp://history/ resource
	// template (history.go).
	History *history.History
	// Alarms, when set, is served as physmcp://alarms and adds the active
	// alarms of matched capabilities to can_do's context.
	Alarms *alarms.Engine
	// Sites, when set (physd fleet), serves the sites' history and active
	// alarms from the fleet's hub (sites.go): physmcp://history/{site}/…,
	// physmcp://history and physmcp://alarms.
	Sites SiteRecords
	// ObsMinInterval is the least time between two updates of one
	// physmcp://obs/ resource (DefaultObsMinInterval when zero).
	ObsMinInterval time.Duration
}

// Server is the MCP face of one node.
type Server struct {
	n          *node.Node
	mcp        *mcp.Server
	streamable http.Handler // the stateless streamable HTTP transport of every endpoint
	opts       Options
	log        *slog.Logger
	stamps     *callerStamps // the boundary's caller tickets (caller.go)
	ts         *toolSet
	requests   sync.Map // Physd-Request id -> the HTTP request's context
	fams       familyTools

	obsMin      time.Duration // least time between two updates of one obs resource
	obsMu       sync.Mutex
	obsListed   map[string]bool // physmcp://obs/ resources listed, by URI
	obsTemplate bool            // ObsURITemplate is served (some capability is not exposed)
	obsWatched  sync.Map        // capability name -> struct{}: an obs resource of it was subscribed to (never forgotten: a stale entry costs one update nobody gets)
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
	srv := &Server{n: n, opts: opts, log: opts.Logger, stamps: newCallerStamps()}
	sdkOpts.SubscribeHandler = srv.subscribable
	sdkOpts.UnsubscribeHandler = func(context.Context, *mcp.UnsubscribeRequest) error { return nil }
	s := mcp.NewServer(&mcp.Implementation{Name: "physd", Title: "physd — PhysMCP edge node " + n.DeviceID(), Version: Version}, sdkOpts)
	srv.mcp = s
	srv.streamable = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: opts.MaxBodyBytes, Logger: opts.Logger,
			// The boundary (package web) checks Host against physd's own
			// allow-list (the SDK's check knows only loopback) and Origin
			// for every route.
			DisableLocalhostProtection: true})
	ts := &toolSet{n: n, stdioRole: opts.StdioRole, authn: srv.authenticate, metrics: opts.Metrics, sourceArg: opts.Router != nil, fleet: opts.Fleet}
	ts.askInView = srv.askInView
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
	if opts.Sites != nil {
		srv.addSiteResources(opts.Sites)
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

// Node is the node this server serves.
func (s *Server) Node() *node.Node { return s.n }

// Endpoint is the MCP endpoint of view (empty: the whole site) over
// stateless streamable HTTP. Mount it only behind physd's HTTP boundary
// (package web), which stamps the caller of every request (StampCaller);
// the endpoint sets the view and names the request for the tool handlers
// (views.go), replacing what a client sent.
func (s *Server) Endpoint(view string) http.Handler { return s.withView(view, s.streamable) }

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
