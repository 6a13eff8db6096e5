// Package fleetd is the fleet endpoint (physd fleet): one MCP endpoint over
// every site's gateways, reached over NATS. It is the MCP server's Router
// (router.go: the gateways' tools with a site argument, read_ from the
// latest observation with its age, do_ forwarded two-phase to the owning
// gateway) and its node's Remote (cando.go: can_do asked of every
// matching gateway with one deadline); the directory (directory.go)
// follows the gateways' catalogs, heartbeats and observations. The MCP
// server, the HTTP boundary and the process around them are the same as
// a gateway's (package daemon); the gateways' side is package fleet.
package fleetd

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/hub"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/metrics"
)

// Endpoint is the fleet endpoint's NATS side.
type Endpoint struct {
	cfg      *Config
	log      *slog.Logger
	instance string
	hub      *hub.Hub // the embedded hub (nil with an external cluster)
	nc       *nats.Conn
	client   *fleet.Client
	dir      *directory
	records  *records // the sites' history and alarms (mcpserver.SiteRecords)
	cancel   context.CancelFunc
	runCtx   context.Context // ends at Close
	done     sync.WaitGroup

	mu        sync.Mutex
	streamErr string        // why the streams could not be made sure of (empty: fine)
	loaded    chan struct{} // closed once the catalogs were read from the stream
	loadOnce  sync.Once

	// Announce, when set, is told how the sites connect to the embedded
	// hub once it runs (HowSitesConnect).
	Announce io.Writer
}

// New builds the endpoint of cfg; Start connects (or embeds) and follows
// the gateways.
func New(cfg *Config, log *slog.Logger) *Endpoint {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.fillStreams()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &Endpoint{cfg: cfg, log: log.With("component", "fleet"), instance: fmt.Sprintf("%x", b), dir: newDirectory(cfg.Prefix, log.With("component", "fleet")),
		loaded: make(chan struct{})}
	e.records = newRecords(cfg, e.dir, e.log)
	return e
}

// Sites are the sites' history and active alarms at the hub (the MCP
// server's physmcp://history/… and physmcp://alarms).
func (e *Endpoint) Sites() mcpserver.SiteRecords { return e.records }

// ID is the endpoint's name (its MCP server's device id).
func (e *Endpoint) ID() string { return e.cfg.ID }

// Manifest is the endpoint's own manifest: no capability (every tool is a
// gateway's), its views, its id.
func (e *Endpoint) Manifest() *manifest.Manifest {
	return &manifest.Manifest{PhysMCPVersion: "0.1",
		Device:  manifest.Device{ID: e.cfg.ID, Type: "fleet_endpoint", Vendor: "physd", Model: "physd fleet", Location: manifest.Location{Zone: "fleet", Area: "fleet"}},
		Network: manifest.Network{Mesh: manifest.Mesh{Enabled: false}},
		Buses:   map[string]*manifest.Bus{},
		Audit:   manifest.Audit{Enabled: true, RetentionDays: 30},
		Views:   e.cfg.Views}
}

// Start connects to the cluster, or starts the embedded hub and connects
// in process, then follows the gateways. A cluster that cannot be reached
// does not stop the endpoint: it keeps trying (readiness says so).
func (e *Endpoint) Start(ctx context.Context) error {
	// What runs until Close (set before the connection's callbacks can
	// run).
	e.runCtx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	opts := []nats.Option{nats.Name("physd fleet " + e.cfg.ID), nats.CustomInboxPrefix(hub.FleetInboxPrefix),
		nats.Timeout(e.cfg.ConnectTimeout), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.ReconnectBufSize(-1),
		nats.ConnectHandler(e.onConnect), nats.ReconnectHandler(e.onConnect),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			e.dir.setConnected(false)
			if err != nil {
				e.log.Warn("fleet: disconnected from NATS; the gateways' states are unknown until it returns", "err", err.Error())
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { e.log.Error("fleet: NATS", "err", err.Error()) }),
	}
	url := ""
	if em := e.cfg.Embed; em != nil {
		h, err := startHub(em, e.cfg)
		if err != nil {
			return err
		}
		e.hub = h
		opts = append(opts, h.ClientOptions()...)
		url = h.URL()
		e.log.Info("fleet: embedded NATS hub", "url", url, "store", em.StoreDir, "sites", len(em.Sites))
		if e.Announce != nil {
			e.HowSitesConnect(e.Announce)
		}
	} else {
		more, err := fleet.Options(&e.cfg.NATS.Fleet)
		if err != nil {
			return err
		}
		opts = append(opts, more...)
		url = strings.Join(e.cfg.NATS.URLs, ",")
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		e.closeHub()
		return fmt.Errorf("fleet: NATS %s: %w", url, err)
	}
	e.nc = nc
	if e.client, err = fleet.NewClient(nc, e.cfg.Prefix, e.cfg.ID+"/"+e.instance); err != nil {
		return e.fail(err)
	}
	e.dir.client = e.client
	if err := e.dir.subscribe(nc); err != nil {
		return e.fail(err)
	}
	e.done.Add(1)
	go func() { defer e.done.Done(); e.dir.run(e.runCtx) }()
	// nats.go calls onConnect once connected. The MCP server starts with
	// the gateways listed when the hub answers within the connect
	// timeout; else it starts without, and lists them as they come.
	select {
	case <-e.loaded:
	case <-time.After(e.cfg.ConnectTimeout):
		e.log.Warn("fleet: NATS has not answered yet; serving, the gateways are listed once it does", "timeout", e.cfg.ConnectTimeout)
	}
	return nil
}

