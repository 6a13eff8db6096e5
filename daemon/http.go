package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/physd/physd/node"
	"github.com/physd/physd/web"
)

// This file is the daemon's only use of package web (the HTTP surface:
// the boundary, every route, the listener).

// checkListen refuses a listener configuration that would expose bearer
// tokens or the equipment.
func checkListen(f Config, token string) error {
	t := f.TLS
	return web.CheckListen(web.Exposure{Addr: f.HTTPAddr, AllowRemote: f.AllowRemote, Token: token,
		ClientCerts: t.ClientCA != "", TLS: t.Cert != "", PlainHTTP: t.InsecurePlainHTTP})
}

func isLoopback(addr string) bool { return web.IsLoopback(addr) }

// credentials authenticates the credential a routed mesh call carries
// with this gateway's boundary (its token and the policy's identities).
// The mesh starts before the HTTP surface that holds the boundary, so
// until that surface is built a routed call is refused as "still
// starting"; once the boundary can be built from the policy alone (before
// the mesh), this type goes.
type credentials struct {
	mu  sync.Mutex
	web *web.Server
}

func (c *credentials) set(w *web.Server) {
	c.mu.Lock()
	c.web = w
	c.mu.Unlock()
}

func (c *credentials) authenticate(cred string) (node.Caller, error) {
	w, err := c.boundary()
	if err != nil {
		return node.Caller{}, err
	}
	return w.AuthenticateCredential(cred)
}

// boundary is the HTTP surface once it is built.
func (c *credentials) boundary() (*web.Server, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.web == nil {
		return nil, errors.New("the gateway is still starting")
	}
	return c.web, nil
}

// authenticateFleet is authenticate for a call the fleet endpoint
// forwarded over NATS (the policy's fleet_resource counts too).
func (c *credentials) authenticateFleet(cred string) (node.Caller, error) {
	w, err := c.boundary()
	if err != nil {
		return node.Caller{}, err
	}
	return w.AuthenticateFleetCredential(cred)
}

// startHTTP builds the HTTP surface over the MCP server: the boundary
// authenticates routed mesh calls from here on, with or without an HTTP
// listener (startListeners serves it).
func (d *Daemon) startHTTP(context.Context) error {
	f := d.cfg
	d.web = web.New(d.srv, web.Options{AuthToken: d.token, Logger: d.log, SimControls: d.simControls,
		TLS: d.sec.TLS, AllowedHosts: d.sec.AllowedHosts, RequireCredentials: d.sec.RequireCredentials,
		Guard: d.guard, Audit: d.al, Metrics: d.mx, PolicyPath: f.PolicyPath, Mesh: meshStatus(d.site, d.md), Fleet: fleetStatus(d.up, d.fsrv, d.cfg.Fleet), MeshReady: d.ready(),
		History: d.hist, Alarms: d.alarms})
	d.creds.set(d.web)
	return nil
}

// ready is /readyz's check beyond the node's: the mesh's, or the fleet
// endpoint's connection to NATS.
func (d *Daemon) ready() func() error {
	if d.cfg.Fleet != nil {
		return d.cfg.Fleet.Ready
	}
	return meshReady(d.site)
}

// startListeners serves the HTTP surface on the HTTP listener and MCP on
// stdio; each sends its end on d.served (serving counts them).
func (d *Daemon) startListeners(ctx context.Context) error {
	f := d.cfg
	if f.HTTPAddr != "" {
		l, err := net.Listen("tcp", f.HTTPAddr)
		if err != nil {
			return listenError(f.HTTPAddr, err)
		}
		d.mcpAddr = l.Addr()
		d.serving++
		go func() { d.served <- d.web.Serve(ctx, l, f.Grace) }()
		d.log.Info("listening", "addr", l.Addr().String(), "mcp", d.sec.scheme+"://"+l.Addr().String()+"/mcp")
	}
	if f.Stdio {
		d.serveStdio(ctx)
	}
	return nil
}

// listenError names --http and what to do about the usual reasons a
// listener cannot open.
func listenError(addr string, err error) error {
	fix := "fix: pass --http with an address of this machine, e.g. --http 127.0.0.1:8080"
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		fix = "fix: another process listens on " + addr + " (a physd run started earlier? `ss -ltnp` names it): stop it, or pass --http with a free port, e.g. --http 127.0.0.1:8081"
	case errors.Is(err, syscall.EACCES):
		fix = "fix: ports below 1024 need privileges physd does not take; pass --http with a port above 1023, e.g. --http 127.0.0.1:8080"
	}
	return fmt.Errorf("--http %s: %w; %s", addr, err, fix)
}
