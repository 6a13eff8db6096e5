package fleetd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/promcp"
)

// directory is what the endpoint knows of the sites' gateways: each one's
// catalog (from the catalog stream at start, then as they publish it or
// their heartbeat names another), its heartbeats, and the latest
// observation of each of its tools. A gateway is known by its subjects
// (<prefix>.<site>.<device>), which the hub's per-site permissions vouch
// for: a catalog, heartbeat or observation whose body names another site
// or device than its subject is not taken.
type directory struct {
	prefix string
	log    *slog.Logger
	client *fleet.Client

	mu        sync.Mutex
	gws       map[string]*gateway // by mcpserver.OwnerKey
	connected time.Time           // when the endpoint's connection last came up (zero: down)
	changed   chan struct{}
	onChange  []func()
	fetching  map[string]bool
	rejected  uint64
}

// gateway is one gateway of a site.
type gateway struct {
	site, device string
	cat          *fleet.Catalog // nil until a catalog is known
	hbAt         time.Time      // the last heartbeat's arrival (this process's clock)
	hbEvery      time.Duration
	hbStopped    bool // the last heartbeat said it stopped
	obs          map[string]cached
}

// cached is an observation as it arrived.
type cached struct {
	obs promcp.Observation
	at  time.Time // arrival, this process's monotonic clock
}

// age is how old the value is now: its age when the gateway sent it plus
// the time since it arrived (no clock is compared across the WAN).
func (c cached) age(now time.Time) time.Duration {
	return time.Duration(saneAge(c.obs.AgeMS))*time.Millisecond + now.Sub(c.at)
}

// maxAgeMS bounds the age_ms a gateway sends: a century, far past any
// capability's freshness, and far below the milliseconds a Duration
// holds (more would overflow into a negative, fresh age).
const maxAgeMS = int64(100 * 365 * 24 * time.Hour / time.Millisecond)

// saneAge is a gateway's age_ms as the endpoint counts it: a negative
// age (a gateway whose clock went back, or that lies) counts as none, so
// a value is never younger than its time since arrival; an absurd one is
// capped, so it stays stale.
func saneAge(ms int64) int64 { return min(max(ms, 0), maxAgeMS) }

func newDirectory(prefix string, log *slog.Logger) *directory {
	return &directory{prefix: prefix, log: log, gws: map[string]*gateway{}, changed: make(chan struct{}, 1), fetching: map[string]bool{}}
}

func (d *directory) gatewayLocked(site, device string) *gateway {
	key := mcpserver.OwnerKey(site, device)
	g := d.gws[key]
	if g == nil {
		g = &gateway{site: site, device: device, obs: map[string]cached{}}
		d.gws[key] = g
	}
	return g
}

// subscribe follows the gateways' catalogs, heartbeats and observations.
func (d *directory) subscribe(nc *nats.Conn) error {
	for subj, h := range map[string]nats.MsgHandler{
		d.prefix + ".*.*." + fleet.SuffixCatalog:    d.onCatalog,
		d.prefix + ".*.*." + fleet.SuffixHeartbeat:  d.onHeartbeat,
		d.prefix + ".*.*." + fleet.SuffixObs + ".*": d.onObservation,
	} {
		if _, err := nc.Subscribe(subj, h); err != nil {
			return fmt.Errorf("subscribe %s: %w", subj, err)
		}
	}
	return nil
}

// take puts a catalog that arrived on subject in place, if it is the
// subject's gateway's and intact.
func (d *directory) take(subject string, data []byte) {
	site, device, _, ok := fleet.SplitSubject(d.prefix, subject)
	if !ok {
		return
	}
	var c fleet.Catalog
	if err := json.Unmarshal(data, &c); err != nil || !c.Valid() || c.Site != site || c.DeviceID != device {
		d.mu.Lock()
		d.rejected++
		d.mu.Unlock()
		d.log.Warn("fleet: a catalog not taken: its body is not intact, or names another gateway than its subject", "subject", subject)
		return
	}
	d.mu.Lock()
	g := d.gatewayLocked(site, device)
	same := g.cat != nil && g.cat.Hash == c.Hash
	g.cat = &c
	d.mu.Unlock()
	if !same {
		d.log.Info("fleet: gateway catalog", "site", site, "device", device, "state", c.State, "capabilities", len(c.Capabilities), "serves", c.Serves)
		d.notify()
	}
}

