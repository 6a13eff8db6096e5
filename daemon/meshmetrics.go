package daemon

import (
	"errors"
	"fmt"

	gometrics "github.com/hashicorp/go-metrics"
	gmprom "github.com/hashicorp/go-metrics/prometheus"

	"github.com/physd/physd/discovery"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/metrics"
)

// bridgeMemberlistMetrics sends memberlist's own metrics (probe times,
// gossip and push/pull counts, health score …), which it reports through
// hashicorp/go-metrics, into physd's registry as memberlist_* series.
func bridgeMemberlistMetrics(mx *metrics.Metrics) error {
	sink, err := gmprom.NewPrometheusSinkFrom(gmprom.PrometheusOpts{Registerer: mx.Registry, Name: "physd_memberlist_sink"})
	if err != nil {
		return err
	}
	cfg := gometrics.DefaultConfig("")
	cfg.EnableHostname, cfg.EnableRuntimeMetrics, cfg.EnableServiceLabel = false, false, false
	_, err = gometrics.NewGlobal(cfg, sink)
	return err
}

// registerMeshMetrics exports members by state and the partition state.
func registerMeshMetrics(mx *metrics.Metrics, m *mesh.Mesh) {
	for _, state := range []string{mesh.StateAlive, mesh.StateSuspect, mesh.StateDead, mesh.StateLeft} {
		mx.Gauge("physd_mesh_members", "Mesh members by state (this node included as alive).", map[string]string{"state": state}, func() float64 {
			n := 0
			for _, mem := range m.Members() {
				if mem.State == state {
					n++
				}
			}
			return float64(n)
		})
	}
	for _, ps := range []string{"healthy", "suspected_partition", "partitioned"} {
		mx.Gauge("physd_mesh_partition_state", "1 for the current partition state.", map[string]string{"state": ps}, func() float64 {
			if m.PartitionState() == ps {
				return 1
			}
			return 0
		})
	}
	mx.Gauge("physd_mesh_responses_dropped_late_total", "Mesh replies that arrived after their deadline.", nil, func() float64 { return float64(m.LateDropped()) })
}

// meshStatus is /status's mesh section (with the gateways mDNS found,
// when discovery runs).
func meshStatus(m *mesh.Mesh, md *mdnsService) func() any {
	if m == nil {
		return nil
	}
	return func() any {
		return struct {
			mesh.Status
			Members    []mesh.Member     `json:"members"`
			Discovered []discovery.Found `json:"mdns_discovered,omitempty"`
		}{m.Status(), m.Members(), md.Found()}
	}
}

// meshReady is /readyz's mesh check: the mesh runs and, when peers are
// expected, at least one of them is alive.
func meshReady(m *mesh.Mesh) func() error {
	if m == nil {
		return nil
	}
	return func() error {
		if err := m.Err(); err != nil {
			return err
		}
		if st := m.Status(); st.ExpectedSize > 1 && st.Alive < 2 {
			msg := fmt.Sprintf("not joined: no peer alive (expected %d nodes)", st.ExpectedSize)
			if st.LastJoinError != "" {
				msg += "; last join error: " + st.LastJoinError
			}
			return errors.New(msg)
		}
		return nil
	}
}
