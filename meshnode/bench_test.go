package meshnode_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/physd/physd/audit"
	_ "github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// gateway is one node of a site: a simulated zone with a temperature
// sensor and a fan, joined to the mesh over real loopback UDP/TCP.
func gateway(tb testing.TB, i int, seeds []string, size int) (*node.Node, *mesh.Mesh) {
	tb.Helper()
	n, ms, _ := gatewayWith(tb, i, seeds, size, nil, 0)
	return n, ms
}

// gatewayWith is gateway over transport t (nil: real loopback), asking at
// most maxPeers peers at once.
func gatewayWith(tb testing.TB, i int, seeds []string, size int, t memberlist.NodeAwareTransport, maxPeers int) (*node.Node, *mesh.Mesh, *meshnode.Remote) {
	tb.Helper()
	zone := fmt.Sprintf("zone_%02d", i)
	src := fmt.Sprintf(`physmcp_version: "0.1"
device: {id: gw_%02d, type: greenhouse_controller, location: {zone: %s}}
network: {protocols: [{type: ip}], mesh: {enabled: true}}
buses: {plant: {type: sim, zones: {%s: {}}}}
capabilities:
  - {name: temperature_%s, kind: read, description: Air temperature., zone: %s, binding: {type: sim, bus: plant, point: %s.temperature}, data_type: float, unit: celsius, semantic_tags: [temperature, air, %s]}
  - {name: fan_%s, kind: do, description: Fan speed., zone: %s, binding: {type: sim, bus: plant, point: %s.fan}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [fan, ventilation, cooling, %s]}
  - {name: heater_%s, kind: do, description: Heater power., zone: %s, binding: {type: sim, bus: plant, point: %s.heater}, data_type: int, unit: percent, range: {min: 0, max: 100}, semantic_tags: [heating, %s],
     safe: {value: 0, on: [lease_expiry]}, lease: {default_s: 60, max_s: 600}}
`, i, zone, zone, zone, zone, zone, zone, zone, zone, zone, zone, zone, zone, zone, zone)
	m, err := manifest.Parse("gw.yml", []byte(src))
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		tb.Fatal(err)
	}
	al, err := audit.Open(filepath.Join(dir, "audit"))
	if err != nil {
		tb.Fatal(err)
	}
	remote := &meshnode.Remote{Budget: 500 * time.Millisecond, MaxPeers: maxPeers}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Remote: remote})
	if err != nil {
		tb.Fatal(err)
	}
	ms, err := mesh.New(mesh.Config{NodeName: m.Device.ID, BindAddr: "127.0.0.1", Seeds: seeds, Label: "bench",
		Profile: mesh.ProfileLocal, ExpectedSize: size, RequestTimeout: 500 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler), Transport: t}, mesh.CatalogFromManifest(m), meshnode.Handler(n, nil))
	if err != nil {
		tb.Fatal(err)
	}
	remote.Mesh = ms
	tb.Cleanup(func() { ms.Shutdown(); n.Close(context.Background()); al.Close(); st.Close() })
	return n, ms, remote
}

// BenchmarkDistributedCanDo is a can_do asked of one gateway that every
// other gateway of the site can answer (all own a fan), over real loopback,
// all nodes in this one process.
func BenchmarkDistributedCanDo(b *testing.B) {
	for _, size := range []int{3, 10, 30} {
		b.Run(fmt.Sprintf("nodes=%d", size), func(b *testing.B) {
			var first *node.Node
			var meshes []*mesh.Mesh
			var seeds []string
			for i := 1; i <= size; i++ {
				n, ms := gateway(b, i, seeds, size)
				if i == 1 {
					first, seeds = n, []string{ms.SelfAddr()}
				}
				meshes = append(meshes, ms)
			}
			deadline := time.Now().Add(90 * time.Second)
			for len(meshes[0].Catalogs()) != size {
				if time.Now().After(deadline) {
					b.Fatalf("coordinator sees %d catalogs of %d", len(meshes[0].Catalogs()), size)
				}
				time.Sleep(50 * time.Millisecond)
			}
			req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				rep, err := first.CanDo(context.Background(), req, node.Caller{})
				lat = append(lat, time.Since(start))
				if err != nil || len(rep.Candidates) != size || rep.Metadata.ResponsesReceived != size-1 {
					b.Fatalf("can_do: %d candidates of %d, %d responses, err %v", len(rep.Candidates), size, rep.Metadata.ResponsesReceived, err)
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

// TestDistributedCanDo: a coordinator merges the answers of two peers over
// real loopback, and reports a stopped peer's capabilities as unreachable.
func TestDistributedCanDo(t *testing.T) {
	first, m1 := gateway(t, 1, nil, 3)
	_, m2 := gateway(t, 2, []string{m1.SelfAddr()}, 3)
	gateway(t, 3, []string{m1.SelfAddr()}, 3)
	deadline := time.Now().Add(30 * time.Second)
	for len(m1.Catalogs()) != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("catalogs: %d", len(m1.Catalogs()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"fan"}, Action: "set", Value: 30.0}}
	rep, err := first.CanDo(context.Background(), req, node.Caller{})
	if err != nil || len(rep.Candidates) != 3 || !rep.Feasible || rep.Metadata.PeersConsulted != 2 || rep.Metadata.ResponsesReceived != 2 {
		t.Fatalf("distributed can_do: %+v %v", rep, err)
	}
	m2.Shutdown() // gw_02 stops answering
	rep, _ = first.CanDo(context.Background(), req, node.Caller{})
	found := false
	for _, b := range rep.Blocked {
		found = found || (b.Source == "gw_02" && b.Permission == promcp.PermSourceUnreachable)
	}
	if !found || len(rep.Candidates) != 2 {
		t.Errorf("after gw_02 stopped: candidates %d, blocked %+v", len(rep.Candidates), rep.Blocked)
	}
}
