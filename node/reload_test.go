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
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// line is a fake bus that behaves like a serial line: at most one open
// instance per bus name (a second master is a violation), each write
// takes delay_ms, and two writes to one point at once are a violation.
type line struct {
	mu         sync.Mutex
	open       map[string]int // instances open, by bus name
	opened     map[string]int // instances ever opened, by bus name
	writing    map[string]bool
	values     map[string]float64
	writes     map[string]int
	violations []string
}

var lines = &line{}

func (l *line) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open, l.opened, l.writing = map[string]int{}, map[string]int{}, map[string]bool{}
	l.values, l.writes, l.violations = map[string]float64{}, map[string]int{}, nil
}

func (l *line) violation(f string, a ...any) {
	l.violations = append(l.violations, fmt.Sprintf(f, a...))
}

func init() {
	lines.reset()
	drivers.Register("line", func(_ context.Context, b *manifest.Bus) (drivers.Bus, error) {
		var cfg struct {
			DelayMS int    `yaml:"delay_ms"`
			Port    string `yaml:"port"` // the line's device; default: the bus name
		}
		if errs := b.DecodeConfig(&cfg); len(errs) > 0 {
			return nil, errs
		}
		name := b.Name
		if cfg.Port != "" {
			name = cfg.Port
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.open[name] > 0 {
			lines.violation("bus %s opened while another instance was open", name)
		}
		lines.open[name]++
		lines.opened[name]++
		return &lineBus{name: name, delay: time.Duration(cfg.DelayMS) * time.Millisecond}, nil
	})
}

type lineBus struct {
	name   string
	delay  time.Duration
	closed bool
}

func (b *lineBus) Point(c *manifest.Capability) (drivers.Point, error) {
	if c.Binding.Address == "unbindable" {
		// A binding only the open bus can judge (a GPIO pin two
		// capabilities claim with other electrical settings, a part that
		// must answer its ID).
		return nil, fmt.Errorf("capability %s: the line refuses this point", c.Name)
	}
	return linePoint{bus: b, point: c.Binding.Address}, nil
}
func (b *lineBus) Health() error { return nil }
func (b *lineBus) Close() error {
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if !b.closed {
		b.closed = true
		lines.open[b.name]--
	}
	return nil
}

type linePoint struct {
	bus   *lineBus
	point string
}

func (p linePoint) Read(context.Context) (drivers.Reading, error) {
	lines.mu.Lock()
	defer lines.mu.Unlock()
	if p.bus.closed {
		lines.violation("read of %s on a closed bus", p.point)
	}
	return drivers.Reading{Value: lines.values[p.point]}, nil
}

func (p linePoint) Write(_ context.Context, v any) error {
	lines.mu.Lock()
	if p.bus.closed {
		lines.violation("write of %s on a closed bus", p.point)
	}
	if lines.writing[p.point] {
		lines.violation("two writes of %s at once", p.point)
	}
	lines.writing[p.point] = true
	lines.mu.Unlock()
	time.Sleep(p.bus.delay)
	lines.mu.Lock()
	defer lines.mu.Unlock()
	lines.writing[p.point] = false
	lines.values[p.point] = v.(float64)
	lines.writes[p.point]++
	return nil
}

func lineManifest(delayMS int, caps ...string) *manifest.Manifest {
	m, err := manifest.Parse("line.yml", []byte(manifestSource(delayMS, caps...)))
	if err != nil {
		panic(err)
	}
	return m
}

func manifestSource(delayMS int, caps ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `physmcp_version: "0.1"
device: {id: line_node, type: test, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  rs485: {type: line, delay_ms: %d}
capabilities:
`, delayMS)
	for _, c := range caps {
		// name:point[:max]
		f := strings.Split(c, ":")
		max := "100"
		if len(f) > 2 {
			max = f[2]
		}
		fmt.Fprintf(&b, `  - name: %s
    kind: do
    description: Setpoint %s.
    binding: {type: virtual, bus: rs485, address: %s}
    data_type: float
    unit: percent
    range: {min: 0, max: %s}
    semantic_tags: [setpoint]
`, f[0], f[0], f[1], max)
	}
	return b.String()
}

