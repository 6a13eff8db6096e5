package node_test

// Attacks on the fail-safe feature (docs/safety.md): leases, safe drives
// and interlocks, each test failing when the product misbehaves. Timing
// is exact under testing/synctest (no sleeps on the real clock).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/interlock"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/policy"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// ---------------------------------------------------------------------
// atk: a fake device the attacks control point by point.

type atkWrite struct {
	Point string
	Value float64
	// LastVent is the value the last completed read of "vent" returned
	// before this write (what physd can know of the plant).
	LastVent float64
	At       time.Time
}

type atkDevice struct {
	mu        sync.Mutex
	v         map[string]float64
	writeFail map[string]bool
	readFail  map[string]bool
	stuck     map[string]bool // writes acknowledged with no effect
	// lossAfterWrite: the reads of the point fail right after a write
	// (the read-back is lost), until cleared.
	lossAfterWrite map[string]bool
	// okWrites: while writeFail is set, this many more writes still apply.
	okWrites map[string]int
	delay    map[string]time.Duration
	lastRead map[string]float64
	writes   []atkWrite
	// onRead, when set, gives the value of a read (the plant's law).
	onRead func(point string, v float64) float64
}

var atkDev = &atkDevice{}

func (d *atkDevice) reset(v map[string]float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.v = v
	d.writeFail, d.readFail, d.stuck, d.lossAfterWrite = map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	d.delay, d.lastRead, d.okWrites = map[string]time.Duration{}, map[string]float64{}, map[string]int{}
	d.writes, d.onRead = nil, nil
}

func (d *atkDevice) set(p string, v float64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.v[p] = v
}

func (d *atkDevice) get(p string) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.v[p]
}

func (d *atkDevice) with(f func(d *atkDevice)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f(d)
}

func (d *atkDevice) writeLog() []atkWrite {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]atkWrite(nil), d.writes...)
}

func init() {
	drivers.Register("atk", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return atkBus{}, nil })
}

type atkBus struct{}

func (atkBus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c.Binding.Address == "vheater" {
		// The heater with a verify point (the read-back is the feedback
		// signal, drivers.Verifier), like a Modbus binding's verify:.
		return atkVPoint{atkPoint("heater")}, nil
	}
	return atkPoint(c.Binding.Address), nil
}

type atkVPoint struct{ atkPoint }

func (p atkVPoint) Verify(ctx context.Context, v any) (drivers.Verification, error) {
	if err := p.wait(ctx); err != nil {
		return drivers.Verification{Point: "fb"}, err
	}
	want, _ := v.(float64)
	atkDev.mu.Lock()
	defer atkDev.mu.Unlock()
	if atkDev.readFail[string(p.atkPoint)] {
		return drivers.Verification{Point: "fb"}, fmt.Errorf("%w: feedback does not answer", drivers.ErrTimeout)
	}
	got := atkDev.v[string(p.atkPoint)]
	return drivers.Verification{Point: "fb", Observed: got, Expected: want, OK: got == want, At: time.Now()}, nil
}
func (atkBus) Health() error { return nil }
func (atkBus) Close() error  { return nil }

type atkPoint string

func (p atkPoint) wait(ctx context.Context) error {
	atkDev.mu.Lock()
	d := atkDev.delay[string(p)]
	atkDev.mu.Unlock()
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w: %s slow", drivers.ErrTimeout, p)
	}
}

func (p atkPoint) Read(ctx context.Context) (drivers.Reading, error) {
	if err := p.wait(ctx); err != nil {
		return drivers.Reading{}, err
	}
	atkDev.mu.Lock()
	defer atkDev.mu.Unlock()
	if atkDev.readFail[string(p)] {
		return drivers.Reading{}, fmt.Errorf("%w: %s does not answer", drivers.ErrTimeout, p)
	}
	v := atkDev.v[string(p)]
	if atkDev.onRead != nil {
		v = atkDev.onRead(string(p), v)
	}
	atkDev.lastRead[string(p)] = v
	return drivers.Reading{Value: v}, nil
}

func (p atkPoint) Write(ctx context.Context, v any) error {
	if err := p.wait(ctx); err != nil {
		return err
	}
	f, _ := v.(float64)
	atkDev.mu.Lock()
	defer atkDev.mu.Unlock()
	if atkDev.writeFail[string(p)] {
		if atkDev.okWrites[string(p)] <= 0 {
			return fmt.Errorf("%w: %s refuses writes", drivers.ErrOffline, p)
		}
		atkDev.okWrites[string(p)]--
	}
	atkDev.writes = append(atkDev.writes, atkWrite{Point: string(p), Value: f, LastVent: atkDev.lastRead["vent"], At: time.Now()})
	if !atkDev.stuck[string(p)] {
		atkDev.v[string(p)] = f
	}
	if atkDev.lossAfterWrite[string(p)] {
		atkDev.readFail[string(p)] = true
	}
	return nil
}

// atkManifest: a leased heater (safe 0 on lease_expiry, interlock_trip,
// shutdown; each access bounded by 500 ms) and a vent position polled
// every 100 ms (so a rule's max_age is 2×100+500 = 700 ms).
const atkManifest = `physmcp_version: "0.1"
device: {id: atk_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  dev: {type: atk}
capabilities:
  - {name: vent, kind: read, description: Vent position., binding: {type: virtual, bus: dev, address: vent}, data_type: float, unit: percent, range: {min: 0, max: 100}, poll_ms: 100, timeout_ms: 500, semantic_tags: [vent]}
  - name: heater
    kind: do
    description: Heater.
    binding: {type: virtual, bus: dev, address: heater}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    timeout_ms: 500
    semantic_tags: [heater, heating]
    safe: {value: 0, on: [lease_expiry, interlock_trip, shutdown]}
    lease: {default_s: 60, max_s: 600}
`

