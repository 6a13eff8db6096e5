package gpio

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers"
	"periph.io/x/conn/v3/gpio"
)

// Edges are driven through the fake's EdgesChan inside a synctest bubble:
// time.Sleep moves the fake clock exactly, and synctest.Wait returns once
// the counter goroutine has handled the edge and is waiting again.
func TestEdgeCountWithDebounce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		flow := newPin(t, "TCNT_FLOW")
		b, pts := open(t, parse(t,
			readCap("pulses", "int", `{type: gpio, bus: gpio, pin: TCNT_FLOW, pull: up, edge_count: {edge: falling, debounce_ms: 10}}`)+
				readCap("flow_level", "bool", `{type: gpio, bus: gpio, pin: TCNT_FLOW, pull: up}`)))
		p := pts["pulses"]
		count := func() int64 {
			t.Helper()
			synctest.Wait()
			return read(t, p).(int64)
		}
		edge := func() { flow.EdgesChan <- gpio.Low }

		if n := count(); n != 0 {
			t.Fatalf("count at start = %d", n)
		}
		edge()
		if n := count(); n != 1 {
			t.Fatalf("after one edge: %d", n)
		}
		// Contact bounce: edges 1, 3 and 9 ms after the counted one.
		for _, gap := range []time.Duration{1, 2, 6} {
			time.Sleep(gap * time.Millisecond)
			edge()
		}
		if n := count(); n != 1 {
			t.Fatalf("bounces within 10 ms were counted: %d", n)
		}
		// 10 ms after the counted edge the lockout is over.
		time.Sleep(time.Millisecond)
		edge()
		if n := count(); n != 2 {
			t.Fatalf("an edge 10 ms after the last counted one: %d", n)
		}
		// A clean pulse train at 50 Hz (20 ms apart) is counted in full.
		for range 50 {
			time.Sleep(20 * time.Millisecond)
			edge()
			synctest.Wait()
		}
		if n := count(); n != 52 {
			t.Fatalf("after a 50-pulse train: %d", n)
		}
		cnt := b.pins["TCNT_FLOW"].counter
		if got := cnt.bounced.Load(); got != 3 {
			t.Errorf("%d edges ignored as bounce, want 3", got)
		}
		// The level capability on the same input still reads.
		if got := read(t, pts["flow_level"]); got != false {
			t.Errorf("level after falling edges = %v", got)
		}
		if err := p.Write(context.Background(), int64(0)); !errors.Is(err, drivers.ErrReadOnly) {
			t.Errorf("write to a counter: %v", err)
		}
		// Close stops the goroutine; synctest.Test fails if it leaks.
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Read(context.Background()); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("read after Close: %v", err)
		}
	})
}

// edgeRecorder records the edge each In call asks for.
type edgeRecorder struct {
	*testPin
	mu    sync.Mutex
	edges []gpio.Edge
}

func (r *edgeRecorder) In(pull gpio.Pull, edge gpio.Edge) error {
	r.mu.Lock()
	r.edges = append(r.edges, edge)
	r.mu.Unlock()
	return r.testPin.In(pull, edge)
}

func (r *edgeRecorder) last() gpio.Edge {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.edges) == 0 {
		return -1
	}
	return r.edges[len(r.edges)-1]
}

// Edges are logical: with active_low, "rising" (becoming active) asks the
// hardware for the falling voltage edge.
func TestEdgeCountActiveLowMapsTheEdge(t *testing.T) {
	for _, tc := range []struct {
		binding string
		want    gpio.Edge
	}{
		{`edge_count: {edge: rising}`, gpio.RisingEdge},
		{`active_low: true, edge_count: {edge: rising}`, gpio.FallingEdge},
		{`active_low: true, edge_count: {edge: falling}`, gpio.RisingEdge},
		{`active_low: true, edge_count: {edge: both}`, gpio.BothEdges},
		{`active_low: true, edge_count: {}`, gpio.FallingEdge}, // rising by default
	} {
		t.Run(tc.binding, func(t *testing.T) {
			r := &edgeRecorder{testPin: &testPin{N: "TEDGE", EdgesChan: make(chan gpio.Level, 4)}}
			register(t, r)
			open(t, parse(t, readCap("n", "int", `{type: gpio, bus: gpio, pin: TEDGE, `+tc.binding+`}`)))
			if got := r.last(); got != tc.want {
				t.Fatalf("In(edge) = %v, want %v", got, tc.want)
			}
		})
	}
}

// A counter joining a pin that a level read configured first reconfigures
// it with edge detection; the PhysMCP address form counts too.
func TestCounterJoinsALevelInput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &edgeRecorder{testPin: &testPin{N: "TJOIN", EdgesChan: make(chan gpio.Level, 4)}}
		register(t, r)
		b, pts := open(t, parse(t,
			readCap("door", "bool", `{type: gpio, bus: gpio, pin: TJOIN, pull: up, active_low: true}`)+
				readCap("openings", "int", `{type: gpio, bus: gpio, address: "pin=TJOIN:pull=up:active_low=true:edge=rising:debounce_ms=50"}`)))
		if got := r.last(); got != gpio.FallingEdge {
			t.Fatalf("In(edge) = %v after the counter joined", got)
		}
		r.EdgesChan <- gpio.Low // the door opens
		synctest.Wait()
		if n := read(t, pts["openings"]); n != int64(1) {
			t.Fatalf("openings = %v", n)
		}
		if read(t, pts["door"]) != true {
			t.Fatal("door level")
		}
		_ = b.Close()
	})
}
