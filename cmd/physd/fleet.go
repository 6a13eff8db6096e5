package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/physd/physd/daemon"
	"github.com/physd/physd/fleetd"
)

// fleetFlags are physd fleet's flags.
type fleetFlags struct {
	config, policy, httpAddr, state, tokenFile, logLevel, families string
	embed, embedStore                                              string
	allowRemote, stateInTmp                                        bool
	grace                                                          time.Duration
	tls                                                            tlsFlags
}

// cmdFleet is physd fleet: one MCP endpoint over every site's gateways,
// reached over NATS (an external cluster, or a hub it embeds).
func cmdFleet(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("physd fleet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f fleetFlags
	fs.StringVar(&f.config, "config", "", "the fleet endpoint's configuration file (fleet.yml: id, nats: or embed:, views:) (required)")
	fs.StringVar(&f.policy, "policy", "", "physmcp.policy.yml whose identity: (tokens, JWT, OAuth, client certificates) authenticates the endpoint's callers; every do_ is judged by the owning gateway's own policy")
	fs.StringVar(&f.httpAddr, "http", "127.0.0.1:8090", "serve the fleet's MCP endpoint (POST /mcp, /mcp/<view>) and /healthz, /readyz, /status on ADDR")
	fs.StringVar(&f.state, "state", "", "state directory for the endpoint's audit and store, and the embedded hub's JetStream (default $STATE_DIRECTORY, else $XDG_STATE_HOME/physd/<id>, else ~/.local/state/physd/<id>)")
	fs.BoolVar(&f.stateInTmp, "state-in-tmp", false, "with $HOME unset and no --state, keep the state in the temporary directory (lost at reboot) instead of refusing to start")
	fs.BoolVar(&f.allowRemote, "allow-remote", false, "allow --http on a non-loopback address (requires credentials)")
	fs.StringVar(&f.tokenFile, "auth-token-file", "", "file holding a bearer token that authenticates a viewer on every route (or set PHYSD_AUTH_TOKEN)")
	fs.StringVar(&f.families, "families", "auto", "list one tool per capability family with site and zone arguments: on, off, or auto (on)")
	fs.StringVar(&f.embed, "embed", "", "run the NATS hub in this process on ADDR (e.g. 127.0.0.1:4222) with JetStream; the sites' users come from embed.sites in --config")
	fs.StringVar(&f.embedStore, "embed-store", "", "the embedded hub's JetStream directory (default embed.store_dir, else <state>/nats)")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&f.grace, "shutdown-grace", 10*time.Second, "how long in-flight calls may take to finish on SIGTERM")
	f.tls.register(fs)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "physd fleet: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if f.config == "" {
		fmt.Fprintln(stderr, "physd fleet: --config is required; fix: physd fleet --config /etc/physd/fleet.yml (examples/fleet/fleet.yml is one)")
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		fmt.Fprintf(stderr, "physd fleet: --log-level: %v\n", err)
		return 2
	}
	switch f.families {
	case "auto", "on", "off":
	default:
		fmt.Fprintf(stderr, "physd fleet: --families %q: use auto, on or off\n", f.families)
		return 2
	}
	cfg, err := fleetd.LoadConfig(f.config)
	if err != nil {
		fmt.Fprintln(stderr, prefixed("physd fleet", fileError("--config", f.config, err, "give the fleet endpoint's configuration file (examples/fleet/fleet.yml is one)")))
		return 1
	}
	state, err := stateDir(runFlags{state: f.state, stateInTmp: f.stateInTmp}, cfg.ID)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := embedFlags(cfg, f, state); err != nil {
		fmt.Fprintf(stderr, "physd fleet: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	ep := fleetd.New(cfg, log)
	ep.Announce = stderr
	m := ep.Manifest()
	dc := daemon.Config{Manifest: m, StateDir: state, HTTPAddr: f.httpAddr, AllowRemote: f.allowRemote, TokenFile: f.tokenFile,
		StdioRole: "none", Families: f.families, Grace: f.grace, Fleet: ep, Version: buildVersion(), Logger: log,
		TLS: daemon.TLS{Cert: f.tls.cert, Key: f.tls.key, ClientCA: f.tls.clientCA, InsecurePlainHTTP: f.tls.insecurePlainHTTP, AllowedHosts: f.tls.allowedHosts}}
	if f.policy != "" {
		if dc.Policy, dc.Gate, err = loadPolicy(f.policy, m); err != nil {
			fmt.Fprintln(stderr, prefixed("physd fleet", err))
			return 1
		}
		dc.PolicyPath = f.policy
	}
	d, err := daemon.New(dc)
	if err != nil {
		fmt.Fprintf(stderr, "physd fleet: %v\n", err)
		return 1
	}
	if err := d.Run(context.Background()); err != nil {
		log.Error("physd fleet stopped", "err", err.Error())
		fmt.Fprintf(stderr, "physd fleet: %v\n", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// embedFlags applies --embed and --embed-store to the configuration: a
// hub in this process needs the sites' users (embed.sites), and cannot
// stand beside an external cluster (nats:).
func embedFlags(cfg *fleetd.Config, f fleetFlags, state string) error {
	switch {
	case f.embed != "" && cfg.NATS != nil:
		return fmt.Errorf("--embed %s: %s connects to an external cluster (nats:); fix: drop --embed, or replace nats: with embed: {sites: …}", f.embed, f.config)
	case f.embed != "" && cfg.Embed == nil:
		return fmt.Errorf("--embed %s: %s has no embed: block naming the sites' users; fix: add embed: {sites: {north: {password_file: north.pw}}}", f.embed, f.config)
	case f.embedStore != "" && cfg.Embed == nil:
		return fmt.Errorf("--embed-store: %s runs no embedded hub (add embed: to it, or drop the flag)", f.config)
	case cfg.NATS == nil && cfg.Embed == nil:
		return fmt.Errorf("%s names no hub; fix: add nats: {urls: [...]} (an external cluster) or embed: {sites: …} (a hub in this process)", f.config)
	}
	if cfg.Embed == nil {
		return nil
	}
	if f.embed != "" {
		cfg.Embed.Listen = f.embed
	}
	if f.embedStore != "" {
		cfg.Embed.StoreDir = f.embedStore
	}
	if cfg.Embed.StoreDir == "" {
		cfg.Embed.StoreDir = filepath.Join(state, "nats")
	}
	return nil
}
