package node_test

import (
	"context"
	"testing"

	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// BenchmarkCanDo measures the node's own can_do work (no MCP, no HTTP).
func BenchmarkCanDo(b *testing.B) {
	f := open(b, b.TempDir())
	in := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"heating"}, Action: "increase", Location: "zone_a"}}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.n.CanDo(ctx, in, node.Caller{}); err != nil {
			b.Fatal(err)
		}
	}
}
