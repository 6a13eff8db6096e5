// Package daemon is `physd run` once its flags are parsed and its files
// checked: the components of a gateway started in one explicit order,
// stopped in the reverse order, and reloaded as one transaction.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/history"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/mqtt"
	"github.com/physd/physd/node"
	"github.com/physd/physd/sdnotify"
	"github.com/physd/physd/store"
	"github.com/physd/physd/web"
)

// A component is one part of the running gateway. start may use what the
// components before it built; stop (nil: nothing to stop) undoes start.
type component struct {
	name  string
	start func(ctx context.Context) error
	stop  func(ctx context.Context)
}

// Daemon is one running gateway. Its fields are filled by the components'
// start, in order; a component reads only what the ones before it built.
type Daemon struct {
	cfg   Config
	log   *slog.Logger
	begin time.Time
	token string
	mx    *metrics.Metrics
	parts []component

	ctx    context.Context // ends on SIGINT/SIGTERM, stdin closing or a listener failing
	cancel context.CancelFunc

	st            *store.Store
	sink          audit.Sink
	pub           *mqtt.Publisher // nil without --mqtt-url
	up            *fleet.Uplink   // nil without network.fleet
	fsrv          *fleet.Server   // nil unless network.fleet serves something
	al            *audit.Log
	guard         *guard.Guard // the policy (nil without --policy)
	inForce       *guard.Guard // the policy, or the manifest-only guard: reloads replace its rules
	approvals     *approval.Authority
	nodeGuard     node.Guard
	peers         peers
	remote        *meshnode.Remote // nil without a mesh
	n             *node.Node
	stopDrain     func() bool
	cancelSignals context.CancelFunc
	simControls   map[string]http.Handler
	hist          *history.History // nil with history off
	alarms        *alarms.Engine
	site          *mesh.Mesh // nil without a mesh
	creds         credentials
	sec           httpSecurity
	srv           *mcpserver.Server
	web           *web.Server
	rl            *reloader
	md            *mdnsService
	mcpAddr       net.Addr // the HTTP listener's (nil over stdio only)
	serving       int
	served        chan error
	notify        *sdnotify.Notifier
}

// New checks what the flags alone decide (the stdio role, the token, the
// listener's exposure) and lists the components; it opens nothing.
func New(cfg Config) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: cfg.Logger, begin: time.Now(), mx: metrics.New(), md: &mdnsService{}, served: make(chan error, 2)}
	tuneGC(cfg.Manifest)
	switch cfg.StdioRole {
	case "none", "viewer", "operator", "supervisor", "admin":
	default:
		return nil, fmt.Errorf("--stdio-role %q: use none, viewer, operator, supervisor or admin", cfg.StdioRole)
	}
	if d.cfg.HTTPAddr == "" && !cfg.Stdio {
		d.cfg.HTTPAddr = "127.0.0.1:8080"
	}
	var err error
	if d.token, err = readToken(cfg.TokenFile); err != nil {
		return nil, err
	}
	if d.cfg.HTTPAddr != "" {
		if err := checkExposure(d.cfg, d.token); err != nil {
			return nil, err
		}
	}
	if d.notify, err = sdnotify.New(d.log); err != nil {
		return nil, err
	}
	d.parts = d.components()
	return d, nil
}

// readToken is the bearer token /mcp requires: the --auth-token-file's
// first line, else $PHYSD_AUTH_TOKEN. An empty file is refused: it would
// silently serve without the token the flag asked for.
func readToken(file string) (string, error) {
	if file == "" {
		return os.Getenv("PHYSD_AUTH_TOKEN"), nil
	}
	const fix = "fix: give a file that holds the bearer token on one line, readable by the user physd runs as (or drop the flag and set PHYSD_AUTH_TOKEN)"
	b, err := os.ReadFile(file)
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return "", fmt.Errorf("--auth-token-file %s: cannot read it (%v); %s", file, pe.Err, fix)
	}
	if err != nil {
		return "", fmt.Errorf("--auth-token-file %s: %w; %s", file, err, fix)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--auth-token-file %s is empty; %s", file, fix)
	}
	return tok, nil
}

// Run starts the components in order, serves until ctx ends (or stdin
// closes, or a listener fails), then stops the started components in
// the reverse order, each within the shutdown grace.
func (d *Daemon) Run(ctx context.Context) error {
	d.ctx, d.cancel = context.WithCancel(ctx)
	defer d.cancel()
	started := 0
	defer func() { d.stop(started) }()
	for _, c := range d.parts {
		if err := c.start(d.ctx); err != nil {
			return err
		}
		started++
	}
	ready, _ := d.n.Ready()
	m := d.cfg.Manifest
	d.log.Info("ready", "device_id", m.Device.ID, "capabilities", len(m.Capabilities), "state", d.cfg.StateDir,
		"ready", ready, "policy", policyName(d.cfg.PolicyPath), "startup_ms", time.Since(d.begin).Milliseconds(), "version", d.cfg.Version)

	var firstErr error
	for range d.serving {
		if err := <-d.served; err != nil && !errors.Is(err, context.Canceled) && firstErr == nil {
			firstErr = err
			d.cancel()
		}
	}
	d.log.Info("stopping: in-flight actuations finish, then the ledger and audit close")
	return firstErr
}

// stop stops the first n components, last first.
func (d *Daemon) stop(n int) {
	for i := n - 1; i >= 0; i-- {
		if s := d.parts[i].stop; s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Grace)
			s(ctx)
			cancel()
		}
	}
}

func policyName(p string) string {
	if p == "" {
		return "none"
	}
	return p
}
