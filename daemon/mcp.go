package daemon

import (
	"context"
	"errors"
	"io"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
)

// This file is the daemon's only use of package mcpserver (the MCP
// surface); http.go holds its use of package web (the HTTP surface).

// startMCP builds the MCP server over the components started before it.
func (d *Daemon) startMCP(context.Context) error {
	f, m := d.cfg, d.cfg.Manifest
	var router mcpserver.Router
	var sites mcpserver.SiteRecords
	status := meshStatus(d.site, d.md)
	hist, al := d.hist, d.alarms
	switch {
	case d.site != nil:
		router = &meshnode.Router{Mesh: d.site}
	case f.Fleet != nil:
		// The endpoint owns no capability: its history and alarms are
		// the sites', at the hub.
		router, status, sites, hist, al = f.Fleet, f.Fleet.Status, f.Fleet.Sites(), nil, nil
	}
	d.srv = mcpserver.New(d.n, mcpserver.Options{StdioRole: f.StdioRole, View: f.View,
		Families: f.Families == "on" || f.Families == "auto" && (m.Network.Mesh.Enabled || f.Fleet != nil), Logger: d.log,
		Guard: d.guard, Audit: d.al, Metrics: d.mx, Mesh: status,
		Router: router, Fleet: f.Fleet != nil, History: hist, Alarms: al, Sites: sites})
	return nil
}

// serveStdio serves MCP on stdin/stdout; the end is sent on d.served
// (serving counts it). The client closing stdin shuts the daemon down.
func (d *Daemon) serveStdio(ctx context.Context) {
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

// mcpReload lists the tools of the manifest and policy now in force
// (tools/list_changed), the reload's last step.
func (d *Daemon) mcpReload(context.Context, *change) (func(), error) {
	d.srv.ManifestReloaded()
	return nil, nil
}
