package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/physd/physd/alarms"
	"github.com/physd/physd/history"
	"github.com/physd/physd/manifest"
)

// The fleet endpoint's history and active alarms (physd fleet): what the
// sites' gateways copied to the hub, across sites, through the same view
// as every other method. A gateway's own are history.go and alarms.go.
//
//   - physmcp://history/{site}/{device}/{capability}{?since,until,step}:
//     one capability's history at one gateway of one site, answered as a
//     gateway answers physmcp://history/{capability} (the same URI query,
//     the same buckets).
//   - physmcp://history: the series the hub holds, each with its URI.
//   - physmcp://alarms: the alarms raised now at every gateway, each
//     naming its site and device, with when the hub stored each gateway's
//     state and its link: a site whose link is down shows its last state
//     with its age. Subscribable: a subscriber is told when what its view
//     shows changes.
//
// Through a view, a series or an alarm is there only when the view
// selects its capability at its site and gateway (from the gateway's
// catalog, as tools/list judges its tools); what no catalog describes is
// in no view.

// SiteRecords are the sites' records as the fleet's hub holds them
// (package fleetd, over fleet.HistoryReader and fleet.AlarmReader).
type SiteRecords interface {
	// Series lists the history series the hub holds.
	Series(ctx context.Context) ([]SeriesKey, error)
	// History answers one series' window as history.History.Query does
	// (a *history.QueryError for a bad window or an unknown series).
	History(ctx context.Context, k SeriesKey, since, until time.Time, step time.Duration) (*history.Series, error)
	// Alarms reads every gateway's last alarm state from the hub.
	Alarms(ctx context.Context) ([]SiteAlarms, error)
	// AlarmsFollowed is the same, as followed from the hub's stream
	// without a round trip (it decides whom an update is sent to), and
	// OnAlarms registers f, called after each state that arrives.
	AlarmsFollowed() []SiteAlarms
	OnAlarms(f func())
}

// SeriesKey names one capability's history at one gateway of one site.
type SeriesKey struct {
	Site, Device, Tool string
}

// SiteAlarms is one gateway's alarm state at the hub.
type SiteAlarms struct {
	Site, Device string
	// Stored is when the hub stored the state; Link is the gateway's link
	// as the endpoint sees it now (up, waiting, down, stopped, unknown).
	Stored time.Time
	Link   string
	Active []alarms.Active
}

// SiteHistoryURITemplate is the history of one capability at one gateway
// of one site (the fleet endpoint's).
const SiteHistoryURITemplate = "physmcp://history/{site}/{device}/{capability}{?since,until,step}"

// SiteHistoryIndexURI lists the history series the hub holds.
const SiteHistoryIndexURI = "physmcp://history"

// maxFleetHistoryWait bounds a history or alarm read at the hub when the
// caller set no deadline.
const maxFleetHistoryWait = 30 * time.Second

func (s *Server) addSiteResources(r SiteRecords) {
	s.mcp.AddResourceTemplate(&mcp.ResourceTemplate{
		URITemplate: SiteHistoryURITemplate, Name: "site_history", Title: "History of a capability at a site",
		Description: "Downsampled history of a numeric capability at one gateway of one site, from the copy its gateway keeps at the fleet's hub: buckets of step with min, max, mean, count, good_share and last. " +
			"since and until are RFC 3339 times or durations before now (since=1h); default the last hour until now. step is a duration, a multiple of the gateway's resolution. " +
			"physmcp://history lists the series. Example: physmcp://history/north/gw_greenhouse_001/temperature_zone_a?since=6h&step=10m",
		MIMEType: "application/json",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return s.readSiteHistory(ctx, r, req)
	})
	s.mcp.AddResource(&mcp.Resource{
		URI: SiteHistoryIndexURI, Name: "site_history_index", Title: "History series across sites",
		Description: "The history series the fleet's hub holds: site, device, capability and its URI (the last hour; add since, until and step).",
		MIMEType:    "application/json",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		ctx, cancel := boundedRead(ctx)
		defer cancel()
		keys, err := r.Series(ctx)
		if err != nil {
			return nil, err
		}
		v, subjects := s.scopeOf(req.Extra).view, s.siteSubjects()
		type entry struct {
			Site       string `json:"site"`
			Device     string `json:"device"`
			Capability string `json:"capability"`
			Tool       string `json:"tool"`
			URI        string `json:"uri"`
		}
		out := []entry{}
		for _, k := range keys {
			if sub, known := subjects[seriesOwnerTool(k)]; v != nil && (!known || !v.Match(sub)) {
				continue
			}
			name := manifest.CapabilityName(k.Tool)
			out = append(out, entry{Site: k.Site, Device: k.Device, Capability: name, Tool: k.Tool,
				URI: "physmcp://history/" + k.Site + "/" + k.Device + "/" + name})
		}
		return jsonResource(SiteHistoryIndexURI, map[string]any{"series": out})
	})
	s.mcp.AddResource(&mcp.Resource{
		URI: AlarmsURI, Name: "alarms", Title: "Active alarms across sites",
		Description: "The alarms raised now at every gateway of every site (their capabilities[].alarms: high, low, quality, stale), each with its site, device, capability, kind, since and message, " +
			"and for each gateway when the hub stored its state and its link: a site whose link is down shows its last state, with its age. Subscribe to be told when one is raised or cleared.",
		MIMEType: "application/json",
	}, func(ctx context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		ctx, cancel := boundedRead(ctx)
		defer cancel()
		states, err := r.Alarms(ctx)
		if err != nil {
			return nil, err
		}
		return jsonResource(AlarmsURI, siteAlarmsDoc(s.siteAlarmsInView(s.scopeOf(req.Extra).view, states), time.Now()))
	})
	r.OnAlarms(func() {
		_ = s.mcp.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: AlarmsURI})
	})
}

