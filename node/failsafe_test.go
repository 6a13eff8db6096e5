package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// leasedManifest has zones heaters, each leased (default 60 s, at most
// 600 s) with safe value 0 on lease_expiry, shutdown and bus_restored.
func leasedManifest(zones int) string {
	var b strings.Builder
	b.WriteString(`physmcp_version: "0.1"
device: {id: lease_node, type: greenhouse_controller, location: {zone: house}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  plant:
    type: sim
    zones:
`)
	for i := range zones {
		fmt.Fprintf(&b, "      z%d: {ambient_c: 12, initial_c: 18}\n", i)
	}
	b.WriteString("capabilities:\n")
	for i := range zones {
		fmt.Fprintf(&b, `  - name: heater_z%d
    kind: do
    description: Heater power in zone %d.
    zone: z%d
    binding: {type: sim, bus: plant, point: z%d.heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    semantic_tags: [heating, heater, z%d]
    safe: {value: 0, on: [lease_expiry, shutdown, bus_restored]}
    lease: {default_s: 60, max_s: 600}
`, i, i, i, i, i)
	}
	return b.String()
}

type leaseFixture struct {
	n     *node.Node
	plant *sim.Plant
	st    *store.Store
	al    *audit.Log
	dir   string
	once  sync.Once
}

func openLeased(t testing.TB, dir string, zones int) *leaseFixture {
	t.Helper()
	n, st, al := openNode(t, dir, leasedManifest(zones), node.Config{})
	f := &leaseFixture{n: n, plant: n.Buses()["plant"].(*sim.Plant), st: st, al: al, dir: dir}
	t.Cleanup(f.close)
	return f
}

func (f *leaseFixture) close() {
	f.once.Do(func() {
		f.n.Close(context.Background())
		f.al.Close()
		f.st.Close()
	})
}

func (f *leaseFixture) heater(t testing.TB, zone int) float64 {
	t.Helper()
	v, ok := f.plant.Snapshot()[fmt.Sprintf("z%d.heater", zone)]
	if !ok {
		t.Fatalf("no point z%d.heater", zone)
	}
	return v
}

func doHold(t testing.TB, n *node.Node, tool string, value any, key string, holdS int) promcp.DoResult {
	t.Helper()
	raw, _ := json.Marshal(value)
	body, err := n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, HoldS: holdS, Caller: node.Caller{ID: "agent"}})
	if err != nil {
		t.Fatalf("%s(%v, hold %d): %v", tool, value, holdS, err)
	}
	var r promcp.DoResult
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func safeRecords(t testing.TB, al *audit.Log) []audit.Record {
	t.Helper()
	var out []audit.Record
	if err := al.ScanSince(time.Time{}, func(r audit.Record) bool {
		if r.Event == "safe_state" {
			out = append(out, r)
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLeaseExpiresExactly: a do_ with hold_s 30 answers lease_expires_at
// 30 s on; the output holds its value until then and is at its safe value
// (verified, audited, no lease left) right after.
func TestLeaseExpiresExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		r := doHold(t, f.n, "do_heater_z0", 40, "k1", 30)
		if r.Status != promcp.StatusSuccess || r.LeaseExpiresAt == nil {
			t.Fatalf("answer: %+v", r)
		}
		if got := r.LeaseExpiresAt.Sub(r.Timestamp); got != 30*time.Second {
			t.Errorf("lease_expires_at is %v after the answer's timestamp; want 30s", got)
		}
		time.Sleep(30*time.Second - time.Millisecond)
		synctest.Wait()
		if v := f.heater(t, 0); v != 40 {
			t.Fatalf("1 ms before the lease ends the heater is %v; want 40", v)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if v := f.heater(t, 0); v != 0 {
			t.Fatalf("after the lease ended the heater is %v; want its safe value 0", v)
		}
		st := f.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry || st.Previous != 40.0 {
			t.Errorf("safe status: %+v", st)
		}
		if l := f.n.LeaseOf("do_heater_z0"); l != nil {
			t.Errorf("a lease is left after the drive to safe: %+v", l)
		}
		recs := safeRecords(t, f.al)
		if len(recs) != 1 || recs[0].Status != "success" || !strings.Contains(recs[0].Reason, "lease_expiry") || !strings.Contains(recs[0].Reason, "k1") {
			t.Fatalf("safe_state audit: %+v", recs)
		}
		if ok, checks := f.n.Ready(); !ok {
			t.Errorf("ready after a verified drive: %+v", checks)
		}
	})
}

// TestLeaseRenewal: each do_ that applies starts a new hold from its own
// time; the last one decides when the output goes safe.
func TestLeaseRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		doHold(t, f.n, "do_heater_z0", 40, "a", 30)
		time.Sleep(20 * time.Second)
		r := doHold(t, f.n, "do_heater_z0", 40, "b", 30) // renewal, same value
		if r.LeaseExpiresAt == nil {
			t.Fatal("the renewal has no lease_expires_at")
		}
		time.Sleep(29 * time.Second) // 49 s: the first lease is long over
		synctest.Wait()
		if v := f.heater(t, 0); v != 40 {
			t.Fatalf("within the renewed lease the heater is %v; want 40", v)
		}
		if st := f.n.SafeStatusOf("do_heater_z0"); st.State != "" {
			t.Fatalf("the replaced lease drove the output: %+v", st)
		}
		time.Sleep(1100 * time.Millisecond)
		synctest.Wait()
		if v := f.heater(t, 0); v != 0 {
			t.Fatalf("after the renewed lease the heater is %v; want 0", v)
		}
		// Writing the safe value ends the lease: nothing to drive later.
		doHold(t, f.n, "do_heater_z0", 55, "c", 10)
		doHold(t, f.n, "do_heater_z0", 0, "d", 0)
		if l := f.n.LeaseOf("do_heater_z0"); l != nil {
			t.Fatalf("a do_ with the safe value left a lease: %+v", l)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(safeRecords(t, f.al)); n != 1 {
			t.Errorf("%d safe drives; want 1 (the safe value ended the second lease)", n)
		}
	})
}

