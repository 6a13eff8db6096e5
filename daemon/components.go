package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
)

// components is the gateway in start order; Run stops them in the
// reverse order. The order is the dependencies': the audit trail feeds
// MQTT, the guard judges the node's calls, the node's observations feed
// history, alarms, MQTT and the fleet uplink, the mesh routes to the node, the MCP server
// serves all of them, the HTTP surface puts its boundary in front of the
// MCP server (and authenticates routed calls from then on), the listeners
// serve both, and mDNS advertises the listeners and the mesh once they
// answer.
func (d *Daemon) components() []component {
	return []component{
		{name: "store", start: d.startStore, stop: func(context.Context) { d.st.Close() }},
		{name: "audit sink", start: d.startAuditSink},
		{name: "mqtt", start: d.startMQTT, stop: func(context.Context) {
			if d.pub != nil {
				d.pub.Close()
			}
		}},
		{name: "fleet", start: d.startFleet},
		{name: "audit", start: d.startAudit, stop: func(context.Context) { d.al.Close() }},
		{name: "guard", start: d.startGuard},
		{name: "signals", start: d.startSignals, stop: func(context.Context) { d.cancelSignals() }},
		{name: "node", start: d.startNode, stop: d.stopNode},
		{name: "metrics", start: d.startMetrics},
		{name: "history", start: d.startHistory, stop: func(context.Context) {
			if d.hist != nil {
				d.hist.Close()
			}
		}},
		{name: "alarms", start: d.startAlarms, stop: func(context.Context) { d.alarms.Close() }},
		{name: "fleet uplink", start: d.startFleetUplink, stop: d.stopFleet},
		{name: "fleet endpoint", start: d.startFleetEndpoint, stop: d.stopFleetEndpoint},
		{name: "mesh", start: d.startMesh, stop: d.stopMesh},
		{name: "http security", start: d.startHTTPSecurity},
		{name: "mcp", start: d.startMCP},
		{name: "http", start: d.startHTTP},
		{name: "reload", start: d.startReload},
		// Ending the context is what stops the listeners (they drain
		// within the grace); on the normal path it has ended already.
		{name: "listeners", start: d.startListeners, stop: func(context.Context) { d.cancel() }},
		{name: "mdns", start: func(ctx context.Context) error {
			return d.md.start(ctx, d.cfg.MDNSInterface, d.cfg.Manifest, d.site, d.mcpAddr, d.sec.scheme == "https", d.log)
		}, stop: func(context.Context) { d.md.Close() }},
		// Last: READY=1 only once everything above serves.
		{name: "service manager", start: d.startNotify},
	}
}

// startNotify tells the service manager (systemd Type=notify) that physd
// serves, feeds its watchdog only while the node's actuation path and
// observation loop are alive (node.Alive), and says STOPPING=1 the moment
// shutdown begins. Without $NOTIFY_SOCKET it does nothing.
func (d *Daemon) startNotify(ctx context.Context) error {
	d.notify.Ready()
	go d.notify.Watch(ctx, d.n.Alive)
	context.AfterFunc(ctx, d.notify.Stopping)
	if iv := d.notify.WatchdogInterval(); iv > 0 {
		d.log.Info("service manager watchdog", "watchdog_sec", iv.Seconds(), "ping_every_ms", (iv / 3).Milliseconds())
	}
	return nil
}

func (d *Daemon) startStore(context.Context) (err error) {
	if d.st, err = store.Open(d.cfg.StateDir); err != nil {
		return err
	}
	if prev := d.st.UncleanStop(); prev != nil {
		// Killed, crashed, hung and restarted by the watchdog, or a power
		// cut: the ledger recovers what was in flight (node.Open).
		d.log.Warn("the previous run did not stop cleanly", "previous_pid", prev.PID, "previous_start", prev.Started.Format(time.RFC3339))
	}
	return nil
}

// startAuditSink is the manifest's remote audit sink: unavailable, the
// local audit file still records everything.
func (d *Daemon) startAuditSink(context.Context) error {
	m := d.cfg.Manifest
	if !m.Audit.Enabled {
		d.log.Warn("audit.enabled is false in the manifest, but physd always audits actuations")
	}
	if rs := m.Audit.RemoteSink; rs != nil {
		if sink, err := audit.NewRemoteSink(rs.Type, rs.Address); err != nil {
			d.log.Error("audit remote sink unavailable; the local audit file still records everything", "err", err.Error())
		} else {
			d.sink = sink
		}
	}
	return nil
}

