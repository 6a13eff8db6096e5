package sim

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/physd/physd/drivers"
)

func TestSlowFaultPastDeadlineTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		temp := open(t, p, "read", "float", "zone_a.temperature")
		heater := open(t, p, "do", "float", "zone_a.heater")
		if err := p.SetFault("zone_a.temperature", Fault{Mode: FaultSlow, Delay: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := temp.Read(ctx)
		if !errors.Is(err, drivers.ErrTimeout) {
			t.Fatalf("slow read past deadline: err = %v, want ErrTimeout", err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("timeout error %v should also wrap context.DeadlineExceeded", err)
		}
		if el := time.Since(start); el != time.Second {
			t.Errorf("gave up after %v, want exactly the 1s deadline", el)
		}

		// Within the deadline the read succeeds, after the delay.
		ctx2, cancel2 := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel2()
		start = time.Now()
		if _, err := temp.Read(ctx2); err != nil {
			t.Fatalf("slow read within deadline: %v", err)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Errorf("slow read took %v, want 5s", el)
		}

		// Other points are not slowed; "*" slows writes too.
		start = time.Now()
		write(t, heater, 10.0)
		if el := time.Since(start); el != 0 {
			t.Errorf("unfaulted write took %v", el)
		}
		if err := p.SetFault("*", Fault{Mode: FaultSlow, Delay: 3 * time.Second}); err != nil {
			t.Fatal(err)
		}
		ctx3, cancel3 := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel3()
		if err := heater.Write(ctx3, 20.0); !errors.Is(err, drivers.ErrTimeout) {
			t.Fatalf("write under slow *: err = %v, want ErrTimeout", err)
		}
		p.ClearFaults()
		near(t, "heater after a timed-out write", readF(t, heater), 10, 0)
	})
}

func TestLatencyConfig(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, "latency_ms: 20\n"+oneZone)
		temp := open(t, p, "read", "float", "zone_a.temperature")
		start := time.Now()
		readF(t, temp)
		if el := time.Since(start); el != 20*time.Millisecond {
			t.Fatalf("read with latency_ms 20 took %v", el)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
		defer cancel()
		if _, err := temp.Read(ctx); !errors.Is(err, drivers.ErrTimeout) {
			t.Fatalf("read with 5ms deadline and 20ms latency: %v", err)
		}
	})
}

func TestStuckFaultSwallowsWritesAndFreezesReads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		heater := open(t, p, "do", "float", "zone_a.heater")
		temp := open(t, p, "read", "float", "zone_a.temperature")
		write(t, heater, 30.0)

		if err := p.SetFault("zone_a.heater", Fault{Mode: FaultStuck}); err != nil {
			t.Fatal(err)
		}
		if err := heater.Write(t.Context(), 80.0); err != nil {
			t.Fatalf("write to stuck point: %v, want nil", err)
		}
		near(t, "stuck heater read-back", readF(t, heater), 30, 0)
		if got := p.Snapshot()["zone_a.heater"]; got != 30 {
			t.Fatalf("stuck write changed the plant: heater = %v", got)
		}

		// A stuck sensor reports the value frozen when the fault began.
		frozen := readF(t, temp)
		if err := p.SetFault("zone_a.temperature", Fault{Mode: FaultStuck}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Minute)
		near(t, "stuck temperature", readF(t, temp), frozen, 0)
		real := p.Snapshot()["zone_a.temperature"]
		if real-frozen < 1 {
			t.Fatalf("plant should have warmed under the heater: real %v, frozen %v", real, frozen)
		}
		p.ClearFaults()
		near(t, "temperature after clearing", readF(t, temp), real, 1e-9)
		write(t, heater, 80.0)
		near(t, "heater after clearing", readF(t, heater), 80, 0)
	})
}

