package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/web"
)

// This file is the daemon's only use of package mcpserver (the MCP
// surface and, for now, the HTTP boundary), so that moving the HTTP
// surface to its own package changes one file here.

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
// The mesh starts before the MCP server that holds the boundary, so until
// that server is built a routed call is refused as "still starting";
// once the boundary can be built from the policy alone (before the mesh),
// this type goes.
type credentials struct {
	mu  sync.Mutex
	srv *mcpserver.Server
}

func (c *credentials) set(s *mcpserver.Server) {
	c.mu.Lock()
	c.srv = s
	c.mu.Unlock()
}

func (c *credentials) authenticate(cred string) (node.Caller, error) {
	c.mu.Lock()
	s := c.srv
	c.mu.Unlock()
	if s == nil {
		return node.Caller{}, errors.New("the gateway is still starting")
	}
	return s.AuthenticateCredential(cred)
}

// startMCP builds the MCP server over the components started before it.
func (d *Daemon) startMCP(context.Context) error {
	f, m := d.cfg, d.cfg.Manifest
	var router mcpserver.Router
	if d.site != nil {
		router = &meshnode.Router{Mesh: d.site}
	}
	d.srv = mcpserver.New(d.n, mcpserver.Options{AuthToken: d.token, StdioRole: f.StdioRole, View: f.View,
		Families: f.Families == "on" || f.Families == "auto" && m.Network.Mesh.Enabled, Logger: d.log, SimControls: d.simControls,
		TLS: d.sec.TLS, AllowedHosts: d.sec.AllowedHosts, RequireCredentials: d.sec.RequireCredentials,
		Guard: d.guard, Audit: d.al, Metrics: d.mx, PolicyPath: f.PolicyPath, Mesh: meshStatus(d.site, d.md), MeshReady: meshReady(d.site),
		Router: router, History: d.hist, Alarms: d.alarms})
	d.creds.set(d.srv)
	return nil
}

// startListeners serves MCP on the HTTP listener and on stdio; each sends
// its end on d.served (serving counts them).
func (d *Daemon) startListeners(ctx context.Context) error {
	f := d.cfg
	if f.HTTPAddr != "" {
		l, err := net.Listen("tcp", f.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--http %s: %w", f.HTTPAddr, err)
		}
		d.mcpAddr = l.Addr()
		d.serving++
		go func() { d.served <- d.srv.Serve(ctx, l, f.Grace) }()
		d.log.Info("listening", "addr", l.Addr().String(), "mcp", d.sec.scheme+"://"+l.Addr().String()+"/mcp")
	}
	if f.Stdio {
		d.serving++
		go func() {
			err := d.srv.RunStdio(ctx)
			if err == nil || errors.Is(err, io.EOF) {
				d.log.Info("stdin closed")
				err = nil
			}
			d.cancel() // the client went away: shut the whole daemon down
			d.served <- err
		}()
	}
	return nil
}

// mcpReload lists the tools of the manifest and policy now in force
// (tools/list_changed), the reload's last step.
func (d *Daemon) mcpReload(context.Context, *change) (func(), error) {
	d.srv.ManifestReloaded()
	return nil, nil
}
