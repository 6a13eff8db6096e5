package daemon

import (
	"context"
	"sync"

	"github.com/physd/physd/mesh"
)

// peers is the mesh as the guard asks it for a quorum. The guard judges
// the node's calls and the mesh routes calls to the node, so the guard
// is built before the mesh exists: until the mesh component has joined
// (and on a standalone gateway) a node is its own quorum of one.
type peers struct {
	mu   sync.Mutex
	site *mesh.Mesh
}

func (p *peers) set(m *mesh.Mesh) {
	p.mu.Lock()
	p.site = m
	p.mu.Unlock()
}

// Quorum is a policy.QuorumFunc: the fresh acks of at least need nodes.
func (p *peers) Quorum(ctx context.Context, need int) int {
	p.mu.Lock()
	site := p.site
	p.mu.Unlock()
	if site == nil {
		return 1
	}
	return site.Quorum(ctx, need)
}
