package meshnode_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/mcpserver"
	"github.com/physd/physd/mesh"
	"github.com/physd/physd/mesh/meshtest"
	"github.com/physd/physd/meshnode"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// site starts size gateways on an in-memory network inside the bubble;
// gw_01 asks at most maxPeers peers at once.
func site(t *testing.T, nw *meshtest.Network, size, maxPeers int) ([]*node.Node, []*mesh.Mesh) {
	t.Helper()
	var seeds []string
	for i := 1; i <= size; i++ {
		seeds = append(seeds, fmt.Sprintf("gw_%02d/%s", i, meshtest.NthAddr(i)))
	}
	// Registered first, so it runs last (after every Shutdown):
	// memberlist's detached goroutines run out their timers in the bubble.
	t.Cleanup(func() { time.Sleep(time.Minute) })
	var nodes []*node.Node
	var meshes []*mesh.Mesh
	for i := 1; i <= size; i++ {
		n, ms, _ := gatewayWith(t, i, seeds, size, nw.NewTransport(fmt.Sprintf("gw_%02d", i)), maxPeers)
		nodes, meshes = append(nodes, n), append(meshes, ms)
	}
	for start := time.Now(); len(meshes[0].Catalogs()) != size; time.Sleep(100 * time.Millisecond) {
		if time.Since(start) > 2*time.Minute {
			t.Fatalf("gw_01 sees %d catalogs of %d", len(meshes[0].Catalogs()), size)
		}
	}
	return nodes, meshes
}

// 30 gateways each own a fan; max_peers 10. A can_do matching all 30 is
// complete: 30 candidates, every peer consulted (10 at a time), and the
// metadata says so. With one owner silent, it is reported, not dropped.
func TestCanDoCompleteAtThirty(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(30)
		nodes, _ := site(t, nw, 30, 10)
		req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
		start := time.Now()
		rep, err := nodes[0].CanDo(context.Background(), req, node.Caller{})
		took := time.Since(start)
		md := rep.Metadata
		if err != nil || len(rep.Candidates) != 30 || len(rep.Blocked) != 0 || md.PeersMatched != 29 || md.PeersConsulted != 29 ||
			md.ResponsesReceived != 29 || md.PeersNotConsulted != 0 || md.FanoutUsed != 10 || md.TTLUsed != 1 {
			t.Fatalf("can_do: %d candidates, %d blocked, metadata %+v, err %v", len(rep.Candidates), len(rep.Blocked), md, err)
		}
		t.Logf("REPORT 30 gateways, max_peers 10: %d candidates, matched %d, consulted %d, answered %d, fanout_used %d, ttl_used %d, in %v simulated",
			len(rep.Candidates), md.PeersMatched, md.PeersConsulted, md.ResponsesReceived, md.FanoutUsed, md.TTLUsed, took)

		// "fan in zone_30": the one owner that matches is asked.
		req = promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"fan"}, Action: "set", Value: 40.0, Location: "zone_30"}}
		if rep, _ := nodes[0].CanDo(context.Background(), req, node.Caller{}); !rep.Feasible || len(rep.Candidates) != 1 || rep.Candidates[0].Source != "gw_30" {
			t.Errorf("fan in zone_30: feasible %v, candidates %+v, unroutable %+v", rep.Feasible, rep.Candidates, rep.Unroutable)
		}

		// A silent owner in the first batch: its fan is blocked
		// (source_unreachable, naming it), the other 28 still answer.
		nw.Stop("gw_05")
		req = promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
		start = time.Now()
		rep, _ = nodes[0].CanDo(context.Background(), req, node.Caller{})
		took = time.Since(start)
		if len(rep.Candidates) != 29 || len(rep.Blocked) != 1 || rep.Blocked[0].Source != "gw_05" || took > 500*time.Millisecond {
			t.Errorf("with gw_05 silent: %d candidates, blocked %+v, after %v", len(rep.Candidates), rep.Blocked, took)
		}
		nw.Resume("gw_05")
		time.Sleep(30 * time.Second) // gw_05 is alive and answering again

		// Ten silent owners first in line (frozen just now: still alive in
		// the view) must not starve the other nineteen of the 10 slots.
		var frozen []string
		for i := 2; i <= 11; i++ {
			frozen = append(frozen, fmt.Sprintf("gw_%02d", i))
		}
		nw.Stop(frozen...)
		start = time.Now()
		rep, _ = nodes[0].CanDo(context.Background(), req, node.Caller{})
		took = time.Since(start)
		md = rep.Metadata
		if len(rep.Candidates) != 20 || len(rep.Blocked) != 10 || md.PeersNotConsulted != 0 || took > 500*time.Millisecond {
			t.Errorf("with 10 of 30 silent: %d candidates, %d blocked, metadata %+v, after %v", len(rep.Candidates), len(rep.Blocked), md, took)
		}
		t.Logf("REPORT 30 gateways, 10 of them silent and first in line: %d candidates, %d blocked, %d not consulted, in %v",
			len(rep.Candidates), len(rep.Blocked), md.PeersNotConsulted, took)
		nw.Resume(frozen...)
	})
}

