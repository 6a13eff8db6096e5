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

// canDoRequest travels from the coordinator to an owner. The caller is the
// one the coordinator authenticated: every mesh key holder is trusted.
type canDoRequest struct {
	Request promcp.CanDoRequest `json:"request"`
	Caller  node.Caller         `json:"caller"`
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
}

// Handler serves other nodes' requests with the local node.
func Handler(n *node.Node) mesh.Handler {
	return func(ctx context.Context, from, kind string, payload []byte) ([]byte, error) {
		switch kind {
		case KindCanDo:
			var r canDoRequest
			if err := json.Unmarshal(payload, &r); err != nil {
				return nil, err
			}
			r.Caller.Transport = "mesh:" + from
			rep, err := n.CanDoLocal(ctx, r.Request, r.Caller)
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
			r.Caller.Transport = "mesh:" + from
			return n.Do(ctx, node.DoRequest{Tool: r.Tool, Value: r.Value, IdempotencyKey: r.IdempotencyKey, Caller: r.Caller})
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
	payload, _ := json.Marshal(canDoRequest{Request: req, Caller: caller})
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
