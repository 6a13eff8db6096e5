package fleetd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/promcp"
)

// The endpoint is the MCP server's Router (mcpserver.Router): it lists
// the gateways' tools with their site, answers read_ from the latest
// observation with its age (or, when the caller asks for a younger one, a
// read through the gateway) and forwards do_ to the owning gateway.

// RemoteTools lists the tools every known gateway serves: its read_ tools
// (answered from its observations, or read through it when it serves
// read) and, when it serves do, its do_ tools. A gateway whose link is
// down or that stopped stays listed: a call names its state.
func (e *Endpoint) RemoteTools() []mcpserver.RemoteTool {
	var out []mcpserver.RemoteTool
	for _, g := range e.dir.gateways() {
		for _, en := range g.cat.Capabilities {
			if en.Kind == manifest.KindDo && !g.cat.Serving(manifest.FleetServeDo) {
				continue
			}
			rt := mcpserver.RemoteTool{Owner: g.device, Site: g.site, Tool: en.Tool, Kind: en.Kind, DataType: en.DataType, Unit: en.Unit,
				Zone: en.Zone, Area: g.cat.Area, Tags: en.Tags, Family: en.Family, Description: en.Description, EnumValues: en.EnumValues,
				SideEffects: en.SideEffects, Min: en.Min, Max: en.Max}
			if en.Lease != nil {
				rt.Lease, rt.SafeValue = &manifest.Lease{DefaultS: en.Lease.DefaultS, MaxS: en.Lease.MaxS}, en.Lease.SafeValue
			}
			out = append(out, rt)
		}
	}
	return out
}

// OnChange registers f for changes of the gateways' tools.
func (e *Endpoint) OnChange(f func()) {
	e.dir.mu.Lock()
	e.dir.onChange = append(e.dir.onChange, f)
	e.dir.mu.Unlock()
}

// entry is tool's catalog entry on g.
func entry(g snapshot, tool string) (fleet.Entry, bool) {
	for _, en := range g.cat.Capabilities {
		if en.Tool == tool {
			return en, true
		}
	}
	return fleet.Entry{}, false
}

// Read answers a read_ of tool on the gateway owner (site/device). The
// latest observation the endpoint received is the answer when the caller
// accepts its age (max_age_ms, or any age without it), with age_ms and
// its quality stale once it is older than the capability's freshness;
// a younger one is read through the gateway (when it serves read), and
// if that fails the cached value is the answer, stale, saying why.
func (e *Endpoint) Read(ctx context.Context, owner, tool string, maxAgeMS int64) ([]byte, error) {
	g, ok := e.dir.gateway(owner)
	if !ok {
		return nil, fmt.Errorf("no gateway %s is known to the fleet endpoint", owner)
	}
	en, ok := entry(g, tool)
	if !ok {
		return nil, fmt.Errorf("%s does not offer %s (its catalog changed): list the tools again", owner, tool)
	}
	now := time.Now()
	c, have := e.dir.observation(owner, tool)
	age := c.age(now)
	if have && (maxAgeMS < 0 || age <= time.Duration(maxAgeMS)*time.Millisecond) {
		return json.Marshal(e.fromCache(g, en, c, now, ""))
	}
	why := ""
	switch {
	case !g.cat.Serving(manifest.FleetServeRead):
		why = fmt.Sprintf("%s serves no live read to the fleet (network.fleet.serve)", owner)
	case g.link == LinkDown || g.link == LinkStopped || g.link == LinkDisconnected:
		why = g.why
	default:
		b, err := e.readThrough(ctx, g, tool, maxAgeMS)
		if err == nil {
			return b, nil
		}
		why = "the read through the gateway failed: " + err.Error()
	}
	if !have {
		return nil, fmt.Errorf("no observation of %s on %s has reached the fleet endpoint, and %s", tool, owner, why)
	}
	return json.Marshal(e.fromCache(g, en, c, now, why))
}

