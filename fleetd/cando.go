package fleetd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/physd/physd/fleet"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// CanDo is the node's Remote (node.Remote): the endpoint's node has no
// capability of its own, so a can_do is answered by the gateways. Every
// known gateway whose catalog matches the intent is asked, all at once
// (one request per gateway: each applies its own policy and gate to its
// own capabilities, and NATS carries a hundred requests on one
// connection), with one deadline (call_timeout_ms, less a margin to
// merge). A gateway that does not answer in time, whose link is down,
// that stopped or that serves no can_do has each of its matching
// capabilities reported blocked (source_unreachable, naming the site and
// gateway), never dropped; metadata counts the gateways matched,
// consulted and answered.
func (e *Endpoint) CanDo(ctx context.Context, req promcp.CanDoRequest, caller node.Caller) node.RemoteReport {
	out := node.RemoteReport{PartitionState: "healthy"}
	in, err := node.Normalise(req)
	if err != nil {
		return out
	}
	gws := e.dir.gateways()
	out.MeshSizeEstimate = len(gws) + 1
	type target struct {
		g       snapshot
		matches []fleet.Entry
	}
	var targets []target
	down := 0
	inView := node.InView(ctx) // a gateway outside the caller's view is not asked
	for _, g := range gws {
		var matches []fleet.Entry
		for _, en := range g.cat.Capabilities {
			if inView != nil && !inView(g.site, g.device, en.Tool) {
				continue
			}
			if inScope(req.Scope, g, en.Tool) && node.IntentTouches(in, en.Tool, en.Tags) {
				matches = append(matches, en)
			}
		}
		if len(matches) == 0 {
			continue
		}
		out.PeersMatched++
		switch {
		case !g.cat.Serving(manifest.FleetServeCanDo):
			unreachable(&out, g, matches, "not_served", fmt.Sprintf("gateway %s of site %s serves no can_do to the fleet (network.fleet.serve); ask it on its own endpoint", g.device, g.site))
		case g.link == LinkDown || g.link == LinkStopped || g.link == LinkDisconnected:
			down++
			unreachable(&out, g, matches, "site_unreachable", g.why)
		default:
			targets = append(targets, target{g, matches})
		}
	}
	if down > 0 {
		out.PartitionState = "suspected_partition"
	}
	if e.dir.disconnected() {
		out.PartitionState = "partitioned"
	}
	if len(targets) == 0 {
		return out
	}
	budget := e.cfg.CallTimeout
	ctx, cancel := context.WithTimeout(ctx, budget-min(budget/10, 100*time.Millisecond))
	defer cancel()
	payload, _ := json.Marshal(meshnode.NewCanDoCall(req, caller))
	type answer struct {
		t   target
		b   []byte
		err error
	}
	answers := make(chan answer, len(targets))
	for _, t := range targets {
		go func() {
			b, err := e.client.Request(ctx, t.g.site, t.g.device, fleet.KindCanDo, payload)
			answers <- answer{t, b, err}
		}()
	}
	out.PeersConsulted, out.FanoutUsed, out.TTLUsed = len(targets), len(targets), 1
	for range targets {
		a := <-answers
		var rep promcp.CapabilityReport
		if a.err == nil {
			if err := json.Unmarshal(a.b, &rep); err != nil {
				why := fmt.Sprintf("gateway %s of site %s answered something that is not a can_do report (%v)", a.t.g.device, a.t.g.site, err)
				unreachable(&out, a.t.g, a.t.matches, "site_unreachable", why)
				continue
			}
		}
		if a.err != nil {
			if errors.Is(a.err, fleet.ErrNoAck) || errors.Is(a.err, context.DeadlineExceeded) {
				out.ResponsesDroppedLate++
			}
			why := fmt.Sprintf("gateway %s of site %s did not answer in time (can_do budget %s): %v", a.t.g.device, a.t.g.site, budget, a.err)
			unreachable(&out, a.t.g, a.t.matches, "site_unreachable", why)
			continue
		}
		out.ResponsesReceived++
		out.Reports = append(out.Reports, fromSite(a.t.g, rep))
	}
	return out
}

// inScope: a can_do scope names sites, site/device owners, device ids,
// tools or capability names; an empty scope admits everything.
func inScope(scope []string, g snapshot, tool string) bool {
	if len(scope) == 0 {
		return true
	}
	name := manifest.CapabilityName(tool)
	return slices.ContainsFunc(scope, func(s string) bool {
		return s == g.site || s == g.device || s == mcpserver.OwnerKey(g.site, g.device) || s == tool || s == name
	})
}

// fromSite names the site in a gateway's report; a do_ candidate of a
// gateway that serves no do_ to the fleet is blocked here (the fleet
// cannot run it), saying where it can be run.
//
// A gateway answers for itself only: an entry of a capability its
// catalog lacks, or naming another gateway, is not taken (the hub lets a
// site answer only for itself, but not what its answer says), and each
// capability is taken once (its first entry).
func fromSite(g snapshot, rep promcp.CapabilityReport) promcp.CapabilityReport {
	rep.Metadata.CoordinatorNode = mcpserver.OwnerKey(g.site, g.device) // the merged observations' keys
	seen := map[string]bool{}
	own := func(capability, source, device string) bool {
		if _, ok := entry(g, capability); !ok || seen[capability] || source != g.device || device != "" && device != g.device {
			return false
		}
		seen[capability] = true
		return true
	}
	cands := rep.Candidates[:0]
	var notServed []promcp.Blocked
	for _, c := range rep.Candidates {
		if !own(c.Capability, c.Source, c.DeviceID) {
			continue
		}
		c.Site = g.site
		if c.Kind == manifest.KindDo && !g.cat.Serving(manifest.FleetServeDo) {
			details := "code=not_served"
			notServed = append(notServed, promcp.Blocked{Capability: c.Capability, Source: c.Source, Site: g.site, DeviceID: c.DeviceID,
				Permission: promcp.PermSourceUnreachable, Code: "not_served", Details: &details, Confidence: c.Confidence, MatchReasons: c.MatchReasons,
				Reason: fmt.Sprintf("%s is allowed on gateway %s of site %s, but that gateway serves no do_ to the fleet (network.fleet.serve): call it on the gateway's own endpoint", c.Capability, g.device, g.site)})
			continue
		}
		cands = append(cands, c)
	}
	rep.Candidates = cands
	blocked := make([]promcp.Blocked, 0, len(rep.Blocked)+len(notServed))
	for _, b := range rep.Blocked {
		if own(b.Capability, b.Source, b.DeviceID) {
			b.Site = g.site
			blocked = append(blocked, b)
		}
	}
	rep.Blocked = append(blocked, notServed...)
	return rep
}

// unreachable reports a gateway's matching capabilities as blocked.
func unreachable(out *node.RemoteReport, g snapshot, entries []fleet.Entry, code, reason string) {
	for _, en := range entries {
		details := "code=" + code + "; site=" + g.site
		out.Unreachable = append(out.Unreachable, promcp.Blocked{
			Capability: en.Tool, Source: g.device, Site: g.site, DeviceID: g.device, Permission: promcp.PermSourceUnreachable,
			Reason: reason, Code: code, Details: &details, MatchReasons: []string{"catalog_match"},
		})
	}
}
