// Package meshnode joins a node to the site mesh: it answers other nodes'
// requests with the local node (each owner applies its own policy and
// gate), and it is the node's Remote for distributed can_do. It keeps node
// free of memberlist and mesh free of proMCP.
package meshnode

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// Request kinds between nodes.
const (
	KindCanDo = "can_do"
	KindRead  = "read"
	KindDo    = "do"
)

// CanDoCall travels from the coordinator (a gateway of the mesh, or the
// fleet endpoint) to an owner. The owner authenticates Credential (the
// bearer the caller presented to the coordinator) with its own policy;
// Caller is only what the coordinator saw, and its role is never taken:
// any holder of the mesh key (or of the fleet's NATS credentials) could
// write one.
type CanDoCall struct {
	Request    promcp.CanDoRequest `json:"request"`
	Caller     node.Caller         `json:"caller"`
	Credential string              `json:"credential,omitempty"`
}

// ReadCall asks an owner for an observation.
type ReadCall struct {
	Tool     string `json:"tool"`
	MaxAgeMS int64  `json:"max_age_ms"`
}

// DoCall asks an owner to actuate.
type DoCall struct {
	Tool           string          `json:"tool"`
	Value          json.RawMessage `json:"value"`
	IdempotencyKey string          `json:"idempotency_key"`
	Caller         node.Caller     `json:"caller"`
	Credential     string          `json:"credential,omitempty"`
	// Grant is a two-person grant the caller sent; the owner redeems it.
	Grant string `json:"grant,omitempty"`
	// HoldS is the lease the caller asked for (0: the owner's default).
	HoldS int `json:"hold_s,omitempty"`
}

// NewDoCall is the call that carries a routed do_ to its owner, with the
// credential the caller presented (Caller.Credential is never serialized).
func NewDoCall(d mcpserver.RoutedDo) DoCall {
	return DoCall{Tool: d.Tool, Value: d.Value, IdempotencyKey: d.IdempotencyKey, Caller: d.Caller, Credential: d.Caller.Credential, Grant: d.Grant, HoldS: d.HoldS}
}

// NewCanDoCall is the call that asks an owner's part of a can_do.
func NewCanDoCall(req promcp.CanDoRequest, caller node.Caller) CanDoCall {
	return CanDoCall{Request: req, Caller: caller, Credential: caller.Credential}
}

// Authenticator maps a credential forwarded with a routed call to a caller
// of this gateway's policy (web.Server.AuthenticateCredential).
type Authenticator func(credential string) (node.Caller, error)

// Owner serves routed calls with the local node: the calls the gateways
// of the mesh route to it, and those the fleet endpoint forwards over
// NATS (package fleet). Each call runs as the caller its credential
// authenticates here, never as the one the sender described.
type Owner struct {
	Node  *node.Node
	Authn Authenticator
	// Transport is how the calls arrive ("mesh", "fleet"): the caller's
	// transport in the audit.
	Transport string
	// StrictDo refuses a do_ whose caller this gateway cannot
	// authenticate itself (no credential, or one its policy does not
	// accept) before anything else, audited (node.RefuseUnauthenticated),
	// instead of running it as anonymous for the policy to judge.
	StrictDo bool
}

// Caller is who a routed call runs as on this gateway: the caller its
// credential authenticates here (anonymous without one, or when it is not
// accepted: the policy then refuses what needs a role), through the
// gateway it came from. The role the sender wrote is never used. ok is
// false when the credential did not authenticate (or there was none).
func (o Owner) Caller(from, credential string) (c node.Caller, ok bool) {
	c = node.Caller{ID: "anonymous", Role: "none"}
	if credential != "" {
		if o.Authn == nil {
			c.ID = "unauthenticated (this gateway checks no credentials)"
		} else if ac, err := o.Authn(credential); err != nil {
			c.ID = "unauthenticated (" + err.Error() + ")"
		} else {
			c, ok = ac, true
		}
	}
	c.Transport, c.Via = o.Transport, from
	return c, ok
}

// Handler serves other nodes' requests with the local node; authn checks
// the credentials routed calls carry.
func Handler(n *node.Node, authn Authenticator) mesh.Handler {
	return Owner{Node: n, Authn: authn, Transport: "mesh"}.Serve
}

