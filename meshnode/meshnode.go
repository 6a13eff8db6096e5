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
	"time"

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

// canDoRequest travels from the coordinator to an owner. The owner
// authenticates Credential (the bearer the caller presented to the
// coordinator) with its own policy; Caller is only what the coordinator
// saw, and its role is never taken: any holder of the mesh key could write
// one.
type canDoRequest struct {
	Request    promcp.CanDoRequest `json:"request"`
	Caller     node.Caller         `json:"caller"`
	Credential string              `json:"credential,omitempty"`
}

type readRequest struct {
	Tool     string `json:"tool"`
	MaxAgeMS int64  `json:"max_age_ms"`
}

type doRequest struct {
	Tool           string          `json:"tool"`
	Value          json.RawMessage `json:"value"`
	IdempotencyKey string          `json:"idempotency_key"`
	Caller         node.Caller     `json:"caller"`
	Credential     string          `json:"credential,omitempty"`
}

// Authenticator maps a credential forwarded with a routed call to a caller
// of this gateway's policy (mcpserver.Server.AuthenticateCredential).
type Authenticator func(credential string) (node.Caller, error)

// ownerCaller is who a routed call runs as on this gateway: the caller its
// credential authenticates here (anonymous without one, or when it is not
// accepted: the policy then refuses what needs a role), through the
// gateway it came from. The role the sender wrote is never used.
func ownerCaller(authn Authenticator, from, credential string) node.Caller {
	c := node.Caller{ID: "anonymous", Role: "none"}
	if credential != "" {
		if authn == nil {
			c.ID = "unauthenticated (this gateway checks no credentials)"
		} else if ac, err := authn(credential); err != nil {
			c.ID = "unauthenticated (" + err.Error() + ")"
		} else {
			c = ac
		}
	}
	c.Transport, c.Via = "mesh", from
	return c
}

