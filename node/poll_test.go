package node_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers"
	"github.com/physd/physd/internal/testrig"
	"github.com/physd/physd/manifest"
	"github.com/physd/physd/node"
	"github.com/physd/physd/promcp"
)

// batchBus is a fake bus that reads many points at once
// (drivers.BatchReader), as the Modbus driver does, and records how it was
// asked: each ReadPoints call's points and each single Read.
type batchBus struct{ name string }

type batchLog struct {
	mu      sync.Mutex
	batches map[string][][]string // bus -> each ReadPoints call's point names
	singles []string              // points read alone (a read_'s shared read)
	hold    chan struct{}         // non-nil: ReadPoints waits for it, ignoring its deadlines
	holdOne string                // a point whose single Read waits for hold
}

var batches = &batchLog{batches: map[string][][]string{}}

func init() {
	drivers.Register("batchy", func(_ context.Context, b *manifest.Bus) (drivers.Bus, error) { return &batchBus{name: b.Name}, nil })
}

type batchPoint struct{ name string }

func (b *batchBus) Point(c *manifest.Capability) (drivers.Point, error) {
	return &batchPoint{name: c.Name}, nil
}
func (*batchBus) Health() error { return nil }
func (*batchBus) Close() error  { return nil }

func (b *batchBus) ReadPoints(ctxs []context.Context, points []drivers.Point, done func(int, drivers.Reading, error)) {
	var names []string
	for _, p := range points {
		names = append(names, p.(*batchPoint).name)
	}
	batches.mu.Lock()
	batches.batches[b.name] = append(batches.batches[b.name], names)
	hold := batches.hold
	batches.mu.Unlock()
	if hold != nil {
		<-hold
	}
	for i := range points {
		done(i, drivers.Reading{Value: float64(len(names))}, nil)
	}
}

func (p *batchPoint) Read(context.Context) (drivers.Reading, error) {
	batches.mu.Lock()
	batches.singles = append(batches.singles, p.name)
	hold := batches.hold
	one := batches.holdOne == p.name
	batches.mu.Unlock()
	if one && hold != nil {
		<-hold
	}
	return drivers.Reading{Value: -1.0}, nil
}

func (*batchPoint) Write(context.Context, any) error { return nil }

func (l *batchLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches, l.singles, l.hold, l.holdOne = map[string][][]string{}, nil, nil, ""
}

func (l *batchLog) of(bus string) [][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([][]string(nil), l.batches[bus]...)
}

func (l *batchLog) single() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.singles...)
}

func batchCap(name, bus string, pollMS int) string {
	s := "  - {name: " + name + ", kind: read, description: d, binding: {type: virtual, bus: " + bus + ", address: x}, data_type: float, timeout_ms: 1000, semantic_tags: [t]"
	if pollMS > 0 {
		s += ", poll_ms: " + strconv.Itoa(pollMS)
	}
	return s + "}\n"
}

const batchHeader = `physmcp_version: "0.1"
device: {id: batch_node, type: test, location: {zone: lab}}
network: {protocols: [{type: ip}], mesh: {enabled: false}}
buses:
  a: {type: batchy}
  b: {type: batchy}
capabilities:
`

func openBatch(t *testing.T, caps string) *node.Node {
	t.Helper()
	batches.reset()
	m, err := manifest.Parse("batch.yml", []byte(batchHeader+caps))
	if err != nil {
		t.Fatal(err)
	}
	return testrig.OpenManifest(t, m, "", nil).Node
}

// TestPollsReadEachBusTogether: the background polls read the capabilities
// of one bus and interval in one batch per round (a bus that can merge
// reads is handed all of them at once), each interval on its own round,
// each bus on its own; every polled capability is observed each round, and
// nothing is read point by point.
func TestPollsReadEachBusTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := openBatch(t, batchCap("a1", "a", 1000)+batchCap("a2", "a", 1000)+batchCap("a3", "a", 1000)+
			batchCap("fast1", "a", 500)+batchCap("fast2", "a", 500)+batchCap("b1", "b", 1000)+batchCap("b2", "b", 1000)+batchCap("never", "a", 0))
		sub := n.Subscribe(64)
		time.Sleep(1001 * time.Millisecond)
		synctest.Wait()
		want := map[string][][]string{
			"a": {{"fast1", "fast2"}, {"a1", "a2", "a3"}, {"fast1", "fast2"}},
			"b": {{"b1", "b2"}},
		}
		for bus, w := range want {
			got := batches.of(bus)
			if len(got) != len(w) {
				t.Fatalf("bus %s: batches %v, want %v", bus, got, w)
			}
			for _, batch := range w {
				found := false
				for _, g := range got {
					found = found || strings.Join(g, ",") == strings.Join(batch, ",")
				}
				if !found {
					t.Errorf("bus %s: batches %v lack %v", bus, got, batch)
				}
			}
		}
		if s := batches.single(); len(s) != 0 {
			t.Errorf("points read alone: %v", s)
		}
		seen := map[string]int{}
		for len(sub.C) > 0 {
			o := <-sub.C
			if o.Obs.Quality != promcp.QualityGood {
				t.Errorf("%s: %+v", o.Cap.Name, o.Obs)
			}
			seen[o.Cap.Name]++
		}
		for name, k := range map[string]int{"a1": 1, "a2": 1, "a3": 1, "fast1": 2, "fast2": 2, "b1": 1, "b2": 1} {
			if seen[name] != k {
				t.Errorf("%s observed %d times, want %d (all: %v)", name, seen[name], k, seen)
			}
		}
		if err := n.Alive(); err != nil {
			t.Errorf("Alive: %v", err)
		}
	})
}

