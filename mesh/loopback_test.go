package mesh

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"testing"
	"time"
)

// startLoopback starts n real nodes (UDP+TCP) on 127.0.0.1, ephemeral
// ports, Profile local, encrypted, all seeded with the first node.
func startLoopback(tb testing.TB, n int) []*Mesh {
	tb.Helper()
	var nodes []*Mesh
	tb.Cleanup(func() {
		for _, m := range nodes {
			_ = m.Shutdown()
		}
	})
	level := slog.LevelError
	if os.Getenv("MESH_DEBUG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var seeds []string
	for i := 1; i <= n; i++ {
		m, err := New(Config{
			NodeName:       name(i),
			BindAddr:       "127.0.0.1",
			BindPort:       0,
			Seeds:          seeds,
			Label:          "physd-loopback",
			SecretKey:      testKey,
			Profile:        ProfileLocal,
			ExpectedSize:   n,
			RequestTimeout: 2 * time.Second,
			Logger:         logger,
		}, testCatalog(name(i)), echoHandler(name(i)))
		if err != nil {
			tb.Fatalf("start %s: %v", name(i), err)
		}
		nodes = append(nodes, m)
		if i == 1 {
			seeds = []string{nodes[0].SelfAddr()}
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, m := range nodes {
		for len(m.Catalogs()) != n {
			if time.Now().After(deadline) {
				tb.Fatalf("%s sees %d catalogs", m.Name(), len(m.Catalogs()))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nodes
}

// The real memberlist transport works too.
func TestLoopbackRealTransport(t *testing.T) {
	if testing.Short() {
		t.Skip("real sockets")
	}
	nodes := startLoopback(t, 3)
	n1 := nodes[0]
	if !strings.HasPrefix(n1.SelfAddr(), "127.0.0.1:") {
		t.Fatalf("addr %s", n1.SelfAddr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	out, err := n1.Request(ctx, "n3", "echo", []byte("over tcp"))
	if err != nil || string(out) != "n3:over tcp" {
		t.Fatalf("request = %q, %v", out, err)
	}
	if q := n1.Quorum(ctx, 0); q != 3 {
		t.Errorf("quorum %d", q)
	}
	if st := n1.Status(); st.PartitionState != Healthy || !st.Encrypted || st.Alive != 3 {
		t.Errorf("status %+v", st)
	}
}

// BenchmarkFanoutLoopback measures a trivial request fanned out to 2, 9
// and 29 peers over real loopback TCP (encrypted), as a stand-in for the
// can_do fan-out. Run with a fixed count to bound TIME_WAIT sockets:
//
//	go test ./mesh -run '^$' -bench FanoutLoopback -benchtime 200x  (each request opens two TCP connections: leave a minute between runs for TIME_WAIT)
func BenchmarkFanoutLoopback(b *testing.B) {
	for _, peers := range []int{2, 9, 29} {
		b.Run(fmt.Sprintf("peers=%d", peers), func(b *testing.B) {
			nodes := startLoopback(b, peers+1)
			n1 := nodes[0]
			var targets []string
			for _, m := range nodes[1:] {
				targets = append(targets, m.Name())
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				start := time.Now()
				replies, errs, _ := n1.Fanout(ctx, targets, "echo", []byte("can_do?"))
				lat = append(lat, time.Since(start))
				cancel()
				if len(replies) != peers {
					b.Fatalf("%d replies, errs %v", len(replies), errs)
				}
			}
			b.StopTimer()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			pct := func(p float64) float64 {
				return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
			}
			b.ReportMetric(pct(0.50), "p50-ms")
			b.ReportMetric(pct(0.99), "p99-ms")
			b.ReportMetric(0, "ns/op")
		})
	}
}