// TestLeaseHoldBounds: hold_s is checked against the manifest's terms and
// named in the error; a capability without a lease refuses it.
func TestLeaseHoldBounds(t *testing.T) {
	f := open(t, t.TempDir()) // testManifest: no leases
	_, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_fan_zone_b", Value: json.RawMessage("10"), IdempotencyKey: "x", HoldS: 5})
	var ie *node.InputError
	if !errors.As(err, &ie) || ie.Field != "hold_s" {
		t.Fatalf("hold_s on an unleased capability: %v", err)
	}
	g := openLeased(t, t.TempDir(), 1)
	_, err = g.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_z0", Value: json.RawMessage("10"), IdempotencyKey: "y", HoldS: 601})
	if !errors.As(err, &ie) || ie.Field != "hold_s" || !strings.Contains(ie.Msg, "600") {
		t.Fatalf("hold_s above max_s: %v", err)
	}
	if v := g.heater(t, 0); v != 0 {
		t.Errorf("a refused hold actuated: heater %v", v)
	}
	r := doHold(t, g.n, "do_heater_z0", 10, "z", 0)
	if got := r.LeaseExpiresAt.Sub(r.Timestamp); got != 60*time.Second {
		t.Errorf("default hold: lease_expires_at %v after the answer; want lease.default_s 60 s", got)
	}
}

// TestLeaseSurvivesRestart: a lease is on record; a restart arms it for
// what is left (the output goes safe when it would have), and a lease that
// ran out while the node was down is driven safe before Open returns.
func TestLeaseSurvivesRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 2)
		doHold(t, f.n, "do_heater_z0", 40, "k0", 30)
		doHold(t, f.n, "do_heater_z1", 70, "k1", 300)
		time.Sleep(10 * time.Second)
		f.close()
		time.Sleep(5 * time.Second) // down for 5 s
		g := openLeased(t, dir, 2)
		l := g.n.LeaseOf("do_heater_z0")
		if l == nil || l.Value != 40.0 || l.HoldS != 30 {
			t.Fatalf("lease after the restart: %+v", l)
		}
		time.Sleep(15*time.Second - time.Millisecond) // 30 s after the do_, less 1 ms
		synctest.Wait()
		if st := g.n.SafeStatusOf("do_heater_z0"); st.State != "" {
			t.Fatalf("the restored lease ran out early: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if st := g.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry {
			t.Fatalf("the restored lease did not drive the output safe on time: %+v", st)
		}
		g.close()
		time.Sleep(10 * time.Minute) // do_heater_z1's lease runs out while down
		h := openLeased(t, dir, 2)
		st := h.n.SafeStatusOf("do_heater_z1")
		if st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry || !strings.Contains(st.Reason, "not running") {
			t.Fatalf("a lease that ran out while down: %+v", st)
		}
		if l := h.n.LeaseOf("do_heater_z1"); l != nil {
			t.Errorf("lease left: %+v", l)
		}
	})
}

// TestManyLeases: forty leases with different holds each end at their own
// time, in order, and every output is driven safe once.
func TestManyLeases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const zones = 40
		f := openLeased(t, t.TempDir(), zones)
		for i := range zones {
			doHold(t, f.n, fmt.Sprintf("do_heater_z%d", i), 50, fmt.Sprintf("k%d", i), 10+i)
		}
		if got := len(f.n.Leases()); got != zones {
			t.Fatalf("%d leases; want %d", got, zones)
		}
		time.Sleep(10*time.Second + 500*time.Millisecond)
		for i := range zones {
			synctest.Wait()
			// At 10.5 s + i, the leases of zones 0..i (10+j s) have ended.
			for j := range zones {
				want := 50.0
				if j <= i {
					want = 0
				}
				if v := f.heater(t, j); v != want {
					t.Fatalf("at %d.5 s zone %d heater is %v; want %v", 10+i, j, v, want)
				}
			}
			time.Sleep(time.Second)
		}
		if n := len(safeRecords(t, f.al)); n != zones {
			t.Errorf("%d safe drives; want %d", n, zones)
		}
	})
}

