//go:build !nohub

package hub

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// serverPermissions are p in nats-server's terms.
func serverPermissions(p Permissions) *server.Permissions {
	return &server.Permissions{Publish: &server.SubjectPermission{Allow: p.Publish}, Subscribe: &server.SubjectPermission{Allow: p.Subscribe}}
}

// Hub is an embedded nats-server.
type Hub struct {
	s        *server.Server
	password string
	tls      bool
}

// FleetUser is the embedded hub's user of the fleet endpoint (in process;
// its password is random per start).
const FleetUser = "physd-fleet"

// Start runs the embedded hub; it is ready for connections when Start
// returns.
func Start(cfg Config) (*Hub, error) {
	host, ps, err := net.SplitHostPort(cfg.Listen)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("embedded hub: listen %q: use host:port, e.g. 127.0.0.1:4222", cfg.Listen)
	}
	if cfg.StoreDir == "" {
		return nil, errors.New("embedded hub: a store directory is required (JetStream keeps the audit and catalog streams there)")
	}
	pw := make([]byte, 24)
	_, _ = rand.Read(pw)
	h := &Hub{password: hex.EncodeToString(pw), tls: cfg.TLS != nil}
	users := []*server.User{{Username: FleetUser, Password: h.password, Permissions: serverPermissions(FleetPermissions(cfg.Prefix, "", cfg.Streams))}}
	var nkeys []*server.NkeyUser
	for _, s := range cfg.Sites {
		perm := serverPermissions(SitePermissions(cfg.Prefix, s.Name, "", cfg.Streams.Audit, cfg.Streams.History, cfg.Streams.Alarms))
		if s.NKey != "" {
			nkeys = append(nkeys, &server.NkeyUser{Nkey: s.NKey, Permissions: perm})
			continue
		}
		users = append(users, &server.User{Username: s.Name, Password: s.Password, Permissions: perm})
	}
	if port == 0 {
		// A free port, as :0 says; nats-server's own 0 is its default
		// port, 4222 (taken by another hub, it would never be ready).
		port = server.RANDOM_PORT
	}
	opts := &server.Options{ServerName: "physd-fleet-hub", Host: host, Port: port, JetStream: true, StoreDir: cfg.StoreDir,
		JetStreamMaxStore: cfg.MaxStore, Users: users, Nkeys: nkeys, NoSigs: true, NoLog: true, MaxControlLine: 4096,
		TLSConfig: cfg.TLS, TLS: cfg.TLS != nil, TLSVerify: cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded hub: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded hub: not ready on %s within 10 s (is the port taken, or the store directory %s unwritable?)", cfg.Listen, cfg.StoreDir)
	}
	h.s = s
	return h, nil
}

// Addr is the address the hub listens on (the port chosen for :0).
func (h *Hub) Addr() string { return h.s.Addr().String() }

// URL is how the sites' gateways reach the hub.
func (h *Hub) URL() string {
	if h.tls {
		return "tls://" + h.Addr()
	}
	return "nats://" + h.Addr()
}

// ClientOptions connect the fleet endpoint in process (no socket).
func (h *Hub) ClientOptions() []nats.Option {
	return []nats.Option{nats.InProcessServer(h.s), nats.UserInfo(FleetUser, h.password)}
}

// Shutdown stops the hub and waits for it.
func (h *Hub) Shutdown() {
	h.s.Shutdown()
	h.s.WaitForShutdown()
}
