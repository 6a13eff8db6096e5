package node_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/drivers/sim"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
	"github.com/physd/physd/store"
)

// scripted is a fake bus whose one point does what the test says: it
// holds a value, and each write and each read can be made to fail.
type scripted struct {
	mu       sync.Mutex
	value    any
	writes   int
	writeErr error // returned by Write; applied says whether it landed anyway
	applied  bool
	readErrs []error // consumed one per read; nil entries succeed
	quantum  func(any) (any, error)
	// quantizes makes the point a drivers.Quantizer that tells the node
	// about quantum; without it the node cannot know.
	quantizes bool
}

var current atomic.Pointer[scripted]

func init() {
	drivers.Register("scripted", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return scriptedBus{}, nil })
}

type scriptedBus struct{}

func (scriptedBus) Point(*manifest.Capability) (drivers.Point, error) {
	if current.Load().quantizes {
		return quantPoint{}, nil
	}
	return scriptedPoint{}, nil
}
func (scriptedBus) Health() error { return nil }
func (scriptedBus) Close() error  { return nil }

type scriptedPoint struct{}

func (scriptedPoint) Read(context.Context) (drivers.Reading, error) {
	s := current.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.readErrs) > 0 {
		err := s.readErrs[0]
		s.readErrs = s.readErrs[1:]
		if err != nil {
			return drivers.Reading{}, err
		}
	}
	return drivers.Reading{Value: s.value}, nil
}

func (scriptedPoint) Write(_ context.Context, v any) error {
	s := current.Load()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.writeErr == nil || s.applied {
		s.value = v
		if s.quantum != nil {
			s.value, _ = s.quantum(v)
		}
	}
	return s.writeErr
}

// quantPoint adds drivers.Quantizer to the scripted point.
type quantPoint struct{ scriptedPoint }

func (quantPoint) Quantize(v any) (any, error) { return current.Load().quantum(v) }

const scriptedManifest = `physmcp_version: "0.1"
device: {id: fake_node, type: test, location: {zone: z}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  fake: {type: scripted}
capabilities:
  - name: setpoint
    kind: do
    description: A setpoint on a scripted device.
    binding: {type: virtual, bus: fake, address: setpoint}
    data_type: float
    unit: celsius
    range: {min: 0, max: 100}
    semantic_tags: [setpoint]
`

type codedErr struct{}

func (codedErr) Error() string { return "modbus exception 2 (illegal data address)" }
func (codedErr) Code() string  { return "illegal_data_address" }
func (codedErr) Fix() string   { return "the register is read-only: write its setpoint register instead" }
func (codedErr) Unwrap() error { return drivers.ErrBadValue }

func openScripted(t *testing.T, s *scripted, cfg func(*node.Config)) (*node.Node, *store.Store) {
	t.Helper()
	current.Store(s)
	m, err := manifest.Parse("fake.yml", []byte(scriptedManifest))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	al, err := audit.Open(dir + "/audit")
	if err != nil {
		t.Fatal(err)
	}
	c := node.Config{Manifest: m, Store: st, Audit: al}
	if cfg != nil {
		cfg(&c)
	}
	n, err := node.Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close(context.Background()); al.Close(); st.Close() })
	return n, st
}

// TestWriteOutcomesFollowTheVocabulary: success only when the read-back
// shows the value; failed only when nothing can have changed; partial with
// a code for everything in between — never an answer that invites a
// second actuation.
func TestWriteOutcomesFollowTheVocabulary(t *testing.T) {
	timeout := fmt.Errorf("no reply: %w", drivers.ErrTimeout)
	type script struct {
		writeErr error
		applied  bool
		readErrs []error
		quantum  func(any) (any, error)
	}
	cases := []struct {
		name      string
		script    script
		status    promcp.Status
		code      string
		forgotten bool // the key may be reused: nothing was applied
	}{
		{"verified", script{}, promcp.StatusSuccess, "", false},
		{"not sent", script{writeErr: fmt.Errorf("link down: %w", drivers.ErrOffline)}, promcp.StatusFailed, "device_offline", true},
		{"device exception", script{writeErr: codedErr{}}, promcp.StatusFailed, "illegal_data_address", true},
		{"unreadable before, the driver says why", script{readErrs: []error{codedErr{}}}, promcp.StatusFailed, "illegal_data_address", true},
		{"sent, unreadable after", script{writeErr: timeout, applied: true, readErrs: []error{nil, timeout}}, promcp.StatusPartial, promcp.CodeOutcomeUnknown, false},
		{"sent, landed after all", script{writeErr: timeout, applied: true}, promcp.StatusSuccess, "", false},
		{"sent, not there", script{writeErr: timeout}, promcp.StatusPartial, promcp.CodeOutcomeUnknown, false},
		{"acked, read-back lost", script{readErrs: []error{nil, timeout}}, promcp.StatusPartial, promcp.CodeUnverified, false},
		{"acked, other value", script{quantum: func(any) (any, error) { return 7.0, nil }}, promcp.StatusPartial, promcp.CodeMismatch, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &scripted{value: 1.0, writeErr: c.script.writeErr, applied: c.script.applied, readErrs: c.script.readErrs, quantum: c.script.quantum}
			n, st := openScripted(t, s, nil)
			r := doOn(t, n, "do_setpoint", 42.0, "k")
			if r.Status != c.status || r.Code != c.code {
				t.Fatalf("status %s code %q, want %s %q: %+v", r.Status, r.Code, c.status, c.code, r)
			}
			if r.Verified != (r.Status == promcp.StatusSuccess) {
				t.Errorf("verified %v with status %s", r.Verified, r.Status)
			}
			if r.Status == promcp.StatusPartial && !strings.Contains(r.Reason, "before acting again") {
				t.Errorf("a partial answer must say to read first: %q", r.Reason)
			}
			if c.code == "illegal_data_address" && !strings.Contains(r.Reason, "read-only") {
				t.Errorf("the device's fix is lost: %q", r.Reason)
			}
			e, _ := st.Lookup("k")
			if forgotten := e == nil; forgotten != c.forgotten {
				t.Errorf("key recorded = %v, want %v", !forgotten, !c.forgotten)
			}
		})
	}
}