// TestSafeWriteFailsThenSucceeds: a drive to safe the device refuses
// leaves the output failed (not ready, named in /readyz), is retried with
// backoff, and is verified once the device takes writes again.
func TestSafeWriteFailsThenSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 5)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultOffline}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		st := f.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeFailed || st.Attempts != 1 || st.Error == "" {
			t.Fatalf("a refused safe write: %+v", st)
		}
		ok, checks := f.n.Ready()
		if ok || !hasCheck(checks, "safe:do_heater_z0") {
			t.Fatalf("ready with an unverified safe state: %v %+v", ok, checks)
		}
		time.Sleep(1*time.Second + 2*time.Second) // retries after 1 s and 2 s, still offline
		synctest.Wait()
		if st := f.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeFailed || st.Attempts != 3 {
			t.Fatalf("after two retries: %+v", st)
		}
		f.plant.ClearFaults()
		time.Sleep(4 * time.Second) // the retry after 4 s
		synctest.Wait()
		st = f.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeReached || st.Attempts != 4 || f.heater(t, 0) != 0 {
			t.Fatalf("after the device recovered: %+v, heater %v", st, f.heater(t, 0))
		}
		if ok, checks := f.n.Ready(); !ok {
			t.Errorf("not ready after the verified drive: %+v", checks)
		}
		recs := safeRecords(t, f.al)
		if len(recs) != 4 || recs[0].Status != "failed" || recs[3].Status != "success" {
			t.Errorf("audit: %d safe_state lines: %+v", len(recs), recs)
		}
	})
}

// TestDoSupersedesFailedSafe: while a drive to safe keeps failing, a do_
// that applies takes the output back: the retries stop and the state is
// cleared.
func TestDoSupersedesFailedSafe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 5)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultOffline}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		f.plant.ClearFaults()
		r := doHold(t, f.n, "do_heater_z0", 30, "k2", 100)
		if r.Status != promcp.StatusSuccess {
			t.Fatalf("do_ after the failed drive: %+v", r)
		}
		time.Sleep(60 * time.Second)
		synctest.Wait()
		if v := f.heater(t, 0); v != 30 {
			t.Fatalf("a stale retry overwrote the do_: heater %v", v)
		}
		if st := f.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeCleared {
			t.Errorf("safe state after the do_: %+v", st)
		}
		if ok, _ := f.n.Ready(); !ok {
			t.Error("not ready after the do_ took the output back")
		}
	})
}

// TestRefusedDoKeepsLease: a do_ the device refuses (nothing applied)
// leaves the lease in force as it was, in memory and on record.
func TestRefusedDoKeepsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		first := doHold(t, f.n, "do_heater_z0", 40, "k", 30)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultOffline}); err != nil {
			t.Fatal(err)
		}
		r := doHold(t, f.n, "do_heater_z0", 60, "k2", 600)
		if r.Status != promcp.StatusFailed || r.LeaseExpiresAt != nil {
			t.Fatalf("refused do_: %+v", r)
		}
		f.plant.ClearFaults()
		l := f.n.LeaseOf("do_heater_z0")
		if l == nil || !l.ExpiresAt.Equal(*first.LeaseExpiresAt) || l.IdempotencyKey != "k" {
			t.Fatalf("lease after a refused do_: %+v", l)
		}
		f.close()
		g := openLeased(t, dir, 1)
		if l := g.n.LeaseOf("do_heater_z0"); l == nil || l.IdempotencyKey != "k" || l.HoldS != 30 {
			t.Fatalf("lease on record after a refused do_: %+v", l)
		}
	})
}

// TestDriveSafeWaitsForTheTurn: a drive to safe never interleaves with a
// do_'s device step, and many concurrent drives and do_ calls end with
// the value of whichever ran last under the turn.
func TestDriveSafeWaitsForTheTurn(t *testing.T) {
	f := openLeased(t, t.TempDir(), 1)
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			if i%2 == 0 {
				raw, _ := json.Marshal(float64(10 + i))
				_, _ = f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_z0", Value: raw, IdempotencyKey: fmt.Sprintf("k%d", i), Caller: node.Caller{ID: "a"}})
			} else {
				_, _ = f.n.DriveSafe(context.Background(), "do_heater_z0", manifest.SafeOnShutdown, "test")
			}
		})
	}
	wg.Wait()
	st := f.n.SafeStatusOf("do_heater_z0")
	v := f.heater(t, 0)
	switch st.State {
	case node.SafeReached:
		if v != 0 {
			t.Fatalf("safe state reached but heater %v", v)
		}
	case node.SafeCleared:
		if v == 0 {
			t.Fatalf("a do_ ran last but the heater is 0")
		}
	default:
		t.Fatalf("state %+v", st)
	}
}

func hasCheck(checks []node.Readiness, name string) bool {
	for _, c := range checks {
		if c.Name == name && !c.OK {
			return true
		}
	}
	return false
}
