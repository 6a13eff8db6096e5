package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/physd/physd/daemon"
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mqtt"
)

// runFlags are physd run's flags; config turns them, with the files
// preflight checked, into the daemon's Config.
type runFlags struct {
	manifest, policy, httpAddr, state, tokenFile, stdioRole, logLevel, view, families string
	stdio, allowRemote, simControl, stateInTmp                                        bool
	grace, watchManifest                                                              time.Duration
	tls                                                                               tlsFlags
	historyMaxAge                                                                     time.Duration
	historyMaxMB                                                                      int
	mqtt                                                                              daemon.MQTTSettings
	mqttCfg                                                                           *mqtt.Config
	mdns                                                                              mdnsFlags
	fleet                                                                             fleet.Flags
	fleetCfg                                                                          *manifest.Fleet // network.fleet with the --fleet-* flags applied
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
	registerMQTT(fs, &f.mqtt)
	f.mdns.register(fs)
	f.fleet.Register(fs)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "physd run: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	mcfg, err := f.mqtt.Config()
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
	if f.fleet.Given() {
		eff, err := f.fleet.Apply(c.manifest.Network.Fleet)
		if err != nil {
			fmt.Fprintf(stderr, "physd run: %v\n", err)
			return 2
		}
		f.fleetCfg = eff
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
	d, err := daemon.New(f.config(c, log))
	if err != nil {
		// A flag's problem, found before anything started: text only,
		// like preflight's.
		fmt.Fprintf(stderr, "physd run: %v\n", err)
		return 1
	}
	if err := d.Run(context.Background()); err != nil {
		// The log line for the collector, and the same as text: the one
		// line a person (or an MCP client's log) must be able to read.
		log.Error("physd stopped", "err", err.Error())
		fmt.Fprintf(stderr, "physd run: %v\n", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// config is what the daemon is given: the flags and the checked files.
func (f runFlags) config(c *checked, log *slog.Logger) daemon.Config {
	return daemon.Config{
		ManifestPath: f.manifest, Manifest: c.manifest, ManifestSum: c.sum,
		PolicyPath: f.policy, Policy: c.policy, Gate: c.gate, StateDir: c.stateDir,
		HTTPAddr: f.httpAddr, Stdio: f.stdio, AllowRemote: f.allowRemote, TokenFile: f.tokenFile,
		StdioRole: f.stdioRole, View: f.view, Families: f.families, SimControl: f.simControl,
		TLS: daemon.TLS{Cert: f.tls.cert, Key: f.tls.key, ClientCA: f.tls.clientCA,
			InsecurePlainHTTP: f.tls.insecurePlainHTTP, AllowedHosts: f.tls.allowedHosts},
		MDNSInterface: f.mdns.iface, MQTT: f.mqttCfg, FleetUplink: f.fleetCfg,
		Grace: f.grace, WatchManifest: f.watchManifest, HistoryMaxAge: f.historyMaxAge, HistoryMaxMB: f.historyMaxMB,
		Version: buildVersion(), Logger: log,
	}
}
