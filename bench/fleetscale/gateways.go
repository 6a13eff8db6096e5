package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/sim" // the simulated plant
	"github.com/physd/physd/fleet"
	"github.com/physd/physd/guard"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/store"
)

// A simulated gateway in this process: a physd node (its store, audit
// trail, the manifest-only guard physd run uses without --policy) over a
// simulated zone whose temperature it polls every pollMS, and the fleet
// uplink and serving side on a NATS connection of its own, as physd run
// builds them (daemon/fleet.go): the observations go out as they change,
// the audit to its stream, the catalog and heartbeats, and the fleet's
// read and can_do are answered.
type gateway struct {
	site, device string
	st           *store.Store
	al           *audit.Log
	n            *node.Node
	up           *fleet.Uplink
	srv          *fleet.Server
}

// gatewayManifest is a gateway's manifest: one temperature polled every
// pollMS (deadband 0: every change is an observation the uplink sends)
// and one heater (what a heating can_do matches).
func gatewayManifest(device string, seed, pollMS int) string {
	return fmt.Sprintf(`physmcp_version: "0.1"
device:
  id: %s
  type: bench_gateway
  vendor: physd
  model: fleetscale
  location: {zone: greenhouse, area: block}
network:
  protocols: [{type: ip, address: 127.0.0.1, mcp_port: 8080, role: native}]
  mesh: {enabled: false}
buses:
  plant:
    type: sim
    seed: %d
    zones:
      zone_a: {ambient_c: 12, initial_c: 17.5, initial_rh: 72, tau_s: 600, heater_gain_c: 18}
capabilities:
  - name: temperature_zone_a
    kind: read
    description: Air temperature in zone A.
    zone: zone_a
    binding: {type: sim, bus: plant, point: zone_a.temperature}
    data_type: float
    unit: celsius
    range: {min: -10, max: 50}
    semantic_tags: [temperature, air, zone_a]
    family: temperature
    cache_ttl_ms: 100
    poll_ms: %d
  - name: heater_zone_a
    kind: do
    description: Heating power in zone A.
    zone: zone_a
    binding: {type: sim, bus: plant, point: zone_a.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    precision: 1
    semantic_tags: [heating, heater, zone_a]
    family: heater
    timeout_ms: 2000
`, device, seed, pollMS)
}

func startGateway(dir, site, device string, seed, pollMS int, urls []string, password string) (*gateway, error) {
	m, err := manifest.Parse(device+".yml", []byte(gatewayManifest(device, seed, pollMS)))
	if err != nil {
		return nil, err
	}
	dir = filepath.Join(dir, site, device)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	g := &gateway{site: site, device: device}
	if g.st, err = store.Open(dir); err != nil {
		return nil, err
	}
	if g.al, err = audit.Open(filepath.Join(dir, "audit")); err != nil {
		g.close()
		return nil, err
	}
	pol, err := policy.ManifestOnly(m)
	if err != nil {
		g.close()
		return nil, err
	}
	gd := guard.New(guard.Config{Policy: pol, State: g.st, DeviceID: device})
	if g.n, err = node.Open(context.Background(), node.Config{Manifest: m, Store: g.st, Audit: g.al, Guard: gd}); err != nil {
		g.close()
		return nil, err
	}
	if g.up, err = fleet.New(fleet.Config{URLs: urls, Site: site, DeviceID: device, Stream: manifest.DefaultFleetStream, Prefix: manifest.DefaultFleetSubjectPrefix,
		Options: []nats.Option{nats.UserInfo(site, password)}, ConnectTimeout: 5 * time.Second, PublishTimeout: 5 * time.Second}); err != nil {
		g.close()
		return nil, err
	}
	g.srv = fleet.NewServer(fleet.ServeConfig{Prefix: manifest.DefaultFleetSubjectPrefix, Site: site, Serve: manifest.DefaultFleetServe,
		Owner: meshnode.Owner{Node: g.n}})
	g.srv.Start(g.up)
	g.up.Start(g.al)
	g.up.Follow(g.n)
	return g, nil
}

func (g *gateway) close() {
	if g.srv != nil {
		g.srv.Close()
	}
	if g.up != nil {
		g.up.Close()
	}
	if g.n != nil {
		_ = g.n.Close(context.Background())
	}
	if g.al != nil {
		_ = g.al.Close()
	}
	if g.st != nil {
		_ = g.st.Close()
	}
}
