package node_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/audit"
	"github.com/physd/physd/drivers"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/store"
)

// wedged is a fake device that can hang: while told to, its reads or its
// writes block until released, ignoring their deadline — the driver bug
// (or kernel hang) that no timeout in physd reaches, which the service
// manager's watchdog exists for.
type wedged struct {
	mu          sync.Mutex
	hangWrites  bool
	hangReads   bool
	release     chan struct{}
	value       float64
	writeBlocks chan struct{} // a blocked write says so here
}

var wedge = &wedged{}

func init() {
	drivers.Register("wedged", func(context.Context, *manifest.Bus) (drivers.Bus, error) { return wedgedBus{}, nil })
}

type wedgedBus struct{}

func (wedgedBus) Point(*manifest.Capability) (drivers.Point, error) { return wedgedPoint{}, nil }
func (wedgedBus) Health() error                                     { return nil }
func (wedgedBus) Close() error                                      { return nil }

type wedgedPoint struct{}

func (wedgedPoint) Read(context.Context) (drivers.Reading, error) {
	wedge.mu.Lock()
	hang, rel, v := wedge.hangReads, wedge.release, wedge.value
	wedge.mu.Unlock()
	if hang {
		<-rel
	}
	return drivers.Reading{Value: v}, nil
}

func (wedgedPoint) Write(_ context.Context, v any) error {
	wedge.mu.Lock()
	hang, rel := wedge.hangWrites, wedge.release
	wedge.mu.Unlock()
	if hang {
		<-rel
	}
	wedge.mu.Lock()
	defer wedge.mu.Unlock()
	wedge.value, _ = v.(float64)
	return nil
}

const wedgedManifest = `physmcp_version: "0.1"
device: {id: wedged_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  dev: {type: wedged}
capabilities:
  - name: valve
    kind: do
    description: A valve on a device that can hang.
    binding: {type: virtual, bus: dev, address: valve}
    data_type: float
    unit: percent
    range: {min: 0, max: 100}
    timeout_ms: 1000
    semantic_tags: [valve]
  - name: level
    kind: read
    description: A level polled in the background.
    binding: {type: virtual, bus: dev, address: level}
    data_type: float
    unit: percent
    timeout_ms: 1000
    poll_ms: 1000
    semantic_tags: [level]
`

func openWedged(t *testing.T) *node.Node {
	t.Helper()
	wedge.mu.Lock()
	wedge.hangReads, wedge.hangWrites, wedge.release = false, false, make(chan struct{})
	wedge.mu.Unlock()
	m, err := manifest.Parse("wedged.yml", []byte(wedgedManifest))
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
	n, err := node.Open(context.Background(), node.Config{Manifest: m, Store: st, Audit: al})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close(context.Background())
		al.Close()
		st.Close()
	})
	return n
}

func setWedge(reads, writes bool) {
	wedge.mu.Lock()
	defer wedge.mu.Unlock()
	wedge.hangReads, wedge.hangWrites = reads, writes
}

func releaseWedge() {
	wedge.mu.Lock()
	defer wedge.mu.Unlock()
	wedge.hangReads, wedge.hangWrites = false, false
	close(wedge.release)
	wedge.release = make(chan struct{})
}

// TestAliveWhileADeviceStepHangs: a device step that outlives 3 × its
// timeout + settle + 30 s makes Alive fail, naming the tool; one second
// before that bound it is alive, and once the step ends it is alive again.
func TestAliveWhileADeviceStepHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := openWedged(t)
		if err := n.Alive(); err != nil {
			t.Fatalf("a fresh node: %v", err)
		}
		setWedge(false, true)
		done := make(chan struct{})
		go func() {
			defer close(done)
			raw, _ := json.Marshal(40.0)
			_, _ = n.Do(context.Background(), node.DoRequest{Tool: "do_valve", Value: raw, IdempotencyKey: "k1", Caller: node.Caller{ID: "test"}})
		}()
		synctest.Wait() // the write is blocked
		bound := 3*time.Second + 30*time.Second
		time.Sleep(bound - time.Second)
		if err := n.Alive(); err != nil {
			t.Fatalf("a step within its bound: %v", err)
		}
		time.Sleep(2 * time.Second)
		err := n.Alive()
		if err == nil || !strings.Contains(err.Error(), "do_valve") || !strings.Contains(err.Error(), "actuation path is stuck") {
			t.Fatalf("a step beyond its bound: Alive = %v; want the actuation path named stuck", err)
		}
		releaseWedge()
		<-done
		if err := n.Alive(); err != nil {
			t.Fatalf("after the step ended: %v", err)
		}
	})
}

// TestAliveWhenAPollStops: a shared device read (here a background poll's)
// that outlives its timeout + 10 s makes Alive fail, naming the
// capability; polls that keep coming round keep it alive, and once the
// read ends it is alive again.
func TestAliveWhenAPollStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := openWedged(t)
		time.Sleep(30 * time.Second) // thirty rounds
		if err := n.Alive(); err != nil {
			t.Fatalf("polls coming round: %v", err)
		}
		setWedge(true, false)
		time.Sleep(1500 * time.Millisecond) // the next round has begun and hangs
		synctest.Wait()
		// The read began at most 500 ms ago; its bound is timeout + 10 s.
		time.Sleep(time.Second + 10*time.Second - 2*time.Second)
		if err := n.Alive(); err != nil {
			t.Fatalf("a read within its bound: %v", err)
		}
		time.Sleep(2 * time.Second)
		err := n.Alive()
		if err == nil || !strings.Contains(err.Error(), "read_level") || !strings.Contains(err.Error(), "observation loop is stuck") {
			t.Fatalf("a read beyond its bound: Alive = %v; want the observation loop named stuck", err)
		}
		releaseWedge()
		synctest.Wait()
		if err := n.Alive(); err != nil {
			t.Fatalf("after the poll came round again: %v", err)
		}
	})
}