func (d *Daemon) startMQTT(context.Context) (err error) {
	d.pub, err = newMQTT(d.cfg.MQTT, d.cfg.Manifest, d.log)
	return err
}

func (d *Daemon) startAudit(context.Context) (err error) {
	m := d.cfg.Manifest
	aopts := audit.Options{RetentionDays: m.Audit.RetentionDays, Sink: withFleetSink(withMQTTSink(d.sink, d.pub), d.up)}
	d.al, err = audit.OpenWith(filepath.Join(d.cfg.StateDir, "audit"), aopts)
	return err
}

// startGuard builds the guard: the policy, or without --policy the
// manifest's own limits. Quorum asks the mesh (d.peers, a standalone
// node has itself).
func (d *Daemon) startGuard(context.Context) error {
	m := d.cfg.Manifest
	if m.Network.Mesh.Enabled {
		d.remote = &meshnode.Remote{Budget: time.Duration(m.Network.Mesh.RequestTimeoutMS) * time.Millisecond, MaxPeers: m.Network.Mesh.MaxPeers}
	}
	if d.cfg.PolicyPath != "" {
		pol, g := d.cfg.Policy, d.cfg.Gate
		d.warnPolicy(pol, g)
		var err error
		if d.guard, d.approvals, err = newGuard(pol, g, d.st, m.Device.ID, d.peers.Quorum); err != nil {
			return err
		}
		d.nodeGuard, d.inForce = d.guard, d.guard
		return nil
	}
	pol, err := policy.ManifestOnly(m)
	if err != nil {
		return fmt.Errorf("the manifest's limits: %w", err)
	}
	d.inForce = guard.New(guard.Config{Policy: pol, State: d.st, Quorum: d.peers.Quorum, DeviceID: m.Device.ID})
	d.nodeGuard = d.inForce
	if limited := manifestRulesWithoutPolicy(m); len(limited) > 0 {
		d.log.Info("no --policy: the manifest's requires_permission, rate_limit, cooldown_ms and requires_quorum are enforced; no gate, approval or time-window rules",
			"capabilities", limited)
	}
	return nil
}

// startSignals ends the daemon's context on SIGINT or SIGTERM; its stop
// gives the signals back their default (a second one then kills).
func (d *Daemon) startSignals(ctx context.Context) error {
	d.ctx, d.cancelSignals = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	return nil
}

func (d *Daemon) startNode(ctx context.Context) (err error) {
	ncfg := node.Config{Manifest: d.cfg.Manifest, Store: d.st, Audit: d.al, Logger: d.log, Guard: d.nodeGuard, Approvals: d.approvals,
		OnDeviceError: func(bus string, _ error) { d.mx.DriverErrors.WithLabelValues(bus).Inc() }}
	switch {
	case d.remote != nil:
		ncfg.Remote = d.remote
	case d.cfg.Fleet != nil:
		ncfg.Remote = d.cfg.Fleet // can_do is the gateways'
	}
	if d.n, err = node.Open(ctx, ncfg); err != nil {
		return err
	}
	// On SIGTERM no new device step starts, before the listeners drain:
	// calls waiting for their turn are refused with nothing touched.
	d.stopDrain = context.AfterFunc(ctx, d.n.Drain)
	return nil
}

// stopNode drives the outputs whose safe state is on shutdown to safe,
// lets in-flight actuations finish and closes the buses, all within the
// grace. The drives run while the node drains (no do_ starts) and each is
// audited; one that is not verified is logged with its error.
func (d *Daemon) stopNode(ctx context.Context) {
	// Half of the grace at most for the drives (retried until verified),
	// so that the steps under way and the buses still close in time.
	dctx := ctx
	if dl, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		defer cancel()
	}
	for _, st := range d.n.DriveSafeAllUntil(dctx, manifest.SafeOnShutdown, "physd is stopping") {
		if st.State != node.SafeReached {
			d.log.Error("SHUTDOWN SAFE STATE NOT VERIFIED", "tool", st.Tool, "state", st.State, "err", st.Error)
		}
	}
	if err := d.n.Close(ctx); err != nil {
		d.log.Error("shutdown", "err", err.Error())
	}
	d.stopDrain()
}