type lineFixture struct {
	n  *node.Node
	al *audit.Log
	st *store.Store
}

func openLine(t *testing.T, m *manifest.Manifest, guard node.Guard) lineFixture {
	t.Helper()
	lines.reset()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al, Guard: guard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close(context.Background())
		al.Close()
		st.Close()
		lines.mu.Lock()
		defer lines.mu.Unlock()
		for _, v := range lines.violations {
			t.Error(v)
		}
	})
	return lineFixture{n: n, al: al, st: st}
}

func doLine(n *node.Node, tool string, v float64, key string) (promcp.DoResult, error) {
	raw, _ := json.Marshal(v)
	body, err := n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "t"}})
	if err != nil {
		return promcp.DoResult{}, err
	}
	var r promcp.DoResult
	return r, json.Unmarshal(body, &r)
}

func isUnknown(err error) bool {
	var ie *node.InputError
	return errors.As(err, &ie) && strings.Contains(ie.Msg, "unknown capability")
}

// TestReloadAddsRemovesAndKeeps: a reload applies the difference; a kept
// capability keeps its state and its open bus.
func TestReloadAddsRemovesAndKeeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(0, "valve:p1", "pump:p2"), nil)
		if r, err := doLine(f.n, "do_valve", 40, "k1"); err != nil || r.Status != promcp.StatusSuccess {
			t.Fatalf("do_valve: %+v %v", r, err)
		}
		res, err := f.n.Reload(context.Background(), lineManifest(0, "valve:p1", "fan:p3"))
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(res.Added, res.Removed, res.Changed, res.Kept, res.Opened, res.Closed, res.Reopened) != "[do_fan] [do_pump] [] 1 [] [] []" {
			t.Errorf("reload result: %+v", res)
		}
		if _, err := doLine(f.n, "do_pump", 10, "k2"); !isUnknown(err) {
			t.Errorf("a removed capability still answers: %v", err)
		}
		if r, err := doLine(f.n, "do_fan", 70, "k3"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("the added capability: %+v %v", r, err)
		}
		// The kept capability's ledger and cache carry over.
		if r, err := doLine(f.n, "do_valve", 40, "k1"); err != nil || r.Status != promcp.StatusSuccess || r.Audit == nil || r.Audit.Seq != 1 {
			t.Errorf("replaying k1 after the reload: %+v %v", r, err)
		}
		for _, c := range f.n.Capabilities() {
			if c.Tool == "do_valve" && (c.Value != 40.0 || c.Quality == "unread") {
				t.Errorf("the kept capability lost its last value: %+v", c)
			}
			if c.Tool == "do_fan" && c.Value != 70.0 {
				t.Errorf("the added capability: %+v", c)
			}
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.opened["rs485"] != 1 || lines.writes["p1"] != 1 {
			t.Errorf("the unchanged bus was reopened (%d opens) or k1 replayed as a write (%d)", lines.opened["rs485"], lines.writes["p1"])
		}
	})
}

// TestReloadRemovesMidActuation: an actuation in its device step when its
// capability is removed completes on the old binding and is audited; the
// next call finds no such tool.
func TestReloadRemovesMidActuation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1", "pump:p2"), nil)
		done := make(chan promcp.DoResult, 1)
		go func() {
			r, err := doLine(f.n, "do_pump", 55, "mid")
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		time.Sleep(100 * time.Millisecond) // in its write now
		if _, err := f.n.Reload(context.Background(), lineManifest(2000, "valve:p1")); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			t.Fatalf("the actuation ended before its write did: %+v", r)
		default:
		}
		r := <-done
		if r.Status != promcp.StatusSuccess || !r.Verified || r.Audit == nil {
			t.Errorf("the in-flight actuation: %+v", r)
		}
		var audited bool
		_ = f.al.ScanSince(time.Time{}, func(rec audit.Record) bool {
			audited = audited || rec.Event == "do" && rec.IdempotencyKey == "mid" && rec.Status == "success"
			return true
		})
		if !audited {
			t.Error("the in-flight actuation is not in the audit trail")
		}
		if _, err := doLine(f.n, "do_pump", 55, "after"); !isUnknown(err) {
			t.Errorf("do_pump after its removal: %v", err)
		}
	})
}