// Serve answers one call of kind (KindCanDo, KindRead, KindDo) from the
// coordinator from.
func (o Owner) Serve(ctx context.Context, from, kind string, payload []byte) ([]byte, error) {
	n := o.Node
	switch kind {
	case KindCanDo:
		var r CanDoCall
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, err
		}
		c, _ := o.Caller(from, r.Credential)
		rep, err := n.CanDoLocal(ctx, r.Request, c)
		if err != nil {
			return nil, err
		}
		return json.Marshal(rep)
	case KindRead:
		var r ReadCall
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, err
		}
		// A point that is no tool here (expose: false) is not routed
		// either: the mesh and the fleet reach tools, not the plant's points.
		if c := n.Manifest().Capability(manifest.CapabilityName(r.Tool)); c != nil && !c.Exposed() {
			return nil, node.NotExposed(r.Tool)
		}
		obs, err := n.Read(ctx, r.Tool, time.Duration(r.MaxAgeMS)*time.Millisecond)
		if err != nil {
			return nil, err
		}
		return json.Marshal(obs)
	case KindDo:
		var r DoCall
		if err := json.Unmarshal(payload, &r); err != nil {
			return nil, err
		}
		c, ok := o.Caller(from, r.Credential)
		req := node.DoRequest{Tool: r.Tool, Value: r.Value, IdempotencyKey: r.IdempotencyKey, Caller: c, Grant: r.Grant, HoldS: r.HoldS}
		if o.StrictDo && !ok {
			why := "no credential was forwarded"
			if r.Credential != "" {
				why = c.ID
			}
			return n.RefuseUnauthenticated(req, why)
		}
		// A two-person request is registered here, at the owner, and
		// its grant (sent with the repeated call, or the decision held
		// for this caller's call) is redeemed here: the owner's node
		// checks it against its definition in force.
		body, err := n.Do(ctx, req)
		var ar *node.ApprovalRequired
		if errors.As(err, &ar) {
			// Approval rounds need the caller's own connection: a routed
			// call gets the refusal that says how to get approval.
			return ar.Body, nil
		}
		return body, err
	}
	return nil, fmt.Errorf("unknown request kind %q", kind)
}

// DefaultDownListed is how long the capabilities of a member that died
// (failed, unreachable) stay known: listed as routed tools (a call gets a
// tool error naming the owner and its state) and reported by can_do
// (blocked, source_unreachable, with the same state). After it, both
// forget them. A member that left gracefully is forgotten by both at once.
const DefaultDownListed = 10 * time.Minute

// Remote is the node's view of the rest of the site.
type Remote struct {
	// Mesh is the site's mesh; the daemon sets it with SetMesh once the
	// mesh has joined (the node, which reads over it, opens before).
	Mesh *mesh.Mesh
	live atomic.Pointer[mesh.Mesh]
	// Budget bounds a distributed can_do (PhysMCP's 500 ms total).
	Budget time.Duration
	// MaxPeers bounds how many peers are asked at once (manifest
	// network.mesh.max_peers); every matching peer is asked, in turn, or
	// reported not_consulted when the budget runs out first.
	MaxPeers int
	// DownListed overrides DefaultDownListed.
	DownListed time.Duration
}

// downListed reports whether a dead or left member's capabilities are
// still listed, and its state text for errors and reports.
func downListed(mem mesh.Member, keep time.Duration) (bool, string) {
	if mem.State == mesh.StateLeft {
		return false, ""
	}
	if keep <= 0 {
		keep = DefaultDownListed
	}
	since := mem.DownSince
	if since.IsZero() {
		since = mem.LastSeen
	}
	text := fmt.Sprintf("node %s is %s (last seen %s)", mem.Name, mem.State, mem.LastSeen.UTC().Format(time.RFC3339))
	return since.IsZero() || time.Since(since) <= keep, text
}

