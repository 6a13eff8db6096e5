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

// BenchmarkReadDevice measures a device read (max_age 0) with no
// subscriber and with three (as physd runs: MCP resources, history,
// alarms), to show what the observation stream adds to each read,
// read-back included.
func BenchmarkReadDevice(b *testing.B) {
	for _, subs := range []int{0, 3} {
		b.Run(map[int]string{0: "no_subscribers", 3: "three_subscribers"}[subs], func(b *testing.B) {
			f := open(b, b.TempDir())
			done := make(chan struct{})
			defer close(done)
			for range subs {
				s := f.n.Subscribe(0)
				go func() {
					for {
						select {
						case <-s.C:
						case <-done:
							return
						}
					}
				}()
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.n.Read(ctx, "read_temperature_zone_a", 0); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