// slowGuard holds every decision until release is closed.
type slowGuard struct{ release chan struct{} }

func (g slowGuard) Evaluate(ctx context.Context, a node.Action, dry bool) node.Verdict {
	if !dry {
		<-g.release
	}
	return node.NoPolicy{}.Evaluate(ctx, a, dry)
}

// TestReloadRefusesADecisionForTheOldDefinition: a call decided under the
// old manifest (range 0–100) whose capability was redefined (0–50) while
// it was deciding does not actuate.
func TestReloadRefusesADecisionForTheOldDefinition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := slowGuard{release: make(chan struct{})}
		f := openLine(t, lineManifest(0, "valve:p1"), g)
		done := make(chan promcp.DoResult, 1)
		go func() {
			r, err := doLine(f.n, "do_valve", 90, "decided-before")
			if err != nil {
				t.Error(err)
			}
			done <- r
		}()
		synctest.Wait() // deciding
		res, err := f.n.Reload(context.Background(), lineManifest(0, "valve:p1:50"))
		if err != nil || fmt.Sprint(res.Changed) != "[do_valve]" {
			t.Fatalf("reload: %+v %v", res, err)
		}
		close(g.release)
		r := <-done
		if r.Status != promcp.StatusFailed || r.Code != node.CodeManifestReloaded {
			t.Errorf("a decision for the old definition: %+v", r)
		}
		lines.mu.Lock()
		writes := lines.writes["p1"]
		lines.mu.Unlock()
		if writes != 0 {
			t.Errorf("%d writes of p1", writes)
		}
		// The key was not used: the same key under the new definition
		// is judged afresh (90 is now out of range).
		if r, _ := doLine(f.n, "do_valve", 90, "decided-before"); r.Status != promcp.StatusFailed || r.Permission != promcp.PermOutOfRange {
			t.Errorf("retry under the new definition: %+v", r)
		}
	})
}

// TestReloadNeverOverlapsActuationsOfOnePoint: a capability added on the
// point of a removed one whose actuation is under way waits for it.
func TestReloadNeverOverlapsActuationsOfOnePoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond)
		if _, err := f.n.Reload(context.Background(), lineManifest(2000, "damper:p1")); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		r, err := doLine(f.n, "do_damper", 20, "new")
		if err != nil || r.Status != promcp.StatusSuccess {
			t.Fatalf("do_damper: %+v %v", r, err)
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the old actuation: %+v", o)
		}
		// The new one waited for the old write (1.9 s left) and did its own (2 s).
		if took := time.Since(start); took < 3900*time.Millisecond {
			t.Errorf("do_damper took %v: it did not wait for the old actuation", took)
		}
	})
}

// TestReloadReopensAChangedBusAfterItsLastAccess: a bus whose settings
// changed is closed when its last access ends and only then opened with
// the new ones — never two masters on one line.
func TestReloadReopensAChangedBusAfterItsLastAccess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond)
		reloaded := make(chan node.ReloadResult, 1)
		go func() {
			res, err := f.n.Reload(context.Background(), lineManifest(500, "valve:p1"))
			if err != nil {
				t.Error(err)
			}
			reloaded <- res
		}()
		synctest.Wait()
		// Meanwhile the capability answers that its bus is being reopened.
		if r, _ := doLine(f.n, "do_valve", 30, "during"); r.Status != promcp.StatusFailed {
			t.Errorf("a do_ while the bus is reopened: %+v", r)
		}
		select {
		case res := <-reloaded:
			t.Fatalf("the reload reopened the bus under an actuation: %+v", res)
		default:
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the old actuation: %+v", o)
		}
		res := <-reloaded
		if fmt.Sprint(res.Reopened, res.Kept, res.Changed) != "[rs485] 1 []" {
			t.Errorf("reload: %+v", res)
		}
		if r, err := doLine(f.n, "do_valve", 30, "after"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("do_valve on the reopened bus: %+v %v", r, err)
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.opened["rs485"] != 2 || lines.open["rs485"] != 1 {
			t.Errorf("opens %d, open now %d", lines.opened["rs485"], lines.open["rs485"])
		}
	})
}