const atkPolicy = `physmcp_policy_version: "0.1"
interlocks:
  - name: vent_open
    kind: interlock
    tool: do_heater
    while: {read: read_vent, above: 80}
    max: 20
`

const atkPolicyNone = `physmcp_policy_version: "0.1"
`

// swapGuard is NoPolicy with interlocks a test can replace (a policy
// reload, as guard.Guard.Reload does it).
type swapGuard struct {
	node.NoPolicy
	set atomic.Pointer[interlock.Set]
}

func (g *swapGuard) Interlocks() *interlock.Set { return g.set.Load() }

type atkFixture struct {
	n    *node.Node
	st   *store.Store
	al   *audit.Log
	m    *manifest.Manifest
	g    *swapGuard
	once sync.Once
}

func atkSet(t testing.TB, m *manifest.Manifest, pol string) *interlock.Set {
	t.Helper()
	p, err := policy.Parse("atk.policy.yml", []byte(pol), m)
	if err != nil {
		t.Fatal(err)
	}
	return interlock.NewSet(p.Interlocks)
}

// openAtk opens the node on dir; the device keeps its state (a restart of
// physd is not a restart of the plant).
func openAtk(t testing.TB, dir, pol string) *atkFixture {
	t.Helper()
	return openAtkWith(t, dir, atkManifest, pol)
}

func openAtkWith(t testing.TB, dir, src, pol string) *atkFixture {
	t.Helper()
	m, err := manifest.Parse("atk.yml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	g := &swapGuard{}
	g.set.Store(atkSet(t, m, pol))
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: g})
	if err != nil {
		t.Fatal(err)
	}
	f := &atkFixture{n: n, st: st, al: al, m: m, g: g}
	t.Cleanup(f.close)
	return f
}

func (f *atkFixture) close() {
	f.once.Do(func() {
		f.n.Close(context.Background())
		f.al.Close()
		f.st.Close()
	})
}

func doAtk(t testing.TB, n *node.Node, value float64, key string, holdS int) promcp.DoResult {
	t.Helper()
	return doHold(t, n, "do_heater", value, key, holdS)
}

// auditAll is every audit line in order.
func auditAll(t testing.TB, al *audit.Log) []audit.Record {
	t.Helper()
	var out []audit.Record
	if err := al.ScanSince(time.Time{}, func(r audit.Record) bool {
		out = append(out, r)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// leaseKeyOf is the key a lease_expiry safe_state reason names.
func leaseKeyOf(reason string) string {
	_, rest, ok := strings.Cut(reason, ", key ")
	if !ok {
		return ""
	}
	k, _, _ := strings.Cut(rest, ",")
	return k
}

// checkLeaseHistory walks the audit of tool: every lease_expiry drive must
// be for the lease of the last do_ that applied before it (a renewal that
// applied is never followed by a drive for an older lease). It returns the
// value the output must hold after the last record (nil: nothing ran).
func checkLeaseHistory(t testing.TB, recs []audit.Record, tool string) any {
	t.Helper()
	lastKey := ""
	var last any
	for _, r := range recs {
		if r.Tool != tool {
			continue
		}
		switch r.Event {
		case "do":
			if r.Status == "success" || r.Status == "partial" {
				lastKey = r.IdempotencyKey
				last = r.Applied
			}
		case "safe_state":
			ev, _ := r.Data["event"].(string)
			if ev == manifest.SafeOnLeaseExpiry {
				if k := leaseKeyOf(r.Reason); k != lastKey {
					t.Errorf("audit seq %d: a lease_expiry drive for the lease of key %q after the do_ with key %q applied (a renewal must cancel the old lease's drive): %s",
						r.Seq, k, lastKey, r.Reason)
				}
			}
			if r.Status == "success" {
				last = r.Applied
			}
		}
	}
	return last
}

// ---------------------------------------------------------------------
// Leases.

// TestAttackRenewalAtExpiryInstant: a renewal arrives exactly when the
// hold ends (the timer and the call at the same instant). Whichever takes
// the turn first, the output ends at the renewal's value with the
// renewal's lease, and no drive for the old lease follows the renewal.
func TestAttackRenewalAtExpiryInstant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		for round := range 25 {
			v := float64(30 + round)
			a := doHold(t, f.n, "do_heater_z0", v, fmt.Sprint("a", round), 5)
			if a.Status != promcp.StatusSuccess {
				t.Fatalf("round %d: %+v", round, a)
			}
			time.Sleep(5 * time.Second) // exactly when the hold ends
			b := doHold(t, f.n, "do_heater_z0", v+0.5, fmt.Sprint("b", round), 5)
			if b.Status != promcp.StatusSuccess {
				t.Fatalf("round %d: renewal at the expiry instant: %+v", round, b)
			}
			synctest.Wait()
			if got := f.heater(t, 0); got != v+0.5 {
				t.Fatalf("round %d: after a renewal at the expiry instant the heater is %v; want the renewal's %v", round, got, v+0.5)
			}
			l := f.n.LeaseOf("do_heater_z0")
			if l == nil || l.IdempotencyKey != fmt.Sprint("b", round) {
				t.Fatalf("round %d: lease after the renewal: %+v", round, l)
			}
			time.Sleep(5*time.Second - time.Millisecond)
			synctest.Wait()
			if got := f.heater(t, 0); got != v+0.5 {
				t.Fatalf("round %d: within the renewed hold the heater is %v; want %v", round, got, v+0.5)
			}
			time.Sleep(2 * time.Millisecond)
			synctest.Wait()
			if got := f.heater(t, 0); got != 0 {
				t.Fatalf("round %d: after the renewed hold the heater is %v; want 0", round, got)
			}
		}
		checkLeaseHistory(t, auditAll(t, f.al), "do_heater_z0")
	})
}

