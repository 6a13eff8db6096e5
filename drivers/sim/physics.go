package sim

import (
	"math"
	"sort"
	"time"
)

// Physics constants that are not configurable.
const (
	// transpirationRH is the relative humidity a closed, unheated, unventilated
	// zone drifts to as the plants transpire.
	transpirationRH = 85.0
	// fanDryingRH is how many %RH the fan at 100 % takes off the equilibrium.
	fanDryingRH = 20.0
	// heatDryingRH is how many %RH each °C of heater contribution takes off
	// the equilibrium (warmer air holds more water).
	heatDryingRH = 1.5
	// rhTauFactor scales tau_s for humidity, which settles faster than heat.
	rhTauFactor = 0.5
	// Humidity equilibrium bounds.
	minRH, maxRH = 5.0, 98.0
	// Sensor noise amplitudes at sensor_noise: 1 (uniform ± this much).
	tempNoiseC = 0.05
	rhNoise    = 0.2
	// maxSubsteps bounds the work of one integration segment while a valve
	// travels; the integration step is 1 s of simulated time below that.
	maxSubsteps = 3600
)

type objKind uint8

const (
	objZone objKind = iota
	objTank
	objValve
)

type sigKind uint8

const (
	sigTemperature sigKind = iota
	sigHumidity
	sigHeater
	sigFan
	sigVent
	sigLevel
	sigCommand
	sigPosition
)

// signal describes one addressable point; immutable after Open.
type signal struct {
	name     string // <object>.<signal>
	obj      objKind
	idx      int // index into zones, tanks or valves
	kind     sigKind
	writable bool
	percent  bool    // a 0..100 % signal (bool capabilities allowed)
	noiseAmp float64 // sensor noise amplitude (before sensor_noise scaling)
	hash     uint64  // stable per-name hash for deterministic noise
	unit     string
}

type zone struct {
	zoneSpec
	temp, rh          float64
	heater, fan, vent float64
}

func (z *zone) steadyTemp() float64 {
	return z.ambientC + z.heaterGainC*z.heater/100 - z.fanCoolingC*z.fan/100 - z.ventCoolC*z.vent/100
}

func (z *zone) steadyRH() float64 {
	rh := transpirationRH -
		fanDryingRH*z.fan/100 -
		(transpirationRH-z.ambientRH)*z.vent/100 -
		heatDryingRH*z.heaterGainC*z.heater/100
	return math.Min(maxRH, math.Max(minRH, rh))
}

type tank struct {
	tankSpec
	level float64
}

type valve struct {
	valveSpec
	tank     int     // index of the drained tank, or -1
	rate     float64 // % per second
	cmd, pos float64
	pos0     float64 // scratch: position at the start of an advance
}

// posAt is the valve's position t seconds after pos0, travelling toward cmd.
func (v *valve) posAt(t float64) float64 {
	d := v.cmd - v.pos0
	step := v.rate * t
	if step >= math.Abs(d) {
		return v.cmd
	}
	if d < 0 {
		return v.pos0 - step
	}
	return v.pos0 + step
}

// advance integrates the plant from p.last to now. Inputs are constant
// between accesses, so zones use the closed-form exponential approach and
// tanks a closed form per segment in which no valve moves; only while a
// valve travels is the tank integrated in steps of 1 s (bounded by
// maxSubsteps). A gap of any length therefore costs O(1).
func (p *Plant) advance(now time.Time) {
	if !now.After(p.last) {
		return
	}
	dt := now.Sub(p.last).Seconds()
	p.last = now
	for i := range p.zones {
		z := &p.zones[i]
		ts := z.steadyTemp()
		z.temp = ts + (z.temp-ts)*math.Exp(-dt/z.tauS)
		rs := z.steadyRH()
		z.rh = rs + (z.rh-rs)*math.Exp(-dt/(z.tauS*rhTauFactor))
	}
	p.advanceWater(dt)
}

func (p *Plant) advanceWater(dt float64) {
	bps := append(p.scratch[:0], 0, dt)
	for i := range p.valves {
		v := &p.valves[i]
		v.pos0 = v.pos
		if v.pos != v.cmd {
			if ta := math.Abs(v.cmd-v.pos) / v.rate; ta < dt {
				bps = append(bps, ta)
			}
		}
	}
	sort.Float64s(bps)
	p.scratch = bps
	for s := 0; s+1 < len(bps); s++ {
		a, b := bps[s], bps[s+1]
		if b <= a {
			continue
		}
		moving := false
		for i := range p.valves {
			v := &p.valves[i]
			if v.posAt(a) != v.cmd {
				moving = true
				break
			}
		}
		n := 1
		if moving {
			n = int(math.Min(maxSubsteps, math.Ceil(b-a)))
			if n < 1 {
				n = 1
			}
		}
		h := (b - a) / float64(n)
		for k := 0; k < n; k++ {
			mid := a + (float64(k)+0.5)*h
			for ti := range p.tanks {
				t := &p.tanks[ti]
				rate := t.inflowLPM
				for vi := range p.valves {
					v := &p.valves[vi]
					if v.tank == ti {
						rate -= v.flowLPM * v.posAt(mid) / 100
					}
				}
				t.level = math.Min(t.capacityL, math.Max(0, t.level+rate*h/60))
			}
		}
	}
	for i := range p.valves {
		v := &p.valves[i]
		v.pos = v.posAt(dt)
	}
}

// trueValue is the physical value of a signal after advance, without noise.
func (p *Plant) trueValue(s *signal) float64 {
	switch s.obj {
	case objZone:
		z := &p.zones[s.idx]
		switch s.kind {
		case sigTemperature:
			return z.temp
		case sigHumidity:
			return z.rh
		case sigHeater:
			return z.heater
		case sigFan:
			return z.fan
		case sigVent:
			return z.vent
		}
	case objTank:
		return p.tanks[s.idx].level
	case objValve:
		v := &p.valves[s.idx]
		if s.kind == sigCommand {
			return v.cmd
		}
		return v.pos
	}
	return math.NaN()
}

// sensed is what the sensor reports: the true value plus deterministic
// sensor noise that depends only on seed, point and the whole second.
func (p *Plant) sensed(s *signal, now time.Time) float64 {
	v := p.trueValue(s)
	if s.noiseAmp == 0 || p.sensorNoise == 0 {
		return v
	}
	v += s.noiseAmp * p.sensorNoise * unitNoise(uint64(p.seed), s.hash, uint64(now.Unix()))
	if s.kind == sigHumidity {
		v = math.Min(100, math.Max(0, v))
	}
	return v
}

// set changes a commanded value; p.advance(now) must have run.
func (p *Plant) set(s *signal, v float64) {
	switch s.kind {
	case sigHeater:
		p.zones[s.idx].heater = v
	case sigFan:
		p.zones[s.idx].fan = v
	case sigVent:
		p.zones[s.idx].vent = v
	case sigCommand:
		p.valves[s.idx].cmd = v
	}
}

// unitNoise is a deterministic pseudo-random number in [-1, 1).
func unitNoise(a, b, c uint64) float64 {
	x := splitmix(a ^ splitmix(b^splitmix(c)))
	return float64(x>>11)/(1<<53)*2 - 1
}

func splitmix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