// TestReloadUnderLoad: many callers actuate and read while the manifest
// flips between two versions; every answer is a success, a failure that
// says nothing was actuated, or "unknown capability" for the tool the
// current version lacks — and no point is ever written twice at once.
func TestReloadUnderLoad(t *testing.T) {
	f := openLine(t, lineManifest(1, "valve:p1", "pump:p2"), nil)
	a, b := lineManifest(1, "valve:p1", "pump:p2"), lineManifest(1, "valve:p1", "fan:p2")
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	counts := map[string]int{}
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				tool := []string{"do_valve", "do_pump", "do_fan"}[(w+i)%3]
				r, err := doLine(f.n, tool, float64(i%100), fmt.Sprintf("w%d-%d", w, i))
				mu.Lock()
				switch {
				case isUnknown(err):
					counts["unknown"]++
				case err != nil:
					t.Errorf("%s: %v", tool, err)
				case r.Status == promcp.StatusSuccess && r.Verified:
					counts["success"]++
				case r.Status == promcp.StatusFailed && r.Code == node.CodeManifestReloaded:
					counts["reloaded"]++
				default:
					t.Errorf("%s: %+v", tool, r)
				}
				mu.Unlock()
				_, _ = f.n.Read(context.Background(), "do_valve", 0)
			}
		}()
	}
	for i := range 60 {
		m := a
		if i%2 == 1 {
			m = b
		}
		if _, err := f.n.Reload(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	t.Logf("answers: %v", counts)
	if counts["success"] == 0 || counts["unknown"] == 0 {
		t.Errorf("the load did not exercise both versions: %v", counts)
	}
}

// TestReloadChainKeepsWaitingForTheOldActuation: an actuation of the first
// manifest is still in its write when two reloads follow (its capability
// removed, then a capability on the same point added): the added one waits
// for it too, though the manifest in between had nothing on that point.
func TestReloadChainKeepsWaitingForTheOldActuation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1", "pump:p2"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond) // in its write
		for _, m := range []*manifest.Manifest{lineManifest(2000, "pump:p2"), lineManifest(2000, "pump:p2", "valve:p1")} {
			if _, err := f.n.Reload(context.Background(), m); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		if r, err := doLine(f.n, "do_valve", 20, "new"); err != nil || r.Status != promcp.StatusSuccess {
			t.Fatalf("do_valve of the third manifest: %+v %v", r, err)
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the first manifest's actuation: %+v", o)
		}
		if took := time.Since(start); took < 3900*time.Millisecond {
			t.Errorf("do_valve took %v: it did not wait for the first manifest's actuation of p1", took)
		}
	})
}

// TestReloadSwappingTwoPointsDoesNotDeadlock: a reload that swaps the
// points of two do_ capabilities on one bus (each changed, each keeping its
// actuator) while one of them actuates: the first calls of the new
// definitions each wait for the other's old actuation, and must not wait
// for each other's new one (a call waiting for a predecessor while it
// holds its own actuator's turn deadlocks with the other).
func TestReloadSwappingTwoPointsDoesNotDeadlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1", "pump:p2"), nil)
		do := func(tool string, v float64, key string) chan promcp.DoResult {
			out := make(chan promcp.DoResult, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				raw, _ := json.Marshal(v)
				body, err := f.n.Do(ctx, node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "t"}})
				var r promcp.DoResult
				if err == nil {
					err = json.Unmarshal(body, &r)
				}
				if err != nil {
					t.Error(err)
				}
				out <- r
			}()
			return out
		}
		old := do("do_pump", 5, "old-pump")
		time.Sleep(100 * time.Millisecond) // writing p2
		if _, err := f.n.Reload(context.Background(), lineManifest(2000, "valve:p2", "pump:p1")); err != nil {
			t.Fatal(err)
		}
		pump := do("do_pump", 6, "new-pump") // waits for its actuator (the old pump's)
		synctest.Wait()
		valve := do("do_valve", 7, "new-valve") // writes p2 now: waits for the old pump
		for name, ch := range map[string]chan promcp.DoResult{"old pump": old, "new pump": pump, "new valve": valve} {
			if r := <-ch; r.Status != promcp.StatusSuccess {
				t.Errorf("%s: %s %s: %s", name, r.Status, r.Code, r.Reason)
			}
		}
	})
}