// TestAttackConcurrentDoRaceLeaseExpiry: many do_ calls with short holds
// race each other's lease expiries. The output always ends at the value of
// whichever actuation ran last under the turn, and no lease_expiry drive
// is for a lease a later do_ replaced.
func TestAttackConcurrentDoRaceLeaseExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		for round := range 6 {
			doHold(t, f.n, "do_heater_z0", 50, fmt.Sprint("base", round), 1)
			var wg sync.WaitGroup
			for i := range 24 {
				wg.Go(func() {
					// Some calls land before the base lease ends, some at
					// its instant, some after; holds of 1 and 2 s make
					// their own leases end among the later calls.
					time.Sleep(time.Duration(i%12) * 125 * time.Millisecond)
					raw, _ := json.Marshal(float64(10 + i))
					_, _ = f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_z0", Value: raw,
						IdempotencyKey: fmt.Sprintf("r%d-%d", round, i), HoldS: 1 + i%2, Caller: node.Caller{ID: "agent"}})
				})
			}
			wg.Wait()
			synctest.Wait()
			want := checkLeaseHistory(t, auditAll(t, f.al), "do_heater_z0")
			if got := f.heater(t, 0); want == nil || got != want.(float64) {
				t.Fatalf("round %d: the heater is %v; the last actuation under the turn left %v", round, got, want)
			}
			time.Sleep(3 * time.Second) // every hold is over
			synctest.Wait()
			if got := f.heater(t, 0); got != 0 {
				t.Fatalf("round %d: after every hold ended the heater is %v; want 0", round, got)
			}
			if l := f.n.LeaseOf("do_heater_z0"); l != nil {
				t.Fatalf("round %d: a lease is left after every hold ended: %+v", round, l)
			}
		}
		checkLeaseHistory(t, auditAll(t, f.al), "do_heater_z0")
	})
}

// rewriteLease replaces the stored lease record of tool (the node closed).
func rewriteLease(t testing.TB, dir, tool string, edit func(m map[string]any)) {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.All("leases")
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := recs[tool]
	if !ok {
		t.Fatalf("no lease record of %s on record: %v", tool, recs)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	raw, _ = json.Marshal(m)
	if err := st.Put("leases", tool, raw); err != nil {
		t.Fatal(err)
	}
}

// TestAttackRestartClockBehindShowsRealExpiry: physd restarts with a clock
// far behind the one the lease was recorded with (the record's expiry is
// years ahead). The hold is armed for at most hold_s — and what physd
// shows the agent (LeaseOf, can_do's fail_safe.lease.active.expires_at)
// must be that real end, not the far-away record: an agent that renews by
// expires_at would otherwise let the output drop to safe unannounced.
func TestAttackRestartClockBehindShowsRealExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k1", 30)
		f.close()
		rewriteLease(t, dir, "do_heater_z0", func(m map[string]any) {
			m["expires_at"] = time.Now().Add(10 * 365 * 24 * time.Hour).UTC().Format(time.RFC3339Nano)
		})
		g := openLeased(t, dir, 1)
		start := time.Now()
		l := g.n.LeaseOf("do_heater_z0")
		if l == nil {
			t.Fatal("the lease was not restored")
		}
		time.Sleep(30*time.Second - time.Millisecond)
		synctest.Wait()
		if st := g.n.SafeStatusOf("do_heater_z0"); st.State != "" {
			t.Fatalf("the restored lease ended before its hold: %+v", st)
		}
		time.Sleep(2 * time.Millisecond)
		synctest.Wait()
		if st := g.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry {
			t.Fatalf("a record 10 years ahead was not bounded by its hold of 30 s: %+v", st)
		}
		if l.ExpiresAt.After(start.Add(30 * time.Second)) {
			t.Errorf("after the restart the lease shows expires_at %s, %v from now, while physd drives it safe in 30 s (its hold): the agent is told the wrong end",
				l.ExpiresAt.Format(time.RFC3339), l.ExpiresAt.Sub(start).Round(time.Hour))
		}
	})
}

// TestAttackRestartExpiredRecordFarPast: a record whose expiry is decades
// in the past (a clock far ahead at the restart) drives the output safe
// before Open returns, ends the lease on record too, and a second restart
// drives nothing.
func TestAttackRestartExpiredRecordFarPast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k1", 600)
		f.close()
		rewriteLease(t, dir, "do_heater_z0", func(m map[string]any) { m["expires_at"] = "1971-01-01T00:00:00Z" })
		g := openLeased(t, dir, 1)
		st := g.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry {
			t.Fatalf("a lease that ended long ago was not driven safe before Open returned: %+v", st)
		}
		if l := g.n.LeaseOf("do_heater_z0"); l != nil {
			t.Fatalf("lease left: %+v", l)
		}
		g.close()
		h := openLeased(t, dir, 1)
		if st := h.n.SafeStatusOf("do_heater_z0"); st.State != "" {
			t.Fatalf("a second restart drove the output again (the lease was not ended on record): %+v", st)
		}
	})
}

