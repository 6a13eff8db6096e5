package mcpserver

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/gate"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
	"github.com/physd/physd/safety"
)

// Options configure the MCP surface.
type Options struct {
	// AuthToken, when set, is required as "Authorization: Bearer <token>"
	// on /mcp. It is mandatory for a non-loopback listener.
	AuthToken string
	// StdioRole is the role of the local stdio caller.
	StdioRole string
	// MaxBodyBytes bounds a request body on /mcp (default 1 MiB).
	MaxBodyBytes int64
	Logger       *slog.Logger
	// ExtraRoutes are mounted as given (pattern → handler), e.g. the
	// simulator's development controls under /sim/.
	ExtraRoutes map[string]http.Handler
	// Safety is the policy and gate in force (nil: no policy). With it come
	// approval rounds, bearer identities and the emergency override route.
	Safety    *safety.Guard
	Approvals *gate.Approvals
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
	// Router, when set, lists and routes the tools of the site's other
	// nodes (a source argument picks the owner).
	Router Router
}

// Server is the MCP face of one node.
type Server struct {
	start time.Time
	n     *node.Node
	mcp   *mcp.Server
	opts  Options
	log   *slog.Logger
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
	s := mcp.NewServer(&mcp.Implementation{Name: "physd", Title: "physd — PhysMCP edge node " + n.DeviceID(), Version: Version},
		&mcp.ServerOptions{
			Instructions: Instructions,
			// Explicit capabilities: no deprecated logging capability, and
			// the lists are fixed for a node's lifetime. The SDK answers
			// prompts/list (empty) regardless, so prompts is declared too.
			Capabilities: &mcp.ServerCapabilities{
				Tools:     &mcp.ToolCapabilities{ListChanged: opts.Router != nil}, // the mesh changes the list
				Resources: &mcp.ResourceCapabilities{ListChanged: false},
				Prompts:   &mcp.PromptCapabilities{ListChanged: false},
			},
			SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
				// Tool and resource lists change only with a restart.
				c.TTLMs, c.CacheScope = 60_000, "public"
			},
		})
	srv := &Server{start: time.Now(), n: n, mcp: s, opts: opts, log: opts.Logger}
	ts := &toolSet{n: n, stdioRole: opts.StdioRole, authn: srv.authenticate, metrics: opts.Metrics, sourceArg: opts.Router != nil}
	if opts.Safety != nil {
		ts.approvals = opts.Approvals
	}
	ts.register(s)
	if opts.Router != nil {
		ts.enableRouting(s, opts.Router)
	}
	srv.addPolicyResources()
	srv.addMeshResource()
	s.AddResource(&mcp.Resource{
		URI: ManifestURI, Name: "manifest", Title: "PhysMCP device manifest",
		Description: "The physmcp.manifest.yml this node serves, as JSON, with promcp_base and physmcp_version.",
		MIMEType:    "application/json",
	}, srv.readManifest)
	return srv
}

// MCP returns the underlying SDK server.
func (s *Server) MCP() *mcp.Server { return s.mcp }

func (s *Server) readManifest(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	body, err := manifestJSON(s.n.Manifest())
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

// IsLoopback reports whether a listen address binds only to loopback.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckListen refuses a non-loopback bind unless it is explicitly allowed
// and protected by a token.
func CheckListen(addr string, allowRemote bool, token string) error {
	if IsLoopback(addr) {
		return nil
	}
	if !allowRemote {
		return fmt.Errorf("--http %s is not a loopback address: physd binds to 127.0.0.1 by default because tools here move real equipment; "+
			"to listen on a network, pass --allow-remote and an auth token (--auth-token-file or PHYSD_AUTH_TOKEN)", addr)
	}
	if len(token) < 16 {
		return fmt.Errorf("--http %s with --allow-remote needs an auth token of at least 16 characters (--auth-token-file or PHYSD_AUTH_TOKEN)", addr)
	}
	return nil
}

// Handler serves /mcp and the operational routes on one listener.
func (s *Server) Handler() http.Handler {
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return s.mcp },
		&mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true, MaxRequestBodyBytes: s.opts.MaxBodyBytes, Logger: s.log})
	// The SDK checks Host (DNS rebinding) but not Origin: a browser page on
	// another origin must never reach a tool that moves equipment.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Forbidden: cross-origin request (Origin "+r.Header.Get("Origin")+")", http.StatusForbidden)
	}))
	mux := http.NewServeMux()
	mux.Handle("/mcp", s.requireOrigin(cop.Handler(s.requireAuth(mcpHandler))))
	if s.opts.Safety != nil {
		mux.Handle("/emergency/override", s.requireOrigin(cop.Handler(http.HandlerFunc(s.serveOverride))))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "device_id": s.n.DeviceID(), "version": Version})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
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
		writeJSON(w, code, map[string]any{"ready": ok, "checks": checks})
	})
	if s.opts.Metrics != nil {
		mux.Handle("GET /metrics", s.opts.Metrics.Handler())
	}
	mux.HandleFunc("GET /status", s.serveStatus)
	mux.HandleFunc("GET /{$}", s.servePage)
	for pattern, h := range s.opts.ExtraRoutes {
		mux.Handle(pattern, s.requireOrigin(h))
	}
	return mux
}

// requireOrigin rejects any Origin that is not this server's own. Go's
// CrossOriginProtection lets requests without Sec-Fetch-Site through when
// Origin matches Host; an Origin naming another host (or "null") is refused
// here for every method, as the MCP transport spec requires.
func (s *Server) requireOrigin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := r.Header.Get("Origin"); o != "" {
			host := strings.TrimPrefix(strings.TrimPrefix(o, "http://"), "https://")
			if o == "null" || !strings.EqualFold(host, r.Host) {
				http.Error(w, "Forbidden: Origin "+o+" is not allowed", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// authenticate maps an HTTP request's bearer credential to a caller: the
// transport token (--auth-token-file) is an anonymous caller with role
// none; a policy identity (hashed token or JWT) carries its role; no
// credential is anonymous, allowed only when no transport token is set.
func (s *Server) authenticate(h http.Header) (node.Caller, error) {
	c := node.Caller{ID: "anonymous", Role: "none", Transport: "http"}
	bearer, has := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !has || bearer == "" {
		if s.opts.AuthToken != "" {
			return c, errors.New("send Authorization: Bearer <token>")
		}
		return c, nil
	}
	if s.opts.AuthToken != "" {
		want := sha256.Sum256([]byte(s.opts.AuthToken))
		got := sha256.Sum256([]byte(bearer))
		if subtle.ConstantTimeCompare(got[:], want[:]) == 1 {
			c.ID = "transport-token"
			return c, nil
		}
	}
	if s.opts.Safety != nil && s.opts.Safety.Policy().Identity.Configured() {
		p, err := s.opts.Safety.Policy().Identity.Authenticate(bearer)
		if err != nil {
			return c, err
		}
		return node.Caller{ID: p.ID, Role: p.Role, Transport: "http"}, nil
	}
	return c, errors.New("the bearer token is not accepted here")
}

// requireAuth refuses a request whose credential does not authenticate.
func (s *Server) requireAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := s.authenticate(r.Header); err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="physd"`)
			http.Error(w, "Unauthorized: "+err.Error(), http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
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
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(l) }()
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
