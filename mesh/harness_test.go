package mesh

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/physd/physd/mesh/meshtest"
)

// testKey is the AES-256 key of the test meshes.
var testKey = bytes.Repeat([]byte{0x42}, 32)

// cluster is an in-memory mesh inside a synctest bubble.
type cluster struct {
	t     *testing.T
	net   *meshtest.Network
	n     int
	nodes map[string]*Mesh
	logs  *logBuf
	k     int // transports created
	extra []*Mesh
}

func name(i int) string { return fmt.Sprintf("n%d", i) }

// newCluster starts n nodes n1..nN; each lists every node (itself
// included, as a site-wide manifest would) as a seed. mod adjusts each
// node's Config. Callers must `defer c.close()` inside the bubble.
func newCluster(t *testing.T, n int, seed uint64, mod func(*Config)) *cluster {
	t.Helper()
	return newClusterOn(t, meshtest.NewNetwork(seed), n, mod)
}

// newClusterOn is newCluster on a network prepared by the caller (e.g.
// with loss set before the nodes join).
func newClusterOn(t *testing.T, nw *meshtest.Network, n int, mod func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t, net: nw, n: n, nodes: map[string]*Mesh{}, logs: &logBuf{}}
	for i := 1; i <= n; i++ {
		m, err := c.start(name(i), mod)
		if err != nil {
			t.Fatalf("start %s: %v", name(i), err)
		}
		c.nodes[name(i)] = m
	}
	return c
}

func (c *cluster) seeds() []string {
	var s []string
	for i := 1; i <= c.n; i++ {
		s = append(s, name(i)+"/"+meshtest.NthAddr(i))
	}
	return s
}

// start creates one node (with the next transport address).
func (c *cluster) start(node string, mod func(*Config)) (*Mesh, error) {
	c.k++
	cfg := Config{
		NodeName:  node,
		Seeds:     c.seeds(),
		SecretKey: testKey,
		Label:     "physd-test",
		Transport: c.net.NewTransport(node),
		Logger:    slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if mod != nil {
		mod(&cfg)
	}
	m, err := New(cfg, testCatalog(node), echoHandler(node))
	if err == nil {
		c.extra = append(c.extra, m)
	}
	return m, err
}

// close shuts every node down, then lets memberlist's detached probe and
// dial goroutines run out their timers: synctest stops the clock once the
// bubble's root goroutine returns, so this must run in it (defer).
func (c *cluster) close() {
	for _, m := range c.extra {
		_ = m.Shutdown()
	}
	time.Sleep(time.Minute)
}

func (c *cluster) names() []string {
	var out []string
	for i := 1; i <= c.n; i++ {
		out = append(out, name(i))
	}
	return out
}

// state returns node's view of peer's state ("" when unknown).
func state(m *Mesh, peer string) string {
	for _, mem := range m.Members() {
		if mem.Name == peer {
			return mem.State
		}
	}
	return ""
}

// sees reports whether m sees exactly want alive, with their catalogs.
func sees(m *Mesh, want []string) bool {
	var alive []string
	for _, mem := range m.Members() {
		if mem.State == StateAlive && mem.Catalog != nil {
			alive = append(alive, mem.Name)
		}
	}
	want = slices.Sorted(slices.Values(want))
	return slices.Equal(alive, want)
}

// converged: every node in group sees exactly group alive with catalogs.
func (c *cluster) converged(group []string) bool {
	for _, n := range group {
		if !sees(c.nodes[n], group) {
			return false
		}
	}
	return true
}

// waitFor polls cond every 50 ms of (simulated) time and returns how long
// it took; it fails the test after limit.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not reached within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

func testCatalog(node string) Catalog {
	lo, hi := -10.0, 50.0
	return Catalog{DeviceID: node, Zone: "zone_" + node, Capabilities: []CatalogEntry{
		{Tool: "read_temperature_" + node, Kind: "read", Unit: "celsius", Tags: []string{"temperature", "air"}, Min: &lo, Max: &hi},
		{Tool: "do_valve_" + node, Kind: "do", Tags: []string{"valve"}},
	}}
}

// echoHandler: "echo" answers "<node>:<payload>", "fail" returns an
// error, "slow" sleeps 2 s on n3, "count" counts calls.
func echoHandler(node string) Handler {
	return func(ctx context.Context, from, kind string, payload []byte) ([]byte, error) {
		switch kind {
		case "echo":
			return []byte(node + ":" + string(payload)), nil
		case "fail":
			return nil, errors.New("boom on " + node)
		case "slow":
			if node == "n3" {
				time.Sleep(2 * time.Second)
			}
			return []byte(node), nil
		case "panic":
			panic("handler bug")
		case "big":
			return make([]byte, MaxPayload+1), nil
		case "count":
			served.Add(node, 1)
			return []byte(node), nil
		}
		return nil, fmt.Errorf("unknown kind %q", kind)
	}
}

// served counts "count" requests served, by node.
var served counter

type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counter) Add(k string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[k] += n
}

func (c *counter) Get(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[k]
}

// logBuf is a goroutine-safe log sink.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// report prints a measured figure (visible with -v).
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	t.Logf("REPORT "+format, args...)
}