// fromCache is a cached observation as the fleet endpoint answers it.
func (e *Endpoint) fromCache(g snapshot, en fleet.Entry, c cached, now time.Time, why string) promcp.Observation {
	o := c.obs
	age := c.age(now)
	o.Site, o.Cached, o.AgeMS = g.site, true, age.Milliseconds()
	fresh := time.Duration(en.StaleAfterMS) * time.Millisecond
	var reasons []string
	if o.Reason != "" {
		reasons = append(reasons, o.Reason)
	}
	if fresh > 0 && age > fresh && o.Quality == promcp.QualityGood {
		o.Quality = promcp.QualityStale
		reasons = append(reasons, fmt.Sprintf("observed %s ago, older than the %s this capability stays fresh; pass max_age_ms to read it through the gateway", age.Round(time.Second), fresh))
	}
	if g.why != "" {
		reasons = append(reasons, g.why)
	}
	if why != "" && why != g.why {
		reasons = append(reasons, why)
	}
	if why != "" && o.Quality == promcp.QualityGood {
		// A fresher value was asked for and could not be had: the copy
		// does not meet the caller's max_age_ms (a gateway answers a read
		// whose device failed with its recent value, stale, the same).
		o.Quality = promcp.QualityStale
	}
	o.Reason = joinReasons(reasons)
	return o
}

func joinReasons(rs []string) string {
	out := ""
	for i, r := range rs {
		if i > 0 {
			out += "; "
		}
		out += r
	}
	return out
}

// readThrough asks the gateway for an observation; the answer carries the
// site and is kept as the latest.
func (e *Endpoint) readThrough(ctx context.Context, g snapshot, tool string, maxAgeMS int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.ReadTimeout)
	defer cancel()
	payload, _ := json.Marshal(meshnode.ReadCall{Tool: tool, MaxAgeMS: maxAgeMS})
	b, err := e.client.Request(ctx, g.site, g.device, fleet.KindRead, payload)
	if err != nil {
		return nil, err
	}
	var o promcp.Observation
	if err := json.Unmarshal(b, &o); err != nil || o.Capability != tool || o.Source != g.device {
		return nil, fmt.Errorf("%s/%s answered %s with something that is not its observation", g.site, g.device, tool)
	}
	o.Site, o.AgeMS = g.site, saneAge(o.AgeMS)
	e.dir.keep(mcpserver.OwnerKey(g.site, g.device), o)
	return json.Marshal(o)
}

// Do forwards a do_ to the owning gateway, which authenticates the caller
// from the credential it presented here and applies its own policy, gate,
// approval and ledger; its answer is returned as it is. Before the
// go-ahead left, an error means nothing was done; after it, a missing
// answer is mcpserver.ErrOutcomeUnknown.
func (e *Endpoint) Do(ctx context.Context, owner string, d mcpserver.RoutedDo) ([]byte, error) {
	g, ok := e.dir.gateway(owner)
	switch {
	case !ok:
		return nil, fmt.Errorf("no gateway %s is known to the fleet endpoint; nothing was done", owner)
	case !g.cat.Serving(manifest.FleetServeDo):
		return nil, fmt.Errorf("%s serves no do_ to the fleet (its network.fleet.serve lacks do); nothing was done", owner)
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DoTimeout)
	defer cancel()
	payload, _ := json.Marshal(meshnode.NewDoCall(d))
	b, err := e.client.Do(ctx, g.site, g.device, payload, e.cfg.CallTimeout)
	if err == nil {
		err = doAnswer(g, d.Tool, b)
	}
	switch {
	case errors.Is(err, fleet.ErrOutcomeUnknown):
		return nil, fmt.Errorf("%w: %v", mcpserver.ErrOutcomeUnknown, err)
	case err != nil && g.why != "":
		return nil, fmt.Errorf("%w (%s)", err, g.why)
	}
	return b, err
}

// doAnswer checks that a gateway's answer to a do_ is a do_ result of
// that tool on that gateway, with an outcome; the answer is passed on
// byte for byte, so anything else (a broken or lying gateway, a body cut
// on the way) would reach the caller as if it were one. Such an answer
// says nothing certain: the do_ may have run (fleet.ErrOutcomeUnknown).
func doAnswer(g snapshot, tool string, b []byte) error {
	var r promcp.DoResult
	err := json.Unmarshal(b, &r)
	switch {
	case err != nil:
		err = fmt.Errorf("it is not a do_ result (%v)", err)
	case r.Capability != tool:
		err = fmt.Errorf("it is a result of %q, not of %s", r.Capability, tool)
	case r.Source != "" && r.Source != g.device:
		err = fmt.Errorf("it names gateway %q", r.Source)
	case r.Status != promcp.StatusSuccess && r.Status != promcp.StatusFailed && r.Status != promcp.StatusPartial:
		err = fmt.Errorf("its status %q is none of success, failed, partial", r.Status)
	default:
		return nil
	}
	return fmt.Errorf("%w: gateway %s of site %s answered the do_ with something the fleet cannot take as its outcome: %v; the do_ may have run",
		fleet.ErrOutcomeUnknown, g.device, g.site, err)
}