// TestAttackStuckSafeDriveStaysFailed: the device acknowledges the safe
// write but keeps showing the held value. The output stays failed, /readyz
// names it, the drive is retried with backoff (1, 2, 4 … 30 s), the lease
// stays on record (a restart drives it again), and once the device acts
// the next retry verifies it.
func TestAttackStuckSafeDriveStaysFailed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 5)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultStuck}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		st := f.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeFailed || st.Attempts != 1 || !strings.Contains(st.Error, "40") {
			t.Fatalf("a safe write the device ignored: %+v", st)
		}
		// Attempts at 5 s, then +1, +2, +4, +8, +16, +30, +30: 8 by 5+91 s.
		time.Sleep(91 * time.Second)
		synctest.Wait()
		st = f.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeFailed || st.Attempts != 8 {
			t.Fatalf("after 91 s of a stuck device: %+v; want failed after 8 attempts", st)
		}
		if ok, checks := f.n.Ready(); ok || !hasCheck(checks, "safe:do_heater_z0") {
			t.Fatalf("ready with a stuck safe drive: %v %+v", ok, checks)
		}
		recs := safeRecords(t, f.al)
		for _, r := range recs {
			if r.Status != "partial" {
				t.Errorf("a stuck drive audited %s: %+v", r.Status, r)
			}
		}
		f.plant.ClearFaults()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if st := f.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeReached || f.heater(t, 0) != 0 {
			t.Fatalf("after the device acts again: %+v heater %v", st, f.heater(t, 0))
		}
		if ok, checks := f.n.Ready(); !ok {
			t.Fatalf("not ready after the verified drive: %+v", checks)
		}
	})
}

// TestAttackStuckSafeDriveRecordSurvivesRestart: while the drive is not
// verified the lease stays on record, so a restart drives the output safe
// again before serving.
func TestAttackStuckSafeDriveRecordSurvivesRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 5)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultStuck}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		if st := f.n.SafeStatusOf("do_heater_z0"); st.State != node.SafeFailed {
			t.Fatalf("stuck drive: %+v", st)
		}
		f.close()
		g := openLeased(t, dir, 1)
		st := g.n.SafeStatusOf("do_heater_z0")
		if st.State != node.SafeReached || st.Event != manifest.SafeOnLeaseExpiry {
			t.Fatalf("a restart after an unverified lease drive did not drive it again: %+v", st)
		}
	})
}

// TestAttackSafeValueDoPartialKeepsLease: a do_ of the safe value the
// device does not act on (partial) must not end the lease: the output may
// still hold the leased value, and the hold's end still drives it.
func TestAttackSafeValueDoPartialKeepsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 30)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultStuck}); err != nil {
			t.Fatal(err)
		}
		r := doHold(t, f.n, "do_heater_z0", 0, "k0", 0)
		if r.Status != promcp.StatusPartial {
			t.Fatalf("safe value on a stuck device: %+v", r)
		}
		if l := f.n.LeaseOf("do_heater_z0"); l == nil || l.IdempotencyKey != "k" {
			t.Fatalf("an unverified do_ of the safe value ended the lease: %+v", l)
		}
		f.plant.ClearFaults() // the heater still holds 40
		if f.heater(t, 0) != 40 {
			t.Fatalf("heater %v", f.heater(t, 0))
		}
		time.Sleep(30*time.Second + time.Millisecond)
		synctest.Wait()
		if v := f.heater(t, 0); v != 0 {
			t.Fatalf("the lease's end did not drive the heater (still %v) after an unverified safe-value do_", v)
		}
	})
}

// TestAttackSafeValueDoVerifiedEndsLeaseOnRecord: a verified do_ of the
// safe value ends the lease on record: a restart long after its hold drives
// nothing.
func TestAttackSafeValueDoVerifiedEndsLeaseOnRecord(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dir := t.TempDir()
		f := openLeased(t, dir, 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 30)
		if r := doHold(t, f.n, "do_heater_z0", 0, "k0", 0); r.Status != promcp.StatusSuccess || r.LeaseExpiresAt != nil {
			t.Fatalf("safe value: %+v", r)
		}
		f.close()
		time.Sleep(time.Hour)
		g := openLeased(t, dir, 1)
		if st := g.n.SafeStatusOf("do_heater_z0"); st.State != "" {
			t.Fatalf("a lease the safe value ended was still on record: %+v", st)
		}
	})
}

// TestAttackHoldBoundsNode: hold_s outside 1..max_s or on an unleased
// capability is bad input naming hold_s; nothing is actuated, no lease
// changes, and the key stays free.
func TestAttackHoldBoundsNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 30)
		before := f.n.LeaseOf("do_heater_z0")
		for _, h := range []int{-1, -86400, 601, 86401, 1 << 40, -(1 << 62)} {
			_, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater_z0", Value: json.RawMessage("70"), IdempotencyKey: fmt.Sprint("bad", h), HoldS: h, Caller: node.Caller{ID: "agent"}})
			var ie *node.InputError
			if !errors.As(err, &ie) || ie.Field != "hold_s" {
				t.Errorf("hold_s %d: %v; want bad input naming hold_s", h, err)
			}
			if v := f.heater(t, 0); v != 40 {
				t.Fatalf("hold_s %d actuated: heater %v", h, v)
			}
			if l := f.n.LeaseOf("do_heater_z0"); l == nil || *l != *before {
				t.Fatalf("hold_s %d changed the lease: %+v", h, l)
			}
			// The key is free: the same key with a good hold runs.
		}
		if r := doHold(t, f.n, "do_heater_z0", 41, "bad-1", 10); r.Status != promcp.StatusSuccess {
			t.Fatalf("the key of a refused hold is not free: %+v", r)
		}
	})
}

// ---------------------------------------------------------------------
// Interlocks.

