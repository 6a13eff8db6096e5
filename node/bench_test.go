package node_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
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

// BenchmarkReload measures a manifest reload of the 50-capability bench
// manifest that removes or re-adds one capability (49 kept: the bus and
// their state are shared, not reopened).
func BenchmarkReload(b *testing.B) {
	full, err := manifest.Load("../bench/manifest50.yml")
	if err != nil {
		b.Fatal(err)
	}
	src, _ := os.ReadFile("../bench/manifest50.yml")
	text := string(src)
	last := strings.LastIndex(text, "  - name: ")
	fewer, err := manifest.Parse("../bench/manifest50.yml", []byte(text[:last]))
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		b.Fatal(err)
	}
	defer al.Close()
	n, err := node.Open(context.Background(), node.Config{Manifest: full, Store: st, Audit: al})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close(context.Background())
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		m := fewer
		if i%2 == 1 {
			m = full
		}
		i++
		if res, err := n.Reload(ctx, m); err != nil || res.Kept != 49 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}

// BenchmarkDoLeased measures a leased do_ (one lease record written with
// the pending ledger entry, one timer re-armed) on one output while 0 or
// 1000 other outputs hold active leases.
func BenchmarkDoLeased(b *testing.B) {
	for _, held := range []int{0, 1000} {
		b.Run(fmt.Sprintf("active_leases_%d", held), func(b *testing.B) {
			f := openLeased(b, b.TempDir(), held+1)
			for i := 1; i <= held; i++ {
				doHold(b, f.n, fmt.Sprintf("do_heater_z%d", i), 50, fmt.Sprint("hold-", i), 600)
			}
			if got := len(f.n.Leases()); got != held {
				b.Fatalf("%d leases; want %d", got, held)
			}
			ctx := context.Background()
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				i++
				raw := []byte(fmt.Sprint(10 + i%50))
				if _, err := f.n.Do(ctx, node.DoRequest{Tool: "do_heater_z0", Value: raw, IdempotencyKey: fmt.Sprint("k", i), HoldS: 600}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