// A can_do through a view asks only the owners the view selects: the
// others are not sent the question or the caller's credential.
func TestCanDoAsksOnlyTheView(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(4)
		nodes, _ := site(t, nw, 4, 10)
		req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
		ctx := node.WithInView(context.Background(), func(site, device, tool string) bool { return site == "" && device == "gw_03" })
		rep, err := nodes[0].CanDo(ctx, req, node.Caller{})
		md := rep.Metadata
		if err != nil || md.PeersMatched != 1 || md.PeersConsulted != 1 || md.ResponsesReceived != 1 {
			t.Errorf("can_do through a view of gw_03: metadata %+v, err %v", md, err)
		}
	})
}

// Budget runs out before every matching peer could be asked (each
// answers slowly): the rest are reported not_consulted: fanout_limit.
func TestCanDoNotConsultedReported(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(31)
		nodes, _ := site(t, nw, 6, 1)
		nw.Stop("gw_02", "gw_03") // the first asked hold the single slot until the deadline
		req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
		rep, _ := nodes[0].CanDo(context.Background(), req, node.Caller{})
		md := rep.Metadata
		notConsulted := 0
		for _, b := range rep.Blocked {
			if b.Code == "not_consulted" && strings.HasPrefix(b.Reason, "not_consulted: fanout_limit") {
				notConsulted++
			}
		}
		if md.PeersMatched != 5 || md.PeersConsulted+md.PeersNotConsulted != 5 || notConsulted != md.PeersNotConsulted || notConsulted == 0 ||
			len(rep.Candidates)+len(rep.Blocked) != 6 {
			t.Errorf("metadata %+v, %d not_consulted entries, %d candidates, blocked %+v", md, notConsulted, len(rep.Candidates), rep.Blocked)
		}
		// As the reason says: asked again with scope [owner], it is consulted.
		for _, b := range rep.Blocked {
			if b.Code != "not_consulted" {
				continue
			}
			req := req
			req.Scope = []string{b.Source}
			again, _ := nodes[0].CanDo(context.Background(), req, node.Caller{})
			if len(again.Candidates) != 1 || again.Candidates[0].Source != b.Source || again.Metadata.PeersConsulted != 1 {
				t.Errorf("scope [%s]: candidates %+v, metadata %+v", b.Source, again.Candidates, again.Metadata)
			}
			break
		}
		nw.Resume("gw_02", "gw_03")
	})
}