// TestAttackInterlockRefusalKeepsLease: a do_ the interlock refuses leaves
// the lease as it was, in memory and on record; its end still drives the
// output.
func TestAttackInterlockRefusalKeepsLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		dir := t.TempDir()
		f := openAtk(t, dir, atkPolicy)
		time.Sleep(150 * time.Millisecond)
		first := doAtk(t, f.n, 15, "k1", 30)
		if first.Status != promcp.StatusSuccess {
			t.Fatalf("heater 15: %+v", first)
		}
		atkDev.set("vent", 95)
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		r := doAtk(t, f.n, 60, "k2", 600)
		if r.Status != promcp.StatusFailed || r.Code != interlock.Code || r.LeaseExpiresAt != nil {
			t.Fatalf("heater 60 with the vent at 95: %+v", r)
		}
		l := f.n.LeaseOf("do_heater")
		if l == nil || l.IdempotencyKey != "k1" || !l.ExpiresAt.Equal(*first.LeaseExpiresAt) {
			t.Fatalf("lease after an interlock refusal: %+v", l)
		}
		if v := atkDev.get("heater"); v != 15 {
			t.Fatalf("heater %v", v)
		}
		f.close()
		g := openAtk(t, dir, atkPolicy)
		if l := g.n.LeaseOf("do_heater"); l == nil || l.IdempotencyKey != "k1" || l.HoldS != 30 {
			t.Fatalf("lease on record after an interlock refusal: %+v", l)
		}
	})
}

// TestAttackTripNotDelayedByOtherRetry: a lease drive of the heater failed
// (the device refused writes for a while) and is retrying with a long
// backoff. The device takes writes again, and then the vent opens with the
// heater above the interlock's bound: the interlock must drive the heater
// safe within an observation, not wait for the lease drive's next retry
// up to 30 s later ("the same rule does not start a second drive": this
// is another event's retry).
func TestAttackTripNotDelayedByOtherRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 60, "k", 2); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.writeFail["heater"] = true })
		// The lease ends at 2 s; attempts at +0, +1, +2, +4, +8, +16, +30.
		time.Sleep(2*time.Second + 61*time.Second + 100*time.Millisecond)
		synctest.Wait()
		st := f.n.SafeStatusOf("do_heater")
		if st.State != node.SafeFailed || st.Event != manifest.SafeOnLeaseExpiry {
			t.Fatalf("lease drive on a device refusing writes: %+v", st)
		}
		next := st.NextRetry
		atkDev.with(func(d *atkDevice) { d.writeFail["heater"] = false })
		t0 := time.Now()
		atkDev.set("vent", 95) // the interlock's condition starts to hold
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			t.Errorf("the vent opened with the heater at %v and the device taking writes: %v later the heater is still %v "+
				"(the interlock waits for the lease drive's retry at %s, %v after the trip's condition held)",
				v, time.Since(t0), v, next.Format(time.TimeOnly), next.Sub(t0).Round(time.Millisecond))
		}
	})
}

// TestAttackInterlockFlapConcurrent: the vent flaps around the bound on
// every poll while many do_ calls of the heater run. No do_ may write a
// value the rule forbids given the reading physd last took before the
// write, every do_ refused or allowed must match that reading, and once the
// vent stays open the heater is within the bound within an observation.
func TestAttackInterlockFlapConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		stop := make(chan struct{})
		var flapper sync.WaitGroup
		flapper.Go(func() {
			// Flip between 79 and 81 every 100 ms, 50 ms off the polls.
			time.Sleep(20 * time.Millisecond)
			for i := 0; ; i++ {
				v := 79.0
				if i%2 == 0 {
					v = 81
				}
				atkDev.set("vent", v)
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
			}
		})
		var wg sync.WaitGroup
		var okHigh, refused atomic.Int64
		for i := range 60 {
			wg.Go(func() {
				// Never at a poll's instant (the polls run every 100 ms
				// from 0, the flips at x70 ms): a reading that lands at
				// the very instant of a do_'s judgement is a race the
				// docs allow ("unless the plant changes in between").
				time.Sleep(time.Duration(i)*40*time.Millisecond + 13*time.Millisecond)
				v := float64(5 + (i*7)%55)
				raw, _ := json.Marshal(v)
				body, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater", Value: raw, IdempotencyKey: fmt.Sprint("f", i), HoldS: 600, Caller: node.Caller{ID: "agent"}})
				if err != nil {
					t.Errorf("do_heater(%v): %v", v, err)
					return
				}
				var r promcp.DoResult
				_ = json.Unmarshal(body, &r)
				switch {
				case r.Status == promcp.StatusSuccess && v > 20:
					okHigh.Add(1)
				case r.Code == interlock.Code:
					refused.Add(1)
				}
			})
		}
		wg.Wait()
		close(stop)
		flapper.Wait()
		for _, w := range atkDev.writeLog() {
			if w.Point == "heater" && w.Value > 20 && w.LastVent > 80 {
				t.Errorf("heater written %v at %s while the last vent reading physd had taken was %v (rule vent_open: at most 20 while > 80)",
					w.Value, w.At.Format("15:04:05.000"), w.LastVent)
			}
		}
		if okHigh.Load() == 0 || refused.Load() == 0 {
			t.Logf("flapping: %d allowed above the bound, %d refused", okHigh.Load(), refused.Load())
		}
		atkDev.set("vent", 95)
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if v := atkDev.get("heater"); v > 20 {
			t.Fatalf("the vent stayed at 95 for an observation and the heater is %v", v)
		}
	})
}