func (d *directory) onCatalog(m *nats.Msg) { d.take(m.Subject, m.Data) }

func (d *directory) onHeartbeat(m *nats.Msg) {
	site, device, _, ok := fleet.SplitSubject(d.prefix, m.Subject)
	if !ok {
		return
	}
	var hb fleet.Heartbeat
	if json.Unmarshal(m.Data, &hb) != nil {
		return
	}
	d.mu.Lock()
	key := mcpserver.OwnerKey(site, device)
	if d.gws[key] == nil && d.unknown() >= maxUnknown {
		// Heartbeats under more names than gateways answer with a
		// catalog: not remembered (a site's credentials can publish any
		// device name of their site).
		d.mu.Unlock()
		return
	}
	g := d.gatewayLocked(site, device)
	wasStopped := g.hbStopped
	g.hbAt, g.hbEvery, g.hbStopped = time.Now(), time.Duration(hb.IntervalMS)*time.Millisecond, hb.State == fleet.StateStopped
	stale := g.cat == nil || g.cat.Hash != hb.Catalog
	fetch := stale && !d.fetching[key] && !g.hbStopped
	if fetch {
		d.fetching[key] = true
	}
	d.mu.Unlock()
	if wasStopped != g.hbStopped {
		d.notify()
	}
	if fetch {
		// A catalog the endpoint missed (it started later, the stream
		// lost it, or the gateway changed it): ask the gateway.
		go d.fetch(site, device)
	}
}

func (d *directory) fetch(site, device string) {
	defer func() {
		d.mu.Lock()
		delete(d.fetching, mcpserver.OwnerKey(site, device))
		d.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := d.client.Request(ctx, site, device, fleet.KindCatalog, nil)
	if err != nil {
		d.log.Debug("fleet: catalog not fetched", "site", site, "device", device, "err", err.Error())
		return
	}
	d.take(fleet.Base(d.prefix, site, device)+"."+fleet.SuffixCatalog, b)
}

func (d *directory) onObservation(m *nats.Msg) {
	site, device, rest, ok := fleet.SplitSubject(d.prefix, m.Subject)
	if !ok {
		return
	}
	tool := rest[len(fleet.SuffixObs)+1:]
	var o promcp.Observation
	if json.Unmarshal(m.Data, &o) != nil || o.Capability != tool || o.Source != device {
		return
	}
	o.AgeMS = saneAge(o.AgeMS)
	now := time.Now()
	d.mu.Lock()
	// Only a tool of a known gateway's catalog is kept: a site's
	// credentials can publish under any device and tool name of their
	// site, and each name would otherwise be kept for good.
	g := d.gws[mcpserver.OwnerKey(site, device)]
	if g == nil || g.cat == nil || !slices.ContainsFunc(g.cat.Capabilities, func(en fleet.Entry) bool { return en.Tool == tool }) {
		d.mu.Unlock()
		return
	}
	if prev, ok := g.obs[tool]; !ok || prev.age(now) >= time.Duration(o.AgeMS)*time.Millisecond {
		g.obs[tool] = cached{obs: o, at: now}
	}
	d.mu.Unlock()
}

// maxUnknown bounds the gateways heard of by their heartbeats whose
// catalog is not known (yet).
const maxUnknown = 1000

// unknown counts the gateways without a catalog (d.mu held).
func (d *directory) unknown() int {
	n := 0
	for _, g := range d.gws {
		if g.cat == nil {
			n++
		}
	}
	return n
}

// load reads every gateway's last catalog from the catalog stream: the
// gateways are known when the endpoint (re)starts, whether they are up or
// not.
func (d *directory) load(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(d.prefix+".*.*."+fleet.SuffixCatalog))
	if err != nil {
		return err
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for s := range info.State.Subjects {
		subjects = append(subjects, s)
	}
	sort.Strings(subjects)
	for _, s := range subjects {
		m, err := st.GetLastMsgForSubject(ctx, s)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		d.take(s, m.Data)
	}
	return nil
}

// notify tells the listeners (the MCP server's tool lists) that the
// gateways' tools may have changed; notifications that pile up are one.
func (d *directory) notify() {
	select {
	case d.changed <- struct{}{}:
	default:
	}
}

// run calls the listeners on changes until ctx ends.
func (d *directory) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.changed:
		}
		d.mu.Lock()
		fs := append([]func(){}, d.onChange...)
		d.mu.Unlock()
		for _, f := range fs {
			f()
		}
	}
}