// TestEncodingIsNotAMismatch: a register that holds a value in steps of
// 0.5 (a scaled integer) shows 42.5 after a write of 42.3. With the
// point's Quantizer that is the requested value, verified; without one the
// node cannot know, and says mismatch.
func TestEncodingIsNotAMismatch(t *testing.T) {
	halves := func(v any) (any, error) { return math.Round(v.(float64)*2) / 2, nil }
	n, _ := openScripted(t, &scripted{value: 0.0, quantum: halves}, nil)
	if r := doOn(t, n, "do_setpoint", 42.3, "plain"); r.Status != promcp.StatusPartial || r.Code != promcp.CodeMismatch {
		t.Errorf("without a quantizer: %+v", r)
	}
	n, _ = openScripted(t, &scripted{value: 0.0, quantum: halves, quantizes: true}, nil)
	if r := doOn(t, n, "do_setpoint", 42.3, "quantized"); r.Status != promcp.StatusSuccess || !r.Verified || r.AppliedValue != 42.5 {
		t.Errorf("with the point's quantizer: %+v", r)
	}
	// A value the encoding cannot hold is refused before anything moves.
	refuse := func(v any) (any, error) { return nil, fmt.Errorf("not a multiple of 0.5: %w", drivers.ErrBadValue) }
	s := &scripted{value: 0.0, quantum: refuse, quantizes: true}
	n, _ = openScripted(t, s, nil)
	if r := doOn(t, n, "do_setpoint", 42.3, "refused"); r.Status != promcp.StatusFailed || r.Code != "not_representable" || s.writes != 0 {
		t.Errorf("unrepresentable value: %+v (%d writes)", r, s.writes)
	}
}