// CanDo asks every live node whose catalog could match, at most MaxPeers
// at a time, within the budget. Owners that do not answer in time, are
// dead, or could not be asked before the budget ran out are reported
// blocked for their matching capabilities: the answer is complete.
func (r *Remote) CanDo(ctx context.Context, req promcp.CanDoRequest, caller node.Caller) node.RemoteReport {
	st := r.site().Status() // one view of the members for both figures
	out := node.RemoteReport{MeshSizeEstimate: st.SizeEstimate, PartitionState: st.PartitionState}
	in, err := node.Normalise(req)
	if err != nil {
		return out
	}
	matches := map[string][]mesh.CatalogEntry{}
	var targets, suspects []string // alive members are asked first
	inView := node.InView(ctx)     // an owner outside the caller's view is not asked
	for _, mem := range r.site().Members() {
		if mem.Self || mem.Catalog == nil {
			continue
		}
		owner := mem.Name
		for _, e := range mem.Catalog.Capabilities {
			if inView != nil && !inView("", owner, e.Tool) {
				continue
			}
			if inScope(req.Scope, owner, e.Tool) && node.IntentTouches(in, e.Tool, e.Tags) {
				matches[owner] = append(matches[owner], e)
			}
		}
		if len(matches[owner]) == 0 {
			continue
		}
		if mem.State == mesh.StateDead || mem.State == mesh.StateLeft {
			// Known capabilities of a node that is gone: say so (as a
			// call to its tool does), do not pretend they never existed.
			if listed, state := downListed(mem, r.DownListed); listed {
				out.PeersMatched++
				r.unreachable(&out, owner, matches[owner], state, "device_offline")
			}
			continue
		}
		out.PeersMatched++
		if mem.State == mesh.StateSuspect {
			suspects = append(suspects, owner)
		} else {
			targets = append(targets, owner)
		}
	}
	targets = append(targets, suspects...)
	if len(targets) == 0 {
		return out
	}
	budget := r.Budget
	if budget <= 0 {
		budget = 500 * time.Millisecond
	}
	// Decide DecisionMargin before the budget, so the merged answer
	// reaches the agent within it.
	ctx, cancel := context.WithTimeout(ctx, budget-min(r.site().DecisionMargin(), budget/2))
	defer cancel()
	payload, _ := json.Marshal(NewCanDoCall(req, caller))
	res := r.site().Consult(ctx, targets, KindCanDo, payload, r.MaxPeers)
	out.PeersConsulted = len(targets) - len(res.NotConsulted)
	out.PeersNotConsulted = len(res.NotConsulted)
	out.FanoutUsed = res.Peak
	if out.PeersConsulted > 0 {
		out.TTLUsed = 1 // every member is asked directly
	}
	for owner, b := range res.Replies {
		var rep promcp.CapabilityReport
		if err := json.Unmarshal(b, &rep); err != nil {
			res.Errs[owner] = err
			continue
		}
		out.ResponsesReceived++
		out.Reports = append(out.Reports, rep)
	}
	for owner, err := range res.Errs {
		if errors.Is(err, mesh.ErrTimeout) {
			out.ResponsesDroppedLate++
		}
		r.unreachable(&out, owner, matches[owner], fmt.Sprintf("node %s did not answer in time (can_do budget %s): %v", owner, budget, err), "device_offline")
	}
	for _, owner := range res.NotConsulted {
		r.unreachable(&out, owner, matches[owner], fmt.Sprintf("not_consulted: fanout_limit: %s matches but was not asked: at most %d peers are asked at once (max_peers) and the %s budget ran out first; ask again with scope [%q]",
			owner, r.MaxPeers, budget, owner), "not_consulted")
	}
	return out
}

// inScope: a can_do scope (device ids, tool or capability names) admits
// the tool of owner; an empty scope admits everything. The owner filters
// again; filtering here keeps owners out of scope from being asked.
func inScope(scope []string, owner, tool string) bool {
	if len(scope) == 0 {
		return true
	}
	name := manifest.CapabilityName(tool)
	for _, s := range scope {
		if s == owner || s == tool || s == name {
			return true
		}
	}
	return false
}

// unreachable reports an owner's matching capabilities as blocked.
func (r *Remote) unreachable(out *node.RemoteReport, owner string, entries []mesh.CatalogEntry, reason, code string) {
	for _, e := range entries {
		details := "code=device_unreachable"
		if code == "not_consulted" {
			details = "code=not_consulted; reason=fanout_limit"
		}
		out.Unreachable = append(out.Unreachable, promcp.Blocked{
			Capability: e.Tool, Source: owner, DeviceID: owner, Permission: promcp.PermSourceUnreachable,
			Reason: reason, Code: code, Details: &details, MatchReasons: []string{"catalog_match"},
		})
	}
}

// Router lists and routes the site's other capabilities for the MCP
// server: calls go to the owner, which applies its own policy and gate.
type Router struct {
	Mesh *mesh.Mesh
	// ReadTimeout and DoTimeout bound a routed call once the owner has
	// acknowledged it (a slow device may need them); an owner that does
	// not acknowledge within the mesh's request_timeout_ms is silent, and
	// the call fails then, naming it.
	ReadTimeout, DoTimeout time.Duration
	// DownListed overrides DefaultDownListed.
	DownListed time.Duration
}

