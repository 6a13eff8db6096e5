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

	"github.com/physd/physd/node"
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
}

// Server is the MCP face of one node.
type Server struct {
	n    *node.Node
	mcp  *mcp.Server
	opts Options
	log  *slog.Logger
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
			// the tool list is fixed for a node's lifetime.
			Capabilities: &mcp.ServerCapabilities{
				Tools:     &mcp.ToolCapabilities{ListChanged: false},
				Resources: &mcp.ResourceCapabilities{ListChanged: false},
			},
			SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) {
				// Tool and resource lists change only with a restart.
				c.TTLMs, c.CacheScope = 60_000, "public"
			},
		})
	ts := &toolSet{n: n, stdioRole: opts.StdioRole}
	ts.register(s)
	srv := &Server{n: n, mcp: s, opts: opts, log: opts.Logger}
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
	mux.Handle("/mcp", s.requireOrigin(cop.Handler(s.requireToken(mcpHandler))))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "device_id": s.n.DeviceID(), "version": Version})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, checks := s.n.Ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, map[string]any{"ready": ok, "checks": checks})
	})
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

func (s *Server) requireToken(next http.Handler) http.Handler {
	if s.opts.AuthToken == "" {
		return next
	}
	want := sha256.Sum256([]byte(s.opts.AuthToken))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="physd"`)
			http.Error(w, "Unauthorized: send Authorization: Bearer <token>", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// callerFromHeader names an HTTP caller by a short, non-reversible digest of
// its bearer token (never the token itself, which would land in the audit).
func callerFromHeader(h http.Header) (string, bool) {
	tok, ok := strings.CutPrefix(h.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		return "", false
	}
	sum := sha256.Sum256([]byte(tok))
	return fmt.Sprintf("token:%x", sum[:6]), true
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