func doOn(t *testing.T, n *node.Node, tool string, v any, key string) promcp.DoResult {
	t.Helper()
	raw, _ := json.Marshal(v)
	body, err := n.Do(context.Background(), node.DoRequest{Tool: tool, Value: raw, IdempotencyKey: key, Caller: node.Caller{ID: "t"}})
	if err != nil {
		t.Fatal(err)
	}
	var r promcp.DoResult
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// flakyAudit fails every append while broken is set.
type flakyAudit struct {
	*audit.Log
	broken atomic.Bool
}

func (a *flakyAudit) AppendFunc(build func(uint64) (*audit.Record, error)) (uint64, error) {
	if a.broken.Load() {
		return 0, errors.New("write audit.jsonl: no space left on device")
	}
	return a.Log.AppendFunc(build)
}

// TestAuditFailureStopsActuation: an actuation whose audit line cannot be
// written is answered truthfully (it happened) and recorded in the ledger;
// from then on physd actuates nothing until the audit works again, and
// /readyz says why.
func TestAuditFailureStopsActuation(t *testing.T) {
	s := &scripted{value: 1.0}
	var fa *flakyAudit
	n, st := openScripted(t, s, func(c *node.Config) {
		fa = &flakyAudit{Log: c.Audit.(*audit.Log)}
		c.Audit = fa
	})
	fa.broken.Store(true)
	r := doOn(t, n, "do_setpoint", 10.0, "during")
	if r.Status != promcp.StatusSuccess || r.Audit != nil || !strings.Contains(r.Reason, "audit record of this actuation could not be written") {
		t.Errorf("actuation whose audit failed: %+v", r)
	}
	if e, _ := st.Lookup("during"); e == nil || e.State != store.StateDone {
		t.Errorf("its answer is not in the ledger: %+v", e)
	}
	r = doOn(t, n, "do_setpoint", 20.0, "after")
	if r.Status != promcp.StatusFailed || r.Code != "audit_unavailable" || !strings.Contains(r.Reason, "no space left") {
		t.Errorf("do_ with a broken audit: %+v", r)
	}
	if s.writes != 1 {
		t.Errorf("%d writes; the broken audit must stop the second", s.writes)
	}
	if ok, checks := n.Ready(); ok || !hasFailedCheck(checks, "audit") {
		t.Errorf("ready = %v with a broken audit: %+v", ok, checks)
	}
	fa.broken.Store(false)
	if r := doOn(t, n, "do_setpoint", 20.0, "after"); r.Status != promcp.StatusSuccess {
		t.Errorf("after the audit recovered: %+v", r)
	}
	if ok, _ := n.Ready(); !ok {
		t.Error("still not ready after the audit recovered")
	}
}

func hasFailedCheck(checks []node.Readiness, name string) bool {
	for _, c := range checks {
		if c.Name == name && !c.OK {
			return true
		}
	}
	return false
}

// TestLedgerStaysBoundedWhileRunning: three simulated days of do_ calls
// on a running node; the ledger never holds more than a day of keys (plus
// the prune interval), and stays under 600 bytes a key.
func TestLedgerStaysBoundedWhileRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &scripted{value: 0.0}
		n, _ := openScripted(t, s, func(c *node.Config) {
			c.Ledger = node.LedgerConfig{Window: 24 * time.Hour, PruneEvery: time.Minute}
		})
		const every = 2 * time.Minute
		perDay := int64(24 * time.Hour / every)
		var most int64
		for i := range 3 * int(perDay) {
			doOn(t, n, "do_setpoint", float64(i%100), fmt.Sprint("key-", i))
			time.Sleep(every)
			st := n.LedgerStats()
			most = max(most, st.Keys)
			if st.Keys > perDay+2 {
				t.Fatalf("after %d calls the ledger holds %d keys, more than a day (%d)", i+1, st.Keys, perDay)
			}
			if st.Keys > 10 && st.Bytes/st.Keys > 600 {
				t.Fatalf("%d bytes a key", st.Bytes/st.Keys)
			}
		}
		st := n.LedgerStats()
		t.Logf("REPORT ledger over 3 simulated days, one do_ every %s: at most %d keys, now %d keys, %d bytes (%d a key), file %d bytes",
			every, most, st.Keys, st.Bytes, st.Bytes/max(st.Keys, 1), st.FileBytes)
	})
}

// TestReadsShareOneDeviceReadAndHonourTheirDeadline: M readers of a slow
// device cost one device read, and each returns when its own deadline
// ends, not after M × the device's timeout.
func TestReadsShareOneDeviceReadAndHonourTheirDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := open(t, t.TempDir())
		if _, err := f.n.Read(context.Background(), "read_humidity_zone_b", 0); err != nil {
			t.Fatal(err)
		}
		before := f.plant.Stats().Points["zone_b.humidity"].Reads
		f.plant.SetFault("zone_b.humidity", sim.Fault{Mode: sim.FaultSlow, Delay: 900 * time.Millisecond})
		start := time.Now()
		var wg sync.WaitGroup
		for range 10 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
				defer cancel()
				o, _ := f.n.Read(ctx, "read_humidity_zone_b", 0)
				if took := time.Since(start); took > 150*time.Millisecond {
					t.Errorf("a reader with a 150 ms deadline waited %s", took)
				}
				if o.Quality == promcp.QualityGood && !o.Cached {
					t.Errorf("a reader whose deadline ended got a fresh good value: %+v", o)
				}
			}()
		}
		wg.Wait()
		time.Sleep(time.Second) // the shared read finishes on its own
		synctest.Wait()
		if reads := f.plant.Stats().Points["zone_b.humidity"].Reads - before; reads != 1 {
			t.Errorf("10 concurrent readers caused %d device reads, want 1", reads)
		}
	})
}

// TestShutdownNeverClosesABusUnderAnActuation: once shutdown begins no
// actuation starts; one under way finishes on an open bus even when the
// grace period ends first.
func TestShutdownNeverClosesABusUnderAnActuation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := open(t, t.TempDir())
		f.plant.SetFault("zone_b.fan", sim.Fault{Mode: sim.FaultSlow, Delay: 2 * time.Second})
		answer := make(chan promcp.DoResult)
		go func() { answer <- do(t, f.n, "do_fan_zone_b", 60, "in-flight") }()
		time.Sleep(100 * time.Millisecond) // in its device step now
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if err := f.n.Close(ctx); err == nil {
			t.Error("Close returned before the actuation finished")
		}
		if _, err := f.n.Do(context.Background(), node.DoRequest{Tool: "do_fan_zone_b", Value: json.RawMessage("10"), IdempotencyKey: "late"}); !errors.Is(err, node.ErrShuttingDown) {
			t.Errorf("an actuation started after shutdown began: %v", err)
		}
		if r := <-answer; r.Status != promcp.StatusSuccess || !r.Verified {
			t.Errorf("the in-flight actuation, with the bus left open: %+v", r)
		}
		if err := f.n.Close(context.Background()); err != nil {
			t.Errorf("second Close: %v", err)
		}
	})
}