// TestAttackPolicyReloadRemovesRuleMidTrip: the vent opens while a slow
// do_ holds the heater's turn, so the trip waits for it; meanwhile a
// policy reload removes the interlock. Under the turn the rules in force
// decide: the heater must keep the value the do_ applied, not be driven
// safe by a rule that is no longer in force.
func TestAttackPolicyReloadRemovesRuleMidTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 60, "k1", 600); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.delay["heater"] = 400 * time.Millisecond })
		done := make(chan promcp.DoResult, 1)
		go func() { done <- doAtk(t, f.n, 50, "k2", 600) }()
		time.Sleep(50 * time.Millisecond) // the do_ is in its device step
		atkDev.set("vent", 95)
		time.Sleep(150 * time.Millisecond) // a poll: the trip waits for the turn
		f.g.set.Store(atkSet(t, f.m, atkPolicyNone))
		r := <-done
		if r.Status != promcp.StatusSuccess {
			t.Fatalf("the slow do_: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.delay["heater"] = 0 })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 50 {
			st := f.n.SafeStatusOf("do_heater")
			t.Errorf("after the reload removed vent_open the heater is %v, not the do_'s 50: driven by a rule no longer in force (%s: %s)", v, st.Event, st.Reason)
		}
	})
}

// TestAttackShutdownWhileLeaseDriveWaits: a lease runs out while a slow
// do_ (each device access near its timeout) holds the turn; a shutdown
// begins at the same time. The do_ finishes with its own lease, the old
// lease's drive does nothing, the shutdown drive verifies the safe value,
// and Close returns within its grace.
func TestAttackShutdownWhileLeaseDriveWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		dir := t.TempDir()
		f := openAtk(t, dir, atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 15, "k1", 1); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 15: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.delay["heater"] = 450 * time.Millisecond })
		done := make(chan promcp.DoResult, 1)
		go func() { done <- doAtk(t, f.n, 18, "k2", 60) }()
		time.Sleep(time.Second) // k1's lease ends during the do_'s step
		f.n.Drain()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		sts := f.n.DriveSafeAll(ctx, manifest.SafeOnShutdown, "physd is stopping")
		if len(sts) != 1 || sts[0].State != node.SafeReached {
			t.Fatalf("shutdown drive: %+v", sts)
		}
		if err := f.n.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
		r := <-done
		if r.Status != promcp.StatusSuccess {
			t.Fatalf("the slow do_ admitted before the shutdown: %+v", r)
		}
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			t.Fatalf("after the shutdown the heater is %v", v)
		}
		last := atkDev.writeLog()
		if w := last[len(last)-1]; w.Value != 0 {
			t.Fatalf("the last write was %v, not the safe value", w.Value)
		}
		recs := auditAll(t, f.al)
		checkLeaseHistory(t, recs, "do_heater")
		f.close()
		g := openAtk(t, dir, atkPolicy)
		if l := g.n.LeaseOf("do_heater"); l != nil {
			t.Errorf("a lease is on record after a verified shutdown drive: %+v", l)
		}
	})
}

// TestAttackInterlockJudgesOutputAfterLostReadBack: a do_ writes the
// heater to 60 (allowed: the vent is closed) but its read-back is lost, so
// the answer is partial and physd's last reading of the heater is the old
// 10. The vent then opens. The output's value is not known (the write may
// have applied), so the interlock must judge it on the unsafe side and
// drive it safe — not keep judging the stale 10 forever.
func TestAttackInterlockJudgesOutputAfterLostReadBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 10, "k1", 600); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 10: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.lossAfterWrite["heater"] = true })
		r := doAtk(t, f.n, 60, "k2", 600)
		if r.Status != promcp.StatusPartial {
			t.Fatalf("heater 60 with a lost read-back: %+v", r)
		}
		atkDev.with(func(d *atkDevice) { d.lossAfterWrite["heater"], d.readFail["heater"] = false, false })
		if v := atkDev.get("heater"); v != 60 {
			t.Fatalf("the device holds %v", v)
		}
		atkDev.set("vent", 95) // the interlock's condition starts to hold
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			t.Errorf("the vent is at 95 for 3 s and the heater, commanded to 60 by a partial do_, is still %v: the interlock judges the heater on its stale pre-write reading", v)
		}
	})
}

// TestAttackInterlockVerifyPointOutput: the heater is verified by a
// feedback point (drivers.Verifier, Modbus verify:). A verified do_ sets it
// to 60 while the vent is closed; then the vent opens. The interlock must
// drive the heater safe within an observation — judged on the value the
// do_ verified, not on the reading taken before the write.
func TestAttackInterlockVerifyPointOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		src := strings.Replace(atkManifest, "address: heater}", "address: vheater}", 1)
		f := openAtkWith(t, t.TempDir(), src, atkPolicy)
		time.Sleep(150 * time.Millisecond)
		r := doAtk(t, f.n, 60, "k1", 600)
		if r.Status != promcp.StatusSuccess || !r.Verified {
			t.Fatalf("heater 60 with the vent at 40: %+v", r)
		}
		atkDev.set("vent", 95)
		time.Sleep(300 * time.Millisecond)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			t.Errorf("the vent opened to 95 with the heater verified at 60; 300 ms later the heater is still %v (judged on the pre-write reading 0)", v)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			t.Errorf("5 s later the heater is still %v with the vent at 95", v)
		}
	})
}