// startMetrics exports the buses and the ledger, and with --sim-control
// the simulators' fault controls.
func (d *Daemon) startMetrics(context.Context) error {
	n := d.n
	d.simControls = map[string]http.Handler{}
	if d.cfg.SimControl {
		for name, b := range n.Buses() {
			if _, ok := b.(interface{ ControlHandler() http.Handler }); ok {
				// The plant in force: a reload that changes the bus's
				// settings reopens it as another plant.
				d.simControls[name] = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	registerBusMetrics(d.mx, n)
	registerLedgerMetrics(d.mx, n)
	return nil
}

func (d *Daemon) startHistory(context.Context) (err error) {
	d.hist, err = openHistory(d.cfg, d.n, d.mx, d.log)
	return err
}

// startAlarms starts the alarm engine and feeds MQTT the observations and
// the alarm events.
func (d *Daemon) startAlarms(context.Context) error {
	d.alarms = startAlarms(d.n, d.al, d.mx, d.log)
	followMQTT(d.pub, d.n, d.alarms, d.mx)
	return nil
}

// startMesh joins the site's mesh (nothing without one). Routed calls
// carry the caller's credential; d.creds authenticates it with this
// gateway's boundary.
func (d *Daemon) startMesh(context.Context) error {
	if d.remote == nil {
		return nil
	}
	m := d.cfg.Manifest
	if err := bridgeMemberlistMetrics(d.mx); err != nil {
		d.log.Warn("memberlist metrics not exported", "err", err.Error())
	}
	mcfg, err := mesh.ConfigFromManifest(m, d.log.With("component", "mesh"))
	if err != nil {
		return err
	}
	site, err := mesh.New(mcfg, mesh.CatalogFromManifest(m), meshnode.Handler(d.n, d.creds.authenticate))
	if err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	d.site = site
	d.remote.SetMesh(site)
	d.peers.set(site)
	go watchQuorum(d.ctx, site, d.n, d.log)
	registerMeshMetrics(d.mx, site)
	d.log.Info("mesh joined", "node", site.Name(), "addr", site.SelfAddr(), "expected_size", site.ExpectedSize())
	return nil
}

func (d *Daemon) stopMesh(context.Context) {
	if d.site == nil {
		return
	}
	if err := d.site.Leave(2 * time.Second); err != nil {
		d.log.Warn("mesh leave", "err", err.Error())
	}
	_ = d.site.Shutdown()
}

func (d *Daemon) startHTTPSecurity(ctx context.Context) (err error) {
	if d.cfg.HTTPAddr == "" {
		return nil
	}
	var pol *policy.Policy
	if d.guard != nil {
		pol = d.guard.Policy()
	}
	d.sec, err = setupHTTPSecurity(ctx, d.cfg, pol, d.log)
	return err
}

// meshReload tells the mesh the capabilities now in force.
func (d *Daemon) meshReload(_ context.Context, c *change) (func(), error) {
	if d.site != nil && c.manifestChanged() {
		if err := d.site.UpdateCatalog(mesh.CatalogFromManifest(c.m)); err != nil {
			d.log.Error("the mesh catalog was not updated; peers see the previous capabilities until the next reload", "err", err.Error())
		}
	}
	return nil, nil
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
// re-marks physd's live heap each time. A soft limit keeps a gateway's
// footprint bounded (measured in bench/results-gc.md): 24 MiB for a small
// site, and gcPerCapability more for each capability of m, whose
// definition, state, cache and place in the observation buffers stay in
// the heap. A limit below the live heap would make the collector run
// without pause (at 10 000 points, 80 % of a core: bench/scale-results.md).
// A manifest reload tunes it again.
func tuneGC(m *manifest.Manifest) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(300)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit(m))
	}
}

// gcBase is the soft memory limit of a small site; gcPerCapability is
// what each capability adds: its live heap, about 2.5 KiB at 10 000
// points (its binding's driver keys packed), and room for the garbage its
// reads leave between two collections. At 10 000 OPC UA monitored items
// (9 000 notifications a second, 9.6 MiB/s allocated) 4 KiB made the
// collector run 2.2 times a second, 15 % of a core; 4.5 KiB, once a
// second and 9.4 % (bench/scale-results.md).
const (
	gcBase          = 24 << 20
	gcPerCapability = 4608
)

// memoryLimit is the soft memory limit for the site of m.
func memoryLimit(m *manifest.Manifest) int64 {
	if m == nil {
		return gcBase
	}
	return gcBase + int64(len(m.Capabilities))*gcPerCapability
}
