// Command physd is the PhysMCP edge daemon: it serves a device manifest's
// capabilities as proMCP tools over MCP (loopback HTTP and stdio).
//
//	physd run --manifest FILE [--policy FILE] [--http ADDR | --stdio] [--state DIR]
//	physd validate [--policy FILE] MANIFEST
//	physd lint …
//	physd client-config --manifest FILE [--client KIND] [--transport stdio|http]
//	physd audit verify STATE_DIR
//	physd scan modbus (--tcp HOST:PORT | --rtu DEVICE) [--units 1-247] [--out FILE]
//	physd scan i2c [--bus 1] [--out FILE]
//	physd version
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	_ "time/tzdata" // time windows name IANA zones; gateways often lack tzdata

	"github.com/physd/physd/approval"
	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	_ "github.com/physd/physd/drivers/all" // every bus driver (the one list)
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/mqtt"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/safety"
	"github.com/physd/physd/store"
)

// version is set with -ldflags "-X main.version=…" by release builds.
var version = ""

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `physd — PhysMCP edge daemon

Usage:
  physd run --manifest FILE [--policy FILE] [--http ADDR | --stdio] [--state DIR]
  physd validate [--policy POLICY] MANIFEST
  physd lint [--json] [--strict] [--allow-do] [--header "K: V"] <URL | tools.json | -- COMMAND...>
  physd client-config --manifest FILE [--client claude-desktop|vscode|cursor] [--transport stdio|http]
  physd audit verify STATE_DIR
  physd scan modbus (--tcp HOST:PORT | --rtu DEVICE) [--units 1-247] [--out FILE]
  physd scan i2c [--bus 1] [--out FILE]
  physd version

Run "physd run -h" (or any command with -h) for its flags.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "validate":
		return cmdValidate(args[1:], stdout, stderr)
	case "lint":
		return cmdLint(args[1:], stdout, stderr)
	case "client-config":
		return cmdClientConfig(args[1:], stdout, stderr)
	case "audit":
		return cmdAudit(args[1:], stdout, stderr)
	case "scan":
		return cmdScan(args[1:], stdout, stderr)
	case "version", "--version", "-v":
		writeVersion(stdout)
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "physd: unknown command %q\n\n%s", args[0], usage)
	return 2
}

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func cmdValidate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	policyPath := fs.String("policy", "", "also check this physmcp.policy.yml against the manifest")
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: physd validate [--policy POLICY] MANIFEST")
		return 2
	}
	args = fs.Args()
	m, err := loadManifest(args[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	reads, dos := 0, 0
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindRead {
			reads++
		} else {
			dos++
		}
	}
	fmt.Fprintf(stdout, "%s: ok (device %s, %d read and %d do capabilities, %d buses)\n", args[0], m.Device.ID, reads, dos, len(m.Buses))
	writeViews(m, stdout, stderr)
	if *policyPath != "" {
		pol, g, err := loadPolicy(*policyPath, m)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		for _, w := range policyWarnings(pol, g) {
			fmt.Fprintln(stderr, "warning:", w)
		}
		fmt.Fprintf(stdout, "%s: ok (%d do_ tools guarded, %d time windows, %d identities)\n", *policyPath, len(pol.Tools), len(pol.Windows), len(pol.Identity.Tokens)+len(pol.Identity.JWT))
	}
	return 0
}

// checkBindings opens each simulated bus and binds its capabilities, and
// checks hardware bindings without opening the hardware, so validate
// catches driver configuration errors too and never touches a device.
func checkBindings(m *manifest.Manifest) error {
	var errs []error
	for _, c := range m.Capabilities {
		if c.Binding.Bus == "" {
			errs = append(errs, fmt.Errorf("%s: %s.bus: required; fix: name the bus this capability is wired to (one of buses:)", c.Binding.Pos, c.Binding.Field))
		}
	}
	// Bus by bus in name order: the same manifest prints the same errors
	// in the same order every time.
	for _, name := range slices.Sorted(maps.Keys(m.Buses)) {
		b := m.Buses[name]
		if b.Type != "sim" {
			d, ok := drivers.LookupDriver(b.Type)
			if !ok {
				errs = append(errs, fmt.Errorf("%s: buses.%s.type: no driver for %q; fix: %s", b.TypePos, name, b.Type, manifest.OneOf(b.Type, drivers.Types())))
				continue
			}
			if span := d.Span; span != nil {
				// The write spans too: two do_ capabilities on one register
				// are refused here, before any bus opens.
				var caps []*manifest.Capability
				var spans []drivers.Spanner
				for _, c := range m.Capabilities {
					if c.Binding.Bus == name {
						sp, err := span(c)
						if err != nil {
							errs = append(errs, err)
							continue
						}
						caps, spans = append(caps, c), append(spans, sp)
					}
				}
				if err := drivers.SharedSpans(name, caps, spans); err != nil {
					errs = append(errs, err)
				}
			} else if check := d.Check; check != nil {
				for _, c := range m.Capabilities {
					if c.Binding.Bus == name {
						if err := check(c); err != nil {
							errs = append(errs, err)
						}
					}
				}
			}
			continue
		}
		bus, err := drivers.Open(context.Background(), b)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var caps []*manifest.Capability
		var points []drivers.Point
		for _, c := range m.Capabilities {
			if c.Binding.Bus == name {
				p, err := bus.Point(c)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				caps, points = append(caps, c), append(points, p)
			}
		}
		if err := drivers.SharedActuators(name, caps, points); err != nil {
			errs = append(errs, err)
		}
		bus.Close()
	}
	return errors.Join(errs...)
}

type runFlags struct {
	manifest, policy, httpAddr, state, tokenFile, stdioRole, logLevel, view, families string
	stdio, allowRemote, simControl, stateInTmp                                        bool
	grace, watchManifest                                                              time.Duration
	tls                                                                               tlsFlags
	historyMaxAge                                                                     time.Duration
	historyMaxMB                                                                      int
	mqtt                                                                              mqttFlags
	mqttCfg                                                                           *mqtt.Config
	mdns                                                                              mdnsFlags
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f runFlags
	fs.StringVar(&f.manifest, "manifest", "", "physmcp.manifest.yml to serve (required)")
	fs.StringVar(&f.policy, "policy", "", "physmcp.policy.yml guarding every do_")
	fs.StringVar(&f.httpAddr, "http", "", "serve MCP (POST /mcp) and /healthz, /readyz on ADDR (default 127.0.0.1:8080 unless --stdio)")
	fs.BoolVar(&f.stdio, "stdio", false, "serve MCP on stdin/stdout")
	fs.StringVar(&f.state, "state", "", "state directory for the ledger and audit (default $STATE_DIRECTORY, else $XDG_STATE_HOME/physd/<device id>, else ~/.local/state/physd/<device id>)")
	fs.BoolVar(&f.stateInTmp, "state-in-tmp", false, "with $HOME unset and no --state, keep the ledger and audit in the temporary directory (lost at reboot) instead of refusing to start")
	fs.BoolVar(&f.allowRemote, "allow-remote", false, "allow --http on a non-loopback address (requires an auth token)")
	fs.StringVar(&f.tokenFile, "auth-token-file", "", "file holding the bearer token required on /mcp (or set PHYSD_AUTH_TOKEN)")
	fs.StringVar(&f.stdioRole, "stdio-role", "none", "role of the stdio caller: none, viewer, operator, supervisor or admin")
	fs.StringVar(&f.families, "families", "auto", "list one tool per capability family (family: in the manifest) instead of every instance: on, off, or auto (on with a mesh)")
	fs.StringVar(&f.view, "view", "", "stdio: serve only this view of the manifest's views: (HTTP serves each view at /mcp/<view>)")
	fs.BoolVar(&f.simControl, "sim-control", false, "development: expose the simulator's fault controls at /sim/<bus>/ on the HTTP listener")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.grace, "shutdown-grace", 10*time.Second, "how long in-flight calls may take to finish on SIGTERM")
	fs.DurationVar(&f.watchManifest, "watch-manifest", 0, "also reload when the manifest file's content changes, checking this often (e.g. 2s; 0: only on SIGHUP)")
	fs.DurationVar(&f.historyMaxAge, "history-max-age", history.Default().MaxAge, "history of numeric capabilities (state dir, history.db): drop buckets older than this")
	fs.IntVar(&f.historyMaxMB, "history-max-mb", int(history.Default().MaxBytes>>20), "history: bound on history.db in MiB, oldest buckets dropped first; 0 turns history off")
	f.tls.register(fs)
	f.mqtt.register(fs)
	f.mdns.register(fs)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "physd run: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	mcfg, err := f.mqtt.config()
	if err != nil {
		fmt.Fprintf(stderr, "physd run: %v\n", err)
		return 2
	}
	f.mqttCfg = mcfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "physd run: --log-level: %v\n", err)
		return 2
	}
	c, code := preflight(f, stderr)
	if c == nil {
		return code
	}
	switch f.families {
	case "auto", "on", "off":
	default:
		fmt.Fprintf(stderr, "physd run: --families %q: use auto, on or off\n", f.families)
		return 2
	}
	if f.view != "" && c.manifest.View(f.view) == nil {
		fix := "declare it under views: in the manifest"
		if names := c.manifest.ViewNames(); len(names) > 0 {
			fix = manifest.OneOf(f.view, names)
		}
		fmt.Fprintf(stderr, "physd run: --view %q: the manifest declares no such view; fix: %s\n", f.view, fix)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	if err := serve(f, c, log); err != nil {
		log.Error("physd stopped", "err", err.Error())
		return 1
	}
	log.Info("stopped")
	return 0
}

func serve(f runFlags, c *checked, log *slog.Logger) error {
	start := time.Now()
	tuneGC()
	switch f.stdioRole {
	case "none", "viewer", "operator", "supervisor", "admin":
	default:
		return fmt.Errorf("--stdio-role %q: use none, viewer, operator, supervisor or admin", f.stdioRole)
	}
	if f.httpAddr == "" && !f.stdio {
		f.httpAddr = "127.0.0.1:8080"
	}
	token := os.Getenv("PHYSD_AUTH_TOKEN")
	if f.tokenFile != "" {
		b, err := os.ReadFile(f.tokenFile)
		if err != nil {
			return fmt.Errorf("--auth-token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if f.httpAddr != "" {
		if err := checkExposure(f, token); err != nil {
			return err
		}
	}
	m, stateDir := c.manifest, c.stateDir
	st, err := store.Open(stateDir)
	if err != nil {
		return err
	}
	defer st.Close()
	aopts := audit.Options{RetentionDays: m.Audit.RetentionDays}
	if !m.Audit.Enabled {
		log.Warn("audit.enabled is false in the manifest, but physd always audits actuations")
	}
	if rs := m.Audit.RemoteSink; rs != nil {
		if sink, err := audit.NewRemoteSink(rs.Type, rs.Address); err != nil {
			log.Error("audit remote sink unavailable; the local audit file still records everything", "err", err.Error())
		} else {
			aopts.Sink = sink
		}
	}
	pub, err := newMQTT(f.mqttCfg, m, log)
	if err != nil {
		return err
	}
	if pub != nil {
		defer pub.Close()
	}
	aopts.Sink = withMQTTSink(aopts.Sink, pub)
	al, err := audit.OpenWith(filepath.Join(stateDir, "audit"), aopts)
	if err != nil {
		return err
	}
	defer al.Close()

	var mcpSrv atomic.Pointer[mcpserver.Server] // set once built; the mesh authenticates with it
	var (
		guard     *safety.Guard // the policy (nil without --policy)
		inForce   *safety.Guard // the policy, or the manifest-only guard: reloads replace its rules
		approvals *approval.Authority
		nodeGuard node.Guard
		site      *mesh.Mesh // set once the node exists; nil without a mesh
		remote    *meshnode.Remote
	)
	// Quorum asks the mesh for fresh acks; a standalone node has itself.
	quorum := func(ctx context.Context, need int) int {
		if site == nil {
			return 1
		}
		return site.Quorum(ctx, need)
	}
	if m.Network.Mesh.Enabled {
		remote = &meshnode.Remote{Budget: time.Duration(m.Network.Mesh.RequestTimeoutMS) * time.Millisecond, MaxPeers: m.Network.Mesh.MaxPeers}
	}
	if f.policy != "" {
		pol, g := c.policy, c.gate
		for _, w := range policyWarnings(pol, g) {
			log.Warn("policy", "warning", w)
		}
		if guard, approvals, err = newSafety(pol, g, st, m.Device.ID, quorum); err != nil {
			return err
		}
		nodeGuard, inForce = guard, guard
	} else {
		// No policy file: the manifest's own limits still hold.
		pol, err := policy.ManifestOnly(m)
		if err != nil {
			return fmt.Errorf("the manifest's limits: %w", err)
		}
		inForce = safety.New(safety.Config{Policy: pol, State: st, Quorum: quorum, DeviceID: m.Device.ID})
		nodeGuard = inForce
		if limited := manifestRulesWithoutPolicy(m); len(limited) > 0 {
			log.Info("no --policy: the manifest's requires_permission, rate_limit, cooldown_ms and requires_quorum are enforced; no gate, approval or time-window rules",
				"capabilities", limited)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	mx := metrics.New()
	ncfg := node.Config{Manifest: m, Store: st, Audit: al, Logger: log, Guard: nodeGuard, Approvals: approvals,
		OnDeviceError: func(bus string, _ error) { mx.DriverErrors.WithLabelValues(bus).Inc() }}
	if remote != nil {
		ncfg.Remote = remote
	}
	n, err := node.Open(ctx, ncfg)
	if err != nil {
		return err
	}
	// On SIGTERM no new device step starts, before the listeners drain:
	// calls waiting for their turn are refused with nothing touched.
	stopDrain := context.AfterFunc(ctx, n.Drain)
	defer stopDrain()
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), f.grace)
		defer cancel()
		if err := n.Close(cctx); err != nil {
			log.Error("shutdown", "err", err.Error())
		}
	}()

	simControls := map[string]http.Handler{}
	if f.simControl {
		for name, b := range n.Buses() {
			if _, ok := b.(interface{ ControlHandler() http.Handler }); ok {
				// The plant in force: a reload that changes the bus's
				// settings reopens it as another plant.
				simControls[name] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					c, ok := n.Buses()[name].(interface{ ControlHandler() http.Handler })
					if !ok {
						http.Error(w, "bus "+name+" is not a simulator in the manifest in force (or is being reopened)", http.StatusServiceUnavailable)
						return
					}
					c.ControlHandler().ServeHTTP(w, r)
				})
			}
		}
	}
	registerBusMetrics(mx, n)
	registerLedgerMetrics(mx, n)
	hist, err := openHistory(f, stateDir, n, mx, log)
	if err != nil {
		return err
	}
	if hist != nil {
		defer hist.Close()
	}
	alarmEngine := startAlarms(n, al, mx, log)
	if alarmEngine != nil {
		defer alarmEngine.Close()
	}
	followMQTT(pub, n, alarmEngine, mx)
	if remote != nil {
		if err := bridgeMemberlistMetrics(mx); err != nil {
			log.Warn("memberlist metrics not exported", "err", err.Error())
		}
		mcfg, err := mesh.ConfigFromManifest(m, log.With("component", "mesh"))
		if err != nil {
			return err
		}
		// Routed calls carry the caller's credential; this gateway's MCP
		// server (built below) authenticates it with this policy.
		authn := func(cred string) (node.Caller, error) {
			s := mcpSrv.Load()
			if s == nil {
				return node.Caller{}, errors.New("the gateway is still starting")
			}
			return s.AuthenticateCredential(cred)
		}
		site, err = mesh.New(mcfg, mesh.CatalogFromManifest(m), meshnode.Handler(n, authn))
		if err != nil {
			return fmt.Errorf("mesh: %w", err)
		}
		remote.Mesh = site
		registerMeshMetrics(mx, site)
		defer func() {
			if err := site.Leave(2 * time.Second); err != nil {
				log.Warn("mesh leave", "err", err.Error())
			}
			_ = site.Shutdown()
		}()
		log.Info("mesh joined", "node", site.Name(), "addr", site.SelfAddr(), "expected_size", site.ExpectedSize())
	}
	var sec httpSecurity
	if f.httpAddr != "" {
		var pol *policy.Policy
		if guard != nil {
			pol = guard.Policy()
		}
		if sec, err = setupHTTPSecurity(ctx, f, pol, log); err != nil {
			return err
		}
	}
	md := &mdnsService{}
	srv := mcpserver.New(n, mcpserver.Options{AuthToken: token, StdioRole: f.stdioRole, View: f.view,
		Families: f.families == "on" || f.families == "auto" && m.Network.Mesh.Enabled, Logger: log, SimControls: simControls,
		TLS: sec.TLS, AllowedHosts: sec.AllowedHosts, RequireCredentials: sec.RequireCredentials,
		Safety: guard, Audit: al, Metrics: mx, PolicyPath: f.policy, Mesh: meshStatus(site, md), MeshReady: meshReady(site), Router: meshRouter(site), History: hist, Alarms: alarmEngine})
	mcpSrv.Store(srv)
	rl := &reloader{f: f, n: n, guard: inForce, withPolicy: guard != nil, al: al, log: log, srv: srv, site: site, sum: c.sum,
		hooks: reloadHooks(alarmEngine, hist, pub)}
	go rl.run(ctx, f.watchManifest)

	errc := make(chan error, 2)
	running := 0
	var mcpAddr net.Addr
	if f.httpAddr != "" {
		l, err := net.Listen("tcp", f.httpAddr)
		if err != nil {
			return fmt.Errorf("--http %s: %w", f.httpAddr, err)
		}
		mcpAddr = l.Addr()
		running++
		go func() { errc <- srv.Serve(ctx, l, f.grace) }()
		log.Info("listening", "addr", l.Addr().String(), "mcp", sec.scheme+"://"+l.Addr().String()+"/mcp")
	}
	if f.stdio {
		running++
		go func() {
			err := srv.RunStdio(ctx)
			if err == nil || errors.Is(err, io.EOF) {
				log.Info("stdin closed")
				err = nil
			}
			stop() // the client went away: shut the whole daemon down
			errc <- err
		}()
	}
	if err := md.start(ctx, f.mdns, m, site, mcpAddr, sec.scheme == "https", log); err != nil {
		stop()
		return err
	}
	defer md.Close()
	ready, _ := n.Ready()
	log.Info("ready", "device_id", m.Device.ID, "capabilities", len(m.Capabilities), "state", stateDir,
		"ready", ready, "policy", policyName(f.policy), "startup_ms", time.Since(start).Milliseconds(), "version", buildVersion())

	var firstErr error
	for range running {
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) && firstErr == nil {
			firstErr = err
			stop()
		}
	}
	log.Info("stopping: in-flight actuations finish, then the ledger and audit close")
	return firstErr
}

// manifestRulesWithoutPolicy names the do_ capabilities whose manifest
// asks for a role, rate limit, cooldown or quorum: without a policy file
// the manifest-only guard enforces them.
func manifestRulesWithoutPolicy(m *manifest.Manifest) []string {
	var out []string
	for _, c := range m.Capabilities {
		if c.Kind == manifest.KindDo && (c.RequiresPermission != "none" || c.RateLimit != nil || c.CooldownMS > 0 || c.RequiresQuorum) {
			out = append(out, c.ToolName())
		}
	}
	return out
}

// tuneGC trades a little memory for CPU unless the operator set GOGC or
// GOMEMLIMIT: the MCP SDK allocates ~440 KB of short-lived buffers per
// request, so with the default GOGC the collector runs every few calls and
// re-marks physd's live heap each time. A 24 MiB soft limit keeps a
// gateway's footprint bounded (measured in bench/results-gc.md).
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(300)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(24 << 20)
	}
}

func policyName(p string) string {
	if p == "" {
		return "none"
	}
	return p
}