func TestOfflineFault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		heater := open(t, p, "do", "float", "zone_a.heater")
		temp := open(t, p, "read", "float", "zone_a.temperature")

		if err := p.SetFault("zone_a.heater", Fault{Mode: FaultOffline}); err != nil {
			t.Fatal(err)
		}
		if _, err := heater.Read(t.Context()); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("read of offline point: %v", err)
		}
		if err := heater.Write(t.Context(), 50.0); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("write to offline point: %v", err)
		}
		if p.Snapshot()["zone_a.heater"] != 0 {
			t.Fatal("write to an offline point reached the plant")
		}
		readF(t, temp) // other points still work
		if err := p.Health(); err != nil {
			t.Fatalf("Health with one point offline = %v, want nil", err)
		}

		if err := p.SetFault("*", Fault{Mode: FaultOffline}); err != nil {
			t.Fatal(err)
		}
		if _, err := temp.Read(t.Context()); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("read under * offline: %v", err)
		}
		if err := p.Health(); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("Health under * offline = %v, want ErrOffline", err)
		}
		if f := p.Faults(); len(f) != 2 || f["*"].Mode != FaultOffline || f["zone_a.heater"].Mode != FaultOffline {
			t.Fatalf("Faults() = %v", f)
		}

		// Clearing "*" leaves the point's own fault.
		if err := p.SetFault("*", Fault{}); err != nil {
			t.Fatal(err)
		}
		if err := p.Health(); err != nil {
			t.Fatalf("Health after clearing * = %v", err)
		}
		readF(t, temp)
		if _, err := heater.Read(t.Context()); !errors.Is(err, drivers.ErrOffline) {
			t.Fatalf("point fault should survive clearing *: %v", err)
		}
		p.ClearFaults()
		write(t, heater, 50.0)
		near(t, "heater", readF(t, heater), 50, 0)
	})
}

func TestNoisyFaultStaysWithinNoise(t *testing.T) {
	p := newPlantT(t, oneZone)
	heater := open(t, p, "do", "float", "zone_a.heater")
	write(t, heater, 40.0)
	if err := p.SetFault("zone_a.heater", Fault{Mode: FaultNoisy, Noise: 2}); err != nil {
		t.Fatal(err)
	}
	seen := map[float64]bool{}
	wide := 0
	for i := 0; i < 200; i++ {
		v := readF(t, heater)
		if math.Abs(v-40) > 2 {
			t.Fatalf("noisy read %v outside 40 ± 2", v)
		}
		if math.Abs(v-40) > 1 {
			wide++
		}
		seen[v] = true
	}
	if len(seen) < 150 || wide == 0 {
		t.Fatalf("noise too tame: %d distinct values, %d beyond ±1", len(seen), wide)
	}
	if got := p.Snapshot()["zone_a.heater"]; got != 40 {
		t.Fatalf("noise leaked into the plant: %v", got)
	}
	p.ClearFaults()
	near(t, "heater after clearing noise", readF(t, heater), 40, 0)
}

func TestSetFaultRejectsBadInput(t *testing.T) {
	p := newPlantT(t, oneZone)
	for _, tc := range []struct {
		point string
		f     Fault
		want  string
	}{
		{"zone_z.temperature", Fault{Mode: FaultOffline}, "zone_a.temperature"},
		{"zone_a.temperature", Fault{Mode: FaultNoisy}, "noise > 0"},
		{"zone_a.temperature", Fault{Mode: FaultSlow}, "delay > 0"},
		{"zone_a.temperature", Fault{Mode: FaultMode(42)}, "invalid fault mode"},
	} {
		err := p.SetFault(tc.point, tc.f)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetFault(%q, %+v) = %v, want an error mentioning %q", tc.point, tc.f, err, tc.want)
		}
	}
	if len(p.Faults()) != 0 {
		t.Fatalf("rejected faults were installed: %v", p.Faults())
	}
}

func TestFaultModeText(t *testing.T) {
	for m := FaultNone; m <= FaultSlow; m++ {
		b, err := m.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back FaultMode
		if err := back.UnmarshalText(b); err != nil || back != m {
			t.Fatalf("round trip of %v: %v, %v", m, back, err)
		}
	}
	if _, err := ParseFaultMode("broken"); err == nil {
		t.Fatal("ParseFaultMode accepted an unknown mode")
	}
}

func TestCloseIsIdempotentAndTakesPlantOffline(t *testing.T) {
	p := newPlantT(t, oneZone)
	temp := open(t, p, "read", "float", "zone_a.temperature")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := temp.Read(t.Context()); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("read after Close: %v", err)
	}
	if err := p.Health(); !errors.Is(err, drivers.ErrOffline) {
		t.Fatalf("Health after Close: %v", err)
	}
}