// RemoteTools lists the tools of members other than this node: live ones,
// and dead or left ones for DownListed after they went down.
func (r *Router) RemoteTools() []mcpserver.RemoteTool {
	var out []mcpserver.RemoteTool
	for _, mem := range r.Mesh.Members() {
		if mem.Self || mem.Catalog == nil {
			continue
		}
		if mem.State == mesh.StateDead || mem.State == mesh.StateLeft {
			if listed, _ := downListed(mem, r.DownListed); !listed {
				continue
			}
		}
		for _, e := range mem.Catalog.Capabilities {
			rt := mcpserver.RemoteTool{Owner: mem.Name, Tool: e.Tool, Kind: e.Kind, DataType: e.DataType, Unit: e.Unit,
				Zone: e.Zone, Area: mem.Catalog.Area, Tags: e.Tags, Family: e.Family, Description: e.Description, EnumValues: e.EnumValues, SideEffects: e.SideEffects, Min: e.Min, Max: e.Max}
			if e.Lease != nil {
				rt.Lease, rt.SafeValue = &manifest.Lease{DefaultS: e.Lease.DefaultS, MaxS: e.Lease.MaxS}, e.Lease.SafeValue
			}
			out = append(out, rt)
		}
	}
	return out
}

// Read asks the owner for an observation.
func (r *Router) Read(ctx context.Context, owner, tool string, maxAgeMS int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, or(r.ReadTimeout, 5*time.Second))
	defer cancel()
	payload, _ := json.Marshal(ReadCall{Tool: tool, MaxAgeMS: maxAgeMS})
	b, err := r.Mesh.Call(ctx, owner, KindRead, payload, mesh.CallOptions{})
	return b, r.explain(owner, err)
}

// Do asks the owner to actuate; the answer is the owner's do_ response.
// The call is two-phase (mesh.CallOptions.Commit): an error before the
// go-ahead left means nothing was done; after it, a missing answer is
// mcpserver.ErrOutcomeUnknown.
func (r *Router) Do(ctx context.Context, owner string, d mcpserver.RoutedDo) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, or(r.DoTimeout, 15*time.Second))
	defer cancel()
	payload, _ := json.Marshal(NewDoCall(d))
	b, err := r.Mesh.Call(ctx, owner, KindDo, payload, mesh.CallOptions{Commit: true})
	if errors.Is(err, mesh.ErrOutcomeUnknown) {
		return nil, fmt.Errorf("%w: %v", mcpserver.ErrOutcomeUnknown, err)
	}
	if err != nil && !errors.As(err, new(*mesh.RemoteError)) {
		err = fmt.Errorf("%w; nothing was done", r.explain(owner, err))
	}
	return b, err
}

// explain names the owner's state in a routing error.
func (r *Router) explain(owner string, err error) error {
	if err == nil {
		return nil
	}
	var na *mesh.NotAliveError
	if errors.As(err, &na) {
		return fmt.Errorf("owner %s is %s (down since %s; its tools stay listed for %s after that): %w",
			owner, na.State, na.Since.UTC().Format(time.RFC3339), or(r.DownListed, DefaultDownListed), err)
	}
	for _, mem := range r.Mesh.Members() {
		if mem.Name == owner {
			return fmt.Errorf("owner %s (%s, last seen %s): %w", owner, mem.State, mem.LastSeen.UTC().Format(time.RFC3339), err)
		}
	}
	return err
}

// OnChange registers f for membership and catalog changes, and calls it
// every minute as well, so a dead owner's tools leave the list once
// DownListed has passed.
func (r *Router) OnChange(f func()) {
	r.Mesh.OnChange(f)
	go func() {
		t := time.NewTicker(time.Minute)
		defer t.Stop()
		for {
			select {
			case <-r.Mesh.Done():
				return
			case <-t.C:
				f()
			}
		}
	}()
}

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// ReadRemote asks owner for an observation of tool (node.RemoteReader):
// the readings of other gateways that the policy's interlocks depend on.
func (r *Remote) ReadRemote(ctx context.Context, owner, tool string, maxAge time.Duration) (promcp.Observation, error) {
	m := r.site()
	if m == nil {
		return promcp.Observation{}, errors.New("the mesh has not started yet")
	}
	payload, _ := json.Marshal(ReadCall{Tool: tool, MaxAgeMS: maxAge.Milliseconds()})
	b, err := m.Call(ctx, owner, KindRead, payload, mesh.CallOptions{})
	if err != nil {
		return promcp.Observation{}, err
	}
	var o promcp.Observation
	if err := json.Unmarshal(b, &o); err != nil {
		return promcp.Observation{}, fmt.Errorf("%s answered %s with something that is not an observation: %w", owner, tool, err)
	}
	return o, nil
}

// SetMesh puts the joined mesh in place; calls that began before see it
// or not, never half of it.
func (r *Remote) SetMesh(m *mesh.Mesh) { r.live.Store(m) }

// site is the mesh in use: SetMesh's, else the Mesh field.
func (r *Remote) site() *mesh.Mesh {
	if m := r.live.Load(); m != nil {
		return m
	}
	return r.Mesh
}