func (e *Endpoint) fail(err error) error {
	e.cancel()
	e.nc.Close()
	e.closeHub()
	return fmt.Errorf("fleet: %w", err)
}

// onConnect makes sure of the streams and reads the gateways' catalogs,
// after every (re)connect (off the connection's callback goroutine).
func (e *Endpoint) onConnect(nc *nats.Conn) {
	e.dir.setConnected(true)
	e.log.Info("fleet: connected to NATS", "server", nc.ConnectedUrlRedacted())
	e.done.Add(1)
	go func() {
		defer e.done.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		js, err := e.jetStream(nc)
		if err == nil {
			e.records.use(js)
			err = e.ensureStreams(ctx, js)
		}
		if err == nil {
			err = e.dir.load(ctx, js, e.cfg.CatalogStream)
		}
		if err == nil {
			e.records.follow(e.runCtx)
		}
		e.mu.Lock()
		e.streamErr = ""
		if err != nil {
			e.streamErr = err.Error()
		}
		e.mu.Unlock()
		if err != nil {
			e.log.Error("fleet: the catalog stream could not be read; gateways are learnt from their heartbeats", "err", err.Error())
			return
		}
		e.loadOnce.Do(func() { close(e.loaded) })
	}()
}

// ensureStreams creates the fleet's streams when they are missing and
// this user may (hub.FleetPermissions): the catalogs (last per gateway),
// the audit trails, the history buckets and the alarm states, with the
// configured replicas.
func (e *Endpoint) ensureStreams(ctx context.Context, js jetstream.JetStream) error {
	c := e.cfg
	for _, sc := range []jetstream.StreamConfig{
		fleet.CatalogStreamConfig(c.CatalogStream, c.Prefix, c.Replicas),
		fleet.AuditStreamConfig(c.AuditStream, c.Prefix, c.Replicas),
		fleet.HistoryStreamConfig(c.HistoryStream, c.Prefix, c.Replicas),
		fleet.AlarmStreamConfig(c.AlarmStream, c.Prefix, c.Replicas),
	} {
		_, err := js.Stream(ctx, sc.Name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			if _, err = js.CreateStream(ctx, sc); err == nil {
				e.log.Info("fleet: stream created", "stream", sc.Name, "replicas", sc.Replicas)
			}
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w (fix: create it with the subjects %s, or give the endpoint's user the JetStream API, hub.FleetPermissions)", sc.Name, err, strings.Join(sc.Subjects, " "))
		}
	}
	return nil
}

// streams are the streams the endpoint reads.
func (c *Config) streams() hub.FleetStreams {
	return hub.FleetStreams{Audit: c.AuditStream, Catalog: c.CatalogStream, History: c.HistoryStream, Alarms: c.AlarmStream}
}

// jetStream is the hub's JetStream, by its domain when one is set.
func (e *Endpoint) jetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	if e.cfg.NATS != nil && e.cfg.NATS.Domain != "" {
		return jetstream.NewWithDomain(nc, e.cfg.NATS.Domain)
	}
	return jetstream.New(nc)
}

// startHub reads the sites' passwords and starts the embedded hub.
func startHub(em *Embed, cfg *Config) (*hub.Hub, error) {
	hc := hub.Config{Listen: em.Listen, StoreDir: em.StoreDir, Prefix: cfg.Prefix, Streams: cfg.streams(), MaxStore: em.MaxStoreMB << 20}
	for _, s := range em.Sites {
		site := hub.Site{Name: s.Name, NKey: s.NKey}
		if s.PasswordFile != "" {
			b, err := os.ReadFile(s.PasswordFile)
			if err != nil {
				return nil, fmt.Errorf("%s: embed.sites.%s.password_file: %w; fix: a file holding the site's password", cfg.Path, s.Name, err)
			}
			if site.Password = strings.TrimRight(string(b), "\r\n"); site.Password == "" {
				return nil, fmt.Errorf("%s: embed.sites.%s.password_file %s is empty; fix: write the site's password in it", cfg.Path, s.Name, s.PasswordFile)
			}
		}
		hc.Sites = append(hc.Sites, site)
	}
	if em.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(em.TLSCert, em.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("%s: embed.tls: %w", cfg.Path, err)
		}
		hc.TLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}
		if em.TLSClientCA != "" {
			b, err := os.ReadFile(em.TLSClientCA)
			if err != nil {
				return nil, fmt.Errorf("%s: embed.tls.client_ca: %w", cfg.Path, err)
			}
			hc.TLS.ClientCAs = x509.NewCertPool()
			if !hc.TLS.ClientCAs.AppendCertsFromPEM(b) {
				return nil, fmt.Errorf("%s: embed.tls.client_ca %s holds no PEM certificate", cfg.Path, em.TLSClientCA)
			}
			hc.TLS.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return hub.Start(hc)
}