// boundedRead bounds a read at the hub by the caller's deadline, or
// maxFleetHistoryWait without one.
func boundedRead(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, maxFleetHistoryWait)
}

// siteSubjects maps each owner's tool (OwnerKey/tool) to what a view
// matches it on, from the gateways' catalogs.
func (s *Server) siteSubjects() map[string]manifest.ViewSubject {
	out := map[string]manifest.ViewSubject{}
	if s.opts.Router == nil {
		return out
	}
	for _, t := range s.opts.Router.RemoteTools() {
		out[t.key()+"/"+t.Tool] = manifest.ViewSubject{Device: t.Owner, Site: t.Site, Area: t.Area, Name: manifest.CapabilityName(t.Tool), Kind: t.Kind, Zone: t.Zone, Tags: t.Tags}
	}
	return out
}

func seriesOwnerTool(k SeriesKey) string { return OwnerKey(k.Site, k.Device) + "/" + k.Tool }

// readSiteHistory answers physmcp://history/{site}/{device}/{capability}.
func (s *Server) readSiteHistory(ctx context.Context, r SiteRecords, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
	uri := req.Params.URI
	site, device, name, since, until, step, err := parseSiteHistoryURI(uri, time.Now())
	if err == nil {
		ctx, cancel := boundedRead(ctx)
		defer cancel()
		var k SeriesKey
		if k, err = s.seriesOf(ctx, r, req.Extra, site, device, name); err == nil {
			var series *history.Series
			if series, err = r.History(ctx, k, since, until, step); err == nil {
				out := struct {
					Site   string `json:"site"`
					Device string `json:"device"`
					*history.Series
				}{site, device, series}
				out.Capability = name
				return jsonResource(uri, out)
			}
		}
	}
	var qe *history.QueryError
	if errors.As(err, &qe) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: uri + ": " + err.Error()}
	}
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return nil, err
	}
	return nil, fmt.Errorf("%s: the fleet's hub did not answer: %w", uri, err)
}

// seriesOf finds the series of capability name at site/device: from the
// gateway's catalog (the view judges it as tools/list judges the tool);
// without a view, also a series whose gateway no catalog describes any
// more (its history stays at the hub until its retention).
func (s *Server) seriesOf(ctx context.Context, r SiteRecords, extra *mcp.RequestExtra, site, device, name string) (SeriesKey, error) {
	v := s.scopeOf(extra).view
	uri := "physmcp://history/" + site + "/" + device + "/" + name
	for key, sub := range s.siteSubjects() {
		if sub.Site != site || sub.Device != device || sub.Name != name {
			continue
		}
		if v != nil && !v.Match(sub) {
			return SeriesKey{}, s.notInView(extra, uri)
		}
		return SeriesKey{Site: site, Device: device, Tool: key[len(OwnerKey(site, device))+1:]}, nil
	}
	if v != nil {
		return SeriesKey{}, s.notInView(extra, uri)
	}
	keys, err := r.Series(ctx)
	if err != nil {
		return SeriesKey{}, err
	}
	for _, k := range keys {
		if k.Site == site && k.Device == device && manifest.CapabilityName(k.Tool) == name {
			return k, nil
		}
	}
	return SeriesKey{}, &history.QueryError{Msg: fmt.Sprintf("no history of %s at %s/%s is known to the fleet; fix: %s lists the series", name, site, device, SiteHistoryIndexURI)}
}