// TestAttackMaxAgeBelowPollTripsHealthyPlant: a rule whose max_age_ms is
// shorter than its condition's poll interval. Every reading is older than
// max_age between two polls, so the once-a-second staleness tick finds the
// plant "unknown" on a healthy, answering device and trips the output. The
// policy must be refused (or the rule judged on the polls it gets), not
// accepted and then drive a healthy plant safe.
func TestAttackMaxAgeBelowPollTripsHealthyPlant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		pol := strings.Replace(atkPolicy, "    max: 20\n", "    max: 20\n    max_age_ms: 50\n", 1)
		m, err := manifest.Parse("atk.yml", []byte(atkManifest))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := policy.Parse("atk.policy.yml", []byte(pol), m); err != nil {
			t.Logf("refused, as it should be: %v", err)
			return
		}
		f := openAtk(t, t.TempDir(), pol)
		time.Sleep(150 * time.Millisecond)
		r := doAtk(t, f.n, 60, "k1", 600)
		if r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60 with the vent at 40 (polled every 100 ms, answering): %+v", r)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 60 {
			st := f.n.SafeStatusOf("do_heater")
			t.Errorf("the policy with max_age_ms 50 < poll_ms 100 was accepted, and a healthy plant (vent 40, polled and answering) tripped the heater to %v: %s", v, st.Reason)
		}
	})
}

// TestAttackReloadRemovesFailedOutput: a lease drive of heater_z0 keeps
// failing (the device refuses writes) when a manifest reload removes
// heater_z0. Nothing can verify or supersede that drive any more (no do_
// of a removed tool runs), so /readyz must not stay 503 naming it forever,
// and no lease of a removed tool may be left on show.
func TestAttackReloadRemovesFailedOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 2)
		doHold(t, f.n, "do_heater_z0", 40, "k", 5)
		if err := f.plant.SetFault("z0.heater", sim.Fault{Mode: sim.FaultOffline}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5*time.Second + time.Millisecond)
		synctest.Wait()
		if ok, checks := f.n.Ready(); ok || !hasCheck(checks, "safe:do_heater_z0") {
			t.Fatalf("a failing drive: %v %+v", ok, checks)
		}
		src := leasedManifest(2)
		i, j := strings.Index(src, "  - name: heater_z0\n"), strings.Index(src, "  - name: heater_z1\n")
		src = src[:i] + src[j:]
		m, err := manifest.Parse("lease.yml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		res, err := f.n.Reload(context.Background(), m)
		if err != nil || len(res.Removed) != 1 {
			t.Fatalf("reload: %+v %v", res, err)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if ok, checks := f.n.Ready(); !ok {
			t.Errorf("2 min after the reload removed do_heater_z0, /readyz is still not ready: %+v", checks)
		}
		for _, l := range f.n.Leases() {
			if l.Tool == "do_heater_z0" {
				t.Errorf("a lease of the removed do_heater_z0 is still shown: %+v", l)
			}
		}
	})
}

// TestAttackReloadDropsLeaseTerms: a manifest reload takes lease: (and
// lease_expiry) off heater_z0 while a 30 s lease is active. The agent then
// commands the heater with a do_ that applies; the capability has no lease
// any more, so that value holds. The old lease's timer must not drive the
// heater safe 30 s after the old do_, overriding the newer command.
func TestAttackReloadDropsLeaseTerms(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLeased(t, t.TempDir(), 1)
		doHold(t, f.n, "do_heater_z0", 40, "k", 30)
		src := strings.Replace(leasedManifest(1), "    safe: {value: 0, on: [lease_expiry, shutdown, bus_restored]}\n    lease: {default_s: 60, max_s: 600}\n",
			"    safe: {value: 0, on: [shutdown, bus_restored]}\n", 1)
		m, err := manifest.Parse("lease.yml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.n.Reload(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		r := doHold(t, f.n, "do_heater_z0", 55, "after-reload", 0)
		if r.Status != promcp.StatusSuccess || r.LeaseExpiresAt != nil {
			t.Fatalf("do_ after the reload: %+v", r)
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if v := f.heater(t, 0); v != 55 {
			st := f.n.SafeStatusOf("do_heater_z0")
			t.Errorf("the heater, commanded to 55 after the reload removed its lease, is %v: the old lease drove it (%s: %s)", v, st.Event, st.Reason)
		}
	})
}

// TestAttackReloadOfConditionTripsHealthyPlant: a manifest reload changes
// only the vent's description (its readings, device and poll are the
// same). The redefined capability starts with no reading until its first
// poll, and the staleness tick must not take that gap as the unsafe side:
// a heater within every rule on a healthy plant must not be driven safe by
// a cosmetic reload (the start has this grace; a reload must too).
func TestAttackReloadOfConditionTripsHealthyPlant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		atkDev.with(func(d *atkDevice) { d.delay["vent"] = 300 * time.Millisecond })
		time.Sleep(time.Second)
		if r := doAtk(t, f.n, 60, "k1", 600); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60 with the vent at 40: %+v", r)
		}
		for round := range 5 {
			// Reload at varying offsets from the once-a-second tick.
			time.Sleep(time.Duration(100+round*200) * time.Millisecond)
			src := strings.Replace(atkManifest, "description: Vent position.", fmt.Sprintf("description: Vent position (rev %d).", round), 1)
			m, err := manifest.Parse("atk.yml", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			if res, err := f.n.Reload(context.Background(), m); err != nil || len(res.Changed) != 1 {
				t.Fatalf("reload: %+v %v", res, err)
			}
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if v := atkDev.get("heater"); v != 60 {
				st := f.n.SafeStatusOf("do_heater")
				t.Fatalf("round %d: a reload that changed only read_vent's description drove the heater to %v on a healthy plant (vent 40): %s", round, v, st.Reason)
			}
		}
	})
}