// TestPollSharesTheReadUnderWay: a read_ that asks for a fresh value while
// the poll's batch is reading joins it (one device read for both, the
// batch's value), and a poll round leaves out a capability whose own
// shared read (a read_'s) is still under way rather than reading it twice.
func TestPollSharesTheReadUnderWay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := openBatch(t, batchCap("a1", "a", 1000)+batchCap("a2", "a", 1000))
		hold := make(chan struct{})
		batches.mu.Lock()
		batches.hold = hold
		batches.mu.Unlock()
		time.Sleep(1001 * time.Millisecond)
		synctest.Wait() // the round's batch is waiting
		var o promcp.Observation
		done := make(chan struct{})
		go func() {
			defer close(done)
			o, _ = n.Read(context.Background(), "read_a1", 0)
		}()
		synctest.Wait()
		close(hold)
		<-done
		synctest.Wait() // the batch reports a2 too
		if o.Value != 2.0 || len(batches.single()) != 0 {
			t.Errorf("read_ during the batch: %+v, single reads %v; want the batch's value 2 and no read of its own", o, batches.single())
		}

		// a2's own shared read (a read_'s) hangs; the next rounds read a1
		// alone. The hold is set for the single read only: it takes it
		// before the batches are told not to wait.
		hold = make(chan struct{})
		batches.mu.Lock()
		batches.hold, batches.holdOne = hold, "a2"
		batches.mu.Unlock()
		go func() { _, _ = n.Read(context.Background(), "read_a2", 0) }()
		synctest.Wait()
		if s := batches.single(); len(s) != 1 || s[0] != "a2" {
			t.Fatalf("read_ of a2: single reads %v, want a2's own", s)
		}
		batches.mu.Lock()
		batches.hold = nil
		batches.mu.Unlock()
		before := len(batches.of("a"))
		time.Sleep(2 * time.Second)
		synctest.Wait()
		for _, b := range batches.of("a")[before:] {
			if strings.Join(b, ",") != "a1" {
				t.Errorf("a round with a2's read under way read %v, want a1 alone", b)
			}
		}
		close(hold)
		synctest.Wait()
	})
}

// TestAliveWhenABatchHangs: a poll's batch that a driver never ends (it
// ignores its deadlines) makes Alive fail after the capabilities' timeout
// + 10 s, naming one of them, as a hung single read does.
func TestAliveWhenABatchHangs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := openBatch(t, batchCap("a1", "a", 1000)+batchCap("a2", "a", 1000))
		hold := make(chan struct{})
		batches.mu.Lock()
		batches.hold = hold
		batches.mu.Unlock()
		time.Sleep(1001 * time.Millisecond)
		synctest.Wait()
		time.Sleep(10 * time.Second)
		if err := n.Alive(); err != nil {
			t.Fatalf("a batch within its bound: %v", err)
		}
		time.Sleep(2 * time.Second)
		err := n.Alive()
		if err == nil || !strings.Contains(err.Error(), "observation loop is stuck") || !strings.Contains(err.Error(), "read_a") {
			t.Fatalf("a batch beyond its bound: Alive = %v", err)
		}
		close(hold)
		synctest.Wait()
		if err := n.Alive(); err != nil {
			t.Errorf("after the batch ended: %v", err)
		}
	})
}

// TestSubscriptionHoldsARound: a poll round's observations arrive
// together, so a subscription's default room is one observation of every
// polled capability: a subscriber that reads nothing during a round of 300
// loses none. SubscribeWhere hands a subscriber only what its filter
// keeps, and what it refuses is neither delivered nor counted as dropped.
func TestSubscriptionHoldsARound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var caps strings.Builder
		for i := range 300 {
			caps.WriteString(batchCap("p"+strconv.Itoa(i), "a", 1000))
		}
		n := openBatch(t, caps.String())
		if got := n.SubscriptionBuffer(); got != 300 {
			t.Fatalf("SubscriptionBuffer = %d, want 300 (the polled capabilities)", got)
		}
		all := n.Subscribe(0)
		some := n.SubscribeWhere(8, func(o node.Observed) bool { return strings.HasSuffix(o.Cap.Name, "7") })
		time.Sleep(1001 * time.Millisecond)
		synctest.Wait()
		if len(all.C) != 300 || all.Dropped() != 0 {
			t.Errorf("the default subscription holds %d of the round's 300 observations, dropped %d", len(all.C), all.Dropped())
		}
		// 30 names end in 7; 8 fit, 22 dropped, the 270 others never offered.
		if len(some.C) != 8 || some.Dropped() != 22 || n.ObservationsDropped() != 22 {
			t.Errorf("filtered: %d held, %d dropped (node: %d); want 8 and 22", len(some.C), some.Dropped(), n.ObservationsDropped())
		}
		for len(some.C) > 0 {
			if o := <-some.C; !strings.HasSuffix(o.Cap.Name, "7") {
				t.Errorf("the filter let %s through", o.Cap.Name)
			}
		}
	})
}