// Routed calls: a silent owner fails within request_timeout_ms naming
// it (a do_ says nothing was done); a dead owner's tools stay listed and
// a call names its state, as can_do does.
func TestRoutedSilentAndDeadOwner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(32)
		nodes, meshes := site(t, nw, 4, 10)
		r := &meshnode.Router{Mesh: meshes[0]}
		ctx := context.Background()
		if b, err := r.Read(ctx, "gw_02", "read_temperature_zone_02", -1); err != nil || !strings.Contains(string(b), "celsius") {
			t.Fatalf("routed read: %s %v", b, err)
		}
		body, err := r.Do(ctx, "gw_02", mcpserver.RoutedDo{Tool: "do_fan_zone_02", Value: json.RawMessage("35"), IdempotencyKey: "k1"})
		var res promcp.DoResult
		if err != nil || json.Unmarshal(body, &res) != nil || res.Status != promcp.StatusSuccess {
			t.Fatalf("routed do: %s %v", body, err)
		}

		nw.Stop("gw_03")
		for _, kind := range []string{"read", "do"} {
			start := time.Now()
			if kind == "read" {
				_, err = r.Read(ctx, "gw_03", "read_temperature_zone_03", -1)
			} else {
				_, err = r.Do(ctx, "gw_03", mcpserver.RoutedDo{Tool: "do_fan_zone_03", Value: json.RawMessage("35"), IdempotencyKey: "k2"})
			}
			took := time.Since(start)
			if !errors.Is(err, mesh.ErrNoAck) || !strings.Contains(err.Error(), "gw_03") || took > 500*time.Millisecond ||
				(kind == "do" && !strings.Contains(err.Error(), "nothing was done")) {
				t.Errorf("routed %s to silent gw_03: %v after %v", kind, err, took)
			}
			t.Logf("REPORT routed %s to a silent owner: %v after %v", kind, err, took)
		}
		nw.Resume("gw_03")

		nw.Crash("gw_04")
		for start := time.Now(); stateOf(meshes[0], "gw_04") != mesh.StateDead; time.Sleep(100 * time.Millisecond) {
			if time.Since(start) > time.Minute {
				t.Fatal("gw_04 never declared dead")
			}
		}
		listed := false
		for _, tool := range r.RemoteTools() {
			listed = listed || (tool.Owner == "gw_04" && tool.Tool == "do_fan_zone_04")
		}
		_, err = r.Do(ctx, "gw_04", mcpserver.RoutedDo{Tool: "do_fan_zone_04", Value: json.RawMessage("35"), IdempotencyKey: "k3"})
		req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"fan"}, Location: "zone_04", Action: "set", Value: 40.0}}
		rep, _ := nodes[0].CanDo(ctx, req, node.Caller{})
		if !listed || err == nil || !strings.Contains(err.Error(), "gw_04 is dead") || len(rep.Blocked) != 1 || !strings.Contains(rep.Blocked[0].Reason, "gw_04 is dead") {
			t.Errorf("dead owner: listed %v, call error %v, can_do blocked %+v", listed, err, rep.Blocked)
		}
		// After DownListed both forget it.
		time.Sleep(meshnode.DefaultDownListed + time.Second)
		for _, tool := range r.RemoteTools() {
			if tool.Owner == "gw_04" {
				t.Errorf("gw_04's %s still listed after %v", tool.Tool, meshnode.DefaultDownListed)
				break
			}
		}
		if rep, _ := nodes[0].CanDo(ctx, req, node.Caller{}); len(rep.Blocked) != 0 {
			t.Errorf("can_do still reports gw_04 after %v: %+v", meshnode.DefaultDownListed, rep.Blocked)
		}
	})
}

func stateOf(m *mesh.Mesh, name string) string {
	for _, mem := range m.Members() {
		if mem.Name == name {
			return mem.State
		}
	}
	return ""
}

var _ mcpserver.Router = (*meshnode.Router)(nil)

