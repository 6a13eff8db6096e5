package daemon

import (
	"context"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/metrics"
	"github.com/physd/physd/node"
)

// FleetEndpoint is what makes a daemon the fleet endpoint (physd fleet,
// package fleetd): the MCP server's Router and the node's Remote over
// NATS, started before the MCP server and stopped after it.
type FleetEndpoint interface {
	mcpserver.Router
	node.Remote
	Start(ctx context.Context) error
	Close()
	// Status is /status's fleet entry and the physmcp://mesh resource;
	// Ready is /readyz's fleet check.
	Status() any
	Ready() error
	// RegisterMetrics exports the gateways' states.
	RegisterMetrics(*metrics.Metrics)
	// Sites are the sites' history and active alarms at the hub.
	Sites() mcpserver.SiteRecords
}

// startFleetEndpoint connects the fleet endpoint (nothing on a gateway).
func (d *Daemon) startFleetEndpoint(ctx context.Context) error {
	if d.cfg.Fleet == nil {
		return nil
	}
	d.cfg.Fleet.RegisterMetrics(d.mx)
	return d.cfg.Fleet.Start(ctx)
}

func (d *Daemon) stopFleetEndpoint(context.Context) {
	if d.cfg.Fleet != nil {
		d.cfg.Fleet.Close()
	}
}

// startFleet builds the site uplink from network.fleet (nothing without
// one) before the audit trail opens, so that the trail's sink can wake it;
// it connects in startFleetUplink, once the trail, the node and the alarm
// engine exist. Reading its credentials is the only thing that can fail
// here: a hub that cannot be reached never stops the gateway.
func (d *Daemon) startFleet(context.Context) error {
	cfg, err := fleet.ConfigFor(d.uplinkBlock(), d.cfg.Manifest.Device.ID, d.log)
	if err != nil || cfg == nil {
		return err
	}
	d.up, err = fleet.New(*cfg)
	return err
}

// uplinkBlock is network.fleet in force: the manifest's, with the
// --fleet-* flags applied.
func (d *Daemon) uplinkBlock() *manifest.Fleet {
	if d.cfg.FleetUplink != nil {
		return d.cfg.FleetUplink
	}
	return d.cfg.Manifest.Network.Fleet
}

// withFleetSink adds the uplink's wake-up to the audit's sink.
func withFleetSink(s audit.Sink, u *fleet.Uplink) audit.Sink {
	if u == nil {
		return s
	}
	if s == nil {
		return u.AuditSink()
	}
	return teeSink{s, u.AuditSink()}
}

// startFleetUplink connects (in the background), publishes the audit
// trail from the stream's cursor, follows the observation stream and the
// alarm events, copies the sealed history buckets and the active alarms,
// and exports the uplink's state. /readyz does not look at
// it: a site keeps working while its WAN is down.
func (d *Daemon) startFleetUplink(context.Context) error {
	u := d.up
	if u == nil {
		return nil
	}
	if f := d.uplinkBlock(); len(f.Serve) > 0 {
		// The fleet endpoint's calls, on the uplink's connection once it
		// is up. A routed do_'s caller is authenticated by this gateway's
		// boundary (refused as "still starting" until it is built).
		d.fsrv = fleet.NewServer(fleet.ServeConfig{Prefix: f.SubjectPrefix, Site: f.Site, Serve: f.Serve,
			Owner: meshnode.Owner{Node: d.n, Authn: d.creds.authenticateFleet}, Logger: d.log})
		d.fsrv.Start(u)
	}
	u.Start(d.al)
	u.Follow(d.n)
	if d.alarms != nil {
		d.alarms.OnEvent(u.Alarm)
		u.FollowAlarms(d.alarms)
	}
	if d.hist != nil {
		u.FollowHistory(d.hist)
	}
	mx := d.mx
	mx.Gauge("physd_fleet_connected", "1 while the fleet hub (NATS) is connected.", nil, func() float64 {
		if u.Stats().Connected {
			return 1
		}
		return 0
	})
	mx.Gauge("physd_fleet_published", "Audit records the fleet hub's stream acknowledged (this run).", nil, func() float64 { return float64(u.Stats().Published) })
	mx.Gauge("physd_fleet_pending", "Audit records on local disk the fleet hub's stream does not hold yet (as of the last sync).", nil, func() float64 { return float64(u.Stats().Pending) })
	mx.Gauge("physd_fleet_core_published", "Observations and alarm events sent to the fleet hub.", nil, func() float64 { return float64(u.Stats().Core) })
	mx.Gauge("physd_fleet_core_dropped", "Observations and alarm events not sent: the fleet hub was not connected.", nil, func() float64 { return float64(u.Stats().Dropped) })
	mx.Gauge("physd_fleet_errors", "Failed fleet syncs and publishes (retried).", nil, func() float64 { return float64(u.Stats().Errors) })
	if srv := d.fsrv; srv != nil {
		mx.Gauge("physd_fleet_served", "Calls of the fleet endpoint this gateway answered.", nil, func() float64 { return float64(srv.Stats().Answered) })
		mx.Gauge("physd_fleet_refused_unauthenticated", "do_ calls of the fleet endpoint refused: this gateway could not authenticate the caller.", nil,
			func() float64 { return float64(srv.Stats().Refused) })
	}
	return nil
}

func (d *Daemon) stopFleet(context.Context) {
	if d.fsrv != nil {
		d.fsrv.Close() // before the connection closes: the catalog says stopped
	}
	if d.up != nil {
		d.up.Close()
	}
}

// fleetStatus is /status's fleet entry: the uplink, and what it serves
// the fleet endpoint (or, at the fleet endpoint, its gateways).
func fleetStatus(u *fleet.Uplink, srv *fleet.Server, ep FleetEndpoint) func() any {
	if ep != nil {
		return ep.Status
	}
	if u == nil {
		return nil
	}
	return func() any {
		var serving *fleet.ServeStats
		if srv != nil {
			st := srv.Stats()
			serving = &st
		}
		return struct {
			Enabled bool   `json:"enabled"`
			Subject string `json:"subject"`
			fleet.Stats
			Serving *fleet.ServeStats `json:"serving,omitempty"`
		}{true, u.AuditSubject(), u.Stats(), serving}
	}
}