// lineManifestOn is lineManifest with its bus called bus.
func lineManifestOn(bus string, delayMS int, caps ...string) *manifest.Manifest {
	src := strings.ReplaceAll(manifestSource(delayMS, caps...), "rs485", bus)
	m, err := manifest.Parse("line.yml", []byte(src))
	if err != nil {
		panic(err)
	}
	return m
}

// TestReloadNeverOpensABusTwice: a bus removed by one reload while an
// actuation uses it, and declared again by the next, is opened again only
// once the removed instance closed — never two masters on one line.
func TestReloadNeverOpensABusTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond) // writing p1
		if _, err := f.n.Reload(context.Background(), lineManifestOn("rs232", 2000, "pump:p2")); err != nil {
			t.Fatal(err)
		}
		if _, err := f.n.Reload(context.Background(), lineManifest(2000, "valve:p1")); err != nil {
			t.Fatal(err)
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the first manifest's actuation: %+v", o)
		}
		if r, err := doLine(f.n, "do_valve", 20, "new"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("do_valve on the bus declared again: %+v %v", r, err)
		}
	})
}

// TestReloadAfterATimedOutReopen: a reload whose wait for a changed bus
// ran out of time leaves the bus being reopened; the next reload (of the
// same manifest, as "send SIGHUP again" advises) reopens it — after the
// old instance closed, never beside it.
func TestReloadAfterATimedOutReopen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(2000, "valve:p1"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond) // writing p1
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := f.n.Reload(ctx, lineManifest(500, "valve:p1"))
		cancel()
		if err == nil {
			t.Fatal("the reload did not run out of time")
		}
		if got := fmt.Sprint(f.n.Reopening()); got != "[rs485]" {
			t.Errorf("Reopening after the timed-out reload: %s", got)
		}
		if _, err := f.n.Reload(context.Background(), lineManifest(500, "valve:p1")); err != nil {
			t.Fatal(err)
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the old actuation: %+v", o)
		}
		if r, err := doLine(f.n, "do_valve", 20, "new"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("do_valve after the second reload: %+v %v", r, err)
		}
		if got := f.n.Reopening(); len(got) != 0 {
			t.Errorf("Reopening after the second reload: %v", got)
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.open["rs485"] != 1 {
			t.Errorf("%d instances of rs485 open", lines.open["rs485"])
		}
	})
}

// TestReloadRefusesAnApprovalForTheOldDefinition: a call that carries the
// definition its approval was given for runs on that definition only: on
// another it is approval_void and writes nothing.
func TestReloadRefusesAnApprovalForTheOldDefinition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(0, "valve:p1"), nil)
		def := f.n.ApprovalDigest("do_valve")
		if _, err := f.n.Reload(context.Background(), lineManifest(0, "valve:p1:80")); err != nil {
			t.Fatal(err)
		}
		if f.n.ApprovalDigest("do_valve") == def || def == "" {
			t.Fatal("the definition did not change")
		}
		body, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_valve", Value: json.RawMessage("40"), IdempotencyKey: "approved",
			Caller: node.Caller{ID: "t"}, Approved: true, ApprovedFor: def})
		var r promcp.DoResult
		if err == nil {
			err = json.Unmarshal(body, &r)
		}
		if err != nil || r.Status != promcp.StatusFailed || r.Code != "approval_void" {
			t.Errorf("an approval for the old definition: %+v %v", r, err)
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.writes["p1"] != 0 {
			t.Errorf("%d writes", lines.writes["p1"])
		}
	})
}