// setConnected records the endpoint's connection state: the gateways'
// link states count from when it came up.
func (d *directory) setConnected(up bool) {
	d.mu.Lock()
	if up {
		d.connected = time.Now()
	} else {
		d.connected = time.Time{}
	}
	d.mu.Unlock()
}

// disconnected reports whether the endpoint's own connection is down.
func (d *directory) disconnected() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.connected.IsZero()
}

// Link states of a gateway.
const (
	LinkUp           = "up"
	LinkWaiting      = "waiting" // known from the stream; no heartbeat yet since the endpoint connected
	LinkDown         = "down"
	LinkStopped      = "stopped" // it stopped gracefully
	LinkDisconnected = "unknown" // the endpoint itself is not connected to NATS
)

// missedBeats is how many heartbeats may be missed before a link is down.
const missedBeats = 3

// link is the gateway's link state now and the words that explain it.
func (d *directory) linkLocked(g *gateway, now time.Time) (string, string) {
	every := g.hbEvery
	if every <= 0 && g.cat != nil {
		every = time.Duration(g.cat.HeartbeatMS) * time.Millisecond
	}
	if every <= 0 {
		every = fleet.DefaultHeartbeat
	}
	switch {
	case d.connected.IsZero():
		return LinkDisconnected, "the fleet endpoint is not connected to NATS"
	case g.hbStopped || g.hbAt.IsZero() && g.cat != nil && g.cat.State == fleet.StateStopped:
		at := "its last catalog says so"
		if !g.hbAt.IsZero() {
			at = fmt.Sprintf("%s ago", now.Sub(g.hbAt).Round(time.Second))
		}
		return LinkStopped, fmt.Sprintf("gateway %s of site %s stopped (%s)", g.device, g.site, at)
	case !g.hbAt.IsZero() && now.Sub(g.hbAt) <= missedBeats*every:
		return LinkUp, ""
	case !g.hbAt.IsZero():
		return LinkDown, fmt.Sprintf("the link to gateway %s of site %s is down: no heartbeat for %s (one is due every %s)", g.device, g.site, now.Sub(g.hbAt).Round(time.Second), every)
	case now.Sub(d.connected) <= missedBeats*every:
		return LinkWaiting, ""
	}
	return LinkDown, fmt.Sprintf("the link to gateway %s of site %s is down: no heartbeat since the fleet endpoint connected %s ago", g.device, g.site, now.Sub(d.connected).Round(time.Second))
}

// snapshot is one gateway as a call sees it.
type snapshot struct {
	site, device string
	cat          fleet.Catalog
	link, why    string
}

// gateways are the gateways with a catalog, by key.
func (d *directory) gateways() []snapshot {
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]snapshot, 0, len(d.gws))
	for _, g := range d.gws {
		if g.cat == nil {
			continue
		}
		link, why := d.linkLocked(g, now)
		out = append(out, snapshot{site: g.site, device: g.device, cat: *g.cat, link: link, why: why})
	}
	sort.Slice(out, func(i, j int) bool {
		return mcpserver.OwnerKey(out[i].site, out[i].device) < mcpserver.OwnerKey(out[j].site, out[j].device)
	})
	return out
}

// gateway is one gateway by key (ok false when it has no catalog).
func (d *directory) gateway(key string) (snapshot, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gws[key]
	if g == nil || g.cat == nil {
		return snapshot{}, false
	}
	link, why := d.linkLocked(g, time.Now())
	return snapshot{site: g.site, device: g.device, cat: *g.cat, link: link, why: why}, true
}

// observation is the latest observation of tool on the gateway key.
func (d *directory) observation(key, tool string) (cached, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gws[key]
	if g == nil {
		return cached{}, false
	}
	c, ok := g.obs[tool]
	return c, ok
}

// keep records an observation a live read returned.
func (d *directory) keep(key string, o promcp.Observation) {
	site, device := mcpserver.SplitOwner(key)
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gatewayLocked(site, device)
	g.obs[o.Capability] = cached{obs: o, at: time.Now()}
}
