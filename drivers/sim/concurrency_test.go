package sim

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// Many goroutines read, write, inject faults and snapshot at once; run with
// -race. Every call must be counted exactly once.
func TestConcurrentUse(t *testing.T) {
	p := newPlantT(t, oneZone+`
tanks:  {tank: {capacity_l: 100, initial_l: 50}}
valves: {v: {travel_ms: 4000, flow_lpm: 60, drains: tank}}
`)
	const workers, ops = 8, 400
	names := []string{"zone_a.heater", "zone_a.fan", "zone_a.vent", "v.command"}
	var wg sync.WaitGroup
	errs := make(chan error, workers*ops)
	for w := 0; w < workers; w++ {
		name := names[w%len(names)]
		wr := open(t, p, "do", "float", name)
		rd := open(t, p, "read", "float", "zone_a.temperature")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ops; i++ {
				if err := wr.Write(context.Background(), float64(i%101)); err != nil {
					errs <- fmt.Errorf("write %s: %w", name, err)
				}
				if _, err := rd.Read(context.Background()); err != nil {
					errs <- fmt.Errorf("read: %w", err)
				}
			}
		}()
	}
	wg.Add(1)
	go func() { // fault churn and observers
		defer wg.Done()
		for i := 0; i < ops; i++ {
			if err := p.SetFault("tank.level", Fault{Mode: FaultNoisy, Noise: 1}); err != nil {
				errs <- err
			}
			_ = p.Snapshot()
			_ = p.Stats()
			_ = p.Faults()
			_ = p.Health()
			p.ClearFaults()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	s := p.Stats()
	if s.Reads != workers*ops || s.Writes != workers*ops {
		t.Fatalf("stats = %d reads, %d writes; want %d each", s.Reads, s.Writes, workers*ops)
	}
	if got := s.Points["zone_a.temperature"].Reads; got != workers*ops {
		t.Fatalf("temperature reads = %d", got)
	}
	if got := s.Points["zone_a.heater"].Writes; got != uint64(workers/len(names)*ops) {
		t.Fatalf("heater writes = %d", got)
	}
}

// A slow fault must not hold the plant's lock while it waits.
func TestSlowPointDoesNotBlockOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		if err := p.SetFault("zone_a.temperature", Fault{Mode: FaultSlow, Delay: time.Hour}); err != nil {
			t.Fatal(err)
		}
		slow := open(t, p, "read", "float", "zone_a.temperature")
		fast := open(t, p, "do", "float", "zone_a.heater")
		done := make(chan error, 1)
		go func() {
			_, err := slow.Read(context.Background())
			done <- err
		}()
		synctest.Wait() // the slow read is now parked in its delay
		start := time.Now()
		write(t, fast, 10.0)
		near(t, "heater", readF(t, fast), 10, 0)
		if time.Since(start) != 0 {
			t.Fatal("fast point waited behind the slow one")
		}
		select {
		case err := <-done:
			t.Fatalf("slow read finished early: %v", err)
		default:
		}
		time.Sleep(time.Hour)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

func BenchmarkRead(b *testing.B) {
	p := newPlantT(b, "") // the default greenhouse, latency_ms 0
	pt := open(b, p, "read", "float", "zone_a.temperature")
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pt.Read(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReadParallel(b *testing.B) {
	p := newPlantT(b, "")
	ctx := context.Background()
	b.ReportAllocs()
	pt := open(b, p, "read", "float", "zone_b.humidity")
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := pt.Read(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