// parseSiteHistoryURI reads
// physmcp://history/<site>/<device>/<capability>?since=…&until=…&step=…,
// the query as a gateway's history URI has it (parseHistoryURI).
func parseSiteHistoryURI(uri string, now time.Time) (site, device, name string, since, until time.Time, step time.Duration, err error) {
	path, _, _ := strings.Cut(strings.TrimPrefix(uri, historyPrefix), "?")
	parts := strings.Split(path, "/")
	if !strings.HasPrefix(uri, historyPrefix) || len(parts) != 3 {
		return "", "", "", since, until, 0, &history.QueryError{Msg: "not a history URI of the fleet; fix: physmcp://history/<site>/<device>/<capability>?since=1h&step=1m"}
	}
	for i, p := range parts {
		if parts[i], err = url.PathUnescape(p); err != nil || parts[i] == "" {
			return "", "", "", since, until, 0, &history.QueryError{Msg: fmt.Sprintf("%q is not a site, device or capability name; fix: physmcp://history/<site>/<device>/<capability>", p)}
		}
	}
	_, since, until, step, err = parseHistoryURI(historyPrefix+parts[2]+strings.TrimPrefix(uri, historyPrefix+path), now)
	return parts[0], parts[1], parts[2], since, until, step, err
}

// siteAlarm is one alarm at the fleet endpoint: the gateway's, naming its
// site and device.
type siteAlarm struct {
	Site   string `json:"site"`
	Device string `json:"device"`
	alarms.Active
}

// siteAlarmsInView cuts the gateways' states to v (nil: all): an alarm is
// kept when v selects its capability at its gateway, a gateway when v
// selects any of its capabilities.
func (s *Server) siteAlarmsInView(v *manifest.View, states []SiteAlarms) []SiteAlarms {
	if v == nil {
		return states
	}
	subjects := s.siteSubjects()
	shown := map[string]bool{} // the gateways v selects some capability of
	for _, sub := range subjects {
		if v.Match(sub) {
			shown[OwnerKey(sub.Site, sub.Device)] = true
		}
	}
	var out []SiteAlarms
	for _, st := range states {
		owner := OwnerKey(st.Site, st.Device)
		if !shown[owner] {
			continue
		}
		cut := st
		cut.Active = nil
		for _, a := range st.Active {
			if sub, ok := subjects[owner+"/"+a.Capability]; ok && v.Match(sub) {
				cut.Active = append(cut.Active, a)
			}
		}
		out = append(out, cut)
	}
	return out
}

// siteAlarmsDoc is physmcp://alarms at the fleet endpoint.
func siteAlarmsDoc(states []SiteAlarms, now time.Time) any {
	type gateway struct {
		Site   string    `json:"site"`
		Device string    `json:"device"`
		Link   string    `json:"link,omitempty"`
		Stored time.Time `json:"stored"`
		AgeMS  int64     `json:"age_ms"`
		Active int       `json:"active"`
	}
	active, gws := []siteAlarm{}, []gateway{}
	for _, st := range states {
		gws = append(gws, gateway{Site: st.Site, Device: st.Device, Link: st.Link, Stored: st.Stored, AgeMS: max(now.Sub(st.Stored).Milliseconds(), 0), Active: len(st.Active)})
		for _, a := range st.Active {
			active = append(active, siteAlarm{Site: st.Site, Device: st.Device, Active: a})
		}
	}
	sort.SliceStable(active, func(i, j int) bool { return active[i].Since.Before(active[j].Since) })
	return map[string]any{"active": active, "gateways": gws}
}

// siteAlarmsSeen names the alarms raised now that v shows, as they were
// raised (the fleet's alarmsSeen: an update is sent only when it changes).
func (s *Server) siteAlarmsSeen(v *manifest.View) string {
	var b strings.Builder
	for _, st := range s.siteAlarmsInView(v, s.opts.Sites.AlarmsFollowed()) {
		for _, a := range st.Active {
			fmt.Fprintf(&b, "%s\x00%s\x00%s\x00%s\x00%s\n", st.Site, st.Device, a.Capability, a.Kind, a.Since.Format(time.RFC3339Nano))
		}
	}
	return b.String()
}