// Handler serves other nodes' requests with the local node; authn checks
// the credentials routed calls carry.
func Handler(n *node.Node, authn Authenticator) mesh.Handler {
	return func(ctx context.Context, from, kind string, payload []byte) ([]byte, error) {
		switch kind {
		case KindCanDo:
			var r canDoRequest
			if err := json.Unmarshal(payload, &r); err != nil {
				return nil, err
			}
			rep, err := n.CanDoLocal(ctx, r.Request, ownerCaller(authn, from, r.Credential))
			if err != nil {
				return nil, err
			}
			return json.Marshal(rep)
		case KindRead:
			var r readRequest
			if err := json.Unmarshal(payload, &r); err != nil {
				return nil, err
			}
			o, err := n.Read(ctx, r.Tool, time.Duration(r.MaxAgeMS)*time.Millisecond)
			if err != nil {
				return nil, err
			}
			return json.Marshal(o)
		case KindDo:
			var r doRequest
			if err := json.Unmarshal(payload, &r); err != nil {
				return nil, err
			}
			body, err := n.Do(ctx, node.DoRequest{Tool: r.Tool, Value: r.Value, IdempotencyKey: r.IdempotencyKey, Caller: ownerCaller(authn, from, r.Credential)})
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
}

// Remote is the node's view of the rest of the site.
type Remote struct {
	Mesh *mesh.Mesh
	// Budget bounds a distributed can_do (PhysMCP's 500 ms total).
	Budget time.Duration
	// MaxPeers caps the fan-out (manifest network.mesh.max_peers).
	MaxPeers int
}

// CanDo asks the nodes whose catalogs could match, within the budget.
// Owners that do not answer in time are reported as source_unreachable for
// their matching capabilities.
func (r *Remote) CanDo(ctx context.Context, req promcp.CanDoRequest, caller node.Caller) node.RemoteReport {
	out := node.RemoteReport{MeshSizeEstimate: r.Mesh.SizeEstimate(), PartitionState: r.Mesh.PartitionState()}
	in, err := node.Normalise(req)
	if err != nil {
		return out
	}
	matches := map[string][]mesh.CatalogEntry{}
	var targets []string
	for _, mem := range r.Mesh.Members() {
		if mem.Self || mem.Catalog == nil {
			continue
		}
		owner := mem.Name
		for _, e := range mem.Catalog.Capabilities {
			if node.IntentTouches(in, e.Tool, e.Tags) {
				matches[owner] = append(matches[owner], e)
			}
		}
		if len(matches[owner]) == 0 {
			continue
		}
		if mem.State == mesh.StateDead || mem.State == mesh.StateLeft {
			// Known capabilities of a node that is gone: say so, do not
			// pretend they never existed.
			r.unreachable(&out, owner, matches[owner], fmt.Sprintf("node %s is %s (last seen %s)", owner, mem.State, mem.LastSeen.UTC().Format(time.RFC3339)))
			continue
		}
		if r.MaxPeers <= 0 || len(targets) < r.MaxPeers {
			targets = append(targets, owner)
		}
	}
	if len(targets) == 0 {
		return out
	}
	budget := r.Budget
	if budget <= 0 {
		budget = 500 * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	payload, _ := json.Marshal(canDoRequest{Request: req, Caller: caller, Credential: caller.Credential})
	replies, errs, _ := r.Mesh.Fanout(ctx, targets, KindCanDo, payload)
	out.PeersConsulted = len(targets)
	for owner, b := range replies {
		var rep promcp.CapabilityReport
		if err := json.Unmarshal(b, &rep); err != nil {
			errs[owner] = err
			continue
		}
		out.ResponsesReceived++
		out.Reports = append(out.Reports, rep)
	}
	for owner, err := range errs {
		if errors.Is(err, mesh.ErrTimeout) {
			out.ResponsesDroppedLate++
		}
		r.unreachable(&out, owner, matches[owner], fmt.Sprintf("node %s did not answer within %s: %v", owner, budget, err))
	}
	return out
}

// unreachable reports an owner's matching capabilities as blocked.
func (r *Remote) unreachable(out *node.RemoteReport, owner string, entries []mesh.CatalogEntry, reason string) {
	for _, e := range entries {
		details := "code=device_unreachable"
		out.Unreachable = append(out.Unreachable, promcp.Blocked{
			Capability: e.Tool, Source: owner, DeviceID: owner, Permission: promcp.PermSourceUnreachable,
			Reason: reason, Code: "device_offline", Details: &details, MatchReasons: []string{"catalog_match"},
		})
	}
}

// Router lists and routes the site's other capabilities for the MCP
// server: calls go to the owner, which applies its own policy and gate.
type Router struct {
	Mesh *mesh.Mesh
	// ReadTimeout and DoTimeout bound a routed call (an unreachable owner
	// is a clear error within them, never a hang).
	ReadTimeout, DoTimeout time.Duration
}

// RemoteTools lists the tools of live members other than this node.
func (r *Router) RemoteTools() []mcpserver.RemoteTool {
	var out []mcpserver.RemoteTool
	for _, mem := range r.Mesh.Members() {
		if mem.Self || mem.Catalog == nil || (mem.State != mesh.StateAlive && mem.State != mesh.StateSuspect) {
			continue
		}
		for _, e := range mem.Catalog.Capabilities {
			out = append(out, mcpserver.RemoteTool{Owner: mem.Name, Tool: e.Tool, Kind: e.Kind, DataType: e.DataType, Unit: e.Unit,
				Zone: e.Zone, Area: mem.Catalog.Area, Tags: e.Tags, Family: e.Family, Description: e.Description, EnumValues: e.EnumValues, SideEffects: e.SideEffects, Min: e.Min, Max: e.Max})
		}
	}
	return out
}

// Read asks the owner for an observation.
func (r *Router) Read(ctx context.Context, owner, tool string, maxAgeMS int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, or(r.ReadTimeout, 5*time.Second))
	defer cancel()
	payload, _ := json.Marshal(readRequest{Tool: tool, MaxAgeMS: maxAgeMS})
	return r.Mesh.Request(ctx, owner, KindRead, payload)
}

// Do asks the owner to actuate; the answer is the owner's do_ response.
func (r *Router) Do(ctx context.Context, owner, tool string, value json.RawMessage, key string, caller node.Caller) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, or(r.DoTimeout, 15*time.Second))
	defer cancel()
	payload, _ := json.Marshal(doRequest{Tool: tool, Value: value, IdempotencyKey: key, Caller: caller, Credential: caller.Credential})
	return r.Mesh.Request(ctx, owner, KindDo, payload)
}

// OnChange registers f for membership and catalog changes.
func (r *Router) OnChange(f func()) { r.Mesh.OnChange(f) }

func or(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