// TestReloadReplaysAKeyAcrossReloads: a key used before a reload, replayed
// after it with its capability kept, redefined, removed and added again,
// gets the recorded answer byte for byte (or, removed, an unknown tool)
// and never actuates a second time.
func TestReloadReplaysAKeyAcrossReloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(0, "valve:p1"), nil)
		do := func() ([]byte, error) {
			return f.n.Do(context.Background(), node.DoRequest{Tool: "do_valve", Value: json.RawMessage("40"), IdempotencyKey: "once", Caller: node.Caller{ID: "t"}})
		}
		first, err := do()
		if err != nil {
			t.Fatal(err)
		}
		for _, step := range []struct {
			name string
			m    *manifest.Manifest
		}{
			{"kept", lineManifest(0, "valve:p1")},
			{"redefined", lineManifest(0, "valve:p1:80")},
			{"removed", lineManifest(0, "pump:p2")},
			{"added again", lineManifest(0, "valve:p1")},
		} {
			if _, err := f.n.Reload(context.Background(), step.m); err != nil {
				t.Fatal(err)
			}
			body, err := do()
			switch {
			case step.name == "removed":
				if !isUnknown(err) {
					t.Errorf("%s: %s %v", step.name, body, err)
				}
			case err != nil || string(body) != string(first):
				t.Errorf("%s: replay %s %v, recorded %s", step.name, body, err, first)
			}
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.writes["p1"] != 1 {
			t.Errorf("%d writes of p1 for one key", lines.writes["p1"])
		}
	})
}

// TestReloadRenamingABus: a reload that renames a bus (same type and
// settings: the same line) while an actuation uses it never has the line
// open twice.
func TestReloadRenamingABus(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		on := func(bus string) *manifest.Manifest {
			src := strings.Replace(manifestSource(2000, "valve:p1"), "rs485: {type: line, delay_ms: 2000}", bus+": {type: line, delay_ms: 2000, port: ttyS0}", 1)
			src = strings.ReplaceAll(src, "bus: rs485", "bus: "+bus)
			m, err := manifest.Parse("line.yml", []byte(src))
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
		f := openLine(t, on("rs485"), nil)
		first := make(chan promcp.DoResult, 1)
		go func() {
			r, _ := doLine(f.n, "do_valve", 10, "old")
			first <- r
		}()
		time.Sleep(100 * time.Millisecond) // writing p1
		if _, err := f.n.Reload(context.Background(), on("line1")); err != nil {
			t.Fatal(err)
		}
		if r, err := doLine(f.n, "do_valve", 20, "new"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("do_valve on the renamed bus: %+v %v", r, err)
		}
		if o := <-first; o.Status != promcp.StatusSuccess {
			t.Errorf("the actuation under way: %+v", o)
		}
	})
}

// TestReloadRejectsWhatAReopenedBusCannotBind: a reload that changes a
// bus's settings and adds a capability that bus cannot bind (only the
// open bus can tell) is rejected like any manifest that does not bind:
// the running manifest goes back in force (the bus reopened with its
// settings) and its capabilities keep working (it stayed in force with
// the bus dead).
func TestReloadRejectsWhatAReopenedBusCannotBind(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := openLine(t, lineManifest(0, "valve:p1"), nil)
		_, err := f.n.Reload(context.Background(), lineManifest(5, "valve:p1", "pump:unbindable"))
		if err == nil {
			t.Fatal("a manifest whose reopened bus cannot bind a capability was accepted")
		}
		if got := f.n.Manifest().Capabilities; len(got) != 1 {
			t.Errorf("the manifest in force after the rejection has %d capabilities", len(got))
		}
		if r, err := doLine(f.n, "do_valve", 20, "after"); err != nil || r.Status != promcp.StatusSuccess {
			t.Errorf("do_valve after the rejected reload: %+v %v", r, err)
		}
		if _, err := doLine(f.n, "do_pump", 20, "pump"); !isUnknown(err) {
			t.Errorf("the rejected manifest's capability answers: %v", err)
		}
		lines.mu.Lock()
		defer lines.mu.Unlock()
		if lines.open["rs485"] != 1 || lines.opened["rs485"] != 3 {
			t.Errorf("rs485: %d open, %d opened (want: start, the new settings tried, the old settings back)", lines.open["rs485"], lines.opened["rs485"])
		}
	})
}