// queueSlowRefusals starts n do_ calls of the heater that each hold the
// turn for a slow previous read and a slow refused write (nothing applies)
// and returns a channel closed when all have answered.
func queueSlowRefusals(t *testing.T, f *atkFixture, n int, tag string) chan struct{} {
	atkDev.with(func(d *atkDevice) {
		d.delay["heater"] = 450 * time.Millisecond
		d.writeFail["heater"] = true
	})
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			raw, _ := json.Marshal(10.0)
			body, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater", Value: raw, IdempotencyKey: fmt.Sprint(tag, i), HoldS: 600, Caller: node.Caller{ID: "agent"}})
			var r promcp.DoResult
			_ = json.Unmarshal(body, &r)
			if err != nil || r.Status != promcp.StatusFailed {
				t.Errorf("slow refused do_ %d: %v %+v", i, err, r)
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// TestAttackTripTimesOutWaitingForTurn: a trip's drive waits for the turn
// behind do_ calls queued on a slow device (each holds it ~0.9 s and
// applies nothing). When its wait runs out it is recorded failed — and
// must then be retried like every failed drive. Once the device is back
// the heater must reach its safe value; it must not stay at 60 with the
// vent open because the failed state also silences every later trip.
func TestAttackTripTimesOutWaitingForTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 60, "k1", 600); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60: %+v", r)
		}
		done := queueSlowRefusals(t, f, 5, "q")
		time.Sleep(50 * time.Millisecond)
		atkDev.set("vent", 95) // the trip's drive queues behind the calls
		<-done
		atkDev.with(func(d *atkDevice) { d.delay["heater"], d.writeFail["heater"] = 0, false })
		st := f.n.SafeStatusOf("do_heater")
		t.Logf("after the queue: %s attempts %d: %s", st.State, st.Attempts, st.Error)
		time.Sleep(time.Minute)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			st := f.n.SafeStatusOf("do_heater")
			t.Errorf("a minute after the device recovered, with the vent at 95, the heater is still %v; safe state %s (attempts %d, next retry %v): %s",
				v, st.State, st.Attempts, st.NextRetry, st.Error)
		}
	})
}

// TestAttackLeaseDriveTimesOutWaitingForTurn: the same for a lease: it
// ends while slow refused do_ calls hold the turn; the drive's wait runs
// out. Nothing renewed the lease, so once the device is back the output
// must reach its safe value (the drive retried), not hold the expired
// lease's value forever.
func TestAttackLeaseDriveTimesOutWaitingForTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicyNone)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 60, "k1", 1); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60: %+v", r)
		}
		done := queueSlowRefusals(t, f, 6, "q")
		<-done
		atkDev.with(func(d *atkDevice) { d.delay["heater"], d.writeFail["heater"] = 0, false })
		time.Sleep(time.Minute)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			st := f.n.SafeStatusOf("do_heater")
			t.Errorf("a minute after the device recovered, the heater whose lease ended is still %v; safe state %s (attempts %d, next retry %v): %s",
				v, st.State, st.Attempts, st.NextRetry, st.Error)
		}
		if ok, checks := f.n.Ready(); !ok {
			t.Logf("readiness: %+v", checks)
		}
	})
}

// TestAttackStaleDriveFailureSilencesInterlock: a lease ends while do_
// calls on a slow device hold the turn; the first two apply (renewing the
// lease), the rest are refused, and the old lease's drive times out in the
// queue. That drive was moot — renewals applied — so it must not leave the
// output "failed": /readyz must be ready, and above all the interlock must
// still act when the vent opens later.
func TestAttackStaleDriveFailureSilencesInterlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		atkDev.reset(map[string]float64{"vent": 40, "heater": 0})
		f := openAtk(t, t.TempDir(), atkPolicy)
		time.Sleep(150 * time.Millisecond)
		if r := doAtk(t, f.n, 60, "k1", 1); r.Status != promcp.StatusSuccess {
			t.Fatalf("heater 60: %+v", r)
		}
		atkDev.with(func(d *atkDevice) {
			d.delay["heater"] = 450 * time.Millisecond
			d.writeFail["heater"], d.okWrites["heater"] = true, 2
		})
		time.Sleep(50 * time.Millisecond)
		var wg sync.WaitGroup
		var applied atomic.Int64
		for i := range 5 {
			wg.Go(func() {
				raw, _ := json.Marshal(30.0)
				body, _ := f.n.Do(context.Background(), node.DoRequest{Tool: "do_heater", Value: raw, IdempotencyKey: fmt.Sprint("q", i), HoldS: 600, Caller: node.Caller{ID: "agent"}})
				var r promcp.DoResult
				_ = json.Unmarshal(body, &r)
				if r.Status == promcp.StatusSuccess {
					applied.Add(1)
				}
			})
		}
		wg.Wait()
		atkDev.with(func(d *atkDevice) { d.delay["heater"], d.writeFail["heater"] = 0, false })
		if applied.Load() != 2 || atkDev.get("heater") != 30 {
			t.Fatalf("%d renewals applied, heater %v; want 2 and 30", applied.Load(), atkDev.get("heater"))
		}
		if l := f.n.LeaseOf("do_heater"); l == nil || l.HoldS != 600 {
			t.Fatalf("lease after the renewals: %+v", l)
		}
		if ok, checks := f.n.Ready(); !ok {
			t.Errorf("renewals applied and their lease is in force, yet not ready: %+v", checks)
		}
		atkDev.set("vent", 95)
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if v := atkDev.get("heater"); v != 0 {
			st := f.n.SafeStatusOf("do_heater")
			t.Errorf("the vent opened with the heater at %v: 500 ms later it is still %v; the interlock is silenced by a moot drive's failure (%s %s: %s)", v, v, st.Event, st.State, st.Error)
		}
	})
}
