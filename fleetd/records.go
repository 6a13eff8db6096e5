package fleetd

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/history"
	"github.com/physd/physd/mcpserver"
)

// errNotConnected answers a read while the endpoint has not reached NATS.
var errNotConnected = errors.New("the fleet endpoint is not connected to NATS yet")

// records are the sites' history and active alarms the endpoint serves
// (mcpserver.SiteRecords): read from the hub's streams, where the
// gateways' uplinks copy them, by fleet.HistoryReader and
// fleet.AlarmReader. The alarm states are also followed as the stream
// stores them (an ordered consumer), to tell subscribers of
// physmcp://alarms when one changes: told after the hub stored it, so a
// read that follows the update finds it.
type records struct {
	cfg *Config
	dir *directory
	log *slog.Logger

	mu        sync.Mutex
	js        jetstream.JetStream // nil until connected
	following bool
	states    map[string]fleet.DeviceAlarms // by owner key, as followed
	onAlarms  []func()
}

func newRecords(cfg *Config, dir *directory, log *slog.Logger) *records {
	return &records{cfg: cfg, dir: dir, log: log, states: map[string]fleet.DeviceAlarms{}}
}

// use gives the records the hub's JetStream (after every connect).
func (r *records) use(js jetstream.JetStream) {
	r.mu.Lock()
	r.js = js
	r.mu.Unlock()
}

// follow starts following the alarm states, once: the ordered consumer
// carries on across reconnects by itself. A failure is tried again at
// the next connect.
func (r *records) follow(ctx context.Context) {
	r.mu.Lock()
	js, start := r.js, !r.following && r.js != nil
	r.following = r.following || start
	r.mu.Unlock()
	if !start {
		return
	}
	if err := r.alarmReader(js).Follow(ctx, "", r.followed); err != nil {
		r.log.Warn("fleet: the alarm states are not followed; physmcp://alarms subscribers are told nothing until the next connect", "err", err.Error())
		r.mu.Lock()
		r.following = false
		r.mu.Unlock()
	}
}

func (r *records) followed(d fleet.DeviceAlarms) {
	r.mu.Lock()
	r.states[mcpserver.OwnerKey(d.Site, d.Device)] = d
	fs := append([]func(){}, r.onAlarms...)
	r.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func (r *records) jetStream() (jetstream.JetStream, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.js == nil {
		return nil, errNotConnected
	}
	return r.js, nil
}

func (r *records) historyReader(js jetstream.JetStream) *fleet.HistoryReader {
	return &fleet.HistoryReader{JS: js, Stream: r.cfg.HistoryStream, Prefix: r.cfg.Prefix}
}

func (r *records) alarmReader(js jetstream.JetStream) *fleet.AlarmReader {
	return &fleet.AlarmReader{JS: js, Stream: r.cfg.AlarmStream, Prefix: r.cfg.Prefix}
}

// Series lists the history series the hub holds.
func (r *records) Series(ctx context.Context) ([]mcpserver.SeriesKey, error) {
	js, err := r.jetStream()
	if err != nil {
		return nil, err
	}
	keys, err := r.historyReader(js).List(ctx, "")
	if err != nil {
		return nil, err
	}
	out := make([]mcpserver.SeriesKey, len(keys))
	for i, k := range keys {
		out[i] = mcpserver.SeriesKey{Site: k.Site, Device: k.Device, Tool: k.Tool}
	}
	return out, nil
}

// History answers one series' window from the hub's copy.
func (r *records) History(ctx context.Context, k mcpserver.SeriesKey, since, until time.Time, step time.Duration) (*history.Series, error) {
	js, err := r.jetStream()
	if err != nil {
		return nil, err
	}
	return r.historyReader(js).Query(ctx, fleet.SeriesKey{Site: k.Site, Device: k.Device, Tool: k.Tool}, since, until, step)
}

// Alarms reads every gateway's last alarm state from the hub, with the
// gateway's link as the endpoint sees it now.
func (r *records) Alarms(ctx context.Context) ([]mcpserver.SiteAlarms, error) {
	js, err := r.jetStream()
	if err != nil {
		return nil, err
	}
	ds, err := r.alarmReader(js).Active(ctx, "")
	if err != nil {
		return nil, err
	}
	return r.siteAlarms(ds), nil
}

// AlarmsFollowed is the alarm states as followed.
func (r *records) AlarmsFollowed() []mcpserver.SiteAlarms {
	r.mu.Lock()
	ds := make([]fleet.DeviceAlarms, 0, len(r.states))
	for _, d := range r.states {
		ds = append(ds, d)
	}
	r.mu.Unlock()
	return r.siteAlarms(ds)
}

// OnAlarms registers f, called after each alarm state the stream stores.
func (r *records) OnAlarms(f func()) {
	r.mu.Lock()
	r.onAlarms = append(r.onAlarms, f)
	r.mu.Unlock()
}

func (r *records) siteAlarms(ds []fleet.DeviceAlarms) []mcpserver.SiteAlarms {
	out := make([]mcpserver.SiteAlarms, len(ds))
	for i, d := range ds {
		link := ""
		if g, ok := r.dir.gateway(mcpserver.OwnerKey(d.Site, d.Device)); ok {
			link = g.link
		}
		out[i] = mcpserver.SiteAlarms{Site: d.Site, Device: d.Device, Stored: d.Stored, Link: link, Active: d.Active}
	}
	return out
}
