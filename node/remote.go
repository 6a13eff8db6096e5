package node

import (
	"context"
	"sort"

	"github.com/physd/physd/promcp"
)

// Remote asks the other nodes of a site (the mesh) to answer can_do for
// their own capabilities; each owner applies its own policy. The node
// merges the answers into its own report as coordinator (PhysMCP §10).
type Remote interface {
	CanDo(ctx context.Context, req promcp.CanDoRequest, caller Caller) RemoteReport
}

// RemoteReport is what the mesh gathered for one can_do.
type RemoteReport struct {
	Reports []promcp.CapabilityReport
	// Unreachable are capabilities of owners that did not answer in time.
	Unreachable          []promcp.Blocked
	PeersMatched         int
	PeersConsulted       int
	PeersNotConsulted    int
	ResponsesReceived    int
	TTLUsed, FanoutUsed  int
	ResponsesDroppedLate int
	MeshSizeEstimate     int
	PartitionState       string
}

// CanDoLocal answers for this node's capabilities only: what an owner
// answers to a coordinator.
func (n *Node) CanDoLocal(ctx context.Context, req promcp.CanDoRequest, caller Caller) (promcp.CapabilityReport, error) {
	return n.canDo(ctx, req, caller, false)
}

// merge adds the mesh's answers to a local report and fills the mesh
// metadata. Candidates and blocked entries keep their owner as source.
func merge(rep *promcp.CapabilityReport, rr RemoteReport) {
	for _, r := range rr.Reports {
		rep.Candidates = append(rep.Candidates, r.Candidates...)
		rep.Blocked = append(rep.Blocked, r.Blocked...)
		rep.Metadata.CapabilitiesScanned += r.Metadata.CapabilitiesScanned
		for k, v := range r.Context.CurrentObservations {
			rep.Context.CurrentObservations[r.Metadata.CoordinatorNode+"."+k] = v
		}
		for _, rd := range r.Context.RelatedReads {
			rep.Context.RelatedReads = append(rep.Context.RelatedReads, r.Metadata.CoordinatorNode+"."+rd)
		}
	}
	rep.Blocked = append(rep.Blocked, rr.Unreachable...)
	sort.SliceStable(rep.Candidates, func(i, j int) bool { return rep.Candidates[i].Confidence > rep.Candidates[j].Confidence })
	sort.SliceStable(rep.Blocked, func(i, j int) bool { return rep.Blocked[i].Confidence > rep.Blocked[j].Confidence })
	if len(rep.Candidates)+len(rep.Blocked) > 0 {
		// Something in the site produces the outcome: not unroutable.
		rep.Unroutable = []promcp.Unroutable{}
	}
	rep.Metadata.PeersMatched = rr.PeersMatched
	rep.Metadata.PeersConsulted = rr.PeersConsulted
	rep.Metadata.PeersNotConsulted = rr.PeersNotConsulted
	rep.Metadata.TTLUsed = rr.TTLUsed
	rep.Metadata.FanoutUsed = rr.FanoutUsed
	rep.Metadata.ResponsesReceived = rr.ResponsesReceived
	rep.Metadata.ResponsesDroppedLate = rr.ResponsesDroppedLate
	if rr.MeshSizeEstimate > 0 {
		rep.Metadata.MeshSizeEstimate = rr.MeshSizeEstimate
	}
	if rr.PartitionState != "" {
		rep.Metadata.PartitionState = rr.PartitionState
	}
}

// InViewFunc reports whether a caller's view selects tool at an owner
// (site is empty in a site mesh).
type InViewFunc func(site, device, tool string) bool

type inViewKey struct{}

// WithInView tells a Remote's can_do whom it may ask: only owners of a
// tool in the caller's view (the MCP server sets it for a request through
// a view). An owner outside the view is never sent the question or the
// caller's credential.
func WithInView(ctx context.Context, f InViewFunc) context.Context {
	return context.WithValue(ctx, inViewKey{}, f)
}

// InView is ctx's WithInView (nil: every owner may be asked).
func InView(ctx context.Context) InViewFunc {
	f, _ := ctx.Value(inViewKey{}).(InViewFunc)
	return f
}