// HowSitesConnect writes, for the embedded hub, the network.fleet block
// each site's gateways need.
func (e *Endpoint) HowSitesConnect(w io.Writer) {
	if e.hub == nil {
		return
	}
	fmt.Fprintf(w, "physd fleet: embedded NATS hub on %s (JetStream in %s). A site's gateways connect with, in their manifest's network:\n", e.hub.URL(), e.cfg.Embed.StoreDir)
	for _, s := range e.cfg.Embed.Sites {
		auth := "user: " + s.Name + "\n      password_file: " + s.PasswordFile
		if s.NKey != "" {
			auth = "nkey_seed_file: <the seed of " + s.NKey + ">"
		}
		fmt.Fprintf(w, "  fleet:\n      urls: [%q]\n      site: %s\n      %s\n      serve: [read, can_do]   # add do to let the fleet actuate\n", e.hub.URL(), s.Name, auth)
	}
}

// HubURL is the embedded hub's URL ("" with an external cluster).
func (e *Endpoint) HubURL() string {
	if e.hub == nil {
		return ""
	}
	return e.hub.URL()
}

// Ready is nil while the endpoint is connected to NATS.
func (e *Endpoint) Ready() error {
	if e.nc == nil || !e.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	return nil
}

// Close stops following the gateways, closes the connection and stops
// the embedded hub.
func (e *Endpoint) Close() {
	if e.cancel != nil {
		e.cancel()
	}
	if e.client != nil {
		e.client.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	e.done.Wait()
	e.closeHub()
}

func (e *Endpoint) closeHub() {
	if e.hub != nil {
		e.hub.Shutdown()
		e.hub = nil
	}
}

// RegisterMetrics exports the gateways' link states and the endpoint's
// connection.
func (e *Endpoint) RegisterMetrics(mx *metrics.Metrics) {
	mx.Gauge("physd_fleet_endpoint_connected", "physd fleet: 1 while the fleet endpoint is connected to NATS.", nil, func() float64 {
		if e.Ready() == nil {
			return 1
		}
		return 0
	})
	mx.GaugeSet("physd_fleet_gateway_up", "physd fleet: 1 while a gateway's heartbeats arrive, 0 while its link is down, it stopped or is not heard yet.",
		[]string{"site", "device", "state"}, func(emit func(float64, ...string)) {
			for _, g := range e.dir.gateways() {
				up := 0.0
				if g.link == LinkUp {
					up = 1
				}
				emit(up, g.site, g.device, g.link)
			}
		})
	mx.Gauge("physd_fleet_catalogs_rejected", "physd fleet: catalogs not taken (not intact, or naming another gateway than their subject).", nil, func() float64 {
		e.dir.mu.Lock()
		defer e.dir.mu.Unlock()
		return float64(e.dir.rejected)
	})
}

// Status is /status's fleet entry and the physmcp://mesh resource: the
// connection, and every gateway with its link state.
func (e *Endpoint) Status() any {
	type member struct {
		Site     string        `json:"site"`
		Name     string        `json:"name"`
		State    string        `json:"state"`
		Why      string        `json:"why,omitempty"`
		Serves   []string      `json:"serves"`
		Instance string        `json:"instance"`
		Catalog  fleet.Catalog `json:"catalog"`
	}
	st := struct {
		ID          string   `json:"id"`
		Connected   bool     `json:"connected"`
		Server      string   `json:"server,omitempty"`
		Embedded    string   `json:"embedded_hub,omitempty"`
		StreamError string   `json:"stream_error,omitempty"`
		Sites       []string `json:"sites"`
		Gateways    int      `json:"gateways"`
		Rejected    uint64   `json:"catalogs_rejected"`
		Members     []member `json:"members"`
	}{ID: e.cfg.ID, Embedded: e.HubURL(), Sites: []string{}, Members: []member{}}
	if e.nc != nil && e.nc.IsConnected() {
		st.Connected, st.Server = true, e.nc.ConnectedUrlRedacted()
	}
	e.mu.Lock()
	st.StreamError = e.streamErr
	e.mu.Unlock()
	for _, g := range e.dir.gateways() {
		st.Members = append(st.Members, member{Site: g.site, Name: g.device, State: g.link, Why: g.why, Serves: g.cat.Serves, Instance: g.cat.Instance, Catalog: g.cat})
		if len(st.Sites) == 0 || st.Sites[len(st.Sites)-1] != g.site {
			st.Sites = append(st.Sites, g.site)
		}
	}
	st.Gateways = len(st.Members)
	e.dir.mu.Lock()
	st.Rejected = e.dir.rejected
	e.dir.mu.Unlock()
	return st
}
