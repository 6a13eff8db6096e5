package sim

import (
	"math"
	"testing"
	"testing/synctest"
	"time"
)

const oneZone = `
sensor_noise: 0
zones:
  zone_a: {ambient_c: 12, initial_c: 12, initial_rh: 85, ambient_rh: 60, tau_s: 600,
           heater_gain_c: 18, fan_cooling_c: 2, vent_cooling_c: 5}
`

func TestHeaterRaisesTemperatureTowardSteadyState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		temp := open(t, p, "read", "float", "zone_a.temperature")
		heater := open(t, p, "do", "float", "zone_a.heater")

		near(t, "initial temperature", readF(t, temp), 12, 1e-9)
		write(t, heater, 100.0)
		near(t, "heater read-back", readF(t, heater), 100, 0)

		prev := readF(t, temp)
		for minute := 1; minute <= 10; minute++ {
			time.Sleep(time.Minute)
			cur := readF(t, temp)
			if cur <= prev {
				t.Fatalf("minute %d: temperature %.4f did not rise from %.4f", minute, cur, prev)
			}
			prev = cur
		}
		// After one time constant (600 s): 63.2 % of the way to 12+18 = 30.
		near(t, "temperature after tau", prev, 12+18*(1-math.Exp(-1)), 1e-9)
		time.Sleep(2 * time.Hour)
		near(t, "steady-state temperature", readF(t, temp), 30, 1e-3)

		// Heater off: back toward ambient.
		write(t, heater, 0.0)
		time.Sleep(10 * time.Minute)
		near(t, "cooling after tau", readF(t, temp), 12+18*math.Exp(-1), 1e-3)
	})
}

// The closed-form integration must not depend on how often the plant is
// observed.
func TestIntegrationIndependentOfReadRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const cfg = oneZone + `
tanks: {t: {capacity_l: 100, initial_l: 80, inflow_lpm: 1}}
valves: {v: {travel_ms: 7300, flow_lpm: 30, drains: t}}
`
		often, rarely := newPlantT(t, cfg), newPlantT(t, cfg)
		for _, p := range []*Plant{often, rarely} {
			write(t, open(t, p, "do", "float", "zone_a.heater"), 70.0)
			write(t, open(t, p, "do", "float", "zone_a.fan"), 30.0)
			write(t, open(t, p, "do", "float", "v.command"), 100.0)
		}
		oftenTemp := open(t, often, "read", "float", "zone_a.temperature")
		for i := 0; i < 1800; i++ {
			time.Sleep(time.Second)
			readF(t, oftenTemp)
		}
		a, b := often.Snapshot(), rarely.Snapshot()
		for k, va := range a {
			if math.Abs(va-b[k]) > 1e-6 {
				t.Errorf("%s: read every second %.9f, read once %.9f", k, va, b[k])
			}
		}
	})
}

func TestFanLowersHumidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		rh := open(t, p, "read", "float", "zone_a.humidity")
		fan := open(t, p, "do", "int", "zone_a.fan")

		time.Sleep(10 * time.Minute)
		near(t, "humidity with fan off", readF(t, rh), 85, 1e-9)

		write(t, fan, int64(100))
		prev := readF(t, rh)
		for i := 0; i < 5; i++ {
			time.Sleep(time.Minute)
			cur := readF(t, rh)
			if cur >= prev {
				t.Fatalf("humidity %.3f did not fall from %.3f with the fan on", cur, prev)
			}
			prev = cur
		}
		time.Sleep(3 * time.Hour)
		near(t, "humidity at steady state with fan", readF(t, rh), 85-fanDryingRH, 1e-3)
	})
}

func TestVentCoolsAndDriesTowardOutside(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		vent := open(t, p, "do", "int", "zone_a.vent")
		write(t, vent, int64(100))
		time.Sleep(5 * time.Hour)
		near(t, "temperature", readF(t, open(t, p, "read", "float", "zone_a.temperature")), 12-5, 1e-3)
		near(t, "humidity", readF(t, open(t, p, "read", "float", "zone_a.humidity")), 60, 1e-3)
	})
}

func TestHeatingLowersHumidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone)
		write(t, open(t, p, "do", "float", "zone_a.heater"), 50.0)
		time.Sleep(5 * time.Hour)
		rh := readF(t, open(t, p, "read", "float", "zone_a.humidity"))
		near(t, "humidity while heating", rh, 85-heatDryingRH*18*0.5, 1e-3)
	})
}

const valveTank = `
sensor_noise: 0
tanks:  {tank: {capacity_l: 100, initial_l: 50}}
valves: {v: {travel_ms: 4000, flow_lpm: 60, drains: tank}}
`

func TestValveTravelsAtItsRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, valveTank)
		cmd := open(t, p, "do", "int", "v.command")
		pos := open(t, p, "read", "float", "v.position")

		write(t, cmd, int64(100))
		r, err := cmd.Read(t.Context())
		if err != nil || r.Value != int64(100) {
			t.Fatalf("command read-back = %#v, %v; want int64(100)", r.Value, err)
		}
		near(t, "position at t=0", readF(t, pos), 0, 0)
		for _, want := range []float64{25, 50, 75, 100, 100} {
			time.Sleep(time.Second)
			near(t, "position", readF(t, pos), want, 1e-9)
		}
		write(t, cmd, int64(40))
		time.Sleep(time.Second)
		near(t, "position closing", readF(t, pos), 75, 1e-9)
		time.Sleep(time.Hour)
		near(t, "position settled", readF(t, pos), 40, 0)
	})
}

func TestTankDrainsWhileValveOpenAndStopsAtZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, valveTank)
		cmd := open(t, p, "do", "float", "v.command")
		level := open(t, p, "read", "float", "tank.level")

		time.Sleep(time.Minute)
		near(t, "level with valve closed", readF(t, level), 50, 0)

		write(t, cmd, 100.0)
		// 4 s ramp at a mean 50 % of 1 L/s = 2 L, then 1 L/s.
		time.Sleep(4 * time.Second)
		near(t, "level after the ramp", readF(t, level), 48, 1e-9)
		time.Sleep(10 * time.Second)
		near(t, "level after 10 s open", readF(t, level), 38, 1e-9)

		time.Sleep(time.Hour)
		if got := readF(t, level); got != 0 {
			t.Fatalf("level after an hour open = %v, want exactly 0 (bounded)", got)
		}
		write(t, cmd, 0.0)
		time.Sleep(time.Hour)
		if got := readF(t, level); got != 0 {
			t.Fatalf("empty tank with no inflow = %v, want 0", got)
		}
	})
}

func TestTankInflowBoundedAtCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, `tanks: {tank: {capacity_l: 10, initial_l: 9, inflow_lpm: 0.5}}`)
		level := open(t, p, "read", "float", "tank.level")
		time.Sleep(time.Minute)
		near(t, "level after a minute of inflow", readF(t, level), 9.5, 1e-9)
		time.Sleep(time.Hour)
		near(t, "level after an hour", readF(t, level), 10, 0)
	})
}

func TestYearLongGapIsCheap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := newPlantT(t, oneZone+`
tanks:  {tank: {capacity_l: 100, initial_l: 50, inflow_lpm: 0.01}}
valves: {v: {travel_ms: 63072000000, flow_lpm: 1, drains: tank}} # two years
`)
		write(t, open(t, p, "do", "float", "zone_a.heater"), 50.0)
		write(t, open(t, p, "do", "float", "v.command"), 100.0)
		time.Sleep(365 * 24 * time.Hour)
		s := p.Snapshot()
		near(t, "temperature", s["zone_a.temperature"], 21, 1e-6)
		near(t, "valve position after half its travel", s["v.position"], 50, 1e-6)
		if l := s["tank.level"]; l < 0 || l > 100 {
			t.Fatalf("tank level %v outside 0..100", l)
		}
	})
}

func TestSensorNoiseIsDeterministicAndSmall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := func(seed int) string {
			return "seed: " + string(rune('0'+seed)) + "\nzones: {zone_a: {ambient_c: 12, initial_c: 12, initial_rh: 85}}\n"
		}
		a, b, c := newPlantT(t, cfg(7)), newPlantT(t, cfg(7)), newPlantT(t, cfg(8))
		ta := open(t, a, "read", "float", "zone_a.temperature")
		tb := open(t, b, "read", "float", "zone_a.temperature")
		tc := open(t, c, "read", "float", "zone_a.temperature")
		differ := 0
		for i := 0; i < 50; i++ {
			time.Sleep(time.Second)
			va, vb, vc := readF(t, ta), readF(t, tb), readF(t, tc)
			if va != vb {
				t.Fatalf("same seed, same time: %v != %v", va, vb)
			}
			if va != vc {
				differ++
			}
			near(t, "noisy temperature", va, 12, tempNoiseC)
		}
		if differ == 0 {
			t.Fatal("seeds 7 and 8 gave identical noise")
		}
		// Two reads within the same second agree (the noise is a function of time).
		if readF(t, ta) != readF(t, ta) {
			t.Fatal("two reads at the same instant differ")
		}
	})
}