// Under 20 % loss of packets, connection attempts and stream segments, a
// distributed can_do stays complete and within its 500 ms budget: the
// lossy owners' capabilities are candidates, not source_unreachable.
func TestCanDoUnderLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(33)
		nodes, _ := site(t, nw, 5, 10)
		nw.Drop(0.20)
		nw.SynLoss(0.20)
		req := promcp.CanDoRequest{Intent: &promcp.Intent{SemanticTags: []string{"ventilation"}, Action: "set", Value: 40.0}}
		complete, slowest := 0, time.Duration(0)
		const rounds = 100
		for range rounds {
			time.Sleep(time.Second)
			start := time.Now()
			rep, _ := nodes[0].CanDo(context.Background(), req, node.Caller{})
			slowest = max(slowest, time.Since(start))
			if len(rep.Candidates) == 5 {
				complete++
				continue
			}
			// Not complete: every gateway is still accounted for, the
			// missing ones blocked with the reason (never dropped).
			if len(rep.Candidates)+len(rep.Blocked) != 5 {
				t.Errorf("a can_do under loss accounts for %d candidates and %d blocked of 5 gateways: %+v", len(rep.Candidates), len(rep.Blocked), rep)
			}
			for _, b := range rep.Blocked {
				if !strings.Contains(b.Reason, " is dead") && !strings.Contains(b.Reason, "did not answer in time") {
					t.Errorf("blocked under loss for another reason: %s", b.Reason)
				}
				if testing.Verbose() {
					t.Logf("blocked: %s", b.Reason)
				}
			}
		}
		t.Logf("REPORT 5 gateways, 20%% packet+SYN+segment loss: %d of %d can_dos complete, slowest %v (budget 500ms)", complete, rounds, slowest)
		// Runs of this test complete 94 to 100 of 100: at 20 % loss
		// memberlist's failure detector now and then declares a healthy
		// gateway dead for a few rounds (its probes and their indirect
		// probes all lost), and can_do then blocks it with that reason.
		if complete < rounds*90/100 || slowest > 500*time.Millisecond {
			t.Errorf("%d of %d can_dos complete under 20%% loss, slowest %v", complete, rounds, slowest)
		}
	})
}

// TestRoutedLeaseHold: a leased output on another gateway, driven through
// the mesh, holds for the hold_s the caller asked for (not the owner's
// default), its owner's default without one, is refused above the owner's
// max_s with nothing done, and goes to its safe value when the hold runs
// out.
func TestRoutedLeaseHold(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := meshtest.NewNetwork(34)
		nodes, meshes := site(t, nw, 2, 10)
		r := &meshnode.Router{Mesh: meshes[0]}
		ctx := context.Background()
		do := func(key string, hold int) (promcp.DoResult, error) {
			b, err := r.Do(ctx, "gw_02", mcpserver.RoutedDo{Tool: "do_heater_zone_02", Value: json.RawMessage("40"), IdempotencyKey: key, HoldS: hold})
			var res promcp.DoResult
			if err == nil {
				err = json.Unmarshal(b, &res)
			}
			return res, err
		}
		start := time.Now()
		res, err := do("lease-5", 5)
		if err != nil || res.Status != promcp.StatusSuccess || res.LeaseExpiresAt == nil || res.LeaseExpiresAt.Sub(start) > 6*time.Second || res.LeaseExpiresAt.Sub(start) < 4*time.Second {
			t.Fatalf("routed do_ with hold_s 5: %+v, %v", res, err)
		}
		if res, err = do("lease-default", 0); err != nil || res.LeaseExpiresAt == nil || res.LeaseExpiresAt.Sub(time.Now()) < 59*time.Second {
			t.Errorf("routed do_ without hold_s: lease_expires_at %v (want the owner's default 60 s), %v", res.LeaseExpiresAt, err)
		}
		if res, err := do("lease-long", 601); err == nil && res.Status == promcp.StatusSuccess {
			t.Errorf("hold_s 601 above the owner's max_s 600 was applied: %+v", res)
		}
		// The second do_ renewed the lease for 60 s; once it runs out the
		// owner drives the heater to its safe value.
		time.Sleep(62 * time.Second)
		synctest.Wait()
		if st := nodes[1].SafeStatusOf("do_heater_zone_02"); st.State != node.SafeReached || st.Event != "lease_expiry" || st.ReadBack != int64(0) {
			t.Errorf("after the routed lease ran out, the owner's heater: %+v", st)
		}
	})
}
